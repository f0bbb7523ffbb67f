"""``--coordinator redis://...``: limits and the cost bound shared through a real ``redis-server``
on 127.0.0.1 (started here, persistence off). Two Coordinators in one test are two processes as far
as Redis can tell (their own connections and ids); the last tests run two ``dxi run`` processes."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from pathlib import Path

import orjson
import pytest
import redis.asyncio

from dxi.adapters import Limits, RateLimited
from dxi.runner.distributed import shared_limits as shared
from dxi.runner.distributed.coordinator import Coordinator, run_id
from dxi.runner.sending.cost import CostBoundReached

from .conftest import DXI
from .fakes.fake_provider import FakeProvider
from .helpers import events
from .helpers.runs import dxi_command
from .helpers.servers import free_port, redis_server, requires_redis
from .helpers.shared_limits import REQUEST
from .helpers.shared_limits import LimitsOnly as _Model
from .helpers.synthetic import data_dir

pytestmark = [requires_redis, pytest.mark.server]


@pytest.fixture
def redis_url():
    with redis_server() as url:
        yield url


def two(url: str, run: str = "t", shares: int = 2, lease: float = 30.0) -> list[Coordinator]:
    """Two coordinators, shards 0 and 1 of ``shares``."""
    cs = [Coordinator(f"{url}?lease={lease}", run, shares, k) for k in range(2)]
    assert all(c.connect() for c in cs)
    return cs


async def two_shards(
    url: str, data: Path, tmp_path: Path, redis_url: str, run_id: str
) -> list[bytes]:
    """``dxi run --shard K/2`` for K = 0 and 1 at once, sharing one coordinator at 600 RPM; their
    stderr. Their bookings go to ``tmp_path / "events.jsonl"`` (``tests.helpers.events``:
    "booking")."""
    env = events.env(tmp_path / "events.jsonl", base={**os.environ, "DXI_RUN_ID": run_id})
    procs = [
        await _shard(k, 2, url, data, tmp_path, redis_url, run_id, 600, max_in_flight=None, env=env)
        for k in range(2)
    ]
    errs = [(await p.communicate())[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errs
    return errs


def bookings(limiter) -> list[tuple[float, float]]:
    """Record each turn Redis books for ``limiter`` (a SharedLimiter): ``(booked_at, turn)`` on
    Redis's clock, the turn being when the attempt may go (``booked_at`` + the wait). The decisions,
    whatever the load."""
    booked: list[tuple[float, float]] = []
    slot = limiter._slot

    async def recorded(cost: float):
        wait, booked_at, rate, member = await slot(cost)
        booked.append((booked_at, booked_at + wait))
        return wait, booked_at, rate, member

    limiter._slot = recorded
    return booked


async def test_two_processes_share_one_request_rate(redis_url: str):
    a, b = two(redis_url)
    limits = Limits(rpm=1200, max_in_flight=8)  # 20 per second: one every 50 ms
    la, lb = shared.limiters(a, [_Model(limits)])["p"], shared.limiters(b, [_Model(limits)])["p"]
    await a.call("join", [])
    await b.call("join", [])  # both present: each books at the whole rate, shared
    ba, bb = bookings(la), bookings(lb)

    async def go(limiter) -> None:
        for _ in range(10):
            limiter.finish(await limiter.acquire(REQUEST), True)

    await asyncio.gather(go(la), go(lb))
    await a.close()
    await b.close()
    booked = sorted(ba + bb)  # Redis runs one script at a time: in the order booked
    assert len(booked) == 20 and len(ba) == len(bb) == 10
    for (_, previous), (at, turn) in zip(booked, booked[1:], strict=False):
        # the next free instant at 20/s for both together (GCRA): never sooner, and no later than
        # needed
        assert turn == pytest.approx(max(at, previous + 0.05), abs=1e-3)


async def test_a_429_seen_by_one_pauses_the_other_and_narrows_the_shared_rate(redis_url: str):
    a, b = two(redis_url)
    limits = Limits(rpm=6000, max_in_flight=4)
    la, lb = shared.limiters(a, [_Model(limits)])["p"], shared.limiters(b, [_Model(limits)])["p"]
    ticket = await la.acquire(REQUEST)
    la.finish(ticket, False, RateLimited("429", status=429, retry_after=0.6))
    await b.call("join", [])
    client = b._client
    for _ in range(
        500
    ):  # the report reaches Redis (a background call: no fixed sleep, the machine may be loaded)
        if await client.hget(b.key("provider", "p"), "rate_limited") == b"1":
            break
        await asyncio.sleep(0.01)
    booked = bookings(lb)
    lb.finish(await lb.acquire(REQUEST), True)
    state = {
        k.decode(): v.decode() for k, v in (await client.hgetall(b.key("provider", "p"))).items()
    }
    # b's turn (Redis's clock) is no sooner than the end of the pause a's 429 stated, 0.6 s from its
    # report
    assert float(state["paused_s"]) == pytest.approx(0.6)
    assert booked[0][1] >= float(state["paused"]) - 1e-3
    assert float(state["rlow"]) == pytest.approx(6000 / 60 * 0.7)  # the shared rate, cut once
    assert (state["decreases"], state["rate_limited"]) == ("1", "1")
    await a.close()
    await b.close()


async def test_a_dead_process_slots_come_back_when_their_leases_end(redis_url: str):
    a, b = two(redis_url, lease=0.6)
    limits = Limits(max_in_flight=2)
    la, lb = shared.limiters(a, [_Model(limits)])["p"], shared.limiters(b, [_Model(limits)])["p"]
    await la.acquire(REQUEST)
    await la.acquire(REQUEST)
    with pytest.raises(TimeoutError):  # both held: b waits
        await asyncio.wait_for(lb.acquire(REQUEST), 0.2)
    for task in a._tasks:  # a dies: its leases are no longer renewed
        task.cancel()
    started = time.monotonic()
    lb.finish(await asyncio.wait_for(lb.acquire(REQUEST), 10), True)
    assert 0.2 <= time.monotonic() - started <= 5
    await b.close()


async def test_a_slot_given_back_is_handed_to_the_first_waiter_of_any_process(redis_url: str):
    a, b = two(redis_url)
    limits = Limits(max_in_flight=1)
    la, lb = shared.limiters(a, [_Model(limits)])["p"], shared.limiters(b, [_Model(limits)])["p"]
    held = await la.acquire(REQUEST)
    order: list[str] = []

    async def wait(name: str, limiter) -> None:
        ticket = await limiter.acquire(REQUEST)
        order.append(name)
        await asyncio.sleep(0.05)
        limiter.finish(ticket, True)

    waiters = [asyncio.create_task(wait("b1", lb))]
    await asyncio.sleep(0.1)
    waiters.append(asyncio.create_task(wait("a2", la)))
    await asyncio.sleep(0.1)
    waiters.append(asyncio.create_task(wait("b3", lb)))
    await asyncio.sleep(0.1)
    assert order == []
    la.finish(held, True)  # handed over in the order they queued, whichever process each is in
    await asyncio.wait_for(asyncio.gather(*waiters), 10)
    assert order == ["b1", "a2", "b3"]
    await a.close()
    await b.close()


async def _cancel_after(steps: int, coroutine) -> asyncio.Task | None:
    """Run ``coroutine`` in a task for ``steps`` turns of the event loop, then cancel it; None if it
    was cancelled (and ended cancelled, which it must), else the task that finished first."""
    task = asyncio.create_task(coroutine)
    for _ in range(steps):
        await asyncio.sleep(0)
    if task.done():
        return task
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    return None


async def test_a_cancel_at_any_step_of_a_redis_call_is_not_lost(redis_url: str):
    # Python 3.11's wait_for, which redis-py wraps round each command's write, drops a cancel that
    # lands as the write completes (CPython gh-86296): a's heartbeat renewed on after its cancel,
    # about 1 run in 6 of the test above
    c = Coordinator(redis_url, "t")
    assert c.connect()
    await c.call("refresh", [1.0, 1, c.key("z"), 1, "m"])  # connected, script loaded
    cancelled = 0
    for steps in range(40):
        if await _cancel_after(steps, c.call("refresh", [1.0, 1, c.key("z"), 1, "m"])) is None:
            cancelled += 1
    assert cancelled >= 3  # the sweep cancelled the call at its first steps, the write among them
    await c.close()


async def test_an_acquire_or_a_reservation_cancelled_at_any_step_leaves_nothing_in_redis(
    redis_url: str,
):
    c = Coordinator(redis_url, "t")
    assert c.connect()
    limiter, budget = (
        shared.limiters(c, [_Model(Limits(max_in_flight=1))])["p"],
        shared.budget(c, 1.0),
    )
    await c.call("join", [])
    client = c._client
    for steps in range(40):
        if (done := await _cancel_after(steps, limiter.acquire(REQUEST))) is not None:
            limiter.finish(done.result(), True)
        if (done := await _cancel_after(steps, budget.reserve(0.5))) is not None:
            assert done.result() == 0.5
            budget.settle(0.5, 0.0)
        for _ in range(3):  # the releases and give-backs reach Redis
            c._flush()
            await asyncio.gather(*c._background)
        assert (await client.zcard(limiter.slots_key), await client.zcard(budget.keys[1])) == (
            0,
            0,
        ), steps
        assert await client.zcard(c.key("waitq", "p")) == 0, steps
        assert float(await client.hget(budget.keys[0], "reserved") or 0) == 0.0
    assert limiter.window.held == 0 and await budget.spent_by_all() == 0.0
    await c.close()


async def test_the_cost_bound_holds_for_both_and_stops_both(redis_url: str):
    a, b = two(redis_url)
    ba, bb = shared.budget(a, 1.0), shared.budget(b, 1.0)
    for c in (a, b):  # both shards in Redis: the whole bound is theirs
        await c.call("join", [])
    await ba.reserve(0.6)
    waiting = asyncio.create_task(bb.reserve(0.6))  # 0.6 + 0.6 > 1: waits for a's attempt to settle
    await asyncio.sleep(0.1)
    assert not waiting.done()
    ba.settle(0.6, 0.3)  # a's reply cost less than its bound
    assert await asyncio.wait_for(waiting, 2) == 0.6
    bb.settle(0.6, 0.6)  # 0.9 spent by both
    await asyncio.sleep(0.05)
    with pytest.raises(CostBoundReached):
        await ba.reserve(0.2)  # does not fit with nothing in flight: the run stops
    with pytest.raises(CostBoundReached):
        await bb.reserve(0.01)  # and b with it, though 0.01 would fit
    assert (ba.spent, bb.spent) == (0.3, 0.6)
    assert await ba.spent_by_all() == pytest.approx(0.9)
    await a.close()
    await b.close()


async def test_redis_unreachable_falls_back_to_one_nth_of_each_limit(caplog):
    c = Coordinator(f"redis://127.0.0.1:{free_port()}/0", "t", shares=4)
    assert not c.connect()
    assert c.down and "falls back to 1/4" in c.warnings[0]
    limiter = shared.limiters(c, [_Model(Limits(rpm=600, max_in_flight=16))])["p"]
    assert (limiter.fallback.limits.rpm, limiter.fallback.limits.max_in_flight) == (150, 4)
    c._local_from = (
        time.monotonic()
    )  # (it waits MEMBER_TTL first, for a share it may still hold in Redis)
    ticket = await limiter.acquire(REQUEST)
    assert limiter.fallback.window.held == 1  # the local quarter's window
    limiter.finish(ticket, True)
    assert limiter.fallback.window.held == 0
    budget = shared.budget(c, 8.0)
    await budget.reserve(1.0)
    assert budget.max_usd == 2.0
    await c.close()


def test_the_run_id_is_the_command_without_its_shard():
    cmd = ["run", "--model", "m", "--shard", "0/4", "--coordinator", "redis://h:1/0"]
    assert run_id(cmd, {}) == run_id(
        [
            "run",
            "--model",
            "m",
            "--shard=3/4",
            "--coordinator",
            "redis://h:1/0",
            "--cache-dir",
            "c3",
            "--out=o3",
            "-q",
        ],
        {},
    )
    assert run_id(cmd, {}) != run_id(["run", "--model", "other", "--shard", "0/4"], {})
    assert run_id(cmd, {"SLURM_ARRAY_JOB_ID": "77"}) == "77"
    assert run_id(cmd, {"DXI_RUN_ID": "nightly", "SLURM_ARRAY_JOB_ID": "77"}) == "nightly"


@pytest.mark.process
async def test_two_dxi_runs_with_the_coordinator_keep_to_600_rpm_together(
    redis_url: str, tmp_path: Path
):
    """The turns Redis booked for the two processes (on its clock, whatever the load): one every 0.1
    s for both together, never sooner; slower (0.2 s: half the rate) only while one process has not
    yet joined (until then its share may be in use elsewhere)."""
    tasks = 50
    data = data_dir(tmp_path / "data", tasks)
    async with FakeProvider(
        model="fake", p_first=None, p_yes=None, rpm=600
    ) as server:  # a burst of 10, as providers allow
        errs = await two_shards(server.url, data, tmp_path, redis_url, "rpm-test")
        stats = server.stats()
    assert all(b"shared by every process of run rpm-test" in e for e in errs)
    assert stats["ok"] == tasks and stats["arrivals"] == tasks + stats["rate_limited"]
    booked = sorted(
        (at, turn) for _, _, _, at, turn in events.read(tmp_path / "events.jsonl", "booking")
    )
    assert (
        len(booked) >= stats["arrivals"]
    )  # one per attempt (and one more for an attempt booked again)
    assert (
        len({e[2] for e in events.read(tmp_path / "events.jsonl", "booking")}) == 2
    )  # both booked
    for (_, previous), (at, turn) in zip(booked, booked[1:], strict=False):
        assert turn >= previous + 0.1 - 1e-3  # never faster than 600 a minute together
        assert turn <= max(at, previous + 0.2) + 1e-3  # and never slower than half of it


@pytest.mark.process
async def test_two_dxi_runs_stop_at_one_global_cost_bound(redis_url: str, tmp_path: Path):
    tasks = 200
    data = data_dir(tmp_path / "data", tasks)
    async with FakeProvider(model="fake", p_first=None, p_yes=None, latency="0.01") as server:
        runs = tmp_path / "run.toml"
        runs.write_text(
            f'data_dir = "{data}"\n[providers.fake]\nkind = "systemone"\nbase_url = "{server.url}"\n'
            '[[models]]\nprovider = "fake"\nmodel = "fake"\nprice = { input = 1000.0, output = 0.0 }\n'
            '[evals]\nselect = ["when2call"]\n'  # the synthetic data: When2Call only
        )
        procs = [
            await asyncio.create_subprocess_exec(
                DXI,
                "run",
                str(runs),
                "--cache-dir",
                str(tmp_path / f"cache{k}"),
                "--out",
                str(tmp_path / f"out{k}"),
                "-q",
                "--max-cost",
                "5",
                "--shard",
                f"{k}/2",
                "--coordinator",
                redis_url,
                env={**os.environ, "DXI_RUN_ID": "cost"},
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            for k in range(2)
        ]
        outs = [await p.communicate() for p in procs]
        assert [p.returncode for p in procs] == [3, 3], outs  # both stopped at the bound
    spent = [
        orjson.loads((tmp_path / f"out{k}" / "summary.json").read_bytes())["cost_bound"][
            "spent_usd"
        ]
        for k in range(2)
    ]
    assert (
        4.0 < sum(spent) <= 5.0
    )  # one bound for both, not 5 each (how it splits depends on who started first)
    assert all(b"shared by every process of run cost" in err for _, err in outs)
    # each says what it spent and what all spent, as Redis counted it
    by_all = [
        orjson.loads((tmp_path / f"out{k}" / "summary.json").read_bytes())["cost_bound"][
            "spent_by_all_usd"
        ]
        for k in range(2)
    ]
    assert by_all[0] == by_all[1] == pytest.approx(sum(spent), abs=1e-5)
    for k, (out, _) in enumerate(outs):
        assert (
            f"Stopped at the cost bound: spent ${spent[k]:.6f} in this process, ${by_all[k]:.6f} "
            "of $5 by every process sharing the bound (--coordinator); "
        ) in " ".join(out.decode().split())


@pytest.mark.process
async def test_a_dxi_run_stopped_at_a_shared_cost_bound_goes_on_when_rerun_with_a_higher_one(
    redis_url: str, tmp_path: Path
):
    data = data_dir(tmp_path / "data", 40)
    async with FakeProvider(model="fake", p_first=None, p_yes=None, latency="0.01") as server:
        runs = tmp_path / "run.toml"
        runs.write_text(
            f'data_dir = "{data}"\n[providers.fake]\nkind = "systemone"\nbase_url = "{server.url}"\n'
            '[[models]]\nprovider = "fake"\nmodel = "fake"\nprice = { input = 1000.0, output = 0.0 }\n'
            '[evals]\nselect = ["when2call"]\n'  # the synthetic data: When2Call only
        )

        async def rerun(bound: str) -> tuple[int, dict]:
            proc = await asyncio.create_subprocess_exec(
                DXI,
                "run",
                str(runs),
                "--out",
                str(tmp_path / "out"),
                "--cache-dir",
                str(tmp_path / "cache"),
                "-q",
                "--max-cost",
                bound,
                "--coordinator",
                redis_url,
                env={**os.environ, "DXI_RUN_ID": "again"},
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            await proc.communicate()
            summary = orjson.loads((tmp_path / "out" / "summary.json").read_bytes())
            return proc.returncode, summary["cost_bound"]

        code, first = await rerun("1")
        assert code == 3 and 0 < first["spent_usd"] <= 1.0
        code, same = await rerun("1")  # the same bound: stopped, nothing sent
        assert (code, same["spent_usd"], same["spent_by_all_usd"]) == (3, 0.0, first["spent_usd"])
        code, higher = await rerun("2")  # a higher one goes on, to $2 in all
        assert code == 3 and higher["spent_usd"] > 0.0  # (it stopped at once, spending nothing)
        assert higher["spent_by_all_usd"] == pytest.approx(first["spent_usd"] + higher["spent_usd"])
        assert higher["spent_by_all_usd"] <= 2.0


if sys.platform != "linux":  # pragma: no cover
    pytestmark = pytest.mark.skip("redis-server tests run on Linux")


async def test_redis_lost_during_the_run_falls_back_with_a_warning_once_its_share_has_lapsed(
    monkeypatch,
):
    from dxi.runner.distributed import coordinator
    from dxi.runner.distributed.shared_limits import SharedTicket

    monkeypatch.setattr(coordinator, "MEMBER_TTL", 1.0)
    with redis_server() as url:
        c = Coordinator(url, "t", shares=2)
        assert c.connect()
        limiter = shared.limiters(c, [_Model(Limits(rpm=6000, max_in_flight=8))])["p"]
        limiter.finish(await limiter.acquire(REQUEST), True)
        assert not c.down
    # the server is gone: the next booking falls back to this process's half, once its share lapsed
    # in Redis
    started = time.monotonic()
    ticket = await limiter.acquire(REQUEST)
    assert time.monotonic() - started >= 1.0 and not isinstance(ticket, SharedTicket)
    limiter.finish(ticket, True)
    assert c.down and "falls back to 1/2" in c.warnings[0]
    assert limiter.fallback.limits.rpm == 3000
    await c.close()


@pytest.mark.process
async def test_a_429_one_dxi_run_sees_pauses_the_other(redis_url: str, tmp_path: Path):
    """The first request is answered 429 with Retry-After: 1. No turn Redis booked after that report
    for either process falls within the pause (on Redis's clock, whatever the load)."""
    tasks = 40
    data = data_dir(tmp_path / "data", tasks)
    async with FakeProvider(
        model="fake", p_first=None, p_yes=None, script=["429:1"]
    ) as server:  # the first: wait 1 s
        await two_shards(server.url, data, tmp_path, redis_url, "pause-test")
        stats = server.stats()
    assert (stats["rate_limited"], stats["ok"]) == (1, tasks)
    async with redis.asyncio.from_url(redis_url) as client:
        hashes = [k async for k in client.scan_iter("dxi:pause-test:provider:*")]
        assert len(hashes) == 1
        state = {
            k.decode(): float(v)
            for k, v in (await client.hgetall(hashes[0])).items()
            if k in (b"paused", b"paused_s")
        }
    assert state["paused_s"] == pytest.approx(1.0)  # the stated wait, reported once
    paused_from, paused_until = state["paused"] - 1.0, state["paused"]
    booked = [(at, turn) for _, _, _, at, turn in events.read(tmp_path / "events.jsonl", "booking")]
    assert len(booked) >= tasks + 1  # one per attempt (and one more for an attempt booked again)
    during = [(at, turn) for at, turn in booked if at >= paused_from and turn < paused_until - 1e-3]
    assert during == []  # booked after the report: not one turn before the pause ended
    assert sum(1 for _, turn in booked if turn >= paused_until - 1e-3) >= 1


async def test_a_shared_limiter_counts_replies_and_honours_a_stated_wait_as_the_local_one_does(
    redis_url: str,
):
    a, b = two(redis_url)
    la = shared.limiters(a, [_Model(Limits(rpm=6000, max_in_flight=4))])["p"]
    la.finish(await la.acquire(REQUEST), True)
    assert (
        la.replies == 1
    )  # a provider that has answered is not stopped by one request's 400 (runner.sending.retry)
    la.finish(await la.acquire(REQUEST), False, RateLimited("429", status=429, retry_after=300.0))
    assert (
        la._paused_until - time.monotonic() > 290
    )  # honoured exactly (up to --max-stated-wait), not cut to 60 s
    await a.close()
    await b.close()


async def _shard(
    k: int,
    n: int,
    url: str,
    data: Path,
    tmp_path: Path,
    redis_port: int | str,
    run: str,
    rpm: int,
    tag: str = "",
    *,
    max_in_flight: int | None = 8,
    env: dict | None = None,
) -> asyncio.subprocess.Process:
    """``dxi run --shard k/n`` at ``rpm`` against ``url``, its coordinator reached through
    ``redis_port`` (or a ``redis://`` URL), its stderr piped; ``env``: over ``DXI_RUN_ID=run``."""
    coordinator = redis_port if isinstance(redis_port, str) else f"redis://127.0.0.1:{redis_port}/0"
    in_flight = [] if max_in_flight is None else ["--max-in-flight", str(max_in_flight)]
    return await asyncio.create_subprocess_exec(
        *dxi_command(
            data,
            tmp_path / f"cache{k}",
            tmp_path / f"out{k}{tag}",
            "-q",
            "--rpm",
            str(rpm),
            *in_flight,
            "--shard",
            f"{k}/{n}",
            "--coordinator",
            coordinator,
            models=[f"systemone:fake@{url}"],
        ),
        env=env or {**os.environ, "DXI_RUN_ID": run},
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )


async def _alive(redis_url: str, run: str, shard: int, within: float) -> float:
    """Seconds until ``shard`` is alive in Redis again (at most ``within``)."""
    import redis.asyncio as aioredis

    started = time.monotonic()
    async with aioredis.Redis.from_url(redis_url) as client:
        while True:
            score = await client.zscore(f"dxi:{run}:members", str(shard))
            now = float((await client.time())[0])
            if score is not None and score > now:
                return time.monotonic() - started
            assert time.monotonic() - started < within
            await asyncio.sleep(0.1)


RPM = 1200  # 20 a second for the run: a turn every 50 ms when every shard books through Redis
SHARE = RPM / 60 / 3  # requests a second of one shard's 1/3 share, on Redis or on its own


async def _all_alive(redis_url: str, run: str, shards: int) -> None:
    """Until every shard of the run is alive in Redis (its process started and reached it)."""
    for k in range(shards):
        await _alive(redis_url, run, k, 60)


async def _redis_now(redis_url: str) -> float:
    """Redis's clock now (seconds), the clock its bookings are on."""
    async with redis.asyncio.Redis.from_url(redis_url) as client:
        sec, usec = await client.time()
    return sec + usec / 1e6


@contextlib.asynccontextmanager
async def _three_shards(redis_url: str, tmp_path: Path, run: str, tasks: int):
    """Three ``dxi run`` shards of ``tasks`` requests at ``RPM`` against the fake provider, each
    reaching Redis through its own proxy (to cut it off), their events (``tests.helpers.events``:
    the turns Redis booked, "booking", and those a shard's own pacer booked, "pacing") in
    ``tmp_path / "events.jsonl"``, all alive in Redis: (server, proxies, procs)."""
    from .helpers.servers import TcpProxy

    data = data_dir(tmp_path / "data", tasks)
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    env = events.env(tmp_path / "events.jsonl", base={**os.environ, "DXI_RUN_ID": run})
    async with (
        FakeProvider(
            model="fake", p_first=None, p_yes=None, latency="0.02", record=False
        ) as server,
        TcpProxy(port) as p0,
        TcpProxy(port) as p1,
        TcpProxy(port) as p2,
    ):
        procs = [
            await _shard(k, 3, server.url, data, tmp_path, p.port, run, RPM, env=env)
            for k, p in enumerate((p0, p1, p2))
        ]
        await _all_alive(redis_url, run, 3)
        await asyncio.sleep(2)
        yield server, (p0, p1, p2), procs


def _turns(log: Path, pids: set[int], since: float, until: float) -> list[float]:
    """The turns Redis booked (its clock, sorted) for the processes ``pids`` at an instant of
    [``since``, ``until``)."""
    return sorted(
        turn
        for _, _, pid, at, turn in events.read(log, "booking")
        if pid in pids and since <= at < until
    )


async def _until(condition, within: float) -> None:
    """Until ``condition()`` holds (checked every 0.1 s); fails after ``within`` seconds."""
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, f"not reached within {within} s"
        await asyncio.sleep(0.1)


def _gaps(turns: list[float]) -> list[float]:
    return [b - a for a, b in zip(turns, turns[1:], strict=False)]


def _paced_on_their_own(log: Path) -> dict[int, set[float]]:
    """The request rates (a second) each process's own pacer booked at, by pid: a shard fallen back
    from Redis (the runs here set no token rate)."""
    rates: dict[int, set[float]] = {}
    for _, _, pid, rate, cost, _ in events.read(log, "pacing"):
        assert cost == 1.0
        rates.setdefault(pid, set()).add(round(rate, 9))
    return rates


@pytest.mark.process
async def test_limits_hold_when_a_shard_restarts_onto_redis_while_two_are_in_fallback(
    redis_url: str, tmp_path: Path
):
    """The decisions, not arrival times (load cannot fail them): shards 1 and 2, cut off, pace
    themselves at their 1/3 share; shard 0, restarted onto Redis meanwhile, gets turns at its 1/3
    only (not the whole rate: the others may be sending); once all are back, the whole rate, never
    more."""
    tasks, run, log = 600, "mix", tmp_path / "events.jsonl"
    async with _three_shards(redis_url, tmp_path, run, tasks) as (server, (p0, p1, p2), procs):
        first = {p.pid for p in procs}
        p1.cut()  # Redis gone for shards 1 and 2: they fall back to a third each
        p2.cut()
        await _until(  # they fall back (once their shares lapsed in Redis, 6 s) and send alone
            lambda: _paced_on_their_own(log).keys() >= {procs[1].pid, procs[2].pid}, 30
        )
        procs[0].kill()
        await procs[0].wait()
        procs[0] = await _shard(
            0,
            3,
            server.url,
            tmp_path / "data",
            tmp_path,
            p0.port,
            run,
            RPM,
            "b",
            env=events.env(log, base={**os.environ, "DXI_RUN_ID": run}),
        )  # back, onto Redis
        restarted = procs[0].pid
        await _until(lambda: len(_turns(log, {restarted}, 0, float("inf"))) >= 20, 30)
        healed = await _redis_now(redis_url)
        p1.heal()
        p2.heal()
        back = [await _alive(redis_url, run, k, 20) for k in (1, 2)]
        errs = [(await p.communicate())[1] for p in procs]
        assert [p.returncode for p in procs] == [0, 0, 0], errs
        stats = server.stats()
    assert stats["keys_ok"] == tasks  # (a request cut by the kill may be sent again)
    alone = _turns(log, {restarted}, 0, healed)  # shard 0 on Redis, shards 1 and 2 out
    assert len(alone) >= 20, len(alone)
    assert min(_gaps(alone)) >= 1 / SHARE - 1e-3  # its third, not the whole rate
    rejoined = _turns(log, first | {restarted}, healed, float("inf"))  # all on Redis again
    assert len(rejoined) >= 20 and min(_gaps(rejoined)) >= 1 / (3 * SHARE) - 1e-3
    on_their_own = _paced_on_their_own(log)
    assert on_their_own == {procs[1].pid: {round(SHARE, 9)}, procs[2].pid: {round(SHARE, 9)}}
    for err in errs[1:]:
        assert b"falls back to 1/3" in err and b"reachable again" in err
    assert (
        max(back) <= 2 * 2.0 + 3
    )  # rejoined within a few seconds of Redis coming back (a try every 2 s)


@pytest.mark.process
async def test_limits_hold_through_a_partition_of_one_shard(redis_url: str, tmp_path: Path):
    """The decisions, not arrival times: shard 2, partitioned, paces itself at its 1/3 share; once
    its share has lapsed in Redis, shards 0 and 1 together get turns at their 2/3 only."""
    from dxi.runner.distributed.coordinator import MEMBER_TTL

    tasks, run, log = 600, "partition", tmp_path / "events.jsonl"
    async with _three_shards(redis_url, tmp_path, run, tasks) as (server, (_, _, p2), procs):
        cut = await _redis_now(redis_url)
        p2.cut(blackhole=True)  # shard 2 partitioned: its calls time out, the others go on
        await _until(  # its calls time out (5 s), its share lapses (6 s), it sends on its own
            lambda: (
                len(events.read(log, "pacing")) >= 20
                and len(_turns(log, {procs[0].pid, procs[1].pid}, cut + MEMBER_TTL, float("inf")))
                >= 20
            ),
            40,
        )
        healed = await _redis_now(redis_url)
        p2.heal()
        back = await _alive(redis_url, run, 2, 20)
        errs = [(await p.communicate())[1] for p in procs]
        assert [p.returncode for p in procs] == [0, 0, 0], errs
        stats = server.stats()
    assert (stats["keys_ok"], stats["duplicates"]) == (tasks, 0)
    two = _turns(log, {procs[0].pid, procs[1].pid}, cut + MEMBER_TTL, healed)
    assert len(two) >= 20, len(two)
    assert min(_gaps(two)) >= 1 / (2 * SHARE) - 1e-3  # two thirds: shard 2 keeps its own
    assert _paced_on_their_own(log) == {procs[2].pid: {round(SHARE, 9)}}
    assert b"falls back to 1/3" in errs[2] and b"reachable again" in errs[2]
    assert b"falls back" not in errs[0] + errs[1]
    assert back <= 2 * 2.0 + 3


# seconds added to Redis's clock by the script under test: a step of the host's
SHIFT = "dxi-test:clock-shift"


async def test_a_backward_step_of_the_redis_hosts_clock_does_not_stall_the_processes(
    redis_url: str, monkeypatch, caplog: pytest.LogCaptureFixture
):
    """Issue 32: the bookings (GCRA), pauses and leases are instants of Redis's clock; after the
    host's clock stepped back an hour every booking lay an hour ahead and every process waited an
    hour, silently. The script keeps the run's clock from going back (time goes on from where it
    was), with a warning, and the shared rate still holds. The step is injected: the script's clock
    is Redis's plus a key's value."""
    import redis

    from dxi.runner.distributed import coordinator as coordinator_mod
    from dxi.runner.distributed.coordinator_script import library

    monkeypatch.setattr(
        coordinator_mod,
        "LIBRARY",
        library(coordinator_mod.TTL_S, 2 * coordinator_mod.HEARTBEAT_S, shift_key=SHIFT),
    )
    a, b = two(redis_url)
    limits = Limits(rpm=1200, max_in_flight=8)  # 20 per second together: one every 50 ms
    la, lb = shared.limiters(a, [_Model(limits)])["p"], shared.limiters(b, [_Model(limits)])["p"]
    sent: list[float] = []

    async def go(limiter, n: int) -> None:
        for _ in range(n):
            ticket = await limiter.acquire(REQUEST)
            sent.append(time.monotonic())
            limiter.finish(ticket, True)

    await asyncio.wait_for(asyncio.gather(go(la, 5), go(lb, 5)), 10)
    with redis.Redis.from_url(redis_url) as client:
        client.set(SHIFT, -3600)  # the host's clock steps back an hour
    sent.clear()
    started = time.monotonic()
    await asyncio.wait_for(asyncio.gather(go(la, 10), go(lb, 10)), 10)  # not an hour
    took = time.monotonic() - started
    await asyncio.sleep(0.2)  # the warning's message (pub/sub) heard
    await a.close()
    await b.close()
    sent.sort()
    gaps = [t2 - t1 for t1, t2 in zip(sent, sent[1:], strict=False)]
    assert (
        sum(gaps) >= 19 * 0.05 * 0.97 and took <= 19 * 0.05 * 1.5 + 0.5
    )  # the shared rate, as before the step
    stepped = [m for m in a.warnings + b.warnings if "clock stepped back 3600" in m]
    assert len(stepped) == 2 and "the shared pacing went on from where it was" in stepped[0]
