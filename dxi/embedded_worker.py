"""The worker side of the embedded decision model (``dxi.adapters.embedded``): what each worker
process of its pool runs. Kept outside ``dxi.adapters`` so that a spawned worker imports
sparrow-decider, orjson and this module, not the adapters package with aiohttp (~0.1 s of CPU a
worker, at the start of every fresh run, on the cores the run itself needs: issue 14).

A worker dies with its parent, whatever ends the parent (Ctrl-C, SIGTERM, SIGKILL, the OOM killer):
a thread watches the parent's sentinel (``multiprocessing.parent_process().sentinel``, the read end
of a pipe only the parent holds open, so it reads as ended once the parent has gone, on every
platform) and ends the worker at once. Otherwise a worker whose parent was killed would wait on the
pool's queue for ever (the other workers hold that pipe open), and so would multiprocessing's
resource tracker, which ends once every process holding its pipe has. SIGINT and SIGTERM are left to
the parent (a terminal's Ctrl-C and a scheduler's SIGTERM reach the whole process group): the parent
finishes the requests in flight, then closes the pool. A worker is started with both *blocked*
(``SpawnHeld``, the context ``dxi.adapters.embedded`` gives its pool: a spawned process inherits its
parent's signal mask), so that one that comes while it starts (its interpreter, the dxi script's
module, this one) is held until ``load`` ignores both and so discards it: before, it printed a
KeyboardInterrupt traceback from an import (or dxi's "Interrupted (Ctrl-C)." line) and died, and
the run ended on a broken pool, exit 70."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from multiprocessing.connection import wait

import orjson

_decider = None  # one per worker process
_HELD = {signal.SIGINT, signal.SIGTERM}


class HeldProcess(multiprocessing.context.SpawnProcess):
    """A spawned worker process started with SIGINT and SIGTERM blocked (see the module docstring).
    The parent holds them only while it starts the process (a fork and an exec); one that comes
    meanwhile is delivered to it right after. Defined here, not in ``dxi.adapters``: the process
    object is unpickled in the worker."""

    def start(self) -> None:
        before = signal.pthread_sigmask(signal.SIG_BLOCK, _HELD)
        try:
            super().start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, before)


class SpawnHeld(multiprocessing.context.SpawnContext):
    """The "spawn" context whose processes are ``HeldProcess``es."""

    Process = HeldProcess


def _die_with_parent() -> None:
    """End this process as soon as its parent has gone (see the module docstring); nothing to watch
    when it was not started by multiprocessing."""
    parent = multiprocessing.parent_process()
    if parent is None or parent.sentinel is None:
        return

    def watch() -> None:
        wait([parent.sentinel])
        os._exit(
            1
        )  # the parent is gone: no one is left to answer (nothing of ours to flush or save)

    threading.Thread(target=watch, name="dxi-parent-watch", daemon=True).start()


def load(name: str) -> None:
    """The pool's initializer: watch the parent (die with it), leave SIGINT and SIGTERM to it
    (ignored, then no longer blocked: one held since the worker started is discarded), and load
    sparrow-decider model ``name`` once in this worker."""
    global _decider
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C and SIGTERM are the parent's to handle
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _HELD)  # held since it started: now discarded
    from sparrow_decider import Decider

    _decider = Decider.load(name)


def ask(body: bytes) -> tuple[bool, bytes | str]:
    """Answer one System One request body (UTF-8 JSON bytes): ``(True, the reply body)`` as
    ``sparrow-decider     serve`` would return it, or ``(False, why the model rejected the
    request)``."""
    payload = orjson.loads(body)
    started = time.perf_counter()
    try:
        answers = _decider.ask(payload["state"], payload["questions"])
    except (KeyError, ValueError, TypeError) as exc:
        return False, str(exc)
    return True, orjson.dumps(
        {
            "model": _decider.name,
            "answers": answers,
            "usage": {"input_tokens": 0, "output_tokens": 0},
            "latency_ms": round((time.perf_counter() - started) * 1000, 2),
        }
    )
