"""The numbers a user gives (``dxi`` flags, a run file's limits): each one's kind and range, in one
place, so that ``--max-in-flight 0``, ``--timeout nan``, ``--tpm -1`` or a value too large to store
is refused when the command line is parsed (argparse's usage error, exit code 2) or the run file
read, never by a hang, a circuit breaker that never gives up, or a traceback (issue 32).

A ``Number`` is an argparse ``type``: ``p.add_argument("--rpm", type=RPM)``. Every numeric flag of
``dxi`` takes one (``tests/test_cli_numbers.py`` checks that no flag takes a bare ``int`` or
``float``).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Number:
    """A number in ``[low, high]`` (``low`` excluded when ``above``): ``kind`` ``int`` or ``float``
    (a float is never NaN nor infinite); ``unit`` names it in messages ("seconds", "USD", "tokens
    per minute")."""

    kind: type
    low: float
    high: float
    above: bool = False
    unit: str = ""

    @property
    def __name__(self) -> str:  # argparse names the type in its messages ("invalid Number value")
        return "number"

    def check(self, value: object) -> int | float:
        """``value`` (a string as typed, or a run file's number) as ``kind``; ValueError saying what
        is expected when it is not a number, not finite, or out of range."""
        expected = self.expected()
        if isinstance(value, bool) or (isinstance(value, str) and "_" in value):
            # (Python reads "1_0" as 10: a digit grouping no user means in a bound or a price)
            raise ValueError(f"expected {expected}, got {value!r}")
        try:
            number = self.kind(value.strip() if isinstance(value, str) else value)
        except (TypeError, ValueError, OverflowError):
            raise ValueError(f"expected {expected}, got {value!r}") from None
        if self.kind is int and isinstance(value, float) and value != number:
            raise ValueError(f"expected {expected}, got {value!r}")
        if self.kind is float and not math.isfinite(number):
            raise ValueError(f"expected {expected}, got {value!r}")
        if number < self.low or (self.above and number == self.low) or number > self.high:
            raise ValueError(f"expected {expected}, got {value!r}")
        return number

    def __call__(self, text: str) -> int | float:
        try:
            return self.check(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    def accepts(self, value: object) -> bool:
        """Whether ``check`` takes ``value``."""
        try:
            self.check(value)
        except ValueError:
            return False
        return True

    def expected(self) -> str:
        """What is expected, e.g. ``a whole number from 1 to 100,000`` or ``a number above 0 and at
        most 86,400 (seconds)``."""
        what = "a whole number" if self.kind is int else "a number"
        low, high = (
            f"{int(v):,}" if float(v).is_integer() else f"{v:g}" for v in (self.low, self.high)
        )
        span = f"above {low} and at most {high}" if self.above else f"from {low} to {high}"
        return f"{what} {span}" + (f" ({self.unit})" if self.unit else "")


DAY_S = 86_400.0
WEEK_S = 7 * DAY_S

MAX_IN_FLIGHT = Number(int, 1, 100_000, unit="requests at once")
RPM = Number(float, 0, 1e9, above=True, unit="requests per minute")
TPM = Number(float, 0, 1e12, above=True, unit="tokens per minute")
TIMEOUT = Number(float, 0, DAY_S, above=True, unit="seconds")
MAX_REPLY_TIME = Number(float, 0, WEEK_S, above=True, unit="seconds")
MAX_ATTEMPTS = Number(int, 1, 1_000)
BACKOFF = Number(float, 0, 3_600, unit="seconds")
MAX_STATED_WAIT = Number(float, 0, WEEK_S, above=True, unit="seconds")
MAX_REPLY_BYTES = Number(int, 1, 1 << 40, unit="bytes")
MAX_COST = Number(float, 0, 1e9, unit="USD")
PRICE = Number(float, 0, 1e6, unit="USD per million tokens")
GRACE = Number(float, 0, 3_600, unit="seconds")
EPOCHS = Number(int, 1, 1_000)
TASKS = Number(int, 1, 1_000_000_000, unit="tasks")  # --limit, --sample
SEED = Number(int, 0, 2**63 - 1)
POLL = Number(float, 0, DAY_S, above=True, unit="seconds")
BATCH_SIZE = Number(int, 1, 10_000_000, unit="requests")
ENQUEUED_TOKENS = Number(int, 1, 10**12, unit="tokens")
UPLOAD_EVERY = Number(float, 0, DAY_S, above=True, unit="seconds")
PORT = Number(int, 0, 65_535)
TARGET_ROWS = Number(int, 1, 10**10, unit="rows")
POINTS = Number(
    float, 0, 100, above=True, unit="index points"
)  # dxi plan --precision, --difference
TOLERANCE = Number(float, 0, 100, unit="index points")  # dxi plan --tolerance
RUNS = Number(int, 1, 100_000, unit="simulated runs")  # dxi plan --runs

RUN_FILE_LIMITS = {
    "rpm": RPM,
    "tpm": TPM,
    "max_in_flight": MAX_IN_FLIGHT,
    "max_attempts": MAX_ATTEMPTS,
    "attempt_timeout_s": TIMEOUT,
    "max_stated_wait_s": MAX_STATED_WAIT,
    "max_reply_time_s": MAX_REPLY_TIME,
    "max_reply_bytes": MAX_REPLY_BYTES,
    "batch_max_requests": BATCH_SIZE,
    "batch_enqueued_tokens": ENQUEUED_TOKENS,
}
"""A run file's ``[providers.NAME]`` numbers and their ranges: those of the flags that override
them."""
