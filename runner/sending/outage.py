"""A provider that cannot be reached: paused and probed, one request at a time, instead of every
request spending its retries on a server that is down.

A server that dies mid-run turns every attempt into a connection refused
(``adapters.errors.Unreachable``): retried each on its own, every remaining request would use up its
attempts within seconds and be stored as a transient failure, to be sent again by the next run.
Instead, per provider (``ProviderLimiter.outage``):

* **Down**: after ``THRESHOLD`` attempts in a row could not connect, with no reply between, the
  provider is down: no attempt of it is sent, except one **probe** at a time (a request waiting for
  the provider, sent as usual). The first probe goes after ``Limits.backoff_s``, each failed one
  doubles the wait before the next, up to ``Limits.max_wait_s`` (as a retry's backoff, without
  jitter: only one attempt is out).
* An attempt that cannot connect while the provider is down is not one of its request's retries
  (``runner.sending.retry``): the request waits for the provider and goes again, its retry budget
  intact (its ``attempts`` count every attempt made, and ``retry_waits_s`` the waits).
* **Back**: the first reply (any HTTP status) ends the outage; every waiting request goes on, within
  the provider's window and rates as usual.
* **Gone**: once the provider has been down for longer than the run's patience,
  ``Limits.max_stated_wait_s`` (``--max-stated-wait``, default 600 s: the longest the run waits on a
  provider, whether it states the wait or is silent), the provider is stopped (``ProviderStop``,
  cause ``UNREACHABLE``; ``runner.sending.stops``): its requests not sent get no row and the next
  run sends them, the other providers go on, and the run ends with exit code 6.

Each process keeps its own (with ``--coordinator`` too): the outage is what this process can reach.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from dxi.adapters import Limits, ProviderStop
from dxi.adapters.errors import UNREACHABLE

log = logging.getLogger("dxi.outage")

THRESHOLD = (
    3  # attempts in a row that could not connect, with no reply between: the provider is down
)


class Outage:
    """The reachability of one provider (see the module docstring). Per attempt:
    ``probe = await turn()`` before it is sent (True: it is the probe), then exactly one
    ``record(probe, reached, error)``.

    ``halt`` stops the provider (``ProviderLimiter.halt``) once its patience runs out; ``ending``
    says the provider is stopped or the run is stopping (every wait then ends). Counters for
    reports: ``outages`` (times the provider went down), ``probes`` (probes sent), ``down_s``
    (seconds down, outages ended)."""

    def __init__(
        self, limits: Limits, halt: Callable[[ProviderStop], None], ending: Callable[[], bool]
    ):
        self.backoff_s, self.max_wait_s = (
            max(limits.backoff_s, 0.001),
            max(limits.max_wait_s, 0.001),
        )
        self.patience_s = limits.max_stated_wait_s
        self._halt, self._ending = halt, ending
        self.failures = 0  # attempts in a row that could not connect, since the last reply
        self.since: float | None = None  # monotonic start of the current outage (None: up)
        self.probing = False
        self.next_probe = 0.0
        self.delay = self.backoff_s
        self.outages = self.probes = 0
        self.down_s = 0.0
        self.last_error = ""
        self._changed: asyncio.Event | None = None

    @property
    def down(self) -> bool:
        return self.since is not None

    def wake(self) -> None:
        """Let every waiting attempt look again (the provider came back, a probe ended, it was
        stopped)."""
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    async def turn(self) -> bool:
        """Wait while the provider is down, until this attempt may go: False when the provider is up
        (or stopped, or the run stopping: the attempt checks that itself), True when this attempt is
        the probe."""
        while self.since is not None and not self._ending():
            now = time.monotonic()
            if now - self.since >= self.patience_s:
                self._give_up(now)
                continue
            if not self.probing and now >= self.next_probe:
                self.probing = True
                self.probes += 1
                return True
            until = (
                self.since + self.patience_s
                if self.probing
                else min(self.next_probe, self.since + self.patience_s)
            )
            if self._changed is None:
                self._changed = asyncio.Event()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), max(0.0, until - now))
        return False

    def record(self, probe: bool, reached: bool | None, error: object = None) -> None:
        """How an attempt ended: ``reached`` True (the server answered, whatever the status), False
        (no connection: ``Unreachable``, ``error`` its message), None (neither: not sent, or a
        connection that opened and then failed). ``probe``: it was the probe (``turn`` returned
        True)."""
        now = time.monotonic()
        if probe:
            self.probing = False
        if reached:
            self.failures = 0
            if self.since is not None:
                log.warning(
                    "the provider answers again after %.0f s without a connection: sending resumed (it was: %s)",
                    now - self.since,
                    self.last_error,
                )
                self.down_s += now - self.since
                self.since, self.delay = None, self.backoff_s
                self.wake()
            return
        if reached is None:
            if probe:
                self.wake()  # the next probe may go (at its time)
            return
        self.failures += 1
        self.last_error = str(error)
        if self.since is None:
            if self.failures >= THRESHOLD:
                self.since, self.delay, self.next_probe = now, self.backoff_s, now + self.backoff_s
                self.outages += 1
                log.warning(
                    "%s (%d attempts in a row): the provider is paused and probed one request at a time, "
                    "for up to %g s (--max-stated-wait)",
                    self.last_error,
                    self.failures,
                    self.patience_s,
                )
            return
        if probe:
            self.delay = min(2 * self.delay, self.max_wait_s)
            self.next_probe = now + self.delay
            if now - self.since >= self.patience_s:
                self._give_up(now)
        self.wake()

    def _give_up(self, now: float) -> None:
        """The provider has been down longer than the run's patience: stop it."""
        down = now - self.since
        self.down_s += down
        self.since = None
        self._halt(
            ProviderStop(
                f"no connection for {down:.0f} s ({self.probes} probe(s), backing off up to "
                f"{self.max_wait_s:g} s; --max-stated-wait {self.patience_s:g} s): {self.last_error}",
                UNREACHABLE,
            )
        )
        self.wake()
