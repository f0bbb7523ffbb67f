"""The cache's key index: what the newest row of each request says, for millions of keys in ~9 bytes
each.

A key is the sha256 (hex) of a request; the index keeps only its first 64 bits (``prefix``), in a
sorted NumPy ``uint64`` array beside a ``uint8`` array of status codes, plus a small dict of the
rows appended since the last merge (merged in batches of ``MERGE_AT``). A million keys take ~9 MB
and load from the shards' index columns in a fraction of a second; a Python dict of the hex strings
would take ~150 MB.

Two different requests share a prefix with probability ~n²/2⁶⁵ (3·10⁻⁸ for a million keys): then the
second would be taken as cached. Keys that are not 64 hex digits (hand-made ones in tests) are
hashed to 64 bits with BLAKE2b instead.

NumPy is imported when the index first holds sorted arrays (loaded from rows on disk, or
``MERGE_AT`` rows appended): an index built empty (a first run's fresh cache) is the dict alone, and
the run's start-up does without NumPy's import (issue 14).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

from dxi.lazy import LazyModule
from dxi.served import served_by_other_expr

from .schema import FAILED, FATAL, INVALID, OK

if TYPE_CHECKING:
    import numpy as np
    import polars as pl
else:
    pl = LazyModule("polars")  # imported when an index is built from rows on disk
    np = LazyModule("numpy")  # imported when the index first holds arrays

# status codes: the class of a key's newest row
ABSENT, CODE_OK, CODE_INVALID, CODE_FATAL, CODE_TRANSIENT, CODE_SET_ASIDE = 0, 1, 2, 3, 4, 5
SET_ASIDE = "set aside"  # another model's reply (``dxi.served``): not the model's answer
NAMES = {
    CODE_OK: OK,
    CODE_INVALID: INVALID,
    CODE_FATAL: FATAL,
    CODE_TRANSIENT: "transient",
    CODE_SET_ASIDE: SET_ASIDE,
}
MERGE_AT = 65_536

# Which row of a request counts (SPEC §4: "the newest final row wins"), the one rule that the key
# index, scoring, export, the view and rescoring all follow (``newest``): a request's rows are
# ordered by their RANK, then ``created_at``, then their order in the cache (shards in name order,
# then the logs; within a file, the order written), and the last wins. RANK: a transient failure (0)
# is not final (the request is sent again), so it never outranks a final row (1: an ok or invalid
# reply, or a deterministic failure). ``created_at`` (wall-clock seconds) only orders rows of one
# rank: a clock that was ahead when a transient failure was written (a restored VM snapshot, an NTP
# step, machines with skewed clocks sharing a remote cache) can no longer make it beat every later
# successful retry (issue 32: a request paid for and reported failed on every run). Between two
# final rows of one request (sent again only by ``--retry-invalid`` / ``--retry-failed``, or by two
# processes at once) the newer wins, by the clock. A reply another model gave (``dxi.served``:
# rows an older dxi stored before ``check_served`` refused them) is set aside (0): not final, its
# request is sent again and the reply that comes back wins; the row itself stays in the cache.
RANK = (-1, 1, 1, 1, 0, 0)  # by status code: ABSENT, OK, INVALID, FATAL, TRANSIENT, SET_ASIDE


def prefix(key: str) -> int:
    """The first 64 bits of a sha256 hex key, as an unsigned integer (any other string: its
    BLAKE2b-64)."""
    if len(key) == 64:
        try:
            return int(key[:16], 16)
        except ValueError:
            pass
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")


def prefixes(keys: Sequence[str] | pl.Series) -> np.ndarray:
    """``prefix`` of each key (hex keys vectorised, any other string hashed one by one), as a uint64
    array."""
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


def code_of(status: str, error_kind: str | None, set_aside: bool = False) -> int:
    """The status code of a row: set aside (another model's reply: ``dxi.served.served_by_other``),
    ok, invalid, or a failed row's fatal / transient."""
    if set_aside:
        return CODE_SET_ASIDE
    if status == OK:
        return CODE_OK
    if status == INVALID:
        return CODE_INVALID
    return CODE_FATAL if status == FAILED and error_kind == FATAL else CODE_TRANSIENT


def rank_expr() -> pl.Expr:
    """``RANK`` of each row from its ``status`` and ``error_kind`` columns, and those
    ``served_by_other_expr`` reads (Int8), named ``rank``."""
    status = pl.col("status")
    return (
        pl.when(
            (status.is_in([OK, INVALID]) | ((status == FAILED) & (pl.col("error_kind") == FATAL)))
            & ~served_by_other_expr()
        )
        .then(1)
        .otherwise(0)
        .cast(pl.Int8)
        .alias("rank")
    )


def newest(
    request: np.ndarray, rank: np.ndarray, created: np.ndarray, in_cache_order: bool = True
) -> np.ndarray:
    """The row that counts for each request (see ``RANK``): of rows numbered 0..n-1 in cache order,
    with their ``request`` (integers), ``rank`` (``RANK``) and ``created`` (Unix seconds, NaN for
    none), the numbers of the winning rows, one per distinct request: in ascending order, or with
    ``in_cache_order`` False in the order of their requests. Times are compared to the microsecond
    (rows written within one microsecond of each other go by cache order). One sort by request
    (Polars, every core), then the rows of the requests that have several (usually few) by rank,
    time and row: as fast as the sort by (request, time) this rule replaced."""
    if len(request) == 0:
        return np.empty(0, np.int64)
    by_request = pl.DataFrame({"request": request}).with_row_index("row").sort("request")
    requests, rows = by_request["request"].to_numpy(), by_request["row"].to_numpy().astype(np.int64)
    same = requests[1:] == requests[:-1]
    last = np.r_[~same, True]  # the last row of each request's run
    if (
        same.any()
    ):  # requests with several rows (usually few): only theirs are ordered by rank and time
        several = np.r_[same, False] | np.r_[False, same]
        mine = rows[several]
        micros = np.clip(
            np.nan_to_num(np.asarray(created, np.float64)[mine] * 1e6, nan=0.0), 0, 2.0**55
        )
        order = np.asarray(rank, np.int64)[mine] * (1 << 56) + micros.astype(np.int64)
        ties = pl.DataFrame({"request": requests[several], "order": order, "row": mine}).sort(
            ["request", "order", "row"]
        )
        tied = ties["request"].to_numpy()
        rows[last & several] = ties["row"].to_numpy()[np.r_[tied[1:] != tied[:-1], True]]
    won = rows[last]
    return np.sort(won) if in_cache_order else won


def _prefix_expr() -> pl.Expr:
    key = pl.col("key")
    return (
        pl.when(key.str.len_bytes() == 64)
        .then(key.str.slice(0, 16).str.to_integer(base=16, dtype=pl.UInt64, strict=False))
        .alias("prefix")
    )


def _code_expr() -> pl.Expr:
    status = pl.col("status")
    return (
        pl.when(served_by_other_expr())
        .then(CODE_SET_ASIDE)
        .when(status == OK)
        .then(CODE_OK)
        .when(status == INVALID)
        .then(CODE_INVALID)
        .when((status == FAILED) & (pl.col("error_kind") == FATAL))
        .then(CODE_FATAL)
        .otherwise(CODE_TRANSIENT)
        .cast(pl.UInt8)
        .alias("code")
    )


def index_columns(rows: pl.LazyFrame) -> pl.LazyFrame:
    """Rows with ``INDEX_COLUMNS`` (the key, status, error kind and time of each, and the provider,
    model and served model ``dxi.served`` reads) -> ``prefix (UInt64), code (UInt8), created_at``:
    the small form the index is built from (the hex strings are dropped as early as possible). Rows
    that are not cache rows (no key, an unknown status: ``cache.verify.valid_rows``) are left
    out."""
    odd = (
        pl.when(_prefix_expr().is_null()).then(pl.col("key")).alias("key")
    )  # kept only where not hex
    row = (pl.col("key").str.len_bytes() > 0) & pl.col("status").is_in([OK, INVALID, FAILED])
    return rows.filter(row.fill_null(False)).select(
        _prefix_expr(), _code_expr(), pl.col("created_at").cast(pl.Float64), odd
    )


class KeyIndex:
    """Status code per key (``ABSENT`` when unknown). ``get`` / ``get_many`` look up, ``set``
    records an appended row (the newest for its key), ``from_frames`` builds the index from rows on
    disk."""

    def __init__(self) -> None:
        self._keys: np.ndarray | None = (
            None  # sorted uint64 prefixes (None: none yet, NumPy not needed)
        )
        self._codes: np.ndarray | None = None  # uint8 codes beside them
        self._recent: dict[int, int] = {}

    @classmethod
    def from_frames(cls, frames: Sequence[pl.LazyFrame]) -> KeyIndex:
        """Build from frames of ``index_columns`` form, in cache order; where a key has several rows
        the one ``newest`` picks wins (its rank, then ``created_at``, then the cache order)."""
        index = cls()
        if not frames:
            return index
        small = pl.concat(list(frames), how="vertical_relaxed").collect()
        if small.height == 0:
            return index
        odd = small["prefix"].is_null()
        if (
            odd.any()
        ):  # keys that are not sha256 hex: hash them (hand-made keys; a few rows), in place
            small = small.with_columns(
                pl.when(odd)
                .then(pl.col("key").map_elements(prefix, return_dtype=pl.UInt64))
                .otherwise(pl.col("prefix"))
                .alias("prefix")
            )
        keys = (
            small["prefix"].cast(pl.UInt64).to_numpy().astype(np.uint64, copy=False)
        )  # never a float array
        codes = small["code"].to_numpy()
        won = newest(
            keys,
            np.asarray(RANK, np.int8)[codes],
            small["created_at"].to_numpy(),
            in_cache_order=False,
        )
        index._keys = np.ascontiguousarray(keys[won])  # sorted: in the order of their prefixes
        index._codes = np.ascontiguousarray(codes[won])
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
        """Codes of ``keys`` in the same order, as a list (``get_many``; without arrays yet, the
        dict alone)."""
        if self._keys is None:
            recent = self._recent
            return [recent.get(prefix(k), ABSENT) for k in keys]
        return self.get_many(keys).tolist()

    def get_many(self, keys: Sequence[str]) -> np.ndarray:
        """Codes of ``keys``, as a uint8 array in the same order."""
        ps = np.fromiter((prefix(k) for k in keys), np.uint64, len(keys))
        out = self._lookup(ps)
        if self._recent:
            recent = self._recent
            for n, p in enumerate(ps.tolist()):
                code = recent.get(p)
                if code is not None:
                    out[n] = code
        return out

    def set(self, key: str, code: int) -> None:
        """Record a row appended now (the last in cache order) of status ``code``: it wins unless
        the key's row so far outranks it (``RANK``: a transient failure never replaces a final
        row)."""
        p = prefix(key)
        if RANK[code] == 0:  # a final row wins over any row: nothing to look up (the usual row)
            old = self._recent.get(p)
            if old is None:
                old = (
                    int(self._lookup(np.array([p], np.uint64))[0])
                    if self._keys is not None
                    else ABSENT
                )
            if RANK[old] > RANK[code]:
                return
        self._recent[p] = code
        if len(self._recent) >= MERGE_AT:
            self._merge()

    def _lookup(self, ps: np.ndarray) -> np.ndarray:
        """Codes of the sorted arrays (not ``_recent``) for prefixes ``ps`` (uint64), ABSENT where
        none."""
        out = np.zeros(len(ps), np.uint8)
        if self._keys is not None and len(self._keys):
            i = self._keys.searchsorted(ps)
            np.minimum(i, len(self._keys) - 1, out=i)
            found = self._keys[i] == ps
            out[found] = self._codes[i[found]]
        return out

    def update(self, newer: KeyIndex) -> bool:
        """Fold in ``newer``, an index of rows read after this one's (``Cache.refresh``: what other
        processes appended since), as if its rows came after this one's in cache order: per key the
        higher ``RANK`` wins, and on equal rank ``newer``'s row. False (nothing changed) when that
        cannot be decided without the rows' ``created_at``, which the index does not keep: a key
        with final rows of different kinds on the two sides (an ok or invalid reply, a deterministic
        failure: ``--retry-invalid`` / ``--retry-failed`` cases); the caller then reads the index
        whole."""
        newer._merge()
        if newer._keys is None or not len(newer._keys):
            return True
        self._merge()
        ps, codes = newer._keys, newer._codes
        old = self._lookup(ps)
        rank = np.asarray(RANK, np.int8)
        new_rank, old_rank = rank[codes], rank[old]
        if ((new_rank == old_rank) & (codes != old) & (old != ABSENT)).any():
            return False
        wins = new_rank >= old_rank
        self._recent = dict(zip(ps[wins].tolist(), codes[wins].tolist(), strict=True))
        self._merge()
        return True

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
