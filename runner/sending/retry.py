"""One request, attempted until it succeeds, fails deterministically, or runs out of attempts.

tenacity drives the retries: exponential backoff with jitter (``Limits.backoff_s`` doubling, capped
at ``Limits.max_wait_s``) on Retryable errors (429, 529, 408, 409, 425, 5xx, timeouts, connection
errors, malformed bodies, errors inside a 200: ``adapters.errors`` classifies) unless the provider
said ``x-should-retry: false``; a 429's stated wait (``Retry-After``, ``retry-after-ms``, a reset
header, Gemini's ``RetryInfo``), when given, is the wait instead, honoured exactly up to
``Limits.max_stated_wait_s``, and pauses the whole provider (``runner.sending.limits``). Fatal
errors (other 4xx) end at once.

A reply the adapter says is not the model asked for (``Adapter.check_served``: a System One
server that now serves another model) is a ProviderStop like those above: it is not stored, and its
cost is settled from its usage.

After each failed attempt ``reclassify`` applies the runner's two re-classifications (a stated wait
too long becomes a ProviderStop; a refused form of request of a model that has answered others
becomes Fatal). A ProviderStop (an exhausted quota, a refused key, an unknown model, a refused form
of request, or a stated wait longer than ``max_stated_wait_s``) halts the provider's limiter at
once, or, when it names one model (``ProviderStop.scope`` "model": an unknown model, a refused
form), that model alone (``halt_model``; a refused form after the model has answered others is that
request's own failure: Fatal, kept): attempts waiting for it end without being sent (raising the
same ProviderStop), and the runner stops the provider or the model (``runner.sending.stops``). The
HTTP adapters time their own attempts (``Adapter.own_timeout``): ``Limits.attempt_timeout_s`` is an
idle timeout (no byte of the reply for that long), ``Limits.max_reply_time_s`` bounds the whole
reply, and a reply cut after it began (a streamed reply's first event, a whole reply's first body
byte) arrives here as a Transient with ``should_retry`` False: part of it arrived (and was billed),
so it is not sent again in this run; the next run sends it (``adapters.http.cut_stream``). Each
attempt's ``adapters.Progress`` gives the Outcome its time to first token. A reply larger than
``Limits.max_reply_bytes`` is recorded as an invalid reply (every answer "reply larger than N
bytes") with its first bytes as the raw reply.

A provider whose attempts cannot connect (``Unreachable``) is paused and probed one request at a
time (``runner.sending.outage``): while it is down an attempt that cannot connect is not a retry of
its request, which waits for the provider and goes again (``_patient``); once it has been down
longer than ``max_stated_wait_s`` it is stopped like any other ProviderStop.

The first attempt runs outside tenacity: most requests succeed at once, and tenacity's bookkeeping
(~25 µs a request, measured here) is about a seventh of the runner's whole CPU per request. When it
fails with a Retryable error, the failure is handed to tenacity as its own first attempt, so the
waits, the stop rule and the attempt count are exactly tenacity's. tenacity itself is imported then,
at the first retry (``_retrying``): its import is ~20 ms of a run's start-up that a run without
retries never needs.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dxi.adapters import (
    Adapter,
    AdapterError,
    Answer,
    ErrorIn200,
    Fatal,
    Limits,
    Progress,
    ProviderStop,
    RateLimited,
    Reply,
    ReplyTooLarge,
    Request,
    Retryable,
    Transient,
    Unreachable,
)
from dxi.adapters.errors import REQUEST, SCOPE_MODEL
from dxi.adapters.provider_errors import STREAM_FIELDS
from dxi.evals import Task

from .cost import Charge, credible
from .limits import ProviderLimiter
from .stops import RunStopping, too_long, too_slow

if TYPE_CHECKING:
    from tenacity import AsyncRetrying, RetryCallState


@dataclass(slots=True)
class Outcome:
    """What came of one request: a decoded ``reply``, or the final ``error``.

    ``attempts`` counts attempts made (1 = no retry); ``rate_limited`` the 429s among them;
    ``latency_ms`` is the duration of the final attempt; ``body`` the final raw reply, when one
    arrived; ``cost_usd`` what the attempts cost (``runner.sending.cost.Charge.settle``; 0 without a
    price), ``cost_at_reservation_usd`` the part of it charged at reservation (cost unknown: at most
    that), ``cost_unbounded`` the attempts among those whose reservation bounds nothing
    (``Settled.bounded`` False: their cost is unknown, with no "at most"); ``waits_s`` the seconds
    waited before each attempt after the first, measured from the end of the attempt before it to
    the start of its own (the backoff or the provider's stated wait, and any pause or pacing of the
    provider meanwhile): ``attempts - 1`` values; ``ended``: ``time.perf_counter()`` at the end of
    the last attempt; ``ttft_s`` the final attempt's time to first token in seconds (a streamed
    reply's first generated token; None when it was not streamed or no token came); ``streamed``:
    the final attempt was streamed.
    """

    reply: Reply | None = None
    error: AdapterError | None = None
    body: bytes | None = None
    attempts: int = 0
    rate_limited: int = 0
    latency_ms: float | None = None
    cost_usd: float = 0.0
    cost_at_reservation_usd: float = 0.0
    cost_unbounded: int = 0
    waits_s: list[float] = field(default_factory=list)
    ended: float | None = None
    ttft_s: float | None = None
    streamed: bool = False


def _waiter(limits: Limits, limiter: ProviderLimiter):
    from tenacity.wait import wait_exponential_jitter

    backoff = wait_exponential_jitter(
        initial=limits.backoff_s, max=limits.max_wait_s, jitter=limits.backoff_s
    )

    def wait(state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        if isinstance(exc, RateLimited):
            if (
                exc.retry_after is not None
            ):  # the limiter paused the provider for it already (up to the bound)
                delay = exc.retry_after
            else:
                delay = backoff(state)
                limiter.pause(delay)
            return delay + random.uniform(0, min(0.5, limits.backoff_s))
        return backoff(state)

    return wait


def reclassify(
    error: AdapterError, max_stated_wait_s: float, model_answered: bool, tokens: float = 1.0
) -> AdapterError:
    """The runner's two re-classifications of an adapter's error (``adapters.errors`` describes them
    beside the tree): a RateLimited whose stated wait (``retry_after`` seconds) is longer than
    ``max_stated_wait_s`` becomes a ProviderStop of cause ``WAIT``
    (``runner.sending.stops.too_long``), as does one that states a limit so low that pacing to it
    would wait longer (``too_slow``: ``tokens`` the request's estimate); a ProviderStop of cause
    ``REQUEST`` (a form of request the model refuses) becomes Fatal (this request's own failure,
    stored and kept) when ``model_answered`` (the model has answered other requests in this run),
    except a refusal of the streamed form (its ``field`` one of ``STREAM_FIELDS``: that request is
    answered when sent whole, so it is never stored as a deterministic failure, which a
    ``--stream never`` run would find cached). Any other error is returned as it is."""
    if (
        isinstance(error, RateLimited)
        and error.retry_after is not None
        and error.retry_after > max_stated_wait_s
    ):
        return too_long(error, max_stated_wait_s)
    if isinstance(error, RateLimited) and (stop := too_slow(error, max_stated_wait_s, tokens)):
        return stop
    if (
        isinstance(error, ProviderStop)
        and error.cause == REQUEST
        and model_answered
        and error.field not in STREAM_FIELDS
    ):
        return Fatal(str(error), error.status)
    return error


def _worth_retrying(exc: BaseException) -> bool:
    return isinstance(exc, Retryable) and exc.should_retry


async def _once(
    adapter: Adapter,
    task: Task,
    request: Request,
    limiter: ProviderLimiter,
    out: Outcome,
    charge: Charge | None,
) -> None:
    """One attempt: wait for the provider's limits, reserve its cost bound (``charge``), send,
    decode into ``out``; raises AdapterError, or CostBoundReached or RunStopping (the run is
    stopping: ``runner.sending.stops``) before sending anything."""
    timeout = adapter.limits.attempt_timeout_s
    outage = limiter.outage
    while True:  # while the provider is down, only its probe goes (runner.sending.outage)
        probe = outage.down and await outage.turn()  # (up: no wait, no coroutine)
        try:
            ticket = await limiter.acquire(request)
        except BaseException:
            outage.record(probe, None)
            raise
        if probe or not outage.down or limiter.ending:
            break
        limiter.finish(
            ticket, False
        )  # it went down while this attempt waited for its turn: wait for it

    def not_sent() -> None:
        limiter.finish(ticket, False)
        outage.record(probe, None)

    if (
        stop := limiter.stop_for(adapter.label)
    ) is not None:  # the provider (or model) stopped while it waited
        not_sent()
        raise stop
    reserved = 0.0
    if charge is not None:
        try:
            reserved = await charge.reserve(adapter, task, request)
        except BaseException:  # CostBoundReached, or cancelled while waiting for room: not sent
            not_sent()
            raise
    if (
        limiter.closed
    ):  # the run is stopping (while this attempt waited for its turn or its reservation): not sent
        not_sent()
        if charge is not None:
            charge.budget.settle(reserved, 0.0)
        raise RunStopping(f"{adapter.label}: not sent, the run is stopping")
    started = time.perf_counter()
    if (
        out.attempts and out.ended is not None
    ):  # a retry: how long it waited since the attempt before
        out.waits_s.append(started - out.ended)
    out.attempts += 1
    out.body = None
    progress = Progress(started)
    ok, error, reply, billed = False, None, None, None
    try:
        try:
            if adapter.own_timeout:  # (idle timeout and total bound: adapters.http)
                out.body = await adapter.transmit(request, progress)
            else:
                async with asyncio.timeout(timeout):
                    out.body = await adapter.transmit(request, progress)
        except TimeoutError:
            raise Transient(f"{adapter.label}: no reply within {timeout:g} s") from None
        finally:
            out.ended = time.perf_counter()
            out.latency_ms = (out.ended - started) * 1000
            out.ttft_s, out.streamed = progress.ttft_s, progress.streamed
        reply = adapter.decode(task, out.body)
        # absurd usage: none, its cost unknown; first, so that a reply the next check refuses is
        # charged as believed too (a stop kept the raw usage: 10^12 tokens charged in full)
        reply = credible(reply, adapter, task, request)
        adapter.check_served(reply)  # not the model asked for: ProviderStop, no row (its cost kept)
        out.reply, ok = reply, True
        limiter.model_replies[adapter.label] += 1
    except ReplyTooLarge as exc:  # read no further; stored invalid with its first bytes
        out.body = exc.prefix
        out.reply = reply = Reply(tuple(Answer.invalid(q.id, str(exc)) for q in task.questions))
        ok = True
    except AdapterError as exc:
        if isinstance(exc, RateLimited):
            out.rate_limited += 1
        if isinstance(exc, ErrorIn200) and exc.usage is not None:  # billed: charged if credible
            billed = credible(exc.usage, adapter, task, request)
        error = reclassify(
            exc,
            adapter.limits.max_stated_wait_s,
            limiter.model_replies[adapter.label] > 0,
            limiter.estimate(len(request.body)),
        )
        if isinstance(error, ProviderStop):
            if error.scope == SCOPE_MODEL:  # this model alone: the provider's other models go on
                limiter.halt_model(adapter.label, error)
            else:
                limiter.halt(error)
        if error is not exc:
            raise error from None
        raise
    finally:  # also on cancellation: the window place is given back, the reservation settled
        if reply is not None:
            limiter.finish(ticket, ok, error, reply.input_tokens, reply.output_tokens)
        else:
            limiter.finish(ticket, ok, error)
        # the server answered (whatever the status), could not be reached, or neither (a connection
        # that failed)
        reached = ok or out.body is not None or (error is not None and error.status is not None)
        outage.record(
            probe, True if reached else (False if isinstance(error, Unreachable) else None), error
        )
        if charge is not None:
            settled = charge.settle(
                reserved, billed if reply is None else reply, error, charge.is_bound(adapter, task)
            )
            out.cost_usd += settled.usd
            if settled.at_reservation:
                out.cost_at_reservation_usd += settled.usd
                out.cost_unbounded += not settled.bounded


async def _patient(
    adapter: Adapter,
    task: Task,
    request: Request,
    limiter: ProviderLimiter,
    out: Outcome,
    charge: Charge | None,
) -> None:
    """``_once``, again for as long as the provider is down (``runner.sending.outage``): an attempt
    that could not connect while the provider is down is not one of the request's retries; it waits
    for the provider (its turn to probe it, or its return, or its stop) and goes again."""
    while True:
        try:
            await _once(adapter, task, request, limiter, out, charge)
            return
        except Unreachable:
            if not limiter.outage.down:
                raise


def _retrying(limits: Limits, limiter: ProviderLimiter) -> AsyncRetrying:
    """tenacity's retry loop for one request under ``limits`` (imported here: the first retry pays
    for it)."""
    from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt

    return AsyncRetrying(
        retry=retry_if_exception(_worth_retrying),
        wait=_waiter(limits, limiter),
        stop=stop_after_attempt(max(1, limits.max_attempts)),
        reraise=True,
        sleep=limiter.sleep,
    )


async def attempt(
    adapter: Adapter,
    task: Task,
    request: Request,
    limiter: ProviderLimiter,
    out: Outcome | None = None,
    charge: Charge | None = None,
) -> Outcome:
    """Send ``request`` with retries and decode the reply, filling ``out`` (a new Outcome if None)
    as it goes, so a caller that is cancelled can still see a reply that arrived. Never raises an
    AdapterError: the final error is in the Outcome (cancellation propagates). With a ``charge``,
    each attempt reserves its cost bound first; CostBoundReached propagates when the bound leaves no
    room, and RunStopping when the run is stopping (the attempt was not sent; earlier attempts'
    outcome is in ``out``)."""
    out = out if out is not None else Outcome()
    try:
        await _patient(adapter, task, request, limiter, out, charge)
        return out
    except Retryable as exc:
        first = exc
        if not exc.should_retry:
            out.error = exc
            return out
    except AdapterError as exc:
        out.error = exc
        return out
    try:
        async for trial in _retrying(adapter.limits, limiter):
            with trial:
                if trial.retry_state.attempt_number == 1:
                    raise first  # the attempt above, replayed: tenacity waits and counts from it
                await _patient(adapter, task, request, limiter, out, charge)
    except AdapterError as exc:
        out.error = exc
    return out
