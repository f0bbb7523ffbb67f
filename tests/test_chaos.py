"""The chaos test: 5,000 tasks against the fault-injecting provider, ``dxi run`` killed with SIGKILL
at five points of the run (after 700, 1,600, 2,600 and 3,700 answers sent; mid-compaction of the log
as a run ends) and resumed each time. It must end with exactly one record per task, every answer the
provider sent either in the cache or re-requested only because it was in flight at a kill, a summary
identical to an uninterrupted run, and no more requests than tasks + retries + what was in
flight."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import orjson
import polars as pl
import pytest

from dxi.cache import Cache

from .conftest import without_requests
from .fakes.fake_provider import serve
from .helpers import events
from .helpers.runs import dxi_command
from .helpers.synthetic import data_dir

pytestmark = pytest.mark.process

TASKS = 5000
MAX_IN_FLIGHT = 64
KILL_AT_ANSWERS = (700, 1600, 2600, 3700)  # then a fifth kill, mid-compaction
KILLS = len(KILL_AT_ANSWERS) + 1
# per attempt: 10% 429 (Retry-After 0.01 s), 5% 5xx, 2% timeouts, 2% connection resets, 3% malformed
# bodies
FAULTS = {
    "rate_limit": 0.10,
    "server_error": 0.05,
    "hang": 0.02,
    "reset": 0.02,
    "malformed": 0.03,
    "retry_after": "0.01",
}


def dxi_run(url: str, data: Path, cache: Path, out: Path) -> list[str]:
    """``dxi run -q`` of the fault-injecting fake ``chaos`` served at ``url`` on ``data``, caching
    in ``cache`` and writing ``out`` (``MAX_IN_FLIGHT`` in flight, 12 attempts, 0.5 s timeout, 0.05
    s backoff): the command line."""
    return dxi_command(
        data,
        cache,
        out,
        "-q",
        "--max-in-flight",
        str(MAX_IN_FLIGHT),
        "--max-attempts",
        "12",
        "--timeout",
        "0.5",
        "--backoff",
        "0.05",
        models=[f"systemone:chaos@{url}"],
    )


def test_kill_9_five_times_then_resume(tmp_path: Path):
    data = data_dir(tmp_path / "data", TASKS, seed=7)
    with serve(model="chaos", p_first=None, p_yes=None, record=False) as clean:
        done = subprocess.run(
            dxi_run(clean.url, data, tmp_path / "ref-cache", tmp_path / "ref"), timeout=300
        )
    assert done.returncode == 0
    reference = orjson.loads((tmp_path / "ref" / "summary.json").read_bytes())

    cache_dir, out = tmp_path / "cache", tmp_path / "out"
    log = tmp_path / "events.jsonl"
    with serve(
        model="chaos", p_first=None, p_yes=None, record=False, seed=3, faults=FAULTS, hang_s=10
    ) as server:
        for (
            target
        ) in KILL_AT_ANSWERS:  # killed the moment the provider has sent that many answers in all
            proc = subprocess.Popen(dxi_run(server.url, data, cache_dir, out))
            deadline = time.monotonic() + 120
            while server.stats()["ok"] < target:
                assert proc.poll() is None, f"the run ended before its kill at {target} answers"
                assert time.monotonic() < deadline
                time.sleep(0.01)
            proc.send_signal(signal.SIGKILL)
            assert proc.wait() == -signal.SIGKILL
            at_kill = server.stats()
            with Cache(
                cache_dir
            ) as cache:  # what the next run starts from (it recovers the killed run's log)
                held = cache.scan().select("key").unique().collect().height
            assert (
                at_kill["keys_ok"] - held <= MAX_IN_FLIGHT
            )  # answers not in the cache were in flight
        # the last kill: mid-compaction of the run's log as it ends (its shard written, not yet in
        # place)
        killed = subprocess.run(
            dxi_run(server.url, data, cache_dir, out),
            env=events.env(log, "compaction:1"),
            timeout=300,
        )
        assert killed.returncode == -signal.SIGKILL and events.reached(log, "compaction:1")
        assert list(
            cache_dir.glob("wal/*.jsonl")
        )  # the log is still there: the next run compacts it
        final = subprocess.run(dxi_run(server.url, data, cache_dir, out), timeout=300)
        stats = server.stats()
    assert final.returncode == 0

    rows = Cache(cache_dir).scan().collect()
    assert rows.height == TASKS  # exactly one record per task
    assert rows["key"].n_unique() == TASKS and rows["task_id"].n_unique() == TASKS
    assert rows["status"].unique().to_list() == ["ok"]
    summary = orjson.loads((out / "summary.json").read_bytes())
    assert without_requests(summary) == without_requests(reference)

    faults = sum(stats[k] for k in ("rate_limited", "server_error", "hang", "reset", "malformed"))
    in_flight_at_kills = KILLS * MAX_IN_FLIGHT
    assert stats["keys_ok"] == TASKS
    assert (
        stats["duplicates"] + stats["aborted"] <= in_flight_at_kills
    )  # re-requested: only what was in flight
    assert stats["arrivals"] <= TASKS + faults + in_flight_at_kills
    assert min(stats[k] for k in ("rate_limited", "server_error", "hang", "reset", "malformed")) > 0
    # the final run sent only what was missing: its own count of sent requests is what the cache
    # lacked
    assert (
        summary["models"][0]["requests"]["sent"] + summary["models"][0]["requests"]["cache_hits"]
        == TASKS
    )
    assert pl.Series(rows["attempts"]).min() >= 1
