"""Whether a reply is another model's answer: the one rule shared by the System One adapter
(``adapters.systemone.SystemOne.check_served`` refuses such a reply, and its provider stops) and the
cache (``cache.index``: such a row, which an older dxi stored, is set aside: never a cache hit,
never scored, its request sent again). Standard library only at import, so that any layer may import
it (``dxi.layers``); ``served_by_other_expr``, the rule over a frame of rows, imports Polars when
called.

A System One server answers with the model it serves whatever the request names
(``sparrow-decider serve``), so a reply naming another model than the one asked for came from
another model (the server was restarted with another). The hosted providers are not held so: an
alias, a dated snapshot (asked ``gpt-4o``, served ``gpt-4o-2024-08-06``) or a provider's reroute
answers under the name asked for (``scoring.replies``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import polars as pl

# the adapter kinds held to the model asked for: ``systemone`` and ``embedded`` (a SystemOne)
SERVED_EXACTLY = ("systemone", "embedded")


def served_by_other(kind: str | None, model: str | None, served: str | None) -> bool:
    """Whether a reply of adapter ``kind`` asked for ``model`` that names ``served`` as the model
    that answered is another model's answer: ``kind`` is held to the model asked for
    (``SERVED_EXACTLY``) and ``served`` is not exactly ``model``. A reply that names no model is
    taken as the model asked for."""
    return kind in SERVED_EXACTLY and bool(served) and bool(model) and served != model


def served_by_other_expr() -> pl.Expr:
    """``served_by_other`` of each row of a frame from its ``provider`` (the adapter kind),
    ``model`` and ``served_model`` columns (String or Categorical), as a Boolean never null, named
    ``set_aside``."""
    import polars as pl

    model, served = pl.col("model").cast(pl.String), pl.col("served_model").cast(pl.String)
    return (
        (
            pl.col("provider").cast(pl.String).is_in(SERVED_EXACTLY)
            & (served != "")
            & (model != "")
            & (served != model)
        )
        .fill_null(False)
        .alias("set_aside")
    )
