"""What the cache checks when it reads: page checksums of shards, and the form of every logged row.

Shards are written with a CRC-32 of every page (``cache.layout.WRITE_OPTIONS``: the ``crc`` field of
each Parquet page header). Polars, which reads the shards, cannot verify those checksums, so before
a shard is read its pages are verified here (``Verifier``): the page headers are walked straight
from the file (a compact Thrift struct before each page) and each page's bytes checked against its
CRC with zlib, about a gigabyte a second. A shard is judged damaged only when pyarrow's own verified
read (``check``: ``page_checksum_verification``) fails too, so a quirk of this walk can never set an
intact shard aside. Each shard is verified once per ``Verifier`` (one per open cache: shards are
immutable once in place): the columns the key index reads when it loads, every column before the
first scan.

What a failed read means is ``is_damage(exc)``: only what reading damaged bytes raises — a page that
fails its checksum here, pyarrow's reader errors (``ArrowException``, and the bare ``OSError``
without an errno its Parquet reader raises for bad bytes), Polars' decoding errors
(``ComputeError``, ``InvalidOperationError``: "parquet: File out of specification", an unreadable
``ARROW:schema``) and its ``PanicException`` (a Rust panic, which derives from ``BaseException``),
and the ``UnicodeDecodeError`` pyarrow raises for a footer whose column names are not UTF-8 (a byte
flipped there: seen on an object the remote tier moved aside).
Anything else (a bug in a query, a missing column, a ``KeyError``, a file that cannot be opened:
``PermissionError``, ``FileNotFoundError``, a full memory) is not damage: it propagates unchanged
and sets nothing aside. ``except damaged()`` catches the candidate types.

``valid_rows`` checks rows read from a write-ahead log against the schema: a line can be valid JSON
and still not a row (``{}``, ``[1, 2, 3]``, a row without its key); those are dropped, never indexed
or scored.

``seal`` and ``line_problem``: every log line is written sealed, with a last field ``crc32``, the
CRC-32 of the line's JSON object without it; a line whose seal does not match is damaged. A line
without a seal (written by a version before seals, or by hand) is checked for what a seal would have
guaranteed: its ``key`` must be the content address of its request (``dxi.stored.request_key`` of
its own columns), its token counts counts (``dxi.stored.as_count``: what the adapters read usage
with), and each ``ok`` answer must name its answer and give probabilities that are probabilities
(``dxi.stored.probability``: what the decision adapters accept). A damaged line is dropped, never
indexed or scored (``cache.store``: the log is set aside in quarantine/ and the line's request sent
again).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from dxi.lazy import LazyModule
from dxi.stored import as_count, probability, request_key

from .schema import FAILED, FATAL, INVALID, OK, TRANSIENT

if TYPE_CHECKING:
    import polars as pl
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
else:  # imported when first used: opening an empty cache (a first run) does without
    pl, pc = LazyModule("polars"), LazyModule("pyarrow.compute")
    pa, pq = LazyModule("pyarrow"), LazyModule("pyarrow.parquet")
layout = LazyModule("dxi.cache.layout")  # PyArrow and NumPy: imported when a shard is first read


@cache
def damaged() -> tuple[type[BaseException], ...]:
    """The exception types reading a damaged shard may raise (``except damaged()``; then
    ``is_damage`` decides): see above."""
    return (
        _Damaged,
        pa.ArrowException,
        OSError,
        pl.exceptions.ComputeError,
        pl.exceptions.InvalidOperationError,
        pl.exceptions.PanicException,
        UnicodeDecodeError,  # a footer's names not UTF-8 (pyarrow's column_paths)
    )


def is_damage(exc: BaseException) -> bool:
    """Whether ``exc``, raised while reading a shard, says its bytes are damaged (see above): one of
    ``damaged()``, and an ``OSError`` only when it is pyarrow's bare ``OSError`` without an errno
    (its subclasses, such as ``PermissionError`` or ``FileNotFoundError``, and system errors are not
    damage)."""
    if isinstance(exc, OSError) and not isinstance(exc, pa.ArrowException):
        return type(exc) is OSError and exc.errno is None
    return isinstance(exc, damaged())


STATUSES = (OK, INVALID, FAILED)
ERROR_KINDS = (TRANSIENT, FATAL)
__all__ = [
    "Verifier",
    "check",
    "damaged",
    "is_damage",
    "line_problem",
    "page_checksums",
    "scan",
    "seal",
    "valid_rows",
]


def scan(shards: Sequence[Path]) -> pl.LazyFrame:
    """The shards (verified first: ``Verifier``) as one Polars LazyFrame in the cache's logical
    shape, whatever their layout (``cache.layout.scan``; a column an older shard lacks reads as
    nulls)."""
    return layout.scan(shards)


def check(shard: Path, columns: Sequence[str] | None = None) -> BaseException | None:
    """Read one shard whole (or ``columns`` of it) with pyarrow, page checksums verified, and with
    Polars: None when both read it, else the damage one of them found (a checksum, a panic:
    ``is_damage``). Any other error (the file cannot be opened, memory runs out) propagates. A
    column of ``columns`` the shard lacks (an older version wrote it: a remote index file written
    before the index read ``served_model``) is not read, as ``scan`` reads it as nulls."""
    try:
        if columns is not None:
            names = set(pq.read_schema(shard).names)
            columns = [c for c in columns if c in names]
        pq.read_table(
            shard,
            columns=list(columns) if columns is not None else None,
            page_checksum_verification=True,
        )
        scan([shard]).select(list(columns) if columns is not None else pl.all()).collect()
    except damaged() as exc:
        if is_damage(exc):
            return exc
        raise
    return None


class Verifier:
    """Which shards' pages were verified, and verifying the others: ``damaged(shards, columns)``."""

    def __init__(self) -> None:
        self._done: dict[Path, frozenset[str] | None] = {}  # shard -> columns verified (None: all)

    def forget(self, shard: Path) -> None:
        """``shard`` was rewritten under its name (``dxi cache compact``): its pages are verified
        again."""
        self._done.pop(shard, None)

    def damaged(
        self, shards: Sequence[Path], columns: Sequence[str] | None = None
    ) -> list[tuple[Path, BaseException]]:
        """The shards among ``shards`` whose pages of ``columns`` (None: all) fail their checksums
        (or cannot be read) and whose verified read (``check``) fails too, with the error; the rest
        are recorded as verified."""
        wanted = None if columns is None else frozenset(columns)
        out = []
        for shard in shards:
            done = self._done.get(shard, frozenset())
            if done is None or (wanted is not None and wanted <= done):
                continue
            problem = page_checksums(shard, wanted)
            if problem is not None:
                problem = check(shard, columns)  # the verified read decides
            if problem is not None:
                out.append((shard, problem))
                self._done.pop(shard, None)
            else:
                self._done[shard] = None if wanted is None else done | wanted
        return out


def page_checksums(shard: Path, columns: frozenset[str] | None = None) -> BaseException | None:
    """Verify every page of ``columns`` (top-level names; None: every column) of ``shard`` against
    its CRC-32, reading the page headers from the file: None when each page that has a checksum
    matches it (a page written without one cannot be checked), else the problem found."""
    try:
        meta = pq.read_metadata(shard)
        buf = shard.read_bytes()
        view = memoryview(buf)
        for g in range(meta.num_row_groups):
            group = meta.row_group(g)
            for c in range(group.num_columns):
                chunk = group.column(c)
                if columns is None or chunk.path_in_schema.split(".", 1)[0] in columns:
                    _check_chunk(buf, view, chunk)
    except (
        *damaged(),
        IndexError,
        RecursionError,
    ) as exc:  # a page header running past the file's end
        return exc
    return None


def _check_chunk(buf: bytes, view: memoryview, chunk: pq.ColumnChunkMetaData) -> None:
    start = (
        chunk.dictionary_page_offset
        if chunk.has_dictionary_page and chunk.dictionary_page_offset
        else chunk.data_page_offset
    )
    end = start + chunk.total_compressed_size
    if start < 4 or end > len(buf) - 8:
        raise _Damaged(f"column {chunk.path_in_schema}: its pages lie outside the file")
    pos = start
    while pos < end:
        pos, fields = _struct(buf, pos, (3, 4))  # PageHeader: 3 compressed_page_size, 4 crc
        size = fields.get(3)
        if size is None or size < 0 or pos + size > end:
            raise _Damaged(
                f"column {chunk.path_in_schema}: a page header at byte {pos} does not fit its column chunk"
            )
        crc = fields.get(4)
        if crc is not None and zlib.crc32(view[pos : pos + size]) != crc & 0xFFFFFFFF:
            raise _Damaged(
                f"column {chunk.path_in_schema}: the page at byte {pos} does not match its CRC-32 checksum"
            )
        pos += size


class _Damaged(Exception):
    """A page header that cannot be parsed, a page that runs past its column chunk, or a CRC
    mismatch."""


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        if byte < 0x80:
            return value | (byte << shift), pos
        value |= (byte & 0x7F) << shift
        shift += 7
        if shift > 63:
            raise _Damaged("a varint longer than 10 bytes")


def _skip(buf: bytes, pos: int, kind: int) -> int:
    """Skip one value of compact-protocol type ``kind`` at ``pos``; the position after it."""
    if 4 <= kind <= 6:  # i16, i32, i64: a varint
        while buf[pos] >= 0x80:
            pos += 1
        return pos + 1
    if kind == 8:  # binary: its length, then its bytes
        size, pos = _varint(buf, pos)
        return pos + size
    if kind == 12:
        return _struct(buf, pos)[0]
    if kind <= 2:  # a boolean inside a struct: its value is the type itself
        return pos
    if kind == 3:
        return pos + 1
    if kind == 7:
        return pos + 8
    if kind in (9, 10):  # list, set: size and element type, then the elements
        head = buf[pos]
        pos += 1
        size, element = head >> 4, head & 0x0F
        if size == 15:
            size, pos = _varint(buf, pos)
        if element <= 3:  # booleans and bytes: one byte each
            return pos + size
        for _ in range(size):
            pos = _skip(buf, pos, element)
        return pos
    if kind == 11:  # map: size, key and value types, then the pairs
        size, pos = _varint(buf, pos)
        if size:
            types = buf[pos]
            pos += 1
            for _ in range(size):
                pos = _skip(buf, _skip(buf, pos, types >> 4), types & 0x0F)
        return pos
    raise _Damaged(f"unknown thrift type {kind}")


def _struct(buf: bytes, pos: int, wanted: tuple[int, ...] = ()) -> tuple[int, dict[int, int]]:
    """Read one compact-protocol struct at ``pos``: (position after it, its i32 fields whose ids are
    in ``wanted``); every other field is skipped."""
    found: dict[int, int] = {}
    field_id = 0
    while True:
        head = buf[pos]
        pos += 1
        if head == 0:
            return pos, found
        kind, delta = head & 0x0F, head >> 4
        if delta:
            field_id += delta
        else:
            raw, pos = _varint(buf, pos)
            field_id = (raw >> 1) ^ -(raw & 1)
        if kind == 5 and field_id in wanted:
            raw, pos = _varint(buf, pos)
            found[field_id] = (raw >> 1) ^ -(raw & 1)
        else:
            pos = _skip(buf, pos, kind)


def valid_rows(table: pa.Table) -> tuple[pa.Table, list[int]]:
    """The rows of ``table`` (read from a log, ``SCHEMA``) that are cache rows, and the 0-based
    positions of those that are not: a row needs a ``key`` (a string of visible characters: a sha256
    in hex, as ``adapters.Request.key`` makes them, or a hand-made key in tests), a known ``status``
    (ok, invalid, failed) and, when it has one, a known ``error_kind`` (transient, fatal)."""
    key, status, kind = table["key"], table["status"], table["error_kind"]
    good = pc.and_kleene(
        pc.match_substring_regex(key, r"^\S+$"), pc.is_in(status, value_set=pa.array(STATUSES))
    )
    good = pc.and_(
        pc.fill_null(good, False),
        pc.or_(pc.is_null(kind), pc.is_in(kind, value_set=pa.array(ERROR_KINDS))),
    )
    good = pc.fill_null(good, False)
    if pc.all(good).as_py() is not False:
        return table, []
    bad = pc.indices_nonzero(pc.invert(good)).to_pylist()
    return table.filter(good), bad


SEAL = b',"crc32":'  # a log line's last field: the CRC-32 of the line's JSON object without it
TOKEN_COLUMNS = (
    "input_tokens",
    "output_tokens",
    "cached_input_tokens",
    "cache_write_tokens",
    "cache_write_1h_tokens",
)


def seal(body: bytes) -> bytes:
    """The log line of a row whose JSON object is ``body`` (no newline): the object with a last
    field ``"crc32"``, the CRC-32 of ``body``, then a newline."""
    return b"".join((body[:-1], b',"crc32":%d}\n' % zlib.crc32(body)))  # the fastest form measured


def line_problem(line: bytes) -> str | None:
    """Why the complete log line ``line`` (without its newline) is damaged, or None. A sealed line
    (``seal``) is damaged when its CRC-32 does not match; a line without a seal when it is not JSON
    (left to the parser if it is not an object: ``valid_rows``) or ``row_problem`` finds one."""
    at = line.rfind(SEAL)
    if at > 0 and line.endswith(b"}") and line[at + len(SEAL) : -1].isdigit():
        if zlib.crc32(line[:at] + b"}") == int(line[at + len(SEAL) : -1]):
            return None
        return "does not match its checksum (crc32)"
    try:
        row = orjson.loads(line)
    except orjson.JSONDecodeError:
        return "is not JSON"
    return row_problem(row) if isinstance(row, dict) else None


def row_problem(row: dict) -> str | None:
    """Why a row read without a seal is not one dxi wrote, or None: its key is not the content
    address of its request (``dxi.stored.request_key`` of its provider, model, endpoint, sample,
    prompt version, params and request body), a token count is not a count
    (``dxi.stored.as_count``), or an ``ok`` answer names no answer or gives a probability that is
    not one (``dxi.stored.probability``: NaN, outside [0, 1])."""
    if not isinstance(row.get("key"), str):
        return None  # not a row (``valid_rows`` drops it)
    try:
        key = request_key(
            row["provider"],
            row["model"],
            row["endpoint"],
            row["sample"],
            row["prompt_version"],
            row["params"],
            row["request_body"].encode(),
        )
    except (KeyError, TypeError, AttributeError, UnicodeEncodeError):
        key = None
    if row["key"] != key:
        return "has a key that is not the content address of its request"
    for name in TOKEN_COLUMNS:
        value = row.get(name)
        if value is not None and as_count(value) is None:
            return f"has {name} {value!r}, not a token count"
    for answer in row.get("answers") or ():
        if not isinstance(answer, dict):
            return "has an answer that is not one"
        if answer.get("status") != OK:
            continue
        qid = answer.get("question_id")
        predicted = answer.get("predicted")
        if not isinstance(predicted, str) or not predicted:
            return f"has an ok answer to {qid!r} with no predicted answer"
        values = [answer.get("p_predicted"), answer.get("p_yes")]
        values += [
            p.get("p") if isinstance(p, dict) else p for p in answer.get("probabilities") or ()
        ]
        bad = next((v for v in values if v is not None and probability(v) is None), None)
        if bad is not None:
            return f"has an ok answer to {qid!r} with probability {bad!r}, not in [0, 1]"
    return None
