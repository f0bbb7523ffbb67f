"""Two processes on one cache never both send a request (issue 23, item 1): the claims of
``cache.claims`` (open-file-description locks the kernel drops when their holder dies), held by
``runner.dispatch`` around a model's sending, counted at the fake provider."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import polars as pl
import pytest

from dxi.cache import Cache
from dxi.cache import claims as claims_mod

from .conftest import without_requests
from .fakes.fake_provider import serve
from .helpers.runs import dxi_command
from .helpers.synthetic import data_dir

HOLD = """
import sys, time
from dxi.cache import claims
got = claims.take(sys.argv[1], "model", "m", None if sys.argv[2] == "all" else tuple(map(int, sys.argv[2].split("/"))))
print("held" if isinstance(got, claims.Claim) else "refused", flush=True)
time.sleep(60)
"""


def holder(root: Path, part: str) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(root), part], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "held"
    return proc


@pytest.mark.process
def test_a_claim_excludes_another_process_until_it_dies_by_kill_9(tmp_path: Path):
    proc = holder(tmp_path, "all")
    try:
        got = claims_mod.take(tmp_path, "model", "m")
        assert isinstance(got, claims_mod.Holder) and got.pid == proc.pid
        assert str(got).startswith(f"process {proc.pid}, since ")
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        again = claims_mod.take(
            tmp_path, "model", "m"
        )  # the kernel dropped the dead holder's lock: no stale claim
        assert isinstance(again, claims_mod.Claim)
        again.release()
    finally:
        proc.kill()
        proc.wait()


def test_shards_of_one_run_claim_side_by_side_and_overlapping_claims_exclude_each_other(
    tmp_path: Path,
):
    first = claims_mod.take(tmp_path, "model", "m", (0, 2))
    second = claims_mod.take(tmp_path, "model", "m", (1, 2))
    assert isinstance(first, claims_mod.Claim) and isinstance(
        second, claims_mod.Claim
    )  # disjoint shards
    assert isinstance(
        claims_mod.take(tmp_path, "model", "m", (1, 2)), claims_mod.Holder
    )  # the same shard again
    assert isinstance(
        claims_mod.take(tmp_path, "model", "m"), claims_mod.Holder
    )  # every request: overlaps both
    assert isinstance(
        claims_mod.take(tmp_path, "model", "m", (0, 3)), claims_mod.Holder
    )  # another sharding overlaps
    assert isinstance(
        claims_mod.take(tmp_path, "other", "o"), claims_mod.Claim
    )  # another model: free
    first.release()
    assert isinstance(
        claims_mod.take(tmp_path, "model", "m", (0, 3)), claims_mod.Holder
    )  # 1/2 still overlaps 0/3
    second.release()
    whole = claims_mod.take(tmp_path, "model", "m")
    assert isinstance(whole, claims_mod.Claim)
    assert isinstance(claims_mod.take(tmp_path, "model", "m", (0, 2)), claims_mod.Holder)
    whole.release()


@pytest.mark.process
def test_a_shard_claimed_in_another_process_excludes_the_whole_model_here(tmp_path: Path):
    proc = holder(tmp_path, "1/4")
    try:
        assert isinstance(claims_mod.take(tmp_path, "model", "m"), claims_mod.Holder)
        assert isinstance(claims_mod.take(tmp_path, "model", "m", (2, 4)), claims_mod.Claim)
    finally:
        proc.kill()
        proc.wait()


TASKS = 400


def dxi_run(url: str, data: Path, cache: Path, out: Path) -> list[str]:
    """``dxi run`` of the System One fake ``twice`` served at ``url``, 4 in flight, 10 s
    attempts."""
    return dxi_command(
        data,
        cache,
        out,
        "--max-in-flight",
        "4",
        "--timeout",
        "10",
        models=[f"systemone:twice@{url}"],
    )


@pytest.mark.process
def test_two_runs_started_together_on_one_cache_send_each_request_once(tmp_path: Path):
    """The report's case: two `dxi run` on one model and cache, started together. The second waits
    for the first, naming its process id, then finds everything cached: arrivals = distinct
    requests."""
    data = data_dir(tmp_path / "data", TASKS, seed=5)
    cache = tmp_path / "cache"
    # 30 ms a reply, 4 in flight: the first run holds its claim for about 3 s, longer than the
    # second takes to start (about 1 s), so they overlap however fast dxi starts
    with serve(model="twice", p_first=None, p_yes=None, record=False, latency="0.03") as server:
        a = subprocess.Popen(
            dxi_run(server.url, data, cache, tmp_path / "a"),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        b = subprocess.Popen(
            dxi_run(server.url, data, cache, tmp_path / "b"),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        out_a, out_b = a.communicate(timeout=300)[0], b.communicate(timeout=300)[0]
        stats = server.stats()
    assert (a.returncode, b.returncode) == (0, 0), out_a[-2000:] + out_b[-2000:]
    assert stats["arrivals"] == stats["keys_ok"] == TASKS and stats["duplicates"] == 0
    waited = [(p, o) for p, o in ((a, out_a), (b, out_b)) if "waiting for it to end" in o]
    assert len(waited) == 1  # one of them waited, saying for whom
    other = b if waited[0][0] is a else a
    assert f"process {other.pid}" in waited[0][1]
    rows = Cache(cache).scan().select("key").collect()
    assert rows.height == rows["key"].n_unique() == TASKS
    summaries = [
        without_requests(orjson.loads((tmp_path / x / "summary.json").read_bytes())) for x in "ab"
    ]
    assert summaries[0] == summaries[1]  # both score the whole cache alike
    sent = [
        orjson.loads((tmp_path / x / "summary.json").read_bytes())["models"][0]["requests"]["sent"]
        for x in "ab"
    ]
    assert sorted(sent) == [0, TASKS]


@pytest.mark.process
def test_a_second_run_goes_on_at_once_when_the_first_is_killed(tmp_path: Path):
    data = data_dir(tmp_path / "data", TASKS, seed=6)
    cache = tmp_path / "cache"
    with serve(model="twice", p_first=None, p_yes=None, record=False, latency="0.15") as server:
        a = subprocess.Popen(
            dxi_run(server.url, data, cache, tmp_path / "a"), stdout=subprocess.DEVNULL
        )
        deadline = time.monotonic() + 60
        while server.stats()["ok"] < 40:
            assert time.monotonic() < deadline and a.poll() is None
            time.sleep(0.01)
        b = subprocess.Popen(
            dxi_run(server.url, data, cache, tmp_path / "b"), stdout=subprocess.PIPE, text=True
        )
        seen = []
        while not any(
            "waiting for it to end" in line for line in seen
        ):  # b waits for a's claim, saying so
            line = b.stdout.readline()
            assert line, "".join(seen)
            seen.append(line)
        assert a.poll() is None, "a ended before b waited for it"
        a.send_signal(signal.SIGKILL)
        a.wait()
        at_kill = server.stats()
        out = "".join(seen) + b.communicate(timeout=300)[0]
        stats = server.stats()
    assert b.returncode == 0, out[-2000:]
    assert f"process {a.pid}" in out
    assert stats["keys_ok"] == TASKS
    # re-sent only what a had in flight when it was killed (its replies were lost with it), never
    # more
    assert (
        stats["duplicates"] <= 4
        and stats["arrivals"] - at_kill["arrivals"] <= TASKS - at_kill["ok"] + 4
    )
    rows = Cache(cache).scan().select("key").collect()
    assert rows["key"].n_unique() == TASKS
    assert pl.Series(rows["key"]).len() <= TASKS + 4


SLOW_KEY = """
import pathlib, sys, time
here = pathlib.Path(sys.argv[0]).parent
(here / "started").touch()
deadline = time.monotonic() + 120
while not (here / "go").exists() and time.monotonic() < deadline:
    time.sleep(0.05)
print("tok-slow")
"""


@pytest.mark.process
async def test_a_second_run_whose_start_up_is_slow_sends_nothing_the_first_stored(tmp_path: Path):
    """Issue 32, item 3: a run reads the cache's key index at start-up (to find the models whose
    every request is cached), then starts its adapters: an ``api_key_command`` may take seconds. A
    first run that started meanwhile, sent everything and ended left the claim free, so the second
    took it at once and sent every request again (230-232 in the report). Here the second run's key
    command waits until the first run has ended (deterministic: the slow start-up spans the whole
    first run); every request reaches the provider exactly once, and the second run counts them all
    as cache hits."""
    import asyncio

    from .fakes.fake_llm_server import FakeLLM

    n = 120
    data = data_dir(tmp_path / "data", n, seed=7)
    cache = tmp_path / "cache"
    (tmp_path / "slow").mkdir()
    (tmp_path / "slow" / "key.py").write_text(SLOW_KEY)
    (tmp_path / "fast.py").write_text("print('tok-fast')\n")

    def argv(url: str, out: str, key: Path) -> list[str]:
        return dxi_command(
            data,
            cache,
            tmp_path / out,
            "--option",
            f"api_key_command={sys.executable} {key}",
            "--max-in-flight",
            "8",
            "--timeout",
            "10",
            models=[f"openai:gpt-fake@{url}/v1"],
        )

    async with FakeLLM() as server:
        slow = await asyncio.create_subprocess_exec(
            *argv(server.url, "slow-out", tmp_path / "slow" / "key.py"),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while not (
            tmp_path / "slow" / "started"
        ).exists():  # its index is read: it is starting its adapter
            assert time.monotonic() < deadline and slow.returncode is None
            await asyncio.sleep(0.05)
        first = await asyncio.create_subprocess_exec(
            *argv(server.url, "first-out", tmp_path / "fast.py"),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        out_first = (await asyncio.wait_for(first.communicate(), 240))[0].decode()
        assert first.returncode == 0, out_first[-2000:]
        assert (
            len(server.requests) == n
        )  # the first run sent every request; the slow one is still starting
        (tmp_path / "slow" / "go").touch()
        out_slow = (await asyncio.wait_for(slow.communicate(), 240))[0].decode()
        assert slow.returncode == 0, out_slow[-2000:]
        bodies = [orjson.dumps(body, option=orjson.OPT_SORT_KEYS) for _, body in server.requests]
    assert len(bodies) == len(set(bodies)) == n  # every request sent exactly once, over both runs
    requests = [
        orjson.loads((tmp_path / o / "summary.json").read_bytes())["models"][0]["requests"]
        for o in ("first-out", "slow-out")
    ]
    assert [(r["sent"], r["cache_hits"]) for r in requests] == [(n, 0), (0, n)]
    rows = Cache(cache).scan().select("key").collect()
    assert rows.height == rows["key"].n_unique() == n
