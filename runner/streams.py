"""Standard output and error whose reader may go away: ``dxi run ... | head -3``, ``dxi report |
less`` quit early. Unix's rule is a quiet end of the output, never of the work: ``guarded()`` puts a
``Guarded`` stream in place of ``sys.stdout`` and ``sys.stderr`` while a command runs, so that the
first write to a pipe whose reader has closed it (``BrokenPipeError``, EPIPE: Python ignores
SIGPIPE) points that file descriptor at ``/dev/null`` (the Python documentation's "Note on SIGPIPE",
``signal`` module) and every later write is dropped. Nothing is raised into the caller: a run keeps
gathering answers, stores every reply in its cache and writes its outputs; the command ends with the
exit code it would have had had its output been read (a closed pipe is the reader's choice, not a
failure of dxi's; docs/cli.md). Rich's own handling (``Console.on_broken_pipe``: ``SystemExit(1)``
from wherever the write was, the progress thread of a run included) is never reached.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from collections.abc import Iterator
from typing import TextIO


class Guarded:
    """``stream`` (a text stream: ``sys.stdout``), except that a write or flush that meets a closed
    pipe (``BrokenPipeError``) ends its output quietly: its file descriptor, when it has one, is
    pointed at ``/dev/null`` (so that what is still buffered, and a flush at exit, go nowhere
    without an error), ``closed_by_reader`` becomes True, and every later write is dropped,
    returning the length written as a write does. Every other attribute is the stream's."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self.closed_by_reader = False

    def write(self, text: str) -> int:
        if not self.closed_by_reader:
            try:
                return self._stream.write(text)
            except BrokenPipeError:
                self._reader_gone()
        return len(text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        if not self.closed_by_reader:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._reader_gone()

    def _reader_gone(self) -> None:
        self.closed_by_reader = True
        with contextlib.suppress(OSError, ValueError, io.UnsupportedOperation):
            fd = self._stream.fileno()
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, fd)
            os.close(devnull)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


@contextlib.contextmanager
def guarded() -> Iterator[tuple[Guarded, Guarded]]:
    """``sys.stdout`` and ``sys.stderr`` as ``Guarded`` streams for the block, flushed at its end
    (so that output still buffered meets a closed pipe here, guarded) and restored; yields the two.
    Both must be streams (not None)."""
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = Guarded(out), Guarded(err)
    try:
        yield sys.stdout, sys.stderr
    finally:
        for stream in (sys.stdout, sys.stderr):  # what is buffered: a reader gone is seen here
            stream.flush()
        sys.stdout, sys.stderr = out, err
