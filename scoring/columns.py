"""Column helpers that keep Polars on its fast paths over the many chunks a cache scan returns (one or
more per shard)."""
from __future__ import annotations

import polars as pl


def explode(lists: pl.Series) -> pl.Series:
    """The elements of a list column in order; null and empty lists give none (``explode`` with
    ``empty_as_null=False, keep_nulls=False``). Chunk by chunk: exploding a column of many chunks at
    once copies it first (measured: ~0.1 s for a million answers, against ~0.01 s chunk by chunk)."""
    chunks = lists.get_chunks()
    if len(chunks) <= 1:
        return lists.explode(empty_as_null=False, keep_nulls=False)
    return pl.concat([c.explode(empty_as_null=False, keep_nulls=False) for c in chunks], rechunk=False)
