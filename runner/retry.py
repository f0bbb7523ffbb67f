"""One request, attempted until it succeeds, fails deterministically, or runs out of attempts.

tenacity drives the loop: exponential backoff with jitter (``Limits.backoff_s`` doubling, capped at
``Limits.max_wait_s``) on Retryable errors (429, 5xx, timeouts, connection errors, malformed bodies);
a 429's Retry-After, when given, is the wait instead, and pauses the whole provider. Fatal errors
(other 4xx) end the loop at once.
"""
from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, stop_after_attempt
from tenacity.wait import wait_exponential_jitter

from adapters import Adapter, AdapterError, RateLimited, Reply, Request, Retryable, Transient
from evals import Task

from .limits import ProviderLimiter


@dataclass
class Outcome:
    """What came of one request: a decoded ``reply``, or the final ``error``.

    ``attempts`` counts attempts made (1 = no retry); ``rate_limited`` the 429s among them;
    ``latency_ms`` is the duration of the final attempt; ``body`` the final raw reply, when one arrived.
    """

    reply: Reply | None = None
    error: AdapterError | None = None
    body: bytes | None = None
    attempts: int = 0
    rate_limited: int = 0
    latency_ms: float | None = None


def _waiter(limits, limiter: ProviderLimiter):
    backoff = wait_exponential_jitter(multiplier=limits.backoff_s, max=limits.max_wait_s, jitter=limits.backoff_s)

    def wait(state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        if isinstance(exc, RateLimited):
            delay = exc.retry_after if exc.retry_after is not None else backoff(state)
            delay = min(delay, limits.max_wait_s)
            limiter.pause(delay)
            return delay + random.uniform(0, min(0.5, limits.backoff_s))
        return backoff(state)

    return wait


async def attempt(adapter: Adapter, task: Task, request: Request, limiter: ProviderLimiter) -> Outcome:
    """Send ``request`` with retries and decode the reply. Never raises an AdapterError: the final
    error is returned in the Outcome (cancellation propagates)."""
    out = Outcome()
    limits = adapter.limits
    retrying = AsyncRetrying(retry=retry_if_exception_type(Retryable), wait=_waiter(limits, limiter),
                             stop=stop_after_attempt(max(1, limits.max_attempts)), reraise=True)
    try:
        async for trial in retrying:
            with trial:
                out.attempts += 1
                await limiter.turn()
                started = time.perf_counter()
                out.body = None
                try:
                    async with asyncio.timeout(limits.attempt_timeout_s):
                        out.body = await adapter.send(request)
                except TimeoutError:
                    raise Transient(f"{adapter.label}: no reply within {limits.attempt_timeout_s:g} s") from None
                except RateLimited:
                    out.rate_limited += 1
                    raise
                finally:
                    out.latency_ms = (time.perf_counter() - started) * 1000
                out.reply = adapter.decode(task, out.body)
    except AdapterError as exc:
        out.error = exc
    return out
