"""Shard layouts: how cache rows lie in a Parquet shard, and the one logical shape every reader
sees.

Two layouts, recorded in each shard's Parquet key-value metadata under ``dxi.layout`` (absent: 1):

* **1, nested**: ``cache.schema.SCHEMA``; a row's answers are one ``answers`` column, a list of
  structs (``ANSWER``) each holding its own list of option probabilities. Shards written before
  layout 2 have it, and so has every row of a write-ahead log (a log line is the row's JSON).
* **2, flat** (every shard written since: ``write_shard``): the request-level columns of ``SCHEMA``
  (all but ``answers``), one row per request as before, and beside them each answer field as its own
  column (``FLAT``): ``answer_<field>`` holds, per row, that field of each answer in the reply's
  order (``list<string>``, ``list<float64>``; ``answer_probabilities`` is
  ``list<list<struct{option, p}>>``). Parquet stores the strings dictionary-encoded (integer codes
  into a dictionary per column chunk). A row without answers (a failure) has null (or empty) lists,
  an answer without probabilities a null (or empty) inner list.

**The logical shape** (``scan``, and so ``Cache.scan``) has ``LOGICAL_COLUMNS`` (``SCHEMA``'s
columns, then ``FLAT``'s) whatever a shard's layout: the representation a source lacks is derived
lazily, only when a query selects it (Polars prunes unused columns before reading): ``answers`` from
the flat columns of a layout-2 shard, the flat columns from ``answers`` of a layout-1 shard or a
log. Scoring reads the flat columns (no nested decoding for layout-2 shards); every reader of
``answers`` reads it as before. This module is the only place that knows the layouts. Shards of both
layouts mix freely in one cache, in name order (a tie between two rows of a request is broken the
same way as before).

Errors: a shard whose ``dxi.layout`` is not one this version knows raises ``UnknownLayout`` (a
``ValueError``) naming the file: written by a newer version, it is never read as something else. A
Parquet file that is not a shard (no ``key`` or ``status`` column, or a column no layout has)
raises ``NotAShard``; the cache skips it with a warning (``cache.store``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from dxi.lazy import LazyModule

from .schema import ANSWER, SCHEMA

if TYPE_CHECKING:
    import polars as pl
    import pyarrow.compute as pc
else:  # imported when first used: opening an empty cache does without
    pl, pc = LazyModule("polars"), LazyModule("pyarrow.compute")

LAYOUT_KEY = b"dxi.layout"
NESTED, FLAT_LAYOUT = 1, 2
LAYOUTS = (NESTED, FLAT_LAYOUT)
WRITE_OPTIONS = {
    "compression": "zstd",
    "write_page_checksum": True,
}  # every shard: page CRC-32s (cache.verify)

FLAT = pa.schema([pa.field(f"answer_{f.name}", pa.list_(f.type)) for f in ANSWER])
FLAT_COLUMNS = tuple(FLAT.names)
SHARD_SCHEMA = pa.schema(
    [f for f in SCHEMA if f.name != "answers"] + list(FLAT)
)  # layout 2 on disk
LOGICAL_COLUMNS = (*SCHEMA.names, *FLAT_COLUMNS)


class UnknownLayout(ValueError):
    """A shard's ``dxi.layout`` is not one this version reads (a newer version wrote it): refused,
    never read as something else (``dxi`` exits with code 2 naming the file)."""


class NotAShard(ValueError):
    """A Parquet file in ``shards/`` that is not a cache shard: it lacks the ``key`` or ``status``
    column, or has a column no layout has (an answers.parquet copied there): skipped with a warning
    naming it (``cache.store``), never read as rows."""


# ---- arrow: one representation from the other ----------------------------------------------------
def _array(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column


def _offsets(lists: pa.Array) -> tuple[pa.Array, pa.Array | None]:
    """The offsets of ``lists`` (a list array, possibly sliced) as a fresh int32 array starting at
    0, and its null mask (None without nulls): with ``lists.flatten()`` a list array's whole
    content."""
    lengths = (
        np.asarray(pc.list_value_length(lists).fill_null(0), dtype=np.int64)
        if len(lists)
        else np.empty(0, np.int64)
    )
    offsets = np.zeros(len(lists) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    mask = lists.is_null() if lists.null_count else None
    return pa.array(offsets.astype(np.int32)), mask


def _list(offsets: pa.Array, values: pa.Array, mask: pa.Array | None) -> pa.Array:
    return pa.ListArray.from_arrays(offsets, values, mask=mask)


def flat_answers(answers: pa.Array | pa.ChunkedArray) -> dict[str, pa.Array]:
    """The ``FLAT`` columns (name -> array, one element per row) of a nested ``answers`` column
    (``list<ANSWER>``, one element per row)."""
    answers = _array(answers).cast(SCHEMA.field("answers").type)
    offsets, mask = _offsets(answers)
    out = {}
    for field, child in zip(
        ANSWER, answers.flatten().flatten(), strict=True
    ):  # struct validity applied
        out[f"answer_{field.name}"] = _list(offsets, child, mask)
    return out


def nested_answers(flat: dict[str, pa.Array | pa.ChunkedArray]) -> pa.Array:
    """The nested ``answers`` column (``list<ANSWER>``) of ``FLAT`` columns (name -> array): the
    inverse of ``flat_answers`` (an answer that was itself null comes back as an answer whose fields
    are null)."""
    flat = {name: _array(flat[name]).cast(FLAT.field(name).type) for name in FLAT_COLUMNS}
    offsets, mask = _offsets(flat["answer_question_id"])
    children = [flat[f"answer_{field.name}"].flatten() for field in ANSWER]
    return _list(offsets, pa.StructArray.from_arrays(children, fields=list(ANSWER)), mask)


def to_shard(table: pa.Table) -> pa.Table:
    """``table`` (rows of either layout, or a log's rows: ``SCHEMA``) in layout 2 (``SHARD_SCHEMA``,
    the layout recorded in its metadata), ready for ``pq.write_table``. Columns it lacks are
    null."""
    columns: dict[str, Any] = {
        name: table[name] for name in table.column_names if name != "answers"
    }
    if "answers" in table.column_names:
        columns.update(flat_answers(table["answers"]))
    n = table.num_rows
    arrays = [columns[f.name] if f.name in columns else pa.nulls(n, f.type) for f in SHARD_SCHEMA]
    return pa.table(
        arrays, schema=SHARD_SCHEMA.with_metadata({LAYOUT_KEY: str(FLAT_LAYOUT).encode()})
    )


ROW_GROUP_ROWS = 65_536  # rows per row group of a merged shard (``write_merged``)


def write_merged(tables: Iterable[pa.Table], where: str | Path) -> int:
    """Write ``tables`` (each of either layout, in order) as one layout-2 shard file ``where``, in
    row groups of ``ROW_GROUP_ROWS`` rows, holding one table and one row group's worth at a time;
    returns the rows written. Reading cost is per column chunk (a row group's column): fewer, larger
    row groups read in about half the CPU of one small shard each (docs/benchmarks.md, goal 4)."""
    schema = SHARD_SCHEMA.with_metadata({LAYOUT_KEY: str(FLAT_LAYOUT).encode()})
    rows, pending, held = 0, [], 0
    with pq.ParquetWriter(str(where), schema, **WRITE_OPTIONS) as writer:
        for table in tables:
            pending.append(to_shard(table))
            held += table.num_rows
            rows += table.num_rows
            if held >= ROW_GROUP_ROWS:
                merged = pa.concat_tables(pending)
                whole = held - held % ROW_GROUP_ROWS
                writer.write_table(merged.slice(0, whole), row_group_size=ROW_GROUP_ROWS)
                pending, held = [merged.slice(whole)], held - whole
        if held:
            writer.write_table(pa.concat_tables(pending), row_group_size=ROW_GROUP_ROWS)
    return rows


def write_shard(table: pa.Table, where: str | Path | Any) -> None:
    """Write ``table`` (either layout) as a layout-2 shard to ``where`` (a path or a writable file),
    with ``WRITE_OPTIONS``. The caller renames a temporary file into place (a shard is whole or
    absent)."""
    pq.write_table(
        to_shard(table), where if not isinstance(where, Path) else str(where), **WRITE_OPTIONS
    )


def read_nested(shard: Path, columns: Sequence[str]) -> pa.Table:
    """``columns`` (names of ``SCHEMA``) of the shard file ``shard`` with pyarrow, ``answers``
    nested whatever the shard's layout (for row-by-row readers; the cache itself reads through
    ``scan``). A column added to ``SCHEMA`` after the shard was written reads as nulls (columns are
    only ever added)."""
    present = set(pq.read_schema(shard).names)
    nested = layout_of(shard) == NESTED or "answers" not in columns
    wanted = [c for c in columns if c in present and (nested or c != "answers")]
    table = pq.read_table(shard, columns=wanted if nested else wanted + list(FLAT_COLUMNS))
    if not nested:
        answers = nested_answers({name: table[name] for name in FLAT_COLUMNS})
        table = table.drop_columns(list(FLAT_COLUMNS)).append_column("answers", answers)
    for name in columns:
        if name not in table.column_names:
            table = table.append_column(
                SCHEMA.field(name), pa.nulls(len(table), SCHEMA.field(name).type)
            )
    return table.select(list(columns))


# ---- which layout a shard has --------------------------------------------------------------------
_LAYOUTS: dict[
    Path, tuple[tuple[int, int, int], int]
] = {}  # path -> ((inode, size, mtime ns), layout)


def layout_of_metadata(metadata: dict[bytes, bytes] | None, where: object) -> int:
    """The layout recorded in a shard's key-value ``metadata`` (none: 1). Raises UnknownLayout
    naming ``where`` for a layout this version does not read."""
    value = (metadata or {}).get(LAYOUT_KEY, b"1")
    try:
        layout = int(value)
    except ValueError:
        layout = -1
    if layout not in LAYOUTS:
        raise UnknownLayout(
            f"{where}: shard layout {value.decode(errors='replace')!r} is not one this version "
            f"of dxi reads ({', '.join(map(str, LAYOUTS))}): written by a newer version? Upgrade "
            "dxi to read this cache, or move the file out of its shards/ folder (its requests are "
            "then sent again)"
        )
    return layout


SHARD_NEEDS = ("key", "status")  # what every shard of every layout has


def shard_columns(names: Sequence[str], where: object) -> None:
    """Raise NotAShard naming ``where`` unless the columns ``names`` are a shard's: ``SHARD_NEEDS``
    among them, and none outside ``LOGICAL_COLUMNS`` (an older shard lacks the newer columns)."""
    missing = [c for c in SHARD_NEEDS if c not in names]
    foreign = [c for c in names if c not in LOGICAL_COLUMNS]
    if missing or foreign:
        why = (
            f"no {' or '.join(missing)} column"
            if missing
            else f"column(s) {', '.join(foreign[:5])} that no shard has"
        )
        raise NotAShard(
            f"{where} is not a cache shard ({why}: another program's Parquet file?); skipped: "
            "move it out of the cache's shards/ folder"
        )


def layout_of(shard: Path) -> int:
    """The layout of the shard file ``shard`` (1 or 2), from its footer; remembered while the file
    is unchanged (a shard rewritten in place by ``dxi cache compact`` is a new file: read again).
    Raises UnknownLayout (a newer version's), NotAShard (not a cache shard: ``shard_columns``)."""
    st = os.stat(shard)
    stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
    known = _LAYOUTS.get(shard)
    if known is not None and known[0] == stamp:
        return known[1]
    found = pq.read_schema(shard)
    layout = layout_of_metadata(found.metadata, shard)
    shard_columns(found.names, shard)
    _LAYOUTS[shard] = (stamp, layout)
    return layout


# ---- polars: the logical shape -------------------------------------------------------------------
@cache
def _schemas() -> dict[int, pl.Schema]:
    """The Polars schema of each layout's files, and of the logical shape (key 0)."""
    return {
        NESTED: pl.from_arrow(SCHEMA.empty_table()).schema,
        FLAT_LAYOUT: pl.from_arrow(SHARD_SCHEMA.empty_table()).schema,
        0: pl.from_arrow(pa.schema(list(SCHEMA) + list(FLAT)).empty_table()).schema,
    }


def _nested_of(flat: pl.Series) -> pl.Series:
    """``answers`` from a struct Series of the ``FLAT`` columns (a layout-2 source)."""
    arrow = flat.to_arrow()
    if isinstance(arrow, pa.ChunkedArray):
        arrow = arrow.combine_chunks()
    return pl.from_arrow(nested_answers({name: arrow.field(name) for name in FLAT_COLUMNS}))


def logical(frame: pl.LazyFrame, layout: int) -> pl.LazyFrame:
    """``frame`` (rows of ``layout``: a scan of its shards, a log's rows) in the logical shape,
    columns ``LOGICAL_COLUMNS``: the missing representation of the answers derived lazily."""
    schema = _schemas()[0]
    if layout == NESTED:
        derived = [
            pl.col("answers").list.eval(pl.element().struct.field(f.name)).alias(f"answer_{f.name}")
            for f in ANSWER
        ]
    else:
        # row by row (``is_elementwise``): a filter on the scan is then pushed down to the Parquet
        # reader past it, which a batch function blocks (every filtered cache read decoded whole
        # shards)
        derived = [
            pl.struct(FLAT_COLUMNS)
            .map_batches(_nested_of, return_dtype=schema["answers"], is_elementwise=True)
            .alias("answers")
        ]
    return frame.with_columns(derived).select(
        pl.col(name).cast(schema[name]) for name in LOGICAL_COLUMNS
    )


def empty() -> pl.LazyFrame:
    """No rows, in the logical shape."""
    return logical(pl.from_arrow(SCHEMA.empty_table()).lazy(), NESTED)


def scan(shards: Sequence[Path]) -> pl.LazyFrame:
    """The shard files (page checksums verified first: ``cache.verify``) as one LazyFrame in the
    logical shape, in the given order; each read with its layout's schema (a column an older shard
    lacks reads as nulls). Raises UnknownLayout for a shard of a layout this version does not
    read."""
    runs: list[tuple[int, list[str]]] = []
    for shard in shards:
        layout = layout_of(shard)
        if runs and runs[-1][0] == layout:
            runs[-1][1].append(str(shard))
        else:
            runs.append((layout, [str(shard)]))
    frames = [
        logical(pl.scan_parquet(files, schema=_schemas()[layout], missing_columns="insert"), layout)
        for layout, files in runs
    ]
    if not frames:
        return empty()
    return frames[0] if len(frames) == 1 else pl.concat(frames, how="vertical")
