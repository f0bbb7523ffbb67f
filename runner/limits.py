"""Per-provider limits: in-flight slots, requests per minute, and a shared pause after a 429.

One ``ProviderLimiter`` exists per provider key (``Adapter.provider``); every model on that provider
shares it. Requests per minute use asyncio-throttle, configured as small bursts spread evenly over the
minute (``burst`` requests every ``60 × burst / rpm`` seconds) rather than one burst of ``rpm`` at the
start of each minute. A 429 pauses every request of the provider until its Retry-After has passed, so a
429 storm does not become a retry storm.
"""
from __future__ import annotations

import asyncio
import math
import time

from asyncio_throttle import Throttler

from adapters import Limits


class ProviderLimiter:
    """``slots`` bounds requests in flight (acquired for a request's whole life, retries included);
    ``turn()`` waits for the shared pause and the rate limit before each attempt."""

    def __init__(self, limits: Limits):
        self.limits = limits
        self.slots = asyncio.Semaphore(max(1, limits.max_in_flight))
        self._throttler: Throttler | None = None
        if limits.rpm:
            burst = max(1, math.floor(limits.rpm / 60))
            self._throttler = Throttler(rate_limit=burst, period=60.0 * burst / limits.rpm, retry_interval=0.005)
        self._paused_until = 0.0

    def pause(self, seconds: float) -> None:
        """Hold every attempt of this provider for ``seconds`` from now (after a 429)."""
        self._paused_until = max(self._paused_until, time.monotonic() + seconds)

    async def turn(self) -> None:
        """Wait until this provider may send one more attempt."""
        while (delay := self._paused_until - time.monotonic()) > 0:
            await asyncio.sleep(delay)
        if self._throttler is not None:
            await self._throttler.acquire()
