"""The cost bound shared through ``--coordinator`` across a Redis restart and across reruns under
one run id (``runner.distributed``): a real ``redis-server`` on 127.0.0.1."""

from __future__ import annotations

import asyncio
import sys
import time

import pytest
import redis

from dxi.adapters import Limits
from dxi.runner.distributed import coordinator
from dxi.runner.distributed import shared_limits as shared
from dxi.runner.distributed.coordinator import Coordinator
from dxi.runner.distributed.shared_limits import SharedTicket
from dxi.runner.sending.cost import CostBoundReached

from .helpers.servers import free_port, redis_server, requires_redis
from .helpers.shared_limits import REQUEST
from .helpers.shared_limits import LimitsOnly as _Model

pytestmark = [requires_redis, pytest.mark.server]
if sys.platform != "linux":  # pragma: no cover
    pytestmark = pytest.mark.skip("redis-server tests run on Linux")


@pytest.fixture
def redis_url():
    with redis_server() as url:
        yield url


async def _until(condition, within: float) -> None:
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, "not within the time given"
        await asyncio.sleep(0.02)


def _cost(url: str, run: str) -> tuple[dict, dict]:
    """The run's ``cost`` and ``spentby`` hashes in Redis, decoded."""
    with redis.Redis.from_url(url, decode_responses=True) as r:
        return r.hgetall(f"dxi:{run}:cost"), r.hgetall(f"dxi:{run}:spentby")


@pytest.mark.slow
async def test_a_process_rejoining_a_restarted_redis_under_a_cost_bound_goes_on_and_restores_its_spend(
    monkeypatch,
):
    monkeypatch.setattr(coordinator, "MEMBER_TTL", 0.5)
    monkeypatch.setattr(coordinator, "REJOIN_S", 0.2)
    port = free_port()
    with redis_server(port) as url:
        c = Coordinator(url, "t", shares=2)
        assert c.connect()
        limiter = shared.limiters(c, [_Model(Limits(rpm=6000, max_in_flight=8))])["p"]
        budget = shared.budget(c, 10.0)
        ticket = await limiter.acquire(REQUEST)
        budget.settle(await budget.reserve(1.0), 1.0)
        limiter.finish(ticket, True)
        ends_while_out = await budget.reserve(0.5)
        in_flight = await budget.reserve(0.75)  # still in flight when it rejoins
        await c.call("join", [])
        assert _cost(url, "t") == ({"spent": "1", "reserved": "1.25"}, {"0": "1"})
    # Redis is gone (its keys with it): this process falls back to half the bound, and to half of
    # what the bound left beyond what it held (2) and shard 1's half, which Redis held back for it
    # (never seen: it may be spending it on its own): 2 + (10 - 5 - 2) / 2
    budget.settle(ends_while_out, 0.25)
    ticket = await limiter.acquire(REQUEST)  # a local turn, once its share has lapsed
    assert not isinstance(ticket, SharedTicket) and limiter.fallback.window.held == 1
    with redis_server(port):  # Redis back, empty, on the same port
        await _until(lambda: c._rejoining, 3.0)  # it waits for its local attempt to end
        # that attempt reserves its cost: on its own (it used to wait for the rejoin, which
        # waited for it: every shard froze)
        local = await asyncio.wait_for(budget.reserve(1.5), 2.0)
        assert (budget.max_usd, budget.local_in_flight) == (3.5, 1)
        budget.settle(local, 1.5)
        limiter.finish(ticket, True)
        await _until(lambda: c.rejoined == 1, 3.0)
        assert "reachable again" in c.warnings[-1] and budget.max_usd == 10.0
        await c.call("join", [])  # (after the calls the rejoin queued)
        # what it spent (1 + 0.25 + 1.5) and its reservation in flight are back in Redis
        assert _cost(url, "t") == ({"spent": "2.75", "reserved": "0.75"}, {"0": "2.75"})
        budget.settle(in_flight, 0.75)
        await c.call("join", [])
        assert _cost(url, "t") == ({"spent": "3.5", "reserved": "0"}, {"0": "3.5"})
        assert budget.spent == 3.5
        await c.close()


async def _budget(url: str, bound: float) -> tuple[Coordinator, shared.SharedBudget]:
    c = Coordinator(url, "nightly", 1, 0)
    assert c.connect()
    b = shared.budget(c, bound)
    await c.call("join", [])
    return c, b


async def test_a_run_stopped_at_its_cost_bound_goes_on_when_rerun_with_a_higher_one(redis_url):
    c, b = await _budget(redis_url, 1.0)
    b.settle(await b.reserve(0.9), 0.9)
    with pytest.raises(CostBoundReached):
        await b.reserve(0.2)  # 1.1 > 1: the run stops at $1
    await c.close()
    assert _cost(redis_url, "nightly")[0]["stopped"] == "1"
    c, b = await _budget(redis_url, 1.0)  # rerun with the same bound: stopped
    with pytest.raises(CostBoundReached):
        await b.reserve(0.01)
    await c.close()
    c, b = await _budget(redis_url, 1.2)  # with a higher one: goes on, from what was spent
    b.settle(await b.reserve(0.2), 0.2)
    with pytest.raises(CostBoundReached):
        await b.reserve(0.2)  # 1.3 > 1.2: stops again, at $1.2
    await c.close()
    cost, _ = _cost(redis_url, "nightly")
    assert (cost["spent"], cost["stopped"]) == ("1.1", "1.2")


async def _spend_until_stopped(budget: shared.SharedBudget, usd: float) -> int:
    """Reserve ``usd`` and spend it, again and again, until the bound stops it: how many times."""
    times = 0
    while True:
        try:
            reserved = await budget.reserve(usd)
        except CostBoundReached:
            return times
        budget.settle(reserved, usd)
        times += 1


async def test_shards_that_all_fall_back_after_spending_unevenly_stay_within_the_bound(monkeypatch):
    monkeypatch.setattr(coordinator, "MEMBER_TTL", 0.2)
    with redis_server() as url:
        a, b = (Coordinator(url, "uneven", 2, k) for k in range(2))
        assert a.connect() and b.connect()
        ba, bb = shared.budget(a, 1.0), shared.budget(b, 1.0)
        for c in (a, b):
            await c.call("join", [])
        # through Redis shard a spends $0.80 (more than its half: b is in Redis too), b $0.10
        ba.settle(await ba.reserve(0.8), 0.8)
        bb.settle(await bb.reserve(0.1), 0.1)
        for c in (a, b):  # (the settlements reach Redis; its answer says what the other spent)
            await c.call("join", [])
    # Redis is gone: both fall back at once. $0.10 is left under the bound: each shard may take
    # half of it at most. a has spent past its half already: nothing; b: $0.05 (it used to take all
    # of its half, $0.40 more, and the two spent $1.30 of $1)
    assert await _spend_until_stopped(ba, 0.1) == 0
    bb.settle(await bb.reserve(0.04), 0.04)  # within b's $0.05
    assert await _spend_until_stopped(bb, 0.02) == 0  # $0.16 > $0.15: b stops
    assert a.down and b.down
    assert (round(ba.max_usd, 9), round(bb.max_usd, 9)) == (0.5, 0.15)
    assert (round(ba.spent, 9), round(bb.spent, 9)) == (0.8, 0.14)
    assert round(ba.spent + bb.spent, 9) == 0.94  # <= $1
    assert (a.others_usd, b.others_usd) == (0.1, 0.8)  # as each last saw the other in Redis
    for c in (a, b):
        await c.close()


async def test_every_answer_from_redis_says_what_the_other_processes_spent_and_reserved(redis_url):
    a, b = (Coordinator(redis_url, "others", 2, k) for k in range(2))
    assert a.connect() and b.connect()
    ba, bb = shared.budget(a, 1.0), shared.budget(b, 1.0)
    for c in (a, b):
        await c.call("join", [])
    held = await ba.reserve(0.375)  # in flight: a's own, b's "others"
    await b.call("join", [])
    assert (a.others_usd, b.others_usd) == (0.0, 0.375)
    ba.settle(held, 0.25)
    bb.settle(await bb.reserve(0.125), 0.125)
    for c in (a, b):
        await c.call("join", [])
    assert (a.others_usd, b.others_usd) == (0.125, 0.25)
    for c in (a, b):
        await c.close()


async def test_a_shard_falling_back_leaves_the_share_held_for_a_shard_out_to_it(monkeypatch):
    monkeypatch.setattr(coordinator, "MEMBER_TTL", 0.2)
    # 4 shards, $4: shard 0 never reaches Redis and keeps to its $1 on its own
    a = Coordinator(f"redis://127.0.0.1:{free_port()}/0", "out", 4, 0)
    assert not a.connect()
    ba = shared.budget(a, 4.0)
    with redis_server() as url:
        b, c, d = (Coordinator(url, "out", 4, k) for k in (1, 2, 3))
        assert b.connect() and c.connect() and d.connect()
        bb, bc, bd = (shared.budget(x, 4.0) for x in (b, c, d))
        for x in (b, c, d):
            await x.call("join", [])
        bb.settle(await bb.reserve(2.0), 2.0)  # within the $3 of the three shards in Redis
        bc.settle(await bc.reserve(0.5), 0.5)
        for x in (b, c, d):
            await x.call("join", [])
        # what the bound holds for the others: their spend, and shard 0's $1
        assert (b.others_usd, c.others_usd, d.others_usd) == (1.5, 3.0, 3.5)
    # Redis is gone: $0.50 is left beyond what was spent and shard 0's share; each of the three
    # takes a quarter of it at most (they used to take their whole quarters: $5 of $4 in all)
    a._local_from = time.monotonic()  # (it waits for a share it may hold in Redis: none)
    assert await _spend_until_stopped(ba, 0.25) == 4
    assert await _spend_until_stopped(bb, 0.125) == 0
    assert await _spend_until_stopped(bc, 0.0625) == 2
    assert await _spend_until_stopped(bd, 0.0625) == 2
    assert [x.max_usd for x in (ba, bb, bc, bd)] == [1.0, 1.0, 0.625, 0.125]
    assert [x.spent for x in (ba, bb, bc, bd)] == [1.0, 2.0, 0.625, 0.125]  # $3.75 <= $4
    for x in (a, b, c, d):
        await x.close()
