"""The runner's usage error and its exit codes, in a module of its own so that the command line can name them
without importing what planning a run needs (Polars, the scoring, the cache): ``dxi --help`` stays fast.
``dxi --help`` lists the exit codes (``runner.commands.options.EXIT_CODES``)."""
from __future__ import annotations


class UsageError(Exception):
    """Bad input from the user (flags, run file, model strings, data): the command line prints it without a
    traceback and exits with ``EXIT_USAGE`` (2); nothing has been sent."""


EXIT_FAILED_REQUESTS = 1  # done, but provisional: answers failed or are missing (left out)
EXIT_USAGE = 2  # bad input (UsageError, a dataset error, argparse's own)
EXIT_COST_BOUND = 3  # stopped at the cost bound
EXIT_CACHE_WRITE = 4  # the cache could not be written
EXIT_UPLOAD = 5  # done, but shards could not be uploaded to the remote cache (runner.distributed)
EXIT_PROVIDER_STOPPED = 6  # a provider (or a model alone) was stopped; the others went on
EXIT_INTERRUPTED, EXIT_TERMINATED = 130, 143  # stopped by SIGINT (Ctrl-C), by SIGTERM: 128 + the signal's number
