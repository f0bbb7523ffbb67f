"""Checking a dataset file whole before a run: every row readable, every task id used once.

``check_file(path, rows, id_field)`` reads every row through its loader (``rows()`` yields
``(row number, Task)``), so a malformed row anywhere in the file raises its ``DatasetError`` before
the first request, and two rows that make one task id (``"id": 1`` and ``"id": "1"`` both make
``<eval>/1``) are a ``DatasetError`` naming both rows: scored, one row's answer would be compared
with the other's gold.

Memory: 16 bytes a row (a 64-bit hash of each id and its row number), not the ids themselves; only
when two hashes meet are the ids of those rows read again, to name them. A file of up to ``SMALL``
rows is checked with a set of the hashes first (a few MB at most, and no NumPy import: a run's
start-up does without it, issue 14); a larger one, or one where two hashes meet, with NumPy's sort.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterator
from pathlib import Path

from .rows import DatasetError
from .task import Task

SMALL = 65_536  # rows checked with a set of their hashes (~5 MB) before NumPy is needed


def check_file(
    path: Path, rows: Callable[[], Iterator[tuple[int, Task]]], id_field: str | None
) -> int:
    """Read every row of ``path`` (``rows()`` streams ``(row number, Task)``); return the number of
    tasks. Raises the loader's DatasetError for a malformed row, and a DatasetError (row and
    ``id_field`` of the later row) when a task id repeats an earlier row's."""
    hashes, numbers = array("q"), array("q")
    for n, task in rows():
        hashes.append(hash(task.id))
        numbers.append(n)
    if len(hashes) <= SMALL and len(set(hashes)) == len(hashes):
        return len(hashes)  # no two hashes meet: no id repeats
    import numpy as np  # imported when a file is checked: reading tasks (and `dxi --help`) does without

    h = np.frombuffer(hashes, np.int64) if len(hashes) else np.empty(0, np.int64)
    order = np.argsort(h, kind="stable")
    same = np.flatnonzero(h[order][1:] == h[order][:-1])
    if not len(same):
        return len(hashes)
    suspects = {numbers[i] for k in same for i in (order[k], order[k + 1])}
    first: dict[str, int] = {}
    for (
        n,
        task,
    ) in rows():  # a hash met another: read those rows' ids to name them (or find no repeat)
        if n not in suspects:
            continue
        if task.id in first:
            raise DatasetError(
                path,
                n,
                id_field,
                f"task id {task.id!r} is also the id of row {first[task.id]}; "
                'each row needs its own id (1 and "1" make the same id)',
            )
        first[task.id] = n
    return len(hashes)
