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
    import pyarrow as pa
else:  # imported when the index first holds arrays (built from rows on disk, or merged)
    np, pa = LazyModule("numpy"), LazyModule("pyarrow")

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


def code_of(status: str, error_kind: str | None) -> int:
    """The status code of a row: ok, invalid, or a failed row's fatal / transient."""
    if status == OK:
        return CODE_OK
    if status == INVALID:
        return CODE_INVALID
    return CODE_FATAL if status == FAILED and error_kind == FATAL else CODE_TRANSIENT


class _HexTable:
    """Byte -> its hex digit's value (0-15), 255 for a byte that is not a hex digit (built on first use)."""

    def take(self, data: np.ndarray) -> np.ndarray:
        table = getattr(self, "_table", None)
        if table is None:
            table = np.full(256, 255, np.uint8)
            for i, c in enumerate(b"0123456789abcdef"):
                table[c] = i
            for i, c in enumerate(b"ABCDEF", 10):
                table[c] = i
            self._table = table
        return table.take(data)


_HEX = _HexTable()


def _prefixes(keys: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """The ``prefix`` of each key of a string array, vectorised: (uint64 prefixes, bool mask of the keys that
    are 64 bytes starting with 16 hex digits). The other keys' prefixes are left 0 for the caller to hash
    (``prefix``)."""
    n = len(keys)
    large = pa.types.is_large_string(keys.type)
    _, offsets_buf, data_buf = keys.buffers()
    offsets = np.frombuffer(offsets_buf, np.int64 if large else np.int32)[keys.offset:keys.offset + n + 1]
    data = np.frombuffer(data_buf, np.uint8) if data_buf is not None else np.empty(0, np.uint8)
    is64 = (offsets[1:] - offsets[:-1]) == 64
    if n and offsets[-1] - offsets[0] == 64 * n and is64.all():  # the usual case: every key a sha256 in hex
        chosen = None
        heads = data[offsets[0]:offsets[-1]].reshape(n, 64)[:, :16]
    else:
        chosen = np.flatnonzero(is64)
        heads = data[offsets[:-1][chosen].astype(np.int64)[:, None] + np.arange(16)]
    nibbles = np.ascontiguousarray(_HEX.take(heads))  # (rows, 16) digit values, 255 where not a hex digit
    bad = (nibbles == 255).any(axis=1) if (nibbles == 255).any() else None
    # 16 digit values -> one big-endian 64-bit number: pack pairs of digits into bytes, then read 8 bytes
    packed = (nibbles[:, 0::2] << 4) | nibbles[:, 1::2]
    values = np.ascontiguousarray(packed).view(">u8").ravel().astype(np.uint64)
    out, mask = np.zeros(n, np.uint64), np.zeros(n, bool)
    if chosen is None:
        chosen = slice(None)
    if bad is not None:
        values[bad] = 0
        chosen = np.flatnonzero(is64)[~bad] if not isinstance(chosen, slice) else np.flatnonzero(~bad)
        values = values[~bad]
    out[chosen] = values
    mask[chosen] = True
    return out, mask


def _valid(array: pa.Array) -> np.ndarray:
    """Which entries of ``array`` are not null, from its validity bitmap (bool array)."""
    bitmap = array.buffers()[0]
    if bitmap is None or array.null_count == 0:
        return np.ones(len(array), bool)
    bits = np.unpackbits(np.frombuffer(bitmap, np.uint8), bitorder="little")
    return bits[array.offset:array.offset + len(array)].astype(bool)


def _strings(column: pa.ChunkedArray) -> tuple[np.ndarray, list[str | None]]:
    """A string column as (codes int32, values): ``values[codes[i]]`` is row i's value (None for a null).
    Dictionary-encoded chunks (the shards' ``status`` and ``error_kind``, read with ``read_dictionary``) are
    taken as they are; plain ones (a log's, a few thousand rows) value by value."""
    codes, values, seen = [], [None], {None: 0}
    for chunk in column.chunks:
        if pa.types.is_dictionary(chunk.type):
            local = [seen.setdefault(v, len(seen)) for v in chunk.dictionary.to_pylist()]
            indices = np.frombuffer(chunk.indices.buffers()[1], np.int32 if chunk.indices.type == pa.int32()
                                    else chunk.indices.type.to_pandas_dtype())[chunk.offset:chunk.offset + len(chunk)]
            mapped = np.asarray(local, np.int32)[indices] if local else np.zeros(len(chunk), np.int32)
            mapped[~_valid(chunk)] = 0
            codes.append(mapped)
        else:
            codes.append(np.fromiter((seen.setdefault(v, len(seen)) for v in chunk.to_pylist()), np.int32, len(chunk)))
    values = list(seen)
    return (np.concatenate(codes) if codes else np.empty(0, np.int32)), values


def index_rows(table: pa.Table) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows with ``key, status, error_kind, created_at`` (a log's or a shard's index columns, PyArrow) ->
    ``(prefix uint64, code uint8, created_at float64)`` arrays, one entry per cache row: the small form the
    index is built from. Rows that are not cache rows (no key, an unknown status:
    ``cache.verify.valid_rows``) are left out; a null ``created_at`` counts as the oldest. NumPy over the
    Arrow buffers (no ``pyarrow.compute``, whose import alone is ~40 ms)."""
    n = table.num_rows
    if n == 0:
        return np.empty(0, np.uint64), np.empty(0, np.uint8), np.empty(0, np.float64)
    key = table["key"].combine_chunks()
    if pa.types.is_dictionary(key.type):
        key = key.dictionary.take(key.indices)
    status, statuses = _strings(table["status"])
    if "error_kind" in table.column_names:
        kind, kinds = _strings(table["error_kind"])
    else:
        kind, kinds = np.zeros(n, np.int32), [None]
    pair_codes = np.array([[code_of(st, k) if st in (OK, INVALID, FAILED) else 255 for k in kinds] for st in statuses],
                          np.uint8)
    codes = pair_codes[status, kind]
    prefixes, hexed = _prefixes(key)
    lengths = np.diff(np.frombuffer(key.buffers()[1], np.int64 if pa.types.is_large_string(key.type) else np.int32)
                      [key.offset:key.offset + n + 1])
    row = (codes != 255) & _valid(key) & (lengths > 0)
    odd = np.flatnonzero(row & ~hexed)
    if len(odd):  # keys that are not sha256 hex: hashed one by one (hand-made keys; a few rows)
        prefixes[odd] = np.fromiter((prefix(key[int(i)].as_py()) for i in odd), np.uint64, len(odd))
    if "created_at" in table.column_names:
        at = table["created_at"].combine_chunks()
        if at.type != pa.float64():
            at = at.cast(pa.float64())
        created = np.frombuffer(at.buffers()[1], np.float64)[at.offset:at.offset + n].copy()
        created[~_valid(at)] = -np.inf
    else:
        created = np.full(n, -np.inf)
    if row.all():
        return prefixes, codes, created
    return prefixes[row], codes[row], created[row]


class KeyIndex:
    """Status code per key (``ABSENT`` when unknown). ``get`` / ``get_many`` / ``codes`` look up, ``set``
    records an appended row (the newest for its key), ``from_rows`` builds the index from rows on disk."""

    def __init__(self) -> None:
        self._keys: np.ndarray | None = None  # sorted uint64 prefixes (None: none yet, NumPy not needed)
        self._codes: np.ndarray | None = None  # uint8 codes beside them
        self._recent: dict[int, int] = {}

    @classmethod
    def from_rows(cls, parts: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> KeyIndex:
        """Build from ``index_rows`` of each log and shard; where a key has several rows the newest
        ``created_at`` wins (of rows with equal times, the last in the order of ``parts``)."""
        index = cls()
        parts = [p for p in parts if len(p[0])]
        if not parts:
            return index
        keys = np.concatenate([p[0] for p in parts])
        codes = np.concatenate([p[1] for p in parts])
        order = np.argsort(keys)  # one sort of the prefixes; only keys met more than once are sorted by time
        keys, codes = keys[order], codes[order]
        same = keys[1:] == keys[:-1]
        if same.any():
            created = np.concatenate([p[2] for p in parts])[order]
            repeated = np.zeros(len(keys), bool)
            repeated[1:] |= same
            repeated[:-1] |= same
            rows = np.flatnonzero(repeated)
            # each repeated key's rows, oldest first (equal times: in the order the parts hold them)
            rows = rows[np.lexsort((order[rows], created[rows], keys[rows]))]
            last = np.ones(len(rows), bool)
            last[:-1] = keys[rows][1:] != keys[rows][:-1]
            keep = ~repeated
            keep[rows[last]] = True  # the newest row of each repeated key
            keys, codes = keys[keep], codes[keep]
        index._keys = np.ascontiguousarray(keys)
        index._codes = np.ascontiguousarray(codes)
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
