"""What the cache checks when it reads: page checksums of shards, and the form of every logged row.

Shards are written with a CRC-32 of every page (``WRITE_OPTIONS``: Parquet's ``crc`` field of the page
header) and read only through ``dataset`` / ``scan`` / ``read``, which verify those checksums as the pages
are decoded (pyarrow's ``page_checksum_verification``; Polars' own Parquet reader cannot verify them, so
Polars reads shards through the pyarrow dataset). A flipped byte inside a page therefore fails the read
instead of changing an answer. What a failed read means is ``DAMAGED``: any ``Exception`` (pyarrow and
Polars raise several types for a damaged file) and Polars' ``PanicException`` (a Rust panic, which
derives from ``BaseException``), never ``KeyboardInterrupt`` or ``SystemExit``.

``valid_rows`` checks rows read from a write-ahead log against the schema: a line can be valid JSON and
still not a row (``{}``, ``[1, 2, 3]``, a row without its key); those are dropped, never indexed or scored.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from .schema import FAILED, FATAL, INVALID, OK, SCHEMA, TRANSIENT

DAMAGED: tuple[type[BaseException], ...] = (Exception, pl.exceptions.PanicException)
WRITE_OPTIONS = {"compression": "zstd", "write_page_checksum": True}
_FORMAT = ds.ParquetFileFormat(
    default_fragment_scan_options=ds.ParquetFragmentScanOptions(page_checksum_verification=True))
STATUSES = (OK, INVALID, FAILED)
ERROR_KINDS = (TRANSIENT, FATAL)


def dataset(shards: Sequence[Path]) -> ds.Dataset:
    """The shards as one pyarrow dataset with the cache's full schema (a column an older shard lacks
    reads as nulls), every page's checksum verified as it is read."""
    return ds.dataset([str(s) for s in shards], schema=SCHEMA, format=_FORMAT)


def scan(shards: Sequence[Path]) -> pl.LazyFrame:
    """The shards as a Polars LazyFrame (columns and filters pushed down to the verified reader)."""
    return pl.scan_pyarrow_dataset(dataset(shards))


def read(shards: Sequence[Path], columns: Sequence[str]) -> pa.Table:
    """``columns`` of every shard, checksums verified. Raises one of ``DAMAGED`` for a damaged shard."""
    return dataset(shards).to_table(columns=list(columns))


def check(shard: Path, columns: Sequence[str] | None = None) -> BaseException | None:
    """Read one shard whole (or ``columns`` of it), checksums verified: None when it is intact, else the
    error that reading it raised."""
    try:
        pq.read_table(shard, columns=list(columns) if columns is not None else None, page_checksum_verification=True)
    except DAMAGED as exc:
        return exc
    return None


def valid_rows(table: pa.Table) -> tuple[pa.Table, list[int]]:
    """The rows of ``table`` (read from a log, ``SCHEMA``) that are cache rows, and the 0-based positions
    of those that are not: a row needs a non-empty ``key``, a known ``status`` (ok, invalid, failed) and,
    when it has one, a known ``error_kind`` (transient, fatal)."""
    key, status, kind = table["key"], table["status"], table["error_kind"]
    good = pc.and_kleene(pc.and_kleene(pc.is_valid(key), pc.greater(pc.utf8_length(key), 0)),
                         pc.is_in(status, value_set=pa.array(STATUSES)))
    good = pc.and_(pc.fill_null(good, False), pc.or_(pc.is_null(kind), pc.is_in(kind, value_set=pa.array(ERROR_KINDS))))
    good = pc.fill_null(good, False)
    if pc.all(good).as_py() is not False:
        return table, []
    bad = pc.indices_nonzero(pc.invert(good)).to_pylist()
    return table.filter(good), bad
