"""A server that dies mid-run (``runner.sending.outage``): a real loopback server (the
fault-injecting provider in its own process) killed with SIGKILL during the run and brought back on
the same port. The provider is paused and probed one request at a time instead of every request
spending its retries; it resumes when the server answers; a server that stays away is stopped after
the run's patience (exit 6) while the other providers go on. And one endpoint unreachable at start
stops only its provider."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import time
from pathlib import Path

import orjson
import pytest

from dxi import adapters
from dxi.adapters import Limits, ProviderStop
from dxi.adapters.errors import UNREACHABLE
from dxi.cache import Cache
from dxi.evals import Suite, discover
from dxi.runner.sending.limits import ProviderLimiter
from dxi.runner.sending.outage import THRESHOLD, Outage
from dxi.runner.sending.scheduler import run

from .fakes.fake_provider import serve
from .helpers.runs import dxi_command
from .helpers.servers import free_port
from .helpers.synthetic import data_dir


def _served(port: int, model: str = "fake", **config: object):
    return serve(port=port, model=model, p_first=None, p_yes=None, latency="0.01", **config)


async def _until(condition, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not await asyncio.to_thread(condition):
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


@pytest.mark.process
async def test_a_server_killed_mid_run_is_probed_one_request_at_a_time_and_the_run_resumes_when_it_is_back(
    tmp_path: Path,
):
    """Killed after 100 replies, back 1.5 s later on the same port. With 3 attempts a request and 50
    ms of backoff, every request would use up its attempts in the outage and be stored failed;
    instead no request fails: the provider is paused, probed with backoff, and every request is
    answered once it is back."""
    tasks, in_flight = 300, 8
    data = data_dir(tmp_path / "data", tasks)
    port = free_port()
    limits = Limits(
        max_in_flight=in_flight,
        max_attempts=3,
        backoff_s=0.05,
        max_wait_s=0.4,
        attempt_timeout_s=10,
    )
    limiters: dict[str, ProviderLimiter] = {}
    with contextlib.ExitStack() as stack:
        first = stack.enter_context(_served(port))
        adapter = adapters.get(f"systemone:fake@{first.url}", limits)
        await adapter.start()

        async def kill_and_bring_back() -> None:
            await _until(lambda: first.stats()["ok"] >= 100)
            first.process.send_signal(signal.SIGKILL)
            await asyncio.to_thread(first.process.wait)
            await asyncio.sleep(1.5)
            back = _served(port)  # back, on the same port
            await asyncio.to_thread(back.__enter__)
            stack.push(back)

        with Cache(tmp_path / "cache") as cache:
            killer = asyncio.create_task(kill_and_bring_back())
            stats = (await run([adapter], Suite(discover(data)), cache, limiters=limiters))[
                adapter.label
            ]
            await killer
            rows = cache.scan().collect()
        await adapter.close()
    outage = next(iter(limiters.values())).outage
    assert (stats.ok, stats.failed, stats.refused, stats.not_sent) == (tasks, 0, 0, 0)
    assert rows.height == rows["key"].n_unique() == tasks and set(rows["status"]) == {"ok"}
    assert outage.outages == 1 and not outage.down
    # one probe at a time, backing off 0.05, 0.1, 0.2, 0.4, 0.4, ... s while it was down (the
    # restart takes seconds)
    assert 1 <= outage.probes <= 4 + outage.down_s / limits.max_wait_s
    # beyond one attempt a request: a retry of each request in flight at the kill (its connection
    # dropped, then refused), the attempts that found the provider down, and the probes; not 3
    # attempts for every request
    assert stats.attempts - tasks <= 2 * in_flight + THRESHOLD + outage.probes
    assert (
        max(sum(w) for w in rows["retry_waits_s"].to_list()) >= 1.0
    )  # a request waited out the outage


@pytest.mark.process
def test_a_server_that_stays_away_is_stopped_after_the_runs_patience_and_the_others_go_on(
    tmp_path: Path,
):
    """Two providers; one is killed mid-run and stays away: past --max-stated-wait it is stopped
    (exit 6, the terminal and summary.json say which and why), the other completes; its requests not
    sent have no row, and the rerun, with the server back on its port, sends exactly them."""
    tasks = 200
    data = data_dir(tmp_path / "data", tasks)
    port = free_port()
    with _served(port, "fake-a") as a, _served(0, "fake-b") as b:
        cmd = dxi_command(
            data,
            tmp_path / "cache",
            tmp_path / "out",
            "--max-in-flight",
            "4",
            "--backoff",
            "0.05",
            "--max-stated-wait",
            "2",
            "-q",
            models=[f"systemone:fake-a@{a.url}", f"systemone:fake-b@{b.url}"],
        )
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            deadline = time.monotonic() + 60
            while a.stats()["ok"] < 30:
                assert time.monotonic() < deadline and proc.poll() is None
                time.sleep(0.01)
            a.process.send_signal(signal.SIGKILL)
            stdout, stderr = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == 6, stderr.decode()
        summary = orjson.loads((tmp_path / "out" / "summary.json").read_bytes())
        (stopped,) = summary["stopped_providers"]
        requests = {m["model"]: m["requests"] for m in summary["models"]}
        assert (stopped["provider"], stopped["models"], stopped["cause"]) == (
            f"systemone@{a.url}",
            ["systemone:fake-a"],
            UNREACHABLE,
        )
        assert (
            stopped["message"].startswith("no connection for 2 s (")
            and "--max-stated-wait 2 s" in stopped["message"]
        )
        assert (requests["systemone:fake-b"]["sent"], requests["systemone:fake-b"]["failed"]) == (
            tasks,
            0,
        )  # went on
        left = requests["systemone:fake-a"]["refused"] + requests["systemone:fake-a"]["not_sent"]
        with Cache(tmp_path / "cache") as cache:
            rows = cache.scan().collect()
        stored_a = rows.filter(rows["model"] == "fake-a")
        assert (
            set(stored_a["status"]) == {"ok"} and stored_a.height + left == tasks
        )  # none failed, none lost
        text = stdout.decode()
        assert (
            f"Provider stopped: systemone@{a.url} stopped at " in text
            and ": server unreachable. " in text
        )
        assert b"the provider is paused and probed one request at a time" in stderr
        with _served(
            port, "fake-a"
        ) as back:  # back on its port: the rerun sends exactly what was not sent
            assert subprocess.run(cmd, timeout=120).returncode == 0
            assert back.stats()["arrivals"] == left


async def test_the_outage_probes_with_backoff_resumes_on_a_reply_and_gives_up_after_the_patience():
    stops: list[ProviderStop] = []
    o = Outage(
        Limits(backoff_s=0.01, max_wait_s=0.04, max_stated_wait_s=600),
        stops.append,
        lambda: bool(stops),
    )
    assert await o.turn() is False  # up: every attempt goes
    for _ in range(THRESHOLD - 1):
        o.record(False, False, "m: ClientConnectorError: refused")
    o.record(False, None)  # a connection that failed after opening says nothing either way
    assert not o.down
    o.record(False, False, "m: ClientConnectorError: refused")
    assert o.down and o.outages == 1
    delays = []
    for _ in range(4):  # each failed probe doubles the wait before the next, up to max_wait_s
        assert await o.turn() is True and o.probing
        o.record(True, False, "m: ClientConnectorError: refused")
        delays.append(o.delay)
    assert delays == [0.02, 0.04, 0.04, 0.04] and o.probes == 4
    two = {
        asyncio.create_task(o.turn()),
        asyncio.create_task(o.turn()),
    }  # one is the probe, the other waits
    (probe,), (waiting,) = await asyncio.wait(two, return_when=asyncio.FIRST_COMPLETED)
    assert probe.result() is True and not waiting.done()
    o.record(True, True)  # the probe got a reply: up again, the waiting attempt goes
    assert await waiting is False and not o.down and o.down_s > 0
    impatient = Outage(
        Limits(backoff_s=0.01, max_wait_s=0.02, max_stated_wait_s=0.05),
        stops.append,
        lambda: bool(stops),
    )
    for _ in range(THRESHOLD):
        impatient.record(False, False, "m: ClientConnectorError: refused")
    while not stops:
        if await impatient.turn():
            impatient.record(True, False, "m: ClientConnectorError: refused")
    (stop,) = stops
    assert stop.cause == UNREACHABLE and str(stop).endswith(
        "--max-stated-wait 0.05 s): m: ClientConnectorError: refused"
    )
    assert not impatient.down and await impatient.turn() is False


# ---- one endpoint unreachable at start stops only its provider -----------------------------------
@pytest.mark.slow
def test_an_endpoint_unreachable_at_start_stops_only_its_provider_and_estimate_warns(
    data_dir: Path, tmp_path: Path, capsys
):
    """A System One server that is not running beside the embedded model: the embedded model runs
    whole, the other provider is stopped alone (exit 6; the terminal and summary.json say which, and
    why), nothing of it is stored; ``dxi estimate`` warned of it first."""
    from dxi.runner.cli import main
    from dxi.runner.errors import EXIT_PROVIDER_STOPPED

    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    where = [
        "--model",
        f"systemone:fake@{dead}",
        "--model",
        "embedded",
        "--data-dir",
        str(data_dir),
        "--cache-dir",
        str(tmp_path / "cache"),
    ]
    assert main(["estimate", *where]) == 0
    assert (
        f"cannot be reached now: systemone:fake: cannot reach {dead} (ConnectionRefusedError"
        in capsys.readouterr().out.replace("\n", " ")
    )
    assert main(["estimate", *where, "--json"]) == 0
    estimate = orjson.loads(capsys.readouterr().out)
    assert list(estimate["unreachable"]) == ["systemone:fake"]  # the embedded model needs no server
    assert main(["run", *where, "--out", str(tmp_path / "out"), "-q"]) == EXIT_PROVIDER_STOPPED
    out = capsys.readouterr().out
    summary = orjson.loads((tmp_path / "out" / "summary.json").read_bytes())
    (stopped,) = summary["stopped_providers"]
    requests = {m["model"]: m["requests"] for m in summary["models"]}
    assert (stopped["provider"], stopped["models"], stopped["cause"]) == (
        f"systemone@{dead}",
        ["systemone:fake"],
        UNREACHABLE,
    )
    assert (stopped["refused"], stopped["not_sent"]) == (0, 12)
    assert (
        requests["embedded:sparrow-nano-general-v1.1"]["sent"],
        requests["systemone:fake"]["sent"],
    ) == (12, 0)
    assert f"Provider stopped: systemone@{dead} stopped at " in out
    assert (
        "server unreachable. 0 request(s) refused, 12 not sent (systemone:fake); the next run sends them."
        in out
    )
    with Cache(tmp_path / "cache") as cache:
        assert set(cache.scan().collect()["model"]) == {"sparrow-nano-general-v1.1"}
