"""Column helpers: Polars on its fast paths over the many chunks a cache scan returns (one or more per
shard), and the canonical order in which answers are summed."""
from __future__ import annotations

import numpy as np
import polars as pl


def explode(lists: pl.Series) -> pl.Series:
    """The elements of a list column in order; null and empty lists give none (``explode`` with
    ``empty_as_null=False, keep_nulls=False``). Chunk by chunk: exploding a column of many chunks at
    once copies it first (measured: ~0.1 s for a million answers, against ~0.01 s chunk by chunk)."""
    chunks = lists.get_chunks()
    if len(chunks) <= 1:
        return lists.explode(empty_as_null=False, keep_nulls=False)
    return pl.concat([c.explode(empty_as_null=False, keep_nulls=False) for c in chunks], rechunk=False)


def canonical_order(key: np.ndarray) -> np.ndarray:
    """The stable ascending order of non-negative integer ``key`` (a radix sort when it fits 16 bits)."""
    if len(key) and 0 <= key.min() and key.max() < 1 << 16:
        return np.argsort(key.astype(np.uint16), kind="stable")
    return np.argsort(key, kind="stable")
