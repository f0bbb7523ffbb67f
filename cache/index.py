"""The cache's key index: what the newest row of each request says, for millions of keys in ~9 bytes each.

A key is the sha256 (hex) of a request; the index keeps only its first 64 bits (``prefix``), in a sorted
NumPy ``uint64`` array beside a ``uint8`` array of status codes, plus a small dict of the rows appended
since the last merge (merged in batches of ``MERGE_AT``). A million keys take ~9 MB and load from the
shards' index columns in a fraction of a second; a Python dict of the hex strings would take ~150 MB.

Two different requests share a prefix with probability ~n²/2⁶⁵ (3·10⁻⁸ for a million keys): then the
second would be taken as cached. Keys that are not 64 hex digits (hand-made ones in tests) are hashed
to 64 bits with BLAKE2b instead.

NumPy is imported when the index first holds sorted arrays (loaded from rows on disk, or ``MERGE_AT``
rows appended): an index built empty (a first run's fresh cache) is the dict alone, and the run's start-up
does without NumPy's import (issue 14).
"""
from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

from dxi.lazy import LazyModule

from .schema import FAILED, FATAL, INVALID, OK

if TYPE_CHECKING:
    import numpy as np
    import polars as pl
else:
    pl = LazyModule("polars")  # imported when an index is built from rows on disk
    np = LazyModule("numpy")  # imported when the index first holds arrays

# status codes: the class of a key's newest row
ABSENT, CODE_OK, CODE_INVALID, CODE_FATAL, CODE_TRANSIENT = 0, 1, 2, 3, 4
NAMES = {CODE_OK: OK, CODE_INVALID: INVALID, CODE_FATAL: FATAL, CODE_TRANSIENT: "transient"}
MERGE_AT = 65_536


def prefix(key: str) -> int:
    """The first 64 bits of a sha256 hex key, as an unsigned integer (any other string: its BLAKE2b-64)."""
    if len(key) == 64:
        try:
            return int(key[:16], 16)
        except ValueError:
            pass
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")


def prefixes(keys: Sequence[str] | pl.Series) -> np.ndarray:
    """``prefix`` of each key (hex keys vectorised, any other string hashed one by one), as a uint64 array."""
    column = keys if isinstance(keys, pl.Series) else pl.Series("key", keys, dtype=pl.String)
    frame = pl.DataFrame({"key": column}).select(_prefix_expr(), pl.col("key"))
    out = frame["prefix"]
    if out.null_count():
        odd = out.is_null()
        fixed = np.fromiter((prefix(k) for k in frame.filter(odd)["key"]), np.uint64)
        values = out.fill_null(0).to_numpy().astype(np.uint64, copy=True)
        values[odd.to_numpy()] = fixed
        return values
    return out.to_numpy().astype(np.uint64, copy=False)


def code_of(status: str, error_kind: str | None) -> int:
    """The status code of a row: ok, invalid, or a failed row's fatal / transient."""
    if status == OK:
        return CODE_OK
    if status == INVALID:
        return CODE_INVALID
    return CODE_FATAL if status == FAILED and error_kind == FATAL else CODE_TRANSIENT


def _prefix_expr() -> pl.Expr:
    key = pl.col("key")
    return (pl.when(key.str.len_bytes() == 64)
            .then(key.str.slice(0, 16).str.to_integer(base=16, dtype=pl.UInt64, strict=False))
            .alias("prefix"))


def _code_expr() -> pl.Expr:
    status = pl.col("status")
    return (pl.when(status == OK).then(CODE_OK).when(status == INVALID).then(CODE_INVALID)
            .when((status == FAILED) & (pl.col("error_kind") == FATAL)).then(CODE_FATAL)
            .otherwise(CODE_TRANSIENT).cast(pl.UInt8).alias("code"))


def index_columns(rows: pl.LazyFrame) -> pl.LazyFrame:
    """Rows with ``key, status, error_kind, created_at`` -> ``prefix (UInt64), code (UInt8), created_at``:
    the small form the index is built from (the hex strings are dropped as early as possible). Rows that
    are not cache rows (no key, an unknown status: ``cache.verify.valid_rows``) are left out."""
    odd = pl.when(_prefix_expr().is_null()).then(pl.col("key")).alias("key")  # kept only where not hex
    row = (pl.col("key").str.len_bytes() > 0) & pl.col("status").is_in([OK, INVALID, FAILED])
    return rows.filter(row.fill_null(False)).select(_prefix_expr(), _code_expr(),
                                                    pl.col("created_at").cast(pl.Float64), odd)


class KeyIndex:
    """Status code per key (``ABSENT`` when unknown). ``get`` / ``get_many`` look up, ``set`` records an
    appended row (the newest for its key), ``from_frames`` builds the index from rows on disk."""

    def __init__(self) -> None:
        self._keys: np.ndarray | None = None  # sorted uint64 prefixes (None: none yet, NumPy not needed)
        self._codes: np.ndarray | None = None  # uint8 codes beside them
        self._recent: dict[int, int] = {}

    @classmethod
    def from_frames(cls, frames: Sequence[pl.LazyFrame]) -> KeyIndex:
        """Build from frames of ``index_columns`` form; where a key has several rows the newest
        ``created_at`` wins."""
        index = cls()
        if not frames:
            return index
        small = pl.concat(list(frames), how="vertical_relaxed").collect()
        if small.height == 0:
            return index
        odd = small["prefix"].is_null()
        if odd.any():  # keys that are not sha256 hex: hash them (hand-made keys; a few rows)
            fixed = small.filter(odd).with_columns(pl.col("key").map_elements(prefix, return_dtype=pl.UInt64)
                                                   .alias("prefix"))
            small = pl.concat([small.filter(~odd), fixed])
        small = small.select("prefix", "code", "created_at").sort(["prefix", "created_at"])
        keys = small["prefix"].cast(pl.UInt64).to_numpy().astype(np.uint64, copy=False)  # never a float array
        codes = small["code"].to_numpy()
        last = np.ones(len(keys), bool)
        last[:-1] = keys[1:] != keys[:-1]
        index._keys = np.ascontiguousarray(keys[last])
        index._codes = np.ascontiguousarray(codes[last])
        return index

    def __len__(self) -> int:
        self._merge()
        return 0 if self._keys is None else len(self._keys)

    def get(self, key: str) -> int:
        p = prefix(key)
        code = self._recent.get(p)
        if code is not None:
            return code
        keys = self._keys
        if keys is None or not len(keys):
            return ABSENT
        i = keys.searchsorted(p)
        return int(self._codes[i]) if i < len(keys) and keys[i] == p else ABSENT

    def codes(self, keys: Sequence[str]) -> list[int]:
        """Codes of ``keys`` in the same order, as a list (``get_many``; without arrays yet, the dict alone)."""
        if self._keys is None:
            recent = self._recent
            return [recent.get(prefix(k), ABSENT) for k in keys]
        return self.get_many(keys).tolist()

    def get_many(self, keys: Sequence[str]) -> np.ndarray:
        """Codes of ``keys``, as a uint8 array in the same order."""
        ps = np.fromiter((prefix(k) for k in keys), np.uint64, len(keys))
        out = np.zeros(len(ps), np.uint8)
        if self._keys is not None and len(self._keys):
            i = self._keys.searchsorted(ps)
            np.minimum(i, len(self._keys) - 1, out=i)
            found = self._keys[i] == ps
            out[found] = self._codes[i[found]]
        if self._recent:
            recent = self._recent
            for n, p in enumerate(ps.tolist()):
                code = recent.get(p)
                if code is not None:
                    out[n] = code
        return out

    def set(self, key: str, code: int) -> None:
        self._recent[prefix(key)] = code
        if len(self._recent) >= MERGE_AT:
            self._merge()

    def _merge(self) -> None:
        if not self._recent:
            return
        new_keys = np.fromiter(self._recent.keys(), np.uint64, len(self._recent))
        new_codes = np.fromiter(self._recent.values(), np.uint8, len(self._recent))
        self._recent = {}
        if self._keys is None:
            self._keys, self._codes = np.empty(0, np.uint64), np.empty(0, np.uint8)
        order = np.argsort(new_keys)
        new_keys, new_codes = new_keys[order], new_codes[order]
        pos = self._keys.searchsorted(new_keys)
        found = np.zeros(len(new_keys), bool)
        if len(self._keys):
            at = np.minimum(pos, len(self._keys) - 1)
            found = self._keys[at] == new_keys
            self._codes[at[found]] = new_codes[found]
        self._keys = np.insert(self._keys, pos[~found], new_keys[~found])
        self._codes = np.insert(self._codes, pos[~found], new_codes[~found])
