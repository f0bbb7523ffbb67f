"""The runner's usage error, in a module of its own so that the command line can name it without importing
what planning a run needs (Polars, the scoring, the cache): ``dxi --help`` stays fast."""
from __future__ import annotations


class PlanError(Exception):
    """Bad input from the user (flags, run file, model strings): printed without a traceback, exit code 2."""


EXIT_INTERRUPTED, EXIT_TERMINATED = 130, 143  # stopped by SIGINT (Ctrl-C), by SIGTERM: 128 + the signal's number
