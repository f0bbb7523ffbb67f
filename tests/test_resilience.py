"""``dxi run`` in its own process against the fault-injecting provider: Ctrl-C, two runs on one
cache, an all-cached rerun, a damaged shard, and a 429 storm. The provider counts what it sent, so
each test can say exactly which requests were sent again and why."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import orjson
import polars as pl
import pytest

from dxi import adapters
from dxi.adapters import Limits
from dxi.cache import Cache
from dxi.evals import DatasetError, Suite, discover
from dxi.runner.sending.scheduler import run

from .conftest import FIXTURES, without_requests
from .fakes.fake_provider import FakeProvider, serve
from .helpers.clock import VirtualLimiter
from .helpers.runs import dxi_command, run_fake
from .helpers.synthetic import data_dir


def dxi_run(url: str, data: Path, cache: Path, out: Path, *extra: str) -> list[str]:
    """``dxi run -q`` of the System One fake ``fake`` served at ``url``, with the flags
    ``extra``."""
    return dxi_command(data, cache, out, "-q", *extra, models=[f"systemone:fake@{url}"])


def summary(out: Path) -> dict:
    return orjson.loads((out / "summary.json").read_bytes())


def _sigint_ignored() -> (
    None
):  # as a non-interactive shell starts a background job (`dxi run ... &` in a script)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _sigint_blocked() -> None:  # a signal mask inherited with SIGINT blocked
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})


@pytest.mark.process
@pytest.mark.parametrize(
    "inherited", [None, _sigint_ignored, _sigint_blocked], ids=["default", "ignored", "blocked"]
)
def test_ctrl_c_stops_cleanly_keeps_what_arrived_and_the_rerun_completes(tmp_path: Path, inherited):
    """SIGINT stops the run cleanly (exit 130, every reply kept) also when dxi was started with
    SIGINT ignored or blocked, as a script's background job is: ``kill -INT`` then does what Ctrl-C
    does."""
    tasks, in_flight = 1500, 16
    data = data_dir(tmp_path / "data", tasks)
    cache = tmp_path / "cache"
    with serve(model="fake", p_first=None, p_yes=None, record=False, latency="0.02") as server:
        cmd = dxi_run(server.url, data, cache, tmp_path / "out", "--max-in-flight", str(in_flight))
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=inherited
        )
        while server.stats()["ok"] < 300:
            assert proc.poll() is None, "the run ended before it could be interrupted"
            time.sleep(0.01)
        proc.send_signal(signal.SIGINT)
        try:
            _, stderr = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:  # SIGINT was not taken: stop it
                proc.kill()
        at_stop = server.stats()
        assert proc.returncode == 130
        assert b"Interrupted" in stderr and b"rerun the same command" in stderr
        assert list(cache.glob("wal/*.jsonl")) == []  # flushed and compacted on the way out
        kept = Cache(cache).scan().collect()
        assert kept["key"].n_unique() == kept.height >= 300 - in_flight
        assert at_stop["keys_ok"] - kept.height <= in_flight  # a reply not kept was still in flight
        assert subprocess.run(cmd, timeout=120).returncode == 0
        after = server.stats()
    requests = summary(tmp_path / "out")["models"][0]["requests"]
    assert (requests["sent"], requests["cache_hits"]) == (tasks - kept.height, kept.height)
    assert (
        after["arrivals"] - at_stop["arrivals"] == tasks - kept.height
    )  # no fault injected: one each
    assert Cache(cache).scan().collect().height == tasks


@pytest.mark.process
def test_two_runs_at_once_share_one_cache_and_a_third_sends_nothing(tmp_path: Path):
    tasks = 800
    data = data_dir(tmp_path / "data", tasks)
    cache = tmp_path / "cache"
    with serve(model="fake", p_first=None, p_yes=None, record=False, latency="0.005") as server:
        procs = [
            subprocess.Popen(dxi_run(server.url, data, cache, tmp_path / f"out{i}"))
            for i in range(2)
        ]
        assert [p.wait(120) for p in procs] == [0, 0]
        both = server.stats()
        with Cache(cache) as c:
            assert c.warnings == []
            rows = c.scan().collect()
        assert rows["key"].n_unique() == tasks
        assert rows.height == both["ok"]  # every reply either run received is in the cache
        assert without_requests(summary(tmp_path / "out0")) == without_requests(
            summary(tmp_path / "out1")
        )
        assert (
            subprocess.run(
                dxi_run(server.url, data, cache, tmp_path / "out2"), timeout=120
            ).returncode
            == 0
        )
        assert server.stats()["arrivals"] == both["arrivals"]  # all cached: not one request
    requests = summary(tmp_path / "out2")["models"][0]["requests"]
    assert (requests["sent"], requests["cache_hits"]) == (0, tasks)
    assert without_requests(summary(tmp_path / "out2")) == without_requests(
        summary(tmp_path / "out0")
    )


@pytest.mark.process
def test_a_damaged_shard_is_set_aside_and_only_its_requests_are_sent_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    data = data_dir(tmp_path / "data", 300)
    cache = tmp_path / "cache"
    with serve(model="fake", p_first=None, p_yes=None, record=False) as server:
        assert run_fake(server.url, data, cache, tmp_path / "first", limit=100) == 0
        assert run_fake(server.url, data, cache, tmp_path / "full") == 0
        first_shard = sorted(cache.glob("shards/*.parquet"))[0]
        assert pl.read_parquet(first_shard).height == 100
        first_shard.write_bytes(
            first_shard.read_bytes()[:-100]
        )  # cut off its end, as a full disk would
        before = server.stats()["arrivals"]
        assert run_fake(server.url, data, cache, tmp_path / "again") == 0
        assert server.stats()["arrivals"] - before == 100  # exactly the lost requests
    assert (
        "is unreadable" in caplog.text and "quarantine" in caplog.text
    )  # the warnings dxi run prints
    assert len(list(cache.glob("quarantine/*.parquet.*"))) == 1
    assert without_requests(summary(tmp_path / "again")) == without_requests(
        summary(tmp_path / "full")
    )


@pytest.mark.slow
async def test_a_429_storm_does_not_become_a_retry_storm(tmp_path: Path):
    """A provider allowing 120 requests a minute (one every 0.5 s, bursts of 2), hit by 8 requests
    at once, twice: once stating its limit in x-ratelimit headers, once not. A client retrying each
    429 after its small backoff (10 ms) would get ~50 429s per request; the runner pauses on each
    429's Retry-After, narrows its window, and (when told) paces itself at the stated rate."""
    data = data_dir(tmp_path / "data", 12)
    limits = Limits(max_in_flight=8, max_attempts=20, backoff_s=0.01, attempt_timeout_s=10)
    counts = {}
    for stated in (True, False):
        async with _provider(rpm=120, burst=2, rate_headers=stated) as server:
            adapter = adapters.get(f"systemone:fake@{server.url}", limits)
            await adapter.start()
            with Cache(tmp_path / f"cache-{stated}") as cache:
                stats = (await run([adapter], Suite(discover(data), evals=("when2call",)), cache))[
                    adapter.label
                ]
            await adapter.close()
            counts[stated] = server.stats()
            assert stats.ok == 12 and stats.rate_limited == counts[stated]["rate_limited"]
    assert (
        counts[True]["rate_limited"] <= 8
    )  # the first burst (8 - 2 let through) and no more than 2 after
    assert (
        counts[False]["rate_limited"] <= 3 * 12
    )  # a few 429s per reply at most, not dozens (~18 here)


def _provider(**config: object) -> FakeProvider:
    return FakeProvider(model="fake", p_first=None, p_yes=None, **config)


async def test_a_token_budget_spaces_requests_by_the_usage_replies_report(tmp_path: Path):
    """100 tokens a second, one request at a time: each request books its estimated tokens,
    corrected to the usage its reply reports before the next is booked, so request i+1 is let
    through exactly (tokens used by request i) / 100 s after request i. The limiter runs on a
    virtual clock (``VirtualLimiter``: its waits advance the clock, nothing else does), so the load
    of the machine cannot move its decisions."""
    data = data_dir(tmp_path / "data", 6)
    limits = Limits(max_in_flight=1, tpm=6000, attempt_timeout_s=10)
    async with _provider() as server:
        adapter = adapters.get(f"systemone:fake@{server.url}", limits)
        await adapter.start()
        limiter = VirtualLimiter(limits)
        with Cache(tmp_path / "cache") as cache:
            await run(
                [adapter],
                Suite(discover(data), evals=("when2call",)),
                cache,
                limiters={adapter.limits_key: limiter},
            )
            rows = cache.scan().collect()
        await adapter.close()
    used = {
        orjson.loads(r["request_body"])["state"]: r["input_tokens"] + r["output_tokens"]
        for r in rows.to_dicts()
    }
    spent = [
        used[payload["state"]] for _, payload in server.requests
    ]  # in the order they were sent
    sent = [t.sent_at for t in limiter.tickets]
    assert len(sent) == len(spent) == 6 and min(spent) > 30 and sent[0] == 0.0
    assert limiter.tickets[0].tokens == pytest.approx(
        limiter.tickets[0].body_bytes / 4
    )  # booked by estimate
    for i in range(5):  # unpaced they would all be sent at 0.0
        assert sent[i + 1] - sent[i] == pytest.approx(spent[i] / 100, abs=1e-9)


async def test_a_request_two_tasks_share_is_sent_once(tmp_path: Path):
    data = tmp_path / "data" / "omniscience" / "o.jsonl"
    data.parent.mkdir(parents=True)
    rows = [
        orjson.loads(line) for line in (FIXTURES / "omniscience.jsonl").read_bytes().splitlines()
    ]
    copies = [
        {**rows[0], "question_id": f"copy-{i}"} for i in range(2)
    ]  # row 1's question twice more
    data.write_bytes(
        b"".join(orjson.dumps(r) + b"\n" for r in [rows[0], rows[1], copies[0], rows[2], copies[1]])
    )
    async with _provider() as server:
        adapter = adapters.get(f"systemone:fake@{server.url}", Limits(max_in_flight=4))
        await adapter.start()
        with Cache(tmp_path / "cache") as cache:
            stats = (await run([adapter], Suite(discover(tmp_path / "data")), cache))[adapter.label]
        await adapter.close()
    assert (server.stats()["arrivals"], stats.sent, stats.cache_hits) == (3, 3, 2)


async def test_a_task_id_twice_is_refused_before_anything_is_sent(tmp_path: Path):
    data = data_dir(tmp_path / "data", 3)
    path = data / "when2call" / "when2call_test_mcq.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(
        lines[0] + lines[1] + lines[0] + lines[2]
    )  # row 1 twice: one task id, two rows
    async with _provider() as server:
        adapter = adapters.get(f"systemone:fake@{server.url}", Limits(max_in_flight=4))
        await adapter.start()
        with (
            Cache(tmp_path / "cache") as cache,
            pytest.raises(DatasetError, match="row 3.*also the id of row 1"),
        ):
            await run([adapter], Suite(discover(data), evals=("when2call",)), cache)
        await adapter.close()
    assert server.stats()["arrivals"] == 0


@pytest.mark.process
def test_a_language_model_through_the_same_faults_ends_with_one_valid_row_per_task(tmp_path: Path):
    """The openai adapter (structured outputs) against the fault-injecting provider's Chat
    Completions route: 10% 429 with Retry-After, 5% 5xx, 2% timeouts, 2% resets, 3% malformed
    bodies; every task ends with one valid row and the provider answered each request content
    once."""
    tasks = 400
    data = data_dir(tmp_path / "data", tasks, seed=11)
    faults = {
        "rate_limit": 0.10,
        "server_error": 0.05,
        "hang": 0.02,
        "reset": 0.02,
        "malformed": 0.03,
        "retry_after": "0.01",
    }
    with serve(model="fake-chat", record=False, seed=5, faults=faults, hang_s=10) as server:
        cmd = dxi_command(
            data,
            tmp_path / "cache",
            tmp_path / "out",
            "-q",
            "--max-in-flight",
            "32",
            "--max-attempts",
            "12",
            "--timeout",
            "0.5",
            "--backoff",
            "0.05",
            models=[f"openai:fake-chat@{server.url}/v1"],
        )
        assert subprocess.run(cmd, timeout=300).returncode == 0
        stats = server.stats()
    rows = Cache(tmp_path / "cache").scan().collect()
    assert rows.height == rows["task_id"].n_unique() == tasks
    assert rows["status"].unique().to_list() == ["ok"]
    assert (stats["keys_ok"], stats["duplicates"]) == (tasks, 0)
    assert min(stats[k] for k in ("rate_limited", "server_error", "hang", "reset", "malformed")) > 0
    m = summary(tmp_path / "out")["models"][0]
    assert m["model"] == "openai:fake-chat" and m["evals"]["when2call"]["n"] == tasks
    assert m["evals"]["when2call"]["invalid"] == 0 and m["requests"]["sent"] == tasks
