"""Per-provider limits: requests per minute, tokens per minute and requests in flight, adapted to
429s.

One ``ProviderLimiter`` exists per limits key (``ModelRun.limits_key``); every model on that
provider shares it. It holds four things:

* **Admission slots** (``slots``, ``Limits.max_in_flight``): a request takes one before it is queued
  and gives it back once its row is in the cache, so the queue, and memory, stay O(concurrency), and
  a provider that is backed up never holds the workers another provider could use.
* **The attempt window** (``window``, adaptive, 1 to ``max_in_flight``): each HTTP attempt holds a
  place while it is on the wire.
* **Pacers** for requests and tokens per minute: each attempt reserves the next free instant at the
  current rate (virtual scheduling, as in GCRA) and sleeps until it: no polling, no burst above the
  rate, first come first served. Requests are also spaced as they go (``Pacer.release``): when the
  event loop was held up past several turns (a process descheduled on a loaded machine), the
  attempts whose turns passed meanwhile go one interval apart, not together. The token cost of an
  attempt is estimated before sending (``runner.planning.tokens.TokenEstimate``: request bytes / 4,
  times a ratio learned from the usage replies report, plus the mean output so far) and corrected
  once the reply's usage is known.
* **A shared pause**: a 429's ``Retry-After`` (or reset header) holds every attempt of the provider,
  for exactly the stated wait up to ``Limits.max_stated_wait_s``.
* **A stop** (``halt``): once the provider is stopped (``runner.sending.stops``), every wait ends
  and nothing more is sent to it; the same once the whole run is stopping (``close``:
  ``runner.sending.stops.RunStop``).
* **An outage** (``outage``, ``runner.sending.outage``): a provider that cannot be reached is paused
  and probed one request at a time, and stopped once it has been down longer than
  ``Limits.max_stated_wait_s``.

Adaptation (AIMD, as in TCP congestion control): a 429 for an attempt sent after the last decrease
multiplies the window and both rates by ``BACKOFF`` = 0.7 (so the 429s of one burst count once);
each success widens the window by 1/window (about one place per round trip), and the rates climb
back linearly to their ceilings over ``RECOVERY_S``. (With 0.7 rather than TCP Reno's 0.5, random
429s at 10% settle the window near 6 rather than 4 attempts.) When a 429's headers state the
provider's own limit (``x-ratelimit-limit-requests`` / ``-tokens``), that becomes the ceiling
instead. After a pause, the waiting attempts leave one by one at the (reduced) rate and within the
(narrowed) window, so a 429 storm does not turn into a retry storm.

asyncio-throttle, which the design card names, counts requests in a sliding window (as the runner
used it: rpm/60 requests let out together each second), polling every few milliseconds. It cannot
budget tokens, change its rate or pause, so the pacer here replaces it; the rate-limited benchmark
(``benchmarks/bench_runner.py``) still runs it side by side as the baseline for requests per minute.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass

from dxi.adapters import AdapterError, Limits, ProviderStop, RateLimited, Request

from ..planning.tokens import TokenEstimate
from .outage import Outage

BACKOFF = 0.7  # a 429 multiplies the window and the rates by this (as TCP CUBIC's beta)
RECOVERY_S = 30.0  # seconds for a reduced rate to climb back to its ceiling
MIN_FRACTION = 1 / 64  # a rate is never cut below this fraction of its ceiling
JITTER_S = 0.005  # a timer's lateness: a request may go this much before its spaced instant


class Pacer:
    """Spaces units (requests, tokens) evenly at ``rate`` units per second.

    ``reserve(cost)`` books the next ``cost`` units and returns the seconds to wait before using
    them; ``release(cost)``, once that wait is over, says whether they may go now (0) or how long
    after the units that went before them; ``correct(delta)`` books ``delta`` more units (or gives
    them back, when negative) once the real cost is known; ``hold_until(t)`` lets nothing start
    before monotonic time ``t``. ``clock``: the monotonic clock in seconds (default
    ``time.monotonic``; tests pass a fake one).
    """

    __slots__ = ("rate", "_next", "_free", "clock")

    def __init__(self, rate: float, clock: Callable[[], float] | None = None):
        self.rate = rate
        self._next = 0.0
        self._free = 0.0  # the next units' instant: the last ones' release, spaced (``release``)
        self.clock = clock or time.monotonic

    def reserve(self, cost: float = 1.0) -> float:
        now = self.clock()
        start = max(self._next, now)
        self._next = start + cost / self.rate
        return start - now

    def release(self, cost: float = 1.0) -> float:
        """0 when ``cost`` units whose reserved instant has come may go now (counted gone: the
        next units' instant is ``cost / rate`` after theirs, or after now when they go late), else
        the seconds still to wait; a unit may go up to ``JITTER_S`` before its instant (a timer
        fires a little late or early), never more, so the units never go faster than ``rate`` on
        average (GCRA's theoretical arrival time, with that tolerance). The reservations alone
        space the instants; the units go when the event loop wakes their waiters, and a loop held
        up past several instants (a process descheduled under load) wakes those waiters together:
        sent at once, they are a burst a provider's limiter refuses (a 429, and an attempt more).
        Released here, they go an interval apart."""
        now = self.clock()
        if now < self._free - JITTER_S:
            return self._free - JITTER_S - now
        self._free = max(self._free, now) + cost / self.rate
        return 0.0

    def correct(self, delta: float) -> None:
        self._next += delta / self.rate

    def hold_until(self, t: float) -> None:
        self._next = max(self._next, t)


class AdaptiveRate:
    """One rate (requests or tokens per second) that is cut on congestion and recovers linearly.

    ``ceiling`` is units per second (None: unlimited, no pacing, until a 429 states a limit);
    ``clock`` as ``Pacer``'s.
    """

    def __init__(self, per_minute: float | None, clock: Callable[[], float] | None = None):
        self.clock = clock or time.monotonic
        self.ceiling = per_minute / 60 if per_minute else None
        self.pacer = Pacer(self.ceiling, self.clock) if self.ceiling else None
        self._low, self._since = self.ceiling, 0.0

    @property
    def rate(self) -> float | None:
        """The current rate in units per second (None when unlimited)."""
        return self.pacer.rate if self.pacer else None

    def _recover(self, now: float) -> None:
        p = self.pacer
        if p is not None and p.rate < self.ceiling:
            p.rate = min(self.ceiling, self._low + self.ceiling * (now - self._since) / RECOVERY_S)

    def wait(self, cost: float) -> float:
        """Reserve ``cost`` units; seconds to wait before using them."""
        if self.pacer is None:
            return 0.0
        self._recover(self.clock())
        return self.pacer.reserve(cost)

    def release(self, cost: float = 1.0) -> float:
        """``Pacer.release``: 0 (the units go now) or the seconds still to wait; 0 when
        unlimited."""
        return 0.0 if self.pacer is None else self.pacer.release(cost)

    def decrease(self, now: float) -> None:
        """Cut the current rate by ``BACKOFF`` (not below ``MIN_FRACTION`` of the ceiling)."""
        if self.pacer is None:
            return
        self._recover(now)
        self._low = max(self.ceiling * MIN_FRACTION, self.pacer.rate * BACKOFF)
        self._since = now
        self.pacer.rate = self._low

    def learn(self, per_minute: float, now: float) -> bool:
        """Take a limit the provider stated as the ceiling, when it is lower than the current one
        (or there was none). Returns whether it changed anything."""
        rate = per_minute / 60
        if self.ceiling is not None and rate >= self.ceiling:
            return False
        self.ceiling = rate
        if self.pacer is None:
            self.pacer = Pacer(rate, self.clock)
        else:
            self.pacer.rate = min(self.pacer.rate, rate)
        self._low, self._since = self.pacer.rate, now
        return True


class Window:
    """A counting semaphore whose size can change while it is in use: at most ``int(size)`` holders
    (never fewer than one place). Waiters are served first come, first served."""

    def __init__(self, size: float):
        self.size = max(1.0, float(size))
        self.held = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    async def acquire(self) -> None:
        if self.held < int(self.size) and not self._waiters:
            self.held += 1
            return
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await fut  # the place is counted in ``held`` by whoever woke us
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release()  # woken and cancelled at once: pass the place on
            raise

    def release(self) -> None:
        self.held -= 1
        self._wake()

    def resize(self, size: float) -> None:
        self.size = max(1.0, size)
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self.held < int(self.size):
            fut = self._waiters.popleft()
            if not fut.done():
                self.held += 1
                fut.set_result(None)


@dataclass(slots=True)
class Ticket:
    """One attempt's booking: when it was let through (monotonic seconds) and the tokens
    reserved."""

    sent_at: float
    body_bytes: int
    tokens: float


class ProviderLimiter:
    """The limits of one provider (see the module docstring). Per attempt: ``ticket = await
    acquire(request)``, then exactly one ``finish(ticket, ...)``.

    Counters for reports: ``rate_limited`` (429s heard), ``decreases`` (times the window and rates
    were cut), ``paused_s`` (total seconds the provider was paused), ``replies`` (attempts that got
    a reply).

    ``clock`` is the monotonic clock (seconds) its decisions read: default ``time.monotonic``; a
    test passes a fake one, and overrides ``sleep`` to advance it, to check the decisions whatever
    the load.
    """

    def __init__(self, limits: Limits, clock: Callable[[], float] | None = None):
        self.limits = limits
        self.clock = clock or time.monotonic
        self.slots = asyncio.Semaphore(max(1, limits.max_in_flight))
        self.window = Window(max(1, limits.max_in_flight))
        self.requests = AdaptiveRate(limits.rpm, self.clock)
        self.tokens = AdaptiveRate(limits.tpm, self.clock)
        self.estimate = TokenEstimate()
        self._paused_until = 0.0
        self._decreased_at = float("-inf")
        self.rate_limited = self.decreases = self.replies = 0
        self.paused_s = 0.0
        self.halted: ProviderStop | None = None
        """Set once the provider is stopped (``runner.sending.stops``): no attempt is sent to it any
        more."""
        self.halted_at: float | None = None  # Unix time of the stop
        self.closed = False
        """Set once the run is stopping (``runner.sending.stops.RunStop``): no attempt is sent any
        more."""
        self._halt: asyncio.Event | None = None
        self.outage = Outage(limits, self.halt, lambda: self.ending)
        self.stopped_models: dict[str, tuple[ProviderStop, float]] = {}
        """Models stopped alone (``ProviderStop.scope`` "model": label -> (the stop, Unix time);
        ``runner.sending.stops``); the provider's other models go on."""
        self.model_replies: Counter[str] = (
            Counter()
        )  # attempts that got a reply, per model label (``runner.sending.retry``)

    def halt_model(self, label: str, error: ProviderStop) -> None:
        """Stop the model ``label`` alone (its first stop is kept): its attempts check
        ``stop_for``."""
        self.stopped_models.setdefault(label, (error, time.time()))

    def stop_for(self, label: str) -> ProviderStop | None:
        """What stops an attempt of the model ``label``: the provider's stop, else the model's own;
        None: neither."""
        if self.halted is not None:
            return self.halted
        stopped = self.stopped_models.get(label)
        return stopped[0] if stopped else None

    def halt(self, error: ProviderStop) -> None:
        """Stop the provider: the first ``error`` is kept; every wait of this limiter (a pause, a
        pacer's turn, a retry's backoff through ``sleep``) ends at once, and the attempts check
        ``halted``."""
        if self.halted is not None:
            return
        self.halted, self.halted_at = error, time.time()
        if self._halt is not None:
            self._halt.set()
        self.outage.wake()

    def close(self) -> None:
        """Send nothing more: the run is stopping (``runner.sending.stops.RunStop``). Every wait of
        this limiter ends at once, as on a ``halt``, and the attempts check ``closed``."""
        self.closed = True
        if self._halt is not None:
            self._halt.set()
        self.outage.wake()

    @property
    def ending(self) -> bool:
        """Whether nothing more is to be sent: the provider stopped (``halted``) or the run is
        stopping (``closed``)."""
        return self.halted is not None or self.closed

    async def sleep(self, seconds: float) -> None:
        """Sleep ``seconds``, or less if the provider is stopped, or the run stops, meanwhile
        (tenacity's sleep for retries)."""
        if self.ending or seconds <= 0:
            return
        if self._halt is None:
            self._halt = asyncio.Event()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._halt.wait(), seconds)

    def pause(self, seconds: float) -> None:
        """Hold every attempt of this provider for ``seconds`` from now."""
        now = self.clock()
        until = now + seconds
        if until > self._paused_until:
            self.paused_s += until - max(now, self._paused_until)
            self._paused_until = until
            for rate in (self.requests, self.tokens):
                if rate.pacer is not None:
                    rate.pacer.hold_until(until)

    async def _unpaused(self) -> None:
        while (delay := self._paused_until - self.clock()) > 0 and not self.ending:
            await self.sleep(delay)

    async def acquire(self, request: Request) -> Ticket:
        """Wait until one more attempt of ``request`` may be sent: no pause, a place in the window,
        and its turn at the request and token rates."""
        await self._unpaused()
        await self.window.acquire()
        size = len(request.body)
        cost = 0.0
        try:
            while True:
                cost = self.estimate(size) if self.tokens.pacer is not None else 0.0
                delay = max(self.requests.wait(1.0), self.tokens.wait(cost))
                if delay > 0:
                    await self.sleep(delay)
                # its turn came: it goes an interval after the request before it went, not at once
                # with the others whose turns came while the event loop was held up
                while (
                    not self.ending
                    and self._paused_until <= self.clock()
                    and (spaced := self.requests.release()) > 0
                ):
                    await self.sleep(spaced)
                if self._paused_until <= self.clock() or self.ending:
                    break
                await (
                    self._unpaused()
                )  # a 429 came in while we waited our turn: book again after it
        except BaseException:
            self.window.release()
            raise
        return Ticket(self.clock(), size, cost)

    def finish(
        self,
        ticket: Ticket,
        ok: bool,
        error: AdapterError | None = None,
        input_tokens: int | None = None,
        output_tokens: int | None = None,
    ) -> None:
        """Record how an attempt ended: ``ok`` (a reply was decoded; its usage corrects the token
        booking and the estimate, and widens the window), a RateLimited ``error`` (slow down,
        pause), or anything else (no change). Always gives the window place back."""
        self.window.release()
        if ok:
            self.replies += 1
            w = self.window
            if w.size < self.limits.max_in_flight:
                w.resize(min(float(self.limits.max_in_flight), w.size + 1 / w.size))
            if input_tokens is not None:
                if self.tokens.pacer is not None:
                    self.tokens.pacer.correct(input_tokens + (output_tokens or 0) - ticket.tokens)
                self.estimate.observe(ticket.body_bytes, input_tokens, output_tokens)
            return
        if not isinstance(error, RateLimited):
            return
        self.rate_limited += 1
        now = self.clock()
        learned = False
        if error.rpm:
            learned |= self.requests.learn(error.rpm, now)
        if error.tpm:
            learned |= self.tokens.learn(error.tpm, now)
        if (
            ticket.sent_at >= self._decreased_at
        ):  # sent after the last decrease: a new round of 429s
            self._decreased_at = now
            if not learned:  # a stated limit explains the 429: the new ceiling is the whole answer
                self.decreases += 1
                self.window.resize(self.window.size * BACKOFF)
                self.requests.decrease(now)
                self.tokens.decrease(now)
        if error.retry_after is not None and error.retry_after <= self.limits.max_stated_wait_s:
            self.pause(
                error.retry_after
            )  # honoured exactly; a longer stated wait stops the provider instead
