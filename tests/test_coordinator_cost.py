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
    # Redis is gone (its keys with it): this process falls back to half the bound
    budget.settle(ends_while_out, 0.25)
    ticket = await limiter.acquire(REQUEST)  # a local turn, once its share has lapsed
    assert not isinstance(ticket, SharedTicket) and limiter.fallback.window.held == 1
    with redis_server(port):  # Redis back, empty, on the same port
        await _until(lambda: c._rejoining, 3.0)  # it waits for its local attempt to end
        # that attempt reserves its cost: on its own (it used to wait for the rejoin, which
        # waited for it: every shard froze)
        local = await asyncio.wait_for(budget.reserve(2.0), 2.0)
        assert (budget.max_usd, budget.local_in_flight) == (5.0, 1)
        budget.settle(local, 2.0)
        limiter.finish(ticket, True)
        await _until(lambda: c.rejoined == 1, 3.0)
        assert "reachable again" in c.warnings[-1] and budget.max_usd == 10.0
        await c.call("join", [])  # (after the calls the rejoin queued)
        # what it spent (1 + 0.25 + 2) and its reservation in flight are back in Redis
        assert _cost(url, "t") == ({"spent": "3.25", "reserved": "0.75"}, {"0": "3.25"})
        budget.settle(in_flight, 0.75)
        await c.call("join", [])
        assert _cost(url, "t") == ({"spent": "4", "reserved": "0"}, {"0": "4"})
        assert budget.spent == 4.0
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
