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
  an earlier scoring out of the way, into ``OUT/.dxi-staging-PID/.old/`` (those this scoring does
  not write too: a ``dxi score`` after a ``dxi report`` takes the report away, whose figures
  summary.json no longer matches), then creates ``OUT/.dxi-staging-PID/.committed`` (``MARK``:
  the point of no return), then renames the new ones in, summary.json last, then removes
  ``.old/``, the mark and the staging folder, in that order.

A SIGKILL or a power cut inside that step (nothing can hold them) leaves ``OUT`` with some of one
set's files, the rest in the staging folder: the next command that writes to ``OUT``
(``recover``: ``dxi run``, ``score``, ``report``, first thing) finds the staging folder of
a process that no longer runs and finishes the step as it was decided: without the mark it moves
the earlier outputs back from ``.old/`` (rolled back: ``OUT`` as it was), with it it moves the
rest of the new ones in (rolled forward); then it removes the folder, and says so in one line when
it moved anything. An error inside the step (an ``OSError``) is settled the same way at once.
The staged files and the folders are fsynced before the mark and after the renames, so a power
cut is settled alike.

``holds(out)`` says what ``OUT`` holds for the message of a command a signal stopped
(``runner.signals``): from the moment the command notes it will write there (``writing``, before it
loads or scores anything), so an early Ctrl-C says ``OUT`` is left as it was too. A staging folder a
killed process left is settled (above) and removed by the next one.
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
OLD = ".old"
"""In the staging folder: the earlier scoring's outputs, moved out of ``OUT`` by ``commit``."""
MARK = ".committed"
"""In the staging folder: every earlier output is in ``OLD``, every new one staged whole; a
commit stopped after it is finished (rolled forward), one stopped before it undone (rolled back)."""
_DEFERRED = ("SIGINT", "SIGTERM", "SIGALRM")
_state: dict[str, bool] = {}  # OUT -> True: this process's set is in place; False: left as it was
_active: set[Path] = set()  # the staging folders this process is using now (``recover`` skips them)


class Staging:
    """The outputs of one scoring, staged in ``OUT/.dxi-staging-PID/`` (``path(name)``) and put in
    place by ``commit`` (``discard``: removed, ``OUT`` left as it was). A context manager: leaving
    it with an exception (a signal, an error) discards what was staged."""

    def __init__(self, out: Path):
        self.out = Path(out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.dir = self.out / f"{PREFIX}{os.getpid()}"
        recover(self.out)  # what killed processes left here, settled (their lines: the command's)
        shutil.rmtree(self.dir, ignore_errors=True)  # one this process left (``_active``)
        self.dir.mkdir()
        _active.add(self.dir)
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
        _active.discard(self.dir)

    def commit(self) -> list[str]:
        """Put the staged outputs in place of every output ``OUT`` held (signals deferred meanwhile:
        ``_deferred``); returns those it took away without a new one (``removed``). Stopped by an
        error inside, it is settled (``_settle``: undone before ``MARK``, finished after) and the
        error raised again; killed inside, the next command settles it (``recover``)."""
        new = [n for n in OUTPUTS if (self.dir / n).exists()]
        with _deferred():
            try:
                _sync(self.dir)  # staged whole on the disk before the point of no return
                os.mkdir(self.dir / OLD)
                held = _clear(self.out, self.dir / OLD)
                _mark(self.dir)
                _place(self.dir, self.out, new)
                _sync_folder(self.out)
            finally:
                _state[str(self.out)] = _settle(self.out, self.dir)[0] == "forward"
                _active.discard(self.dir)
        self.removed = [n for n in held if n not in new]
        return self.removed


REPORT = ("report.html", "tables")
"""The report's outputs: written by ``dxi report`` alone, taken away by a scoring without one."""


def report_held(out: Path) -> list[str]:
    """The report's outputs (``REPORT``) ``out`` holds now: what a scoring without a report (``dxi
    run``, ``dxi score``) takes away; ``removed_note`` says so once it did."""
    return [n for n in REPORT if (Path(out) / n).exists()]


def removed_note(out: Path, held: list[str]) -> str | None:
    """The note of a scoring that took away the report ``out`` held before it (``held``, from
    ``report_held``); None when it took none away (or was stopped before it wrote)."""
    gone = [n for n in held if not (Path(out) / n).exists()]
    if not gone:
        return None
    return (
        f"{' and '.join(str(Path(out) / n) for n in gone)} (an earlier scoring's, which "
        "summary.json no longer matches) were removed: `dxi report` writes them for this one"
    )


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


def _mark(folder: Path) -> None:
    """Create ``MARK`` in the staging ``folder`` (its presence is the mark), durably."""
    os.close(os.open(folder / MARK, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    _sync_folder(folder)


def _settle(out: Path, folder: Path) -> tuple[str, list[str]]:
    """Finish (``MARK`` there: "forward", the staged outputs left moved into ``out``) or undo (no
    mark: "back", the earlier outputs in ``OLD`` moved back into ``out``) the commit of the staging
    ``folder``, then remove ``OLD``, the mark and the folder, in that order (so a kill inside this
    too leaves it to be settled the same way); returns how and the names it moved."""
    moved = []
    if (folder / MARK).exists():
        how, source = "forward", folder
    else:
        how, source = "back", folder / OLD
    for name in OUTPUTS:
        if (source / name).exists():
            os.replace(source / name, out / name)
            moved.append(name)
    if moved:
        _sync_folder(out)
    shutil.rmtree(folder / OLD, ignore_errors=True)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(folder / MARK)
    shutil.rmtree(folder, ignore_errors=True)
    return how, moved


def recover(out: Path) -> list[str]:
    """Settle (``_settle``) and remove the staging folders in ``out`` of processes that no longer
    run (killed while they staged or put their outputs in place: a folder named with this
    process's pid that it is not using is a killed one's whose pid it was given); one line for each
    that moved an output, saying what ``out`` holds now (an error that stops it: a line saying so).
    Folders of processes still running are left alone."""
    lines = []
    try:
        folders = sorted(Path(out).glob(f"{PREFIX}*"))
    except OSError:
        return lines
    for folder in folders:
        pid = folder.name[len(PREFIX) :]
        if not pid.isdigit() or folder in _active:
            continue
        if int(pid) != os.getpid() and running(int(pid), 0):
            continue
        try:
            how, moved = _settle(Path(out), folder)
        except OSError as exc:
            lines.append(
                f"{out} holds the outputs a killed dxi (pid {pid}) was putting in place, partly: "
                f"they could not be settled ({exc.strerror or exc}); see {folder}"
            )
            continue
        if moved:
            lines.append(_repaired(Path(out), pid, how))
    return lines


def _repaired(out: Path, pid: str, how: str) -> str:
    """The line of ``recover`` for a commit of process ``pid`` settled ``how``."""
    there = [n + ("/" if n == "tables" else "") for n in OUTPUTS if (out / n).exists()]
    if how == "forward":
        return (
            f"repaired {out}: a dxi killed (pid {pid}) while it put its outputs in place had "
            f"decided to (its mark was written); what it had not moved in was moved in: {out} "
            f"holds that scoring's outputs, whole ({', '.join(there)})."
        )
    return (
        f"repaired {out}: a dxi killed (pid {pid}) while it put its outputs in place had moved "
        f"the earlier ones aside; they were moved back, so {out} is as it was; it holds: "
        + (", ".join(there) or "no output")
        + "."
    )


def _sync(folder: Path) -> None:
    """fsync every file and folder under ``folder``, and ``folder`` itself."""
    for root, _, files in os.walk(folder):
        for name in files:
            fd = os.open(Path(root) / name, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _sync_folder(Path(root))


def _sync_folder(folder: Path) -> None:
    """fsync ``folder`` (its entries: the renames into it), where the system allows it."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


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
