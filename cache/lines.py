"""Appending whole lines to a file that several processes append to (``runs.jsonl``, the batch
ledger).

A line is appended with one ``write(2)`` to the file opened ``O_APPEND``, under an exclusive
``flock``; when the file does not end with a newline (a writer was killed mid-write, or a full disk
took part of a line), the line is written after a newline, so the cut line stays a line of its own,
skipped by readers, and never swallows the whole line written after it.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


class ShortWrite(OSError):
    """Only ``written`` of the ``wanted`` bytes of a line were written (a full disk)."""

    def __init__(self, path: Path, written: int, wanted: int):
        super().__init__(
            f"{path}: only {written} of {wanted} bytes were written (is the disk full?)"
        )
        self.written, self.wanted = written, wanted


def append_line(path: Path | str, line: bytes, *, fsync: bool = False) -> None:
    """Append ``line`` (bytes ending in a newline) to ``path`` (created when missing) as said in the
    module docstring; ``fsync`` makes it survive power loss. Raises ShortWrite when the disk took
    only part of it, OSError when the file cannot be opened or written."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        fcntl.flock(
            fd, fcntl.LOCK_EX
        )  # dropped by close; the check below and the write are one step
        size = os.fstat(fd).st_size
        if (
            size and os.pread(fd, 1, size - 1) != b"\n"
        ):  # a line cut by a kill: end it, keep ours whole
            line = b"\n" + line
        written = os.write(fd, line)
        if written != len(line):
            raise ShortWrite(Path(path), written, len(line))
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)
