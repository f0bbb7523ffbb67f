"""Tables that explain a score: When2Call's confusion matrix, answer statuses and error messages.

(Per-group metrics — HLE category, Omniscience domain, When2Call reply type, WildGuardTest
subcategory and adversarial flag — come from ``scoring.sums.breakdown_table``, with intervals.)
"""

from __future__ import annotations

import polars as pl

from .pipeline import STATUSES

WHEN2CALL = "when2call"
REPLY_TYPES = ("direct", "tool_call", "request_for_info", "cannot_answer")
TOP_ERRORS = 20


def _strings(ans: pl.DataFrame, *columns: str) -> pl.DataFrame:
    return ans.select(*[pl.col(c).cast(pl.String) for c in columns])


def confusion(ans: pl.DataFrame) -> pl.DataFrame:
    """When2Call per label: ``gold_category`` × ``predicted`` (the predicted reply type, or the
    status ``invalid`` / ``failed`` / ``missing`` when there is no prediction) with ``count`` over
    every epoch. Every cell of the 4 × (4 + 3) matrix is present (zeros included) for each label
    with When2Call answers."""
    w2c = ans.filter(pl.col("eval").cast(pl.String) == WHEN2CALL)
    if w2c.is_empty():
        return pl.DataFrame(
            schema={
                "label": pl.String,
                "gold_category": pl.String,
                "predicted": pl.String,
                "count": pl.UInt32,
            }
        )
    cells = (
        _strings(w2c, "label", "gold_category", "predicted_category", "status")
        .select(
            "label", "gold_category", pl.coalesce("predicted_category", "status").alias("predicted")
        )
        .group_by("label", "gold_category", "predicted")
        .len("count")
    )
    columns = [*REPLY_TYPES, *(s for s in STATUSES if s != "ok")]
    grid = (
        cells.select("label")
        .unique()
        .join(pl.DataFrame({"gold_category": REPLY_TYPES}), how="cross")
        .join(pl.DataFrame({"predicted": columns}), how="cross")
    )
    return (
        grid.join(cells, on=["label", "gold_category", "predicted"], how="left")
        .with_columns(pl.col("count").fill_null(0).cast(pl.UInt32))
        .with_columns(
            pl.col("gold_category").cast(pl.Enum(REPLY_TYPES)),
            pl.col("predicted").cast(pl.Enum(columns)),
        )
        .sort("label", "gold_category", "predicted")
        .with_columns(pl.col("gold_category", "predicted").cast(pl.String))
    )


def statuses(ans: pl.DataFrame) -> pl.DataFrame:
    """Per (label, eval): ``answers`` (questions × epochs) and how many are ``ok``, ``invalid``,
    ``failed`` and ``missing`` (any other status gets its own column), plus ``warnings`` (answers
    scored with a validation warning)."""
    status = pl.col("status").cast(pl.String)
    found = sorted(set(ans.select(status.unique()).to_series().to_list()) - set(STATUSES))
    counts = ans.group_by("label", "eval").agg(
        pl.len().alias("answers"),
        *[(status == s).sum().alias(s) for s in (*STATUSES, *found)],
        pl.col("warning").is_not_null().sum().alias("warnings"),
    )
    return counts.with_columns(pl.col("label", "eval").cast(pl.String)).sort("label", "eval")


def errors(ans: pl.DataFrame, top: int = TOP_ERRORS) -> pl.DataFrame:
    """Per (label, eval): the ``top`` most frequent (status, error) pairs of answers that are not
    ok, with ``count`` and one ``example`` task id. Error texts can quote model output: untrusted
    text."""
    bad = _strings(
        ans.filter(pl.col("status").cast(pl.String) != "ok"),
        "label",
        "eval",
        "status",
        "error",
        "task_id",
    )
    return (
        bad.group_by("label", "eval", "status", "error")
        .agg(pl.len().alias("count"), pl.col("task_id").min().alias("example"))
        .sort(
            ["label", "eval", "count", "status", "error"],
            descending=[False, False, True, False, False],
        )
        .group_by("label", "eval", maintain_order=True)
        .head(top)
    )


def warning_kinds(ans: pl.DataFrame) -> pl.DataFrame:
    """Per (label, eval) with answers scored despite a validation warning: ``warnings`` (answers
    with one), ``kinds`` (distinct warnings once numbers are ignored: "held 0.9000 of ..." and "held
    0.8120 of ..." are one kind) and ``example``: the most frequent kind, shown by its first text in
    text order. Warnings come from the adapters (a decision model's choice that is not its most
    probable option, a logprob decision renormalised over the allowed answers, unexpected keys in a
    JSON reply)."""
    warned = _strings(ans.filter(pl.col("warning").is_not_null()), "label", "eval", "warning")
    schema = {
        "label": pl.String,
        "eval": pl.String,
        "warnings": pl.UInt32,
        "kinds": pl.UInt32,
        "example": pl.String,
    }
    if warned.is_empty():
        return pl.DataFrame(schema=schema)
    shapes = (
        warned.with_columns(
            pl.col("warning").str.replace_all(r"[0-9]+(?:\.[0-9]+)?", "#").alias("shape")
        )
        .group_by("label", "eval", "shape")
        .agg(pl.len().alias("count"), pl.col("warning").min().alias("example"))
        .sort(["label", "eval", "count", "example"], descending=[False, False, True, False])
    )
    return (
        shapes.group_by("label", "eval", maintain_order=True)
        .agg(
            pl.col("count").sum().alias("warnings"),
            pl.len().alias("kinds"),
            pl.col("example").first(),
        )
        .cast({"warnings": pl.UInt32, "kinds": pl.UInt32})
        .sort("label", "eval")
    )
