"""Reading dataset rows from JSONL, JSON and Parquet files, with errors that name file, row and
field."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson


class DatasetError(ValueError):
    """A dataset file or row is malformed. The message names the file, the row (1-based) and the
    field."""

    def __init__(self, path: Path | str, row: int | None, field: str | None, problem: str):
        where = (
            str(path)
            + (f", row {row}" if row is not None else "")
            + (f", field {field!r}" if field else "")
        )
        super().__init__(f"{where}: {problem}")
        self.path, self.row, self.field = str(path), row, field


def read_rows(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(row_number, row)`` from a ``.jsonl``, ``.json`` (a list of objects) or ``.parquet``
    file.

    Row numbers are 1-based (JSONL: the line number; JSON/Parquet: the position). Blank JSONL lines
    are skipped but keep their number. Raises DatasetError for unreadable files and non-object rows.
    """
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        with path.open("rb") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = orjson.loads(line)
                except orjson.JSONDecodeError as exc:
                    raise DatasetError(path, n, None, f"not valid JSON ({exc})") from None
                if not isinstance(row, dict):
                    raise DatasetError(path, n, None, "expected a JSON object")
                yield n, row
    elif suffix == ".json":
        try:
            doc = orjson.loads(path.read_bytes())
        except orjson.JSONDecodeError as exc:
            raise DatasetError(path, None, None, f"not valid JSON ({exc})") from None
        if not isinstance(doc, list):
            raise DatasetError(path, None, None, "expected a JSON list of objects")
        for n, row in enumerate(doc, 1):
            if not isinstance(row, dict):
                raise DatasetError(path, n, None, "expected a JSON object")
            yield n, row
    elif suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            pf = pq.ParquetFile(path)
        except Exception as exc:  # pyarrow raises several types for a corrupt file
            raise DatasetError(path, None, None, f"not a readable Parquet file ({exc})") from None
        n = 0
        for batch in pf.iter_batches(batch_size=4096):
            for row in batch.to_pylist():
                n += 1
                yield n, row
    else:
        raise DatasetError(
            path, None, None, "unsupported file type (expected .jsonl, .json or .parquet)"
        )


def field(
    path: Path,
    n: int,
    row: dict[str, Any],
    name: str,
    kind: type | tuple[type, ...],
    *,
    optional: bool = False,
) -> Any:
    """Return ``row[name]`` checked against ``kind``; raise DatasetError naming file, row and
    field."""
    if name not in row or row[name] is None:
        if optional:
            return None
        raise DatasetError(path, n, name, "missing")
    value = row[name]
    if kind is int and isinstance(value, bool) or not isinstance(value, kind):
        want = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise DatasetError(path, n, name, f"expected {want}, got {type(value).__name__}")
    return value
