"""The ``dxi`` command (``python -m dxi`` too): signals taken first, then the command line.

This module imports nothing heavy, so that a Ctrl-C (or SIGTERM) that comes while the command line
and what it needs are still being imported stops ``dxi`` as one anywhere else does: one line, exit
130 (143), no traceback from inside an import: the first thing it does, before importing anything
else, is to make SIGINT and SIGTERM end the process at once with that line (``_early``); ``command``
then hands them to ``runner.signals``, which stops cleanly.

Before this module runs nothing of dxi's can act, so the ``dxi`` script ``make install`` writes
starts the interpreter with SIGINT and SIGTERM blocked (``env --block-signal``, GNU coreutils 9 and
later): one that comes while Python starts (its frozen modules, ``site``, the editable install's
finder: the first ~30 ms) is held until this module has installed ``_early`` and unblocks them. Only
one that comes before ``env`` has blocked them ends the process by the signal itself (no output; a
shell reports 130, or 143). Installed otherwise (pip, uv, an ``env`` without ``--block-signal``), a
signal while ``site`` runs may still end the interpreter with its own traceback.

A worker process multiprocessing spawns (the embedded model's) imports this module too, as it runs
the script as ``__mp_main__``: there nothing of this is done, its signals being held from its start
and then ignored (``dxi.embedded_worker``), so a Ctrl-C to the process group is ``dxi``'s alone."""

from __future__ import annotations

import os
import signal
import sys


def _early(signum: int, frame: object) -> None:
    """SIGINT or SIGTERM while ``dxi`` is still importing its command line: nothing is planned, sent
    or written yet, so one line on standard error and exit 130 (143 for SIGTERM) at once."""
    name = "Ctrl-C" if signum == signal.SIGINT else "SIGTERM"
    os.write(2, f"Interrupted ({name}).\n".encode())
    os._exit(128 + signum)


# a worker process multiprocessing spawned (the embedded model's) runs the `dxi` script as
# ``__mp_main__``, so imports this module too: its signals are not dxi's to act on but its
# initializer's to ignore (dxi.embedded_worker.load), held until then, as it was started with them
if "__mp_main__" not in sys.modules:
    for _signum in (
        signal.SIGINT,
        signal.SIGTERM,
    ):  # an ignored SIGINT (a script's background job) taken back too
        signal.signal(_signum, _early)
    # the `dxi` script make install writes starts Python with both blocked (GNU env's
    # --block-signal): a signal that came while the interpreter started (its own modules, site,
    # the editable install's finder) was held, and is delivered now, to _early: one line and 130
    # (143), never a traceback
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})


def command() -> None:
    """The ``dxi`` command: ``runner.signals.take_signals``, ``runner.cli.main`` on ``sys.argv``,
    then exit without tearing the interpreter down.

    A ``KeyboardInterrupt`` (Ctrl-C, or SIGTERM) that reaches here, from an import, planning or
    scoring (``dxi run`` handles its own during the run), prints "Interrupted." on standard error
    and exits 130 (SIGINT) or 143 (SIGTERM). Once the command has returned its exit code (``main``'s
    ``decided``), its work is done: a signal that comes later ends the process at once with that
    code, no line, no traceback (``runner.signals.exit_at_once``; one raised where Python cannot
    raise it, a weakref callback as the command's objects are freed, is delivered again:
    ``runner.signals._unraisable``). Once ``main`` has returned, every output is written and
    the cache is closed; the exit handlers run (logging's flush, the thread pools' joins) after the
    other threads have ended, standard output and error are flushed, and the process ends with
    ``os._exit``: freeing every module and object one by one (Polars, PyArrow, the frames) would
    take ~60 ms of the tail after the last reply, for nothing (issue 14). An unexpected error
    outside ``main`` (``main`` handles its own) prints one line, writes its trace to a file
    (``runner.crash``) and exits 70."""
    from dxi.runner import signals  # a signal until take_signals: _early, one line and exit at once

    try:
        signals.take_signals()
        from dxi.runner.cli import main

        code = main(decided=signals.exit_at_once)  # from its code on, a signal changes nothing
    except SystemExit as exc:  # argparse's --help and usage errors
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
    except KeyboardInterrupt:  # with what the output folder holds, if a scoring was writing it
        code = signals.exit_code()
        print(signals.stopped_line(), file=sys.stderr)
    except Exception as exc:  # noqa: BLE001 (a bug outside main: one line, the trace in a file)
        from dxi.runner.crash import report
        from dxi.runner.errors import EXIT_SOFTWARE

        print(f"error: {report(exc)}", file=sys.stderr)
        code = EXIT_SOFTWARE
    import atexit
    import threading

    signals.exit_at_once(
        code
    )  # from here a signal ends dxi at once, with code: nothing is left to save
    # the interpreter's own exit sequence, less the teardown: the thread pools are told to stop and
    # every non-daemon thread is joined (threading._shutdown), then the exit handlers run
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
