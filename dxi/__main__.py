"""The ``dxi`` command (``python -m dxi`` too): signals taken first, then the command line.

This module imports nothing heavy, so that a Ctrl-C (or SIGTERM) that comes while the command line and
what it needs are still being imported stops ``dxi`` as one anywhere else does: one line, exit 130 (143),
no traceback from inside an import."""
from __future__ import annotations

import sys


def command() -> None:
    """The ``dxi`` command: ``runner.signals.take_signals``, ``runner.cli.main`` on ``sys.argv``, then exit
    without tearing the interpreter down.

    A ``KeyboardInterrupt`` (Ctrl-C, or SIGTERM) that reaches here, from an import, planning or scoring
    (``dxi run`` handles its own during the run), prints "Interrupted." on standard error and exits 130
    (SIGINT) or 143 (SIGTERM). Once ``main`` has returned, every output is written and the cache is
    closed; the exit handlers run (logging's flush, the thread pools' joins) after the other threads have
    ended, standard output and error are flushed, and the process ends with ``os._exit``: freeing every
    module and object one by one (Polars, PyArrow, the frames) would take ~60 ms of the tail after the last
    reply, for nothing (issue 14)."""
    import os

    from dxi.runner import signals

    signals.take_signals()
    try:
        from dxi.runner.cli import main

        code = main()
    except SystemExit as exc:  # argparse's --help and usage errors
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
    except KeyboardInterrupt:
        code = signals.exit_code()
        print(f"Interrupted ({signals.describe(signals.received())}).", file=sys.stderr)
    import atexit
    import threading

    signals.exit_at_once(code)  # from here a signal ends dxi at once: nothing is left to save
    # the interpreter's own exit sequence, less the teardown: the thread pools are told to stop and every
    # non-daemon thread is joined (threading._shutdown), then the exit handlers run
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None:
        shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more can be written anyway
            code = code or 1
    os._exit(code)


if __name__ == "__main__":
    command()
