"""Per-provider limits on a fake clock: pacing, the adaptive window and rates, token estimates, 429
headers."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from email.utils import formatdate

import pytest

from dxi.adapters import Limits, RateLimited, Request
from dxi.adapters.http import parse_reset, rate_limit_quota, rate_limit_wait
from dxi.runner.planning.tokens import TokenEstimate
from dxi.runner.sending import limits
from dxi.runner.sending.limits import AdaptiveRate, Pacer, ProviderLimiter, Window


class Clock:
    """Stands in for the ``time`` module inside runner.sending.limits: ``monotonic()`` returns
    ``now``."""

    def __init__(self, now: float = 1000.0):
        self.now = now

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(limits, "time", c)
    return c


def request(size: int = 400) -> Request:
    return Request("systemone", "m", "/v1/systemone", b"x" * size)


def test_pacer_spaces_reservations_evenly_and_takes_corrections(clock: Clock):
    p = Pacer(rate=10.0)  # 10 units a second: one every 0.1 s
    assert [p.reserve() for _ in range(3)] == [0.0, pytest.approx(0.1), pytest.approx(0.2)]
    clock.now += (
        1.0  # idle: no credit is saved up, the next unit goes at once and the one after waits
    )
    assert (p.reserve(), p.reserve()) == (0.0, pytest.approx(0.1))
    p.correct(5.0)  # the last reservation really cost 5 more units: 0.5 s more before the next
    assert p.reserve() == pytest.approx(0.7)
    p.hold_until(clock.now + 3.0)
    assert p.reserve() == pytest.approx(3.0)


def test_rate_is_cut_by_backoff_and_recovers_linearly(clock: Clock):
    r = AdaptiveRate(per_minute=600)  # ceiling 10/s
    r.decrease(clock.now)
    assert r.rate == pytest.approx(7.0)
    r.decrease(clock.now)
    assert r.rate == pytest.approx(4.9)
    clock.now += limits.RECOVERY_S / 2  # half the recovery time: +5/s, linearly
    r.wait(1.0)
    assert r.rate == pytest.approx(9.9)
    clock.now += limits.RECOVERY_S
    r.wait(1.0)
    assert r.rate == 10.0  # never above the ceiling
    for _ in range(50):
        r.decrease(clock.now)
    assert r.rate == pytest.approx(10.0 * limits.MIN_FRACTION)


def test_a_stated_limit_becomes_the_ceiling(clock: Clock):
    unlimited = AdaptiveRate(per_minute=None)
    assert (unlimited.rate, unlimited.wait(1.0)) == (None, 0.0)
    assert unlimited.learn(600, clock.now) and unlimited.rate == 10.0
    assert not unlimited.learn(1200, clock.now)  # higher than what we have: ignored
    assert unlimited.learn(300, clock.now) and (unlimited.ceiling, unlimited.rate) == (5.0, 5.0)


async def test_window_resizes_while_in_use_and_serves_in_order():
    w = Window(2)
    await w.acquire()
    await w.acquire()
    order: list[int] = []

    async def take(n: int) -> None:
        await w.acquire()
        order.append(n)

    waiters = [asyncio.create_task(take(n)) for n in range(3)]
    await asyncio.sleep(0)
    assert (w.held, order) == (2, [])
    w.resize(4)  # two more places: the first two waiters get them
    await asyncio.sleep(0)
    assert (w.held, order) == (4, [0, 1])
    w.resize(1.5)  # shrinking takes nothing back; int(1.5) = 1 place once released
    for _ in range(3):
        w.release()
    await asyncio.sleep(0)
    assert (w.held, order) == (1, [0, 1])
    w.release()
    await asyncio.sleep(0)
    assert (w.held, order) == (1, [0, 1, 2])
    await asyncio.gather(*waiters)
    cancelled = asyncio.create_task(w.acquire())
    await asyncio.sleep(0)
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    w.release()
    assert w.held == 0  # the cancelled waiter took no place


def test_token_estimate_learns_from_reported_usage():
    est = TokenEstimate()
    assert est(400) == 100.0  # 400 bytes / 4 bytes a token, before any usage is known
    est.observe(400, input_tokens=50, output_tokens=2)  # first reply: a running mean of one
    assert (est.ratio, est.output) == (0.5, 2.0)
    assert est(400) == 52.0
    est.observe(800, input_tokens=200, output_tokens=4)  # ratio 1.0 this time: mean of the two
    assert (est.ratio, est.output) == (0.75, 3.0)
    est.observe(400, input_tokens=None, output_tokens=None)  # no usage reported: nothing learned
    assert (est.ratio, est.output) == (0.75, 3.0)


async def test_429s_of_one_round_cut_the_window_once(clock: Clock):
    lim = ProviderLimiter(Limits(max_in_flight=10))
    tickets = [await lim.acquire(request()) for _ in range(4)]  # all sent at the same instant
    clock.now += 0.1
    lim.finish(tickets[0], False, RateLimited("429", retry_after=2.0))
    lim.finish(tickets[1], False, RateLimited("429", retry_after=2.0))  # same round: no second cut
    assert (lim.window.size, lim.decreases, lim.rate_limited) == (7.0, 1, 2)
    assert lim._paused_until == pytest.approx(clock.now + 2.0)
    lim.finish(tickets[2], True)  # a success widens by 1/window
    assert lim.window.size == pytest.approx(7.0 + 1 / 7)
    lim.finish(tickets[3], False, RateLimited("500 is not a 429", None))
    clock.now += 2.0
    later = await lim.acquire(request())  # sent after the cut: its 429 is a new round
    lim.finish(later, False, RateLimited("429"))
    assert lim.decreases == 2 and lim.window.size == pytest.approx((7.0 + 1 / 7) * 0.7)
    assert lim.window.held == 0


async def test_a_429_stating_the_limit_sets_the_pace_instead_of_cutting(clock: Clock):
    lim = ProviderLimiter(Limits(max_in_flight=8))
    ticket = await lim.acquire(request())
    lim.finish(ticket, False, RateLimited("429", retry_after=0.5, rpm=120))
    assert (lim.window.size, lim.decreases, lim.requests.rate) == (8.0, 0, 2.0)
    assert lim.requests.pacer.reserve() == pytest.approx(0.5)  # nothing before the pause ends


async def test_token_budget_paces_by_estimate_then_by_usage(clock: Clock):
    lim = ProviderLimiter(Limits(max_in_flight=8, tpm=6000))  # 100 tokens a second
    first = await lim.acquire(request(400))  # estimated 100 tokens: free now
    assert first.tokens == 100.0
    lim.finish(first, True, input_tokens=300, output_tokens=0)  # it really cost 300: 2 s more owed
    assert lim.tokens.pacer.reserve(0) == pytest.approx(3.0)


async def test_turns_that_came_while_the_loop_was_held_up_go_an_interval_apart(clock: Clock):
    """Four attempts at 10 requests a second: the first goes at once, the others book their turns
    0.1, 0.2 and 0.3 s on and sleep; the event loop is held up 0.35 s (a process descheduled on a
    loaded machine) and wakes the three together. They went at once: with the first, four
    requests within 0.35 s, a burst a provider's limiter refuses (test_run_file's three models: a
    429, and 49 requests where 48 were due). They go 0.1 s apart, the first of them at once (it
    is late), each next one up to JITTER_S early."""
    lim = ProviderLimiter(Limits(max_in_flight=4, rpm=600))
    start = clock.now
    sleeping: list[tuple[float, asyncio.Future]] = []

    async def sleep(seconds: float) -> None:  # the event loop's timer, on the fake clock
        woken = asyncio.get_running_loop().create_future()
        sleeping.append((clock.now + seconds, woken))
        await woken

    async def settle() -> None:  # every attempt that can run, run until it waits
        for _ in range(20):
            await asyncio.sleep(0)

    lim.sleep = sleep
    sent: list[float] = []

    async def attempt() -> None:
        sent.append(round((await lim.acquire(request())).sent_at - start, 3))

    tasks = [asyncio.create_task(attempt()) for _ in range(4)]
    await settle()
    assert sent == [0.0] and sorted(round(at - start, 3) for at, _ in sleeping) == [0.1, 0.2, 0.3]
    clock.now = start + 0.35  # held up: every timer due by now fires at once
    while not all(t.done() for t in tasks):
        clock.now = max(clock.now, min(at for at, _ in sleeping))
        for entry in [e for e in sleeping if e[0] <= clock.now]:
            sleeping.remove(entry)
            entry[1].set_result(None)
        await settle()
    assert sent == [0.0, 0.35, 0.445, 0.545]


def test_rate_limit_headers():
    assert rate_limit_wait({"Retry-After": "7"}) == 7.0
    assert (
        rate_limit_wait({"retry-after-ms": "250", "Retry-After": "7"}) == 0.25
    )  # the finer one wins
    http_date = rate_limit_wait({"Retry-After": formatdate(time.time() + 30, usegmt=True)})
    assert 28.0 <= http_date <= 30.0
    assert (
        rate_limit_wait(
            {
                "x-ratelimit-reset-requests": "1m30s",
                "x-ratelimit-remaining-requests": "0",
                "x-ratelimit-reset-tokens": "6m0s",
                "x-ratelimit-remaining-tokens": "900",
            }
        )
        == 90.0
    )
    assert (
        rate_limit_wait({"x-ratelimit-reset-requests": "20ms", "x-ratelimit-reset-tokens": "2s"})
        == 2.0
    )
    assert (
        59.0
        <= rate_limit_wait(
            {
                "anthropic-ratelimit-requests-reset": iso_in(60),
                "anthropic-ratelimit-requests-remaining": "0",
            }
        )
        <= 60.0
    )
    assert rate_limit_wait({"Retry-After": "soon"}) is None and rate_limit_wait({}) is None
    assert [parse_reset(v) for v in ("1h2m3.5s", "750ms", "12", "2s5")] == [
        3723.5,
        0.75,
        12.0,
        None,
    ]
    assert rate_limit_quota(
        {"X-RateLimit-Limit-Requests": "600", "x-ratelimit-limit-tokens": "150000"}
    ) == (600, 150000)
    assert rate_limit_quota({"anthropic-ratelimit-requests-limit": "50"}) == (50, None)
    assert rate_limit_quota({"x-ratelimit-limit-tokens": "-1"}) == (
        None,
        None,
    )  # Azure's "not stated"


def iso_in(seconds: float) -> str:
    return (datetime.now(UTC) + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")
