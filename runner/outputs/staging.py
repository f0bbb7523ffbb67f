"""A scoring's outputs in ``OUT`` as one set: never two scorings' files side by side.

``OUT/summary.json``, ``OUT/answers.parquet``, ``OUT/report.html`` and ``OUT/tables/`` (``OUTPUTS``)
are what one scoring writes (``dxi run``, ``score``: the first two; ``dxi report``: all four). Each
was renamed into place on its own, so a Ctrl-C between two of them left a folder holding a new
summary.json beside the report of an earlier scoring, old figures a user could publish with the
new ones. Now (``Staging``):

* every output is written whole under a staging folder, ``OUT/.dxi-staging-PID/``; a signal (or an
  error) while they are written removes it, and ``OUT`` is left as it was;
* then ``commit`` puts the set in place in one short step (renames, a few milliseconds), with
  SIGINT, SIGTERM and SIGALRM (``runner.signals.within``'s end of the grace period) *deferred*:
  one that comes meanwhile is handled once the step is done. The step first moves every output of
  an earlier scoring out of the way (those this scoring does not write too: a ``dxi score`` after a
  ``dxi report`` takes the report away, whose figures summary.json no longer matches), then renames
  the new ones in, summary.json last. Even a SIGKILL or a power cut inside it leaves ``OUT`` with
  the earlier set's files or this one's, never some of each.

``holds(out)`` says what ``OUT`` holds for the message of a command a signal stopped
(``runner.signals``): from the moment the command notes it will write there (``writing``, before it
loads or scores anything), so an early Ctrl-C says ``OUT`` is left as it was too. A staging folder a
killed process left is removed by the next one.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

from dxi.view.home import running  # whether a process still runs (/proc, else a signal 0)

OUTPUTS = ("answers.parquet", "tables", "report.html", "summary.json")
"""Every output of one scoring in ``OUT``, in the order ``commit`` puts them in place."""
PREFIX = ".dxi-staging-"
_DEFERRED = ("SIGINT", "SIGTERM", "SIGALRM")
_state: dict[str, bool] = {}  # OUT -> True: this process's set is in place; False: left as it was


class Staging:
    """The outputs of one scoring, staged in ``OUT/.dxi-staging-PID/`` (``path(name)``) and put in
    place by ``commit`` (``discard``: removed, ``OUT`` left as it was). A context manager: leaving
    it with an exception (a signal, an error) discards what was staged."""

    def __init__(self, out: Path):
        self.out = Path(out)
        self.out.mkdir(parents=True, exist_ok=True)
        _sweep(self.out)
        self.dir = self.out / f"{PREFIX}{os.getpid()}"
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.mkdir()
        _state[str(self.out)] = False
        self.removed: list[str] = []  # what commit took away that this scoring does not write

    def __enter__(self) -> Staging:
        return self

    def __exit__(self, kind: type | None, *rest: object) -> None:
        if kind is not None:
            self.discard()

    def path(self, name: str) -> Path:
        """Where the output ``name`` (one of ``OUTPUTS``) is staged."""
        assert name in OUTPUTS, name
        return self.dir / name

    def discard(self) -> None:
        """Remove what was staged: ``OUT`` keeps what it held."""
        shutil.rmtree(self.dir, ignore_errors=True)

    def commit(self) -> list[str]:
        """Put the staged outputs in place of every output ``OUT`` held (signals deferred meanwhile:
        ``_deferred``); returns those it took away without a new one (``removed``)."""
        new = [n for n in OUTPUTS if (self.dir / n).exists()]
        old = self.dir / ".old"
        try:
            with _deferred():
                old.mkdir()
                held = _clear(self.out, old)
                _place(self.dir, self.out, new)
                _state[str(self.out)] = True
        finally:
            self.discard()
        self.removed = [n for n in held if n not in new]
        return self.removed


def writing(out: Path) -> None:
    """Note that a scoring of this process will write into ``out`` (``dxi score`` and ``report``,
    first thing): a signal before its staging starts (loading, scoring) then says ``out`` is left as
    it was (``holds``), as one while it is staged does."""
    _state.setdefault(str(Path(out)), False)


def written(out: Path) -> bool | None:
    """Whether this process's scoring into ``out`` is in place (True), or ``out`` was left as it
    was (False: stopped before ``commit``); None when no scoring in this process wrote there."""
    return _state.get(str(out))


def holds(out: Path) -> str | None:
    """What ``out`` holds after a scoring into it was stopped, for the stop's message: this
    scoring's outputs, whole, or what it held before (none of this scoring's written); None when
    no scoring in this process wrote there."""
    state = written(out)
    if state is None:
        return None
    if state:
        there = [n + ("/" if n == "tables" else "") for n in OUTPUTS if (Path(out) / n).exists()]
        return f"{out} holds this scoring's outputs, whole ({', '.join(there)})."
    return f"{out} is left as it was: none of this scoring's outputs was written there."


def told() -> str | None:
    """``holds`` of every folder a scoring of this process wrote to (one, in practice), or None."""
    return " ".join(filter(None, map(holds, _state))) or None


def _clear(out: Path, old: Path) -> list[str]:
    """Move each of ``OUTPUTS`` that ``out`` holds into ``old`` (a rename: the earlier set out of
    the way); the names moved."""
    moved = []
    for name in OUTPUTS:
        with contextlib.suppress(FileNotFoundError):
            os.replace(out / name, old / name)
            moved.append(name)
    return moved


def _place(staged: Path, out: Path, names: list[str]) -> None:
    """Rename each of ``names`` from ``staged`` into ``out`` (summary.json last: ``OUTPUTS``)."""
    for name in names:
        os.replace(staged / name, out / name)


def _sweep(out: Path) -> None:
    """Remove the staging folders in ``out`` of processes that no longer run (killed while they
    wrote)."""
    for folder in out.glob(f"{PREFIX}*"):
        pid = folder.name[len(PREFIX) :]
        if pid.isdigit() and int(pid) != os.getpid() and not running(int(pid), 0):
            shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def _deferred() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGALRM held while the block runs: their Python handlers (which raise
    ``KeyboardInterrupt``, or end the grace period) are replaced by one that notes the signal, and
    put back after it; a signal noted is then delivered again to its own handler. A handler of the
    interpreter's, not a mask: a signal to the process may be delivered to any of its threads
    (Polars' among them), so only the handlers, which always run in the main thread, hold it.
    Outside the main thread (no handler can be set there, and none runs there) the block just
    runs."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came: list[int] = []
    numbers = [getattr(signal, name) for name in _DEFERRED]
    before = {n: signal.signal(n, lambda signum, frame: came.append(signum)) for n in numbers}
    try:
        yield
    finally:
        for n, handler in before.items():
            signal.signal(n, handler if handler is not None else signal.SIG_DFL)
        for n in dict.fromkeys(came):
            signal.raise_signal(n)
