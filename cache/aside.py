"""What the cache set aside as damaged, as far as it can be told: the requests of the shards in
``quarantine/`` (and, for a read-only reader, of the shards it skipped in place), so that what
reports a missing answer (``dxi score``'s reasons, ``dxi estimate``'s "new because") can say it was
set aside rather than never sent.

A shard is set aside because some of its pages fail their checksums; the columns that name its rows'
requests (``IDENTITY``) are usually whole. They are read only when their own pages pass their
checksums (``verify.page_checksums``) and the read succeeds: a shard whose identity columns (or
footer) are damaged too is counted in ``unread``, its requests not told. Nothing read here is ever
scored. A damaged log's unreadable lines name no request that can be trusted (its readable rows are
in the cache), so logs are not read. The remote tier's quarantine (``cache.remote``: objects moved
to its ``quarantine/``) is read the same way, from copies ``Remote.set_aside`` downloads once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dxi.lazy import LazyModule

from . import verify

if TYPE_CHECKING:
    import polars as pl
else:
    pl = LazyModule("polars")

# what names a row's request: its key (``dxi estimate``) and what scoring matches a task by
IDENTITY = (
    "key",
    "provider",
    "model",
    "endpoint",
    "params",
    "prompt_version",
    "eval",
    "task_id",
    "task_digest",
    "sample",
    "created_at",
    "status",
    "error_kind",
    "served_model",
)


@dataclass(frozen=True)
class SetAside:
    """The shards set aside as damaged: ``rows`` (the ``IDENTITY`` columns of each row whose
    identity could be read), ``shards`` (how many were set aside), ``unread`` (of them, those whose
    identity columns are damaged too: their requests cannot be told) and ``where`` (what the cache
    did with them, for a message: "moved them to DIR/quarantine/")."""

    rows: pl.DataFrame
    shards: int
    unread: int
    where: str

    @property
    def keys(self) -> frozenset[str]:
        """The request keys of ``rows``."""
        return frozenset(self.rows["key"].drop_nulls().to_list())


def quarantined(root: Path) -> list[Path]:
    """The shards moved to ``root``'s ``quarantine/`` (``Cache._quarantine``:
    ``<name>.parquet.<id>``), in name order."""
    return sorted(p for p in (root / "quarantine").glob("*.parquet.*") if p.is_file())


def read(shards: Sequence[Path], where: str) -> SetAside:
    """The ``SetAside`` of ``shards`` (damaged shards, wherever they are)."""
    frames, unread = [], 0
    for shard in shards:
        try:
            problem = verify.page_checksums(shard, frozenset(IDENTITY))
            if problem is None:
                frames.append(verify.scan([shard]).select(IDENTITY).collect())
        except verify.damaged() as exc:  # the footer too, or a read that fails
            if not verify.is_damage(exc):
                raise
            problem = exc
        unread += problem is not None
    rows = (
        pl.concat(frames, how="vertical")
        if frames
        else verify.layout.empty().select(IDENTITY).collect()
    )
    return SetAside(rows, len(shards), unread, where)
