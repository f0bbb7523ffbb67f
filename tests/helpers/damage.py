"""Damage done to a cache shard the way a disk does it: bytes flipped inside a column chunk, its
footer intact (``tests/test_integrity.py``, ``tests/test_view.py``)."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq

from dxi.cache import verify


def column_chunks(shard: Path) -> list[tuple[str, int, int]]:
    """Each column chunk of ``shard``: (its column, the offset of its first page, its size)."""
    meta = pq.ParquetFile(shard).metadata
    out = []
    for g in range(meta.num_row_groups):
        for c in range(meta.num_columns):
            col = meta.row_group(g).column(c)
            start = (
                col.dictionary_page_offset
                if col.has_dictionary_page and col.dictionary_page_offset
                else col.data_page_offset
            )
            out.append((col.path_in_schema, start, col.total_compressed_size))
    return out


def damage(shard: Path) -> None:
    """Flip 4 bytes in the middle of ``shard``'s request bodies (outside the index columns: found
    when scoring reads every page), checked to fail the page checksums."""
    (_, start, size) = next(c for c in column_chunks(shard) if c[0] == "request_body")
    pristine = shard.read_bytes()
    for at in range(start + size // 2, start + size - 4):  # a byte of a page, not of its header
        data = bytearray(pristine)
        for k in range(4):
            data[at + k] ^= 0xFF
        shard.write_bytes(bytes(data))
        if verify.page_checksums(shard) is not None:
            return
    raise AssertionError(f"no flip in {shard}'s request bodies fails a checksum")
