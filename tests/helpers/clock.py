"""A virtual monotonic clock for the limiter's decisions (``runner.limits``), so that a timing test
checks what the limiter decided, not when a loaded machine got round to it.

``VirtualLimiter`` is a ``ProviderLimiter`` on a ``VirtualClock``: its waits (a pacer's turn, a
pause, a retry's backoff: everything that goes through ``ProviderLimiter.sleep``) advance the clock
at once instead of sleeping, and nothing else moves it, so the time a request is sent, the network
and the machine's load take no virtual time. ``tickets`` records every attempt it let through
(``Ticket.sent_at`` in virtual seconds), in order.
"""

from __future__ import annotations

import asyncio

from dxi.adapters import Limits, Request
from dxi.runner.sending.limits import ProviderLimiter, Ticket


class VirtualClock:
    """Monotonic seconds that move only when told: ``clock()`` is ``now``; ``advance(s)`` adds
    ``s``."""

    def __init__(self, now: float = 0.0):
        self.now = now

    def __call__(self) -> float:
        return self.now

    def monotonic(self) -> float:
        """``now``, for code that reads ``time.monotonic()`` (a stand-in for the ``time``
        module)."""
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class VirtualLimiter(ProviderLimiter):
    """A ProviderLimiter whose clock is ``clock`` (a VirtualClock) and whose ``sleep`` advances it
    (yielding to the event loop once, as a sleep would). ``tickets``: the attempts let through, in
    order."""

    def __init__(self, limits: Limits, clock: VirtualClock | None = None):
        self.virtual = clock or VirtualClock()
        super().__init__(limits, clock=self.virtual)
        self.tickets: list[Ticket] = []

    async def sleep(self, seconds: float) -> None:
        if self.ending or seconds <= 0:
            return
        self.virtual.advance(seconds)
        await asyncio.sleep(0)

    async def acquire(self, request: Request) -> Ticket:
        ticket = await super().acquire(request)
        self.tickets.append(ticket)
        return ticket
