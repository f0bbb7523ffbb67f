"""The runner's command errors and its exit codes, in a module of its own so that the command line
can name them without importing what planning a run needs (Polars, the scoring, the cache):
``dxi --help`` stays fast. ``dxi --help`` lists the exit codes
(``runner.commands.options.EXIT_CODES``)."""

from __future__ import annotations

import sys

EXIT_FAILED_REQUESTS = 1  # done, but provisional: answers failed or are missing (left out)
EXIT_USAGE = 2  # bad input (UsageError, a dataset error, argparse's own)
EXIT_COST_BOUND = 3  # stopped at the cost bound
EXIT_CACHE_WRITE = 4  # the cache could not be written
EXIT_UPLOAD = (
    5  # done, but shards could not be uploaded to the remote cache (runner.distributed.setup)
)
EXIT_PROVIDER_STOPPED = 6  # a provider (or a model alone) was stopped; the others went on
EXIT_SOFTWARE = 70  # an unexpected error (a bug): one line, the full trace in a file (runner.crash); sysexits' EX_SOFTWARE
EXIT_INTERRUPTED, EXIT_TERMINATED = (
    130,
    143,
)  # stopped by SIGINT (Ctrl-C), by SIGTERM: 128 + the signal's number


class CommandError(Exception):
    """An error the command line prints as one line (``error: MESSAGE``, no traceback) before
    exiting with ``exit_code``; raised before anything is sent or written."""

    exit_code = EXIT_USAGE


class UsageError(CommandError):
    """Bad input from the user (flags, run file, model strings, data, an output path that cannot be
    written): the command line prints it without a traceback and exits with ``EXIT_USAGE`` (2);
    nothing has been sent."""


class CacheFolderError(CommandError):
    """The cache folder cannot be written (read-only, no permission, no room): checked before the
    first request (``runner.planning.paths.cache_folder``); exit code ``EXIT_CACHE_WRITE`` (4), as a
    cache write that fails during a run."""

    exit_code = EXIT_CACHE_WRITE


def cache_refusals() -> tuple[type[Exception], ...]:
    """What the cache refuses to read, which the command line reports as bad input (exit code 2): a
    shard of a layout this version does not know (``cache.layout.UnknownLayout``, naming the file
    and what to do). Only a command that read the cache (so imported its layouts) can raise it:
    nothing is imported here."""
    layout = sys.modules.get("dxi.cache.layout")
    return (layout.UnknownLayout,) if layout is not None else ()
