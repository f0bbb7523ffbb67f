"""How ``dxi`` stops on Ctrl-C (SIGINT) and SIGTERM (a plain ``kill``, a scheduler's time limit or
preemption).

* **Taken however dxi was started** (``take_signals``, first thing in ``dxi.__main__.command``): a
  SIGINT inherited ignored or blocked (a script's background job) is taken back; SIGTERM raises
  ``KeyboardInterrupt`` as SIGINT does, remembering which signal came (``received``), so it stops as
  cleanly and says so, with exit code 143 instead of 130 (``exit_code``).
* **Outside a run's event loop** (imports, planning, scoring, writing outputs): the command stops
  where it is, prints one line (never a traceback) and exits 130 or 143. A signal that lands inside
  an import ends the process at once with that line (``_on_signal``): an exception raised into a C
  extension's initialisation can crash the interpreter (a ``KeyboardInterrupt`` inside orjson's made
  it segfault), and an interrupted import leaves nothing to save. Until ``take_signals`` has run,
  ``dxi.__main__``'s own handler does the same.
* **Once the command has returned its exit code** (``exit_at_once``, from ``runner.cli.main``'s
  ``decided``): its work is done, so a signal changes nothing: the process ends at once with that
  code, no line, no traceback. One raised where Python cannot raise it (a weakref callback as the
  command's objects are freed) is delivered again, never printed (``_unraisable``).
* **During a run** (``Graceful``, around ``runner.session``'s event loop): the first signal
  *drains*: nothing new is sent, the requests on the wire finish and are stored
  (``runner.sending.stops.RunStop``), each model's rest is counted not sent (as after the cost
  bound), the progress says so and counts them down, then the run stops with its resume message and
  its counts (``Interrupted.counts``, for its line in OUT/run-history.jsonl). A second signal aborts
  at once (the replies still on the wire are abandoned: counted sent, their reservations kept as
  spent, "at most"; the next run sends them again), and so does the
  end of the grace period, ``--grace`` seconds (default ``GRACE_S`` = 25): inside the 30 s that
  Kubernetes (``terminationGracePeriodSeconds``) and Slurm (``KillWait``) leave between SIGTERM and
  SIGKILL. A run stopped so, once drained, scores what arrived into its summary.json (marked
  ``interrupted``, its missing answers provisional as after any incomplete run) in what is left of
  the grace period (``within``: at its end, or at a second signal, the writing stops and the
  outputs already there are left whole).
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, TypeVar

from dxi.lazy import LazyModule

from .errors import EXIT_INTERRUPTED, EXIT_TERMINATED

if TYPE_CHECKING:
    from .counts import Counts

# asyncio is used inside a run only: `dxi --help` and the signals taken at start-up need none of it
asyncio = LazyModule("asyncio")

GRACE_S = 25.0
RETRY_S = 0.02  # an end of the grace period that comes inside an import waits this long, again
T = TypeVar("T")
_received: list[int] = []  # the signals that stopped dxi, in order (see ``received``)


def _importing(frame: FrameType | None) -> bool:
    """Whether ``frame`` (the frame a signal interrupted) is inside an import: an import machinery
    frame on its stack."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def _on_signal(signum: int, frame: FrameType | None) -> None:
    """SIGINT or SIGTERM outside a run's event loop: ``KeyboardInterrupt``, remembering the signal;
    inside an import, one line ("Interrupted (Ctrl-C).") and the exit code at once, standard output
    flushed first."""
    _received.append(signum)
    if _importing(frame):
        import os
        import sys

        with contextlib.suppress(Exception):
            sys.stdout.flush()
        os.write(2, f"Interrupted ({describe(signum)}).\n".encode())
        os._exit(exit_code())
    raise KeyboardInterrupt


def take_signals() -> None:
    """Make SIGINT and SIGTERM stop ``dxi`` cleanly however it was started (main thread only, before
    anything runs). A job a non-interactive shell starts in the background (``dxi run ... &`` in a
    script) inherits SIGINT ignored, and Python keeps an inherited ``SIG_IGN``, so ``kill -INT``
    would do nothing; a signal mask inherited with SIGINT or SIGTERM blocked would hold it for ever.
    Both are undone here, and SIGTERM (whose default ends the process at once, silently, its
    embedded workers left behind) raises ``KeyboardInterrupt`` as Ctrl-C does. A Ctrl-C in the
    terminal of such a script then stops its background ``dxi`` cleanly too, which the next run
    continues. Either signal inside an import ends ``dxi`` at once (``_on_signal``)."""
    for sig in (signal.SIGINT, signal.SIGTERM):  # over dxi.__main__'s early handlers
        signal.signal(sig, _on_signal)
    sys.unraisablehook = _unraisable
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})


def _unraisable(info: sys.UnraisableHookArgs) -> None:
    """``sys.unraisablehook`` once ``take_signals`` has run: a ``KeyboardInterrupt`` that
    ``_on_signal`` raised where Python cannot raise it (a weakref callback, a ``__del__``: the
    objects freed as a command returns) is not printed ("Exception ignored in: ...", a traceback)
    but delivered again, at the next point that can raise it (or to ``exit_at_once``'s handler once
    the command's exit code is decided); anything else is printed as Python prints it."""
    if isinstance(info.exc_value, KeyboardInterrupt) and _received:
        signal.raise_signal(_received[-1])
        return
    sys.__unraisablehook__(info)


def exit_at_once(code: int) -> None:
    """Once the command has returned its exit code ``code`` (``runner.cli.main``'s ``decided``,
    then the command's tail: the exit handlers, the streams flushed): its work is done, so a SIGINT
    or SIGTERM changes nothing: it ends the process at once with ``code`` (standard output and
    error flushed first), no line, no traceback."""
    import os

    def end(signum: int, frame: object) -> None:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, end)


def received() -> int:
    """The first signal that stopped dxi: SIGTERM when one came, else SIGINT (a
    ``KeyboardInterrupt`` from Python's own SIGINT handler records nothing)."""
    return _received[0] if _received else signal.SIGINT


def exit_code(stop: BaseException | None = None) -> int:
    """130 for SIGINT (128 + 2), 143 for SIGTERM (128 + 15), as a shell reports a process those
    signals end: of the signal that stopped a run (``stop``: ``Interrupted``), else of the first one
    received."""
    signum = stop.signum if isinstance(stop, Interrupted) else received()
    return EXIT_TERMINATED if signum == signal.SIGTERM else EXIT_INTERRUPTED


def describe(signum: int) -> str:
    """A signal as the user sent it: ``Ctrl-C`` (SIGINT) or ``SIGTERM``."""
    return "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name


class Interrupted(Exception):  # noqa: N818 (a stop, not an error)
    """A run stopped by a signal. ``signum``: the first signal; ``drained``: True when every request
    on the wire finished and was stored, False when it was cut short (``why``: "again", a second
    signal, or "grace", the grace period over) with ``abandoned`` requests still in flight (the next
    run sends them); ``counts``: what the run did (``runner.counts.Counts``: each model's requests
    sent, found in the cache and not sent), for its line in OUT/run-history.jsonl; cut short, what
    was counted by then (the requests abandoned on the wire among those sent, their reservations
    kept as spent; a model whose rest was not counted whole says which of its counts are
    incomplete); None when stopped outside the run's loop. ``deadline``: the end of the grace period
    (``time.monotonic()`` seconds), the time the run has to write what arrived; ``summary``: the
    summary.json written of what arrived (``runner.session.run``), None when none was (cut short, or
    ``unwritten`` says why: "grace", "again").
    """

    def __init__(
        self,
        signum: int,
        drained: bool,
        abandoned: int = 0,
        why: str | None = None,
        counts: Counts | None = None,
        deadline: float | None = None,
    ):
        super().__init__(f"stopped by {describe(signum)}")
        self.signum, self.drained, self.abandoned, self.why = signum, drained, abandoned, why
        self.counts, self.deadline = counts, deadline
        self.summary: object | None = None
        self.unwritten: str | None = None

    def block(self) -> dict:
        """summary.json's ``interrupted`` block: ``signal`` ("Ctrl-C" or "SIGTERM"), ``exit_code``
        (130, 143) and ``not_sent`` (the requests the run did not send: the next run sends them)."""
        not_sent = None if self.counts is None else self.counts.not_sent
        return {"signal": describe(self.signum), "exit_code": exit_code(self), "not_sent": not_sent}


class GraceOver(KeyboardInterrupt):
    """The grace period ended while a stopped run wrote what arrived (``within``)."""


def within(deadline: float, work: Callable[[], T]) -> tuple[T | None, str | None]:
    """``(work(), None)`` when it ends before ``deadline`` (``time.monotonic()`` seconds), else
    ``(None, why)``: "grace" when the deadline came first (SIGALRM raises ``GraceOver`` into it; a
    moment later when it lands inside an import, which an exception could crash), "again" when a
    second Ctrl-C or SIGTERM did (``KeyboardInterrupt``). Nothing runs when the deadline is past.
    Outside the main thread (where no alarm can be set) ``work`` runs to its end."""
    if threading.current_thread() is not threading.main_thread():
        return work(), None
    left = deadline - time.monotonic()
    if left <= 0:
        return None, "grace"

    def over(signum: int, frame: FrameType | None) -> None:
        if _importing(frame):
            signal.setitimer(signal.ITIMER_REAL, RETRY_S)
            return
        raise GraceOver

    before = signal.signal(signal.SIGALRM, over)
    try:
        signal.setitimer(signal.ITIMER_REAL, left)
        try:
            return work(), None
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except GraceOver:
        return None, "grace"
    except KeyboardInterrupt:
        return None, "again"
    finally:
        signal.signal(signal.SIGALRM, before)


def resume_message(stop: BaseException, cache_dir: object, grace_s: float) -> tuple[str, str]:
    """What ``dxi run`` prints when a signal stopped it (``stop``: ``Interrupted``, or a
    ``KeyboardInterrupt`` from outside the run's loop): ``(headline, the rest)``, e.g.
    ``("Interrupted (SIGTERM):", "the requests in flight finished and are stored; 412 request(s)
    were not sent. Every reply that arrived is in .dxi-cache; rerun the same command to
    continue.")`` (the requests not sent: ``Interrupted.counts``)."""
    rest = f"Every reply that arrived is in {cache_dir}; rerun the same command to continue."
    if not isinstance(stop, Interrupted):
        if getattr(stop, "counts", None) is not None:  # cut while scoring (runner.session.run)
            rest = (
                f"Every request had been sent and every reply that arrived is in {cache_dir} (the "
                "run's line in run-history.jsonl has what it sent and spent); the stop came while "
                "it scored or wrote its results: rerun the same command (it sends only what is "
                "missing) or dxi score."
            )
        return f"Interrupted ({describe(received())}).", rest
    head = f"Interrupted ({describe(stop.signum)}):"
    if stop.drained:
        left = "" if stop.counts is None else f"; {stop.counts.not_sent:,} request(s) were not sent"
        return head, f"the requests in flight finished and are stored{left}. {rest}"
    cut = (
        "a second signal came"
        if stop.why == "again"
        else f"they took longer than --grace {grace_s:g} s"
    )
    n, spent, incomplete = stop.abandoned, "", ""
    if stop.counts is not None:
        n, usd, unbounded = stop.counts.abandoned
        if unbounded:
            spent = ", their cost unknown, with no upper bound: nothing caps their output tokens"
        elif usd is not None:
            spent = f", at most ${usd:.4f} spent"
        if stop.counts.incomplete:
            incomplete = (
                " The rest was not all counted in time: the run's line in run-history.jsonl "
                "marks the counts that are incomplete."
            )
    if not n:
        return (
            head,
            f"{cut}, so the run stopped at once (no request was on the wire).{incomplete} {rest}",
        )
    return head, (
        f"{cut}, so {n} request(s) still in flight were abandoned: sent{spent} (their replies were "
        f"not stored; the next run sends them again).{incomplete} {rest}"
    )


def stopped_line() -> str:
    """The line of a command a signal stopped outside a run (``dxi.__main__``): "Interrupted
    (Ctrl-C).", then what the output folder holds when a scoring was writing to it
    (``runner.outputs.staging.told``: this scoring's outputs, whole, or what it held before)."""
    from .outputs import staging

    told = staging.told()
    return f"Interrupted ({describe(received())})." + (f" {told}" if told else "")


def written(stop: BaseException, out: object) -> str:
    """What ``dxi run`` adds to its resume message (``resume_message``) on the summary.json in
    ``out`` of a run a signal stopped once drained: written (partial, marked interrupted), or why
    not (the outputs there are then those of before, whole); for any other stop what ``out``
    holds when the run was writing its outputs (``runner.outputs.staging.holds``), else ""."""
    from .outputs import staging

    if not isinstance(stop, Interrupted) or not stop.drained or stop.counts is None:
        held = staging.holds(out)
        return f" {held}" if held else ""
    summary = f"{out}/summary.json"
    # written, or put in place as the second signal or the end of the grace period came (deferred
    # until they all were: ``runner.outputs.staging``)
    if stop.summary is not None or staging.written(out):
        if getattr(stop.summary, "complete", False):
            return f" Every answer is in: scored in {summary}, marked interrupted."
        return (
            f" What arrived is scored in {summary}, marked interrupted: partial, the answers not "
            "there counted missing (provisional figures, with their bounds)."
        )
    why = "a second signal came" if stop.unwritten == "again" else "the grace period ended"
    return f" {summary} was not written ({why} first): what was there is left as it was."


class Graceful:
    """Inside a run's event loop (``with Graceful(drain, grace_s, abort)`` in the task that runs
    it): the first SIGINT or SIGTERM calls ``drain(signum)`` and starts the grace period of
    ``grace_s`` seconds; a second signal, or the end of the grace period, calls ``abort()`` and
    cancels that task (``aborted``: "again" or "grace"). ``signum`` is the first signal (None: none
    came). On leaving, the handlers are those that were there before. Outside the main thread (where
    no signal handler can be set: a run started from a thread) it does nothing."""

    def __init__(
        self,
        drain: Callable[[int], None],
        grace_s: float = GRACE_S,
        abort: Callable[[], None] | None = None,
    ):
        self.drain, self.grace_s, self.abort = drain, grace_s, abort
        self.signum: int | None = None
        self.deadline: float | None = None  # the end of the grace period (time.monotonic())
        self.aborted: str | None = None
        self._task: asyncio.Task | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._installed = False
        self._before: dict[int, object] = {}

    def __enter__(self) -> Graceful:
        self._installed = threading.current_thread() is threading.main_thread()
        if not self._installed:
            return self
        loop = asyncio.get_running_loop()
        self._task = asyncio.current_task()
        self._before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
        for sig in self._before:
            loop.add_signal_handler(sig, self._on, sig)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if not self._installed:
            return
        loop = asyncio.get_running_loop()
        for sig, handler in self._before.items():
            loop.remove_signal_handler(sig)
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)

    async def settle(self) -> None:
        """Let the event loop handle a signal already delivered but not yet read (the loop learns of
        a signal through its wake-up file descriptor, on its next turn): a run whose work never
        waited on the loop (every request cached) would otherwise leave it unread when the handlers
        are removed, and finish as if no Ctrl-C had come. Call it last inside the ``with``."""
        for _ in range(4):  # a turn to read the wake-up fd, one to run the handler, and spares
            await asyncio.sleep(0)

    def _on(self, signum: int) -> None:
        if self.signum is not None:
            self._abort("again")
            return
        self.signum = signum
        self.deadline = time.monotonic() + self.grace_s
        self._timer = asyncio.get_running_loop().call_later(self.grace_s, self._abort, "grace")
        self.drain(signum)

    def _abort(self, why: str) -> None:
        if self.aborted is None and self._task is not None:
            self.aborted = why
            if self.abort is not None:
                self.abort()
            self._task.cancel()

    def interrupted(self, abandoned: int, counts: Counts | None = None) -> Interrupted:
        """What stopped the run, once it has: drained (with the run's ``counts``), or aborted with
        ``abandoned`` requests still out (``counts``: what was counted by then)."""
        assert self.signum is not None
        if self.aborted is None:
            return Interrupted(self.signum, True, counts=counts, deadline=self.deadline)
        return Interrupted(self.signum, False, abandoned, self.aborted, counts)
