"""``dxi run`` in its own process, stopped by a signal: no process outlives it (the embedded model's
workers and multiprocessing's resource tracker die with it however it ends), SIGTERM stops it as
Ctrl-C does (exit 143), a first Ctrl-C or SIGTERM drains (the requests in flight finish and are
stored, nothing new is sent) while a second aborts at once, and a Ctrl-C while Python is still
importing prints no traceback.

Process trees are read from ``/proc`` (no psutil): ``dxi`` is started in a session of its own, so
every process it starts shares its process group, which outlives it (orphans are adopted, not
moved)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import orjson
import polars as pl
import pytest

from dxi.cache import Cache
from dxi.runner.sending.cost import UNBOUNDED

from .conftest import DXI
from .fakes.fake_provider import serve
from .helpers.runs import dxi_command, served_run
from .helpers.synthetic import data_dir

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/stat").exists(), reason="reads process trees from /proc"
)


def group(pgid: int) -> dict[int, str]:
    """The live processes of process group ``pgid``: pid -> command line (zombies, already dead,
    left out)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (
                (entry / "cmdline")
                .read_bytes()
                .replace(b"\0", b" ")
                .decode(errors="replace")
                .strip()
            )
        except OSError:  # ended while we looked
            continue
        state, _ppid, pgrp = stat.rsplit(")", 1)[1].split()[:3]
        if int(pgrp) == pgid and state != "Z":
            found[int(entry.name)] = cmdline
    return found


def wait_for(condition, timeout: float, what: str):
    """Poll ``condition()`` every 20 ms until it returns something true (returned), failing after
    ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)
    return value


def started(cmd: list[str], tmp_path: Path) -> subprocess.Popen:
    """``cmd`` in a session of its own, its output to ``tmp_path``/stdout and /stderr (files, not
    pipes: a process that outlived it would hold a pipe open)."""
    with (tmp_path / "stdout").open("wb") as out, (tmp_path / "stderr").open("wb") as err:
        return subprocess.Popen(cmd, stdout=out, stderr=err, start_new_session=True)


def output(tmp_path: Path) -> tuple[str, str]:
    return (tmp_path / "stdout").read_text(), (tmp_path / "stderr").read_text()


def embedded_run(tmp_path: Path, tasks: int, *extra: str) -> subprocess.Popen:
    data = data_dir(tmp_path / "data", tasks)
    return started(
        [
            DXI,
            "run",
            "--model",
            "embedded",
            "--data-dir",
            str(data),
            "--evals",
            "when2call",  # the synthetic data: When2Call only
            "--cache-dir",
            str(tmp_path / "cache"),
            "--out",
            str(tmp_path / "out"),
            *extra,
        ],
        tmp_path,
    )


# ---- the embedded model's worker processes die with their parent, whatever kills it --------------
@pytest.mark.process
@pytest.mark.parametrize(
    "sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL], ids=["INT", "TERM", "KILL"]
)
def test_no_embedded_worker_nor_resource_tracker_outlives_dxi(tmp_path: Path, sig: signal.Signals):
    from dxi.adapters.embedded import WORKERS

    proc = embedded_run(tmp_path, 20_000, "-q")
    try:
        # dxi, its workers and the resource tracker, once the run is answering (its log has rows)
        wait_for(
            lambda: (
                len(group(proc.pid)) >= WORKERS + 2
                and any((tmp_path / "cache").glob("wal/*.jsonl"))
            ),
            120,
            "the embedded model's workers",
        )
        children = set(group(proc.pid)) - {proc.pid}
        assert any("resource_tracker" in group(proc.pid).get(p, "") for p in children)
        proc.send_signal(sig)
        assert (
            proc.wait(60)
            == {signal.SIGINT: 130, signal.SIGTERM: 143, signal.SIGKILL: -signal.SIGKILL}[sig]
        )
        if sig != signal.SIGKILL:
            stdout, stderr = output(tmp_path)
            assert "Traceback" not in stderr, stderr
            assert "rerun the same command to continue" in stderr  # a diagnostic: stderr
        left = {}
        try:
            wait_for(lambda: not group(proc.pid), 20, "the workers and the tracker to end")
        except AssertionError:
            left = group(proc.pid)
        assert left == {}, f"outlived dxi (killed by {sig.name}): {left}"
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in group(proc.pid):
            os.kill(pid, signal.SIGKILL)


# ---- the first Ctrl-C or SIGTERM drains: the requests in flight finish and are stored ------------
@pytest.mark.process
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["INT", "TERM"])
def test_the_first_signal_lets_the_requests_in_flight_finish_and_stores_them(
    tmp_path: Path, sig: signal.Signals
):
    """Every request takes 1.5 s, 8 at a time, so requests go in waves 1.5 s apart: the signal comes
    just after the second wave reached the server. Those 8 are answered whole and stored, nothing
    more is sent, and the rerun sends exactly the rest, none of them twice."""
    tasks = 60
    with serve(model="fake", p_first=None, p_yes=None, latency="1.5") as server:
        cmd = served_run(server.url, data_dir(tmp_path / "data", tasks), tmp_path)
        proc = started(cmd, tmp_path)
        try:
            at_signal = wait_for(
                lambda: (s := server.stats())["arrivals"] >= 16 and s, 60, "the second wave"
            )
            proc.send_signal(sig)
            assert proc.wait(60) == (143 if sig == signal.SIGTERM else 130)
        finally:
            if proc.poll() is None:
                proc.kill()
        stopped = server.stats()
        stdout, stderr = output(tmp_path)
        with Cache(tmp_path / "cache") as cache:
            stored = cache.scan().collect()
        name = "SIGTERM" if sig == signal.SIGTERM else "Ctrl-C"
        assert (at_signal["arrivals"], at_signal["ok"]) == (16, 8)  # the second wave on the wire
        assert stopped["arrivals"] == 16  # nothing new was sent
        assert (stopped["ok"], stopped["aborted"]) == (
            16,
            0,
        )  # every request in flight was answered whole ...
        assert stored.height == stored["key"].n_unique() == 16  # ... and stored
        assert (
            f"stopping ({name}): nothing new is sent; 8 request(s) in flight finish and are stored (at most 25 s; "
            "again to stop at once)"
        ) in stdout
        assert f"stopping ({name}): every request that was in flight is stored" in stdout
        # the progress (results) on standard output, the interruption (a status line) on standard
        # error
        assert (
            f"Interrupted ({name}): the requests in flight finished and are stored; {tasks - 16} "
            "request(s) were not sent."
        ) in stderr
        assert "Interrupted" not in stdout
        assert "rerun the same command to continue" in stderr and "Traceback" not in stderr, stderr
        assert subprocess.run(cmd + ["-q"], timeout=120).returncode == 0
        after = server.stats()
    assert after["arrivals"] - stopped["arrivals"] == tasks - 16  # the rest, once each
    assert (after["duplicates"], after["keys_ok"]) == (0, tasks)  # none sent twice over both runs


@pytest.mark.process
@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["INT", "TERM"])
def test_a_drained_run_counts_what_each_model_sent_found_cached_and_left(
    tmp_path: Path, sig: signal.Signals
):
    """Two models, 30 tasks; the last 5 are cached by an earlier run. Requests take 1.5 s, 8 at a
    time, the models taking turns: the signal comes as the second wave (4 of each) reaches the
    server. Each model then sent 8, found 5 in the cache (met while its rest was counted) and left
    17 not sent: sent + cache_hits + not_sent = 30, as after the cost bound. Its line in
    run-history.jsonl carries these counts, the terminal says how many were not sent, and the rerun
    sends exactly those 34."""
    data = data_dir(tmp_path / "data", 30)
    rows = (data / "when2call" / "when2call_test_mcq.jsonl").read_bytes().splitlines(keepends=True)
    last = data_dir(tmp_path / "last", 0)
    (last / "when2call" / "when2call_test_mcq.jsonl").write_bytes(b"".join(rows[25:]))
    with serve(model=None, p_first=None, p_yes=None, latency="1.5") as server:
        urls = [f"systemone:a@{server.url}", f"systemone:b@{server.url}"]
        cmd = dxi_command(
            data, tmp_path / "cache", tmp_path / "out", "--max-in-flight", "8", models=urls
        )
        earlier = dxi_command(last, tmp_path / "cache", tmp_path / "first", "-q", models=urls)
        assert subprocess.run(earlier, timeout=120, stdout=subprocess.DEVNULL).returncode == 0
        assert server.stats()["arrivals"] == 10
        proc = started(cmd, tmp_path)
        try:
            wait_for(lambda: server.stats()["arrivals"] >= 26, 60, "the second wave")
            proc.send_signal(sig)
            assert proc.wait(60) == (143 if sig == signal.SIGTERM else 130)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert server.stats()["arrivals"] == 26  # 16 sent by the interrupted run
        with Cache(tmp_path / "cache") as cache:
            stored = cache.scan().collect()
        (line,) = [orjson.loads(raw) for raw in (tmp_path / "out" / "run-history.jsonl").open("rb")]
        stdout, stderr = output(tmp_path)
        assert subprocess.run(cmd + ["-q"], timeout=120, stdout=subprocess.DEVNULL).returncode == 0
        rerun = server.stats()["arrivals"] - 26
    terminated = sig == signal.SIGTERM
    assert (line["exit_code"], line["outcome"]) == (
        (143, "terminated") if terminated else (130, "interrupted")
    )
    assert (line["cost_bound"], line["stopped_providers"]) == (None, [])
    counted = ("sent", "cache_hits", "not_sent", "refused", "attempts", "failed", "invalid")
    assert {label: {k: block[k] for k in counted} for label, block in line["requests"].items()} == {
        label: {"sent": 8, "cache_hits": 5, "not_sent": 17, "refused": 0, "attempts": 8}
        | {"failed": 0, "invalid": 0}
        for label in ("systemone:a", "systemone:b")
    }
    # what the cache holds: the earlier run's 5 and this run's 8, per model
    assert stored.group_by("model").len().sort("model").rows() == [("a", 13), ("b", 13)]
    name = "SIGTERM" if terminated else "Ctrl-C"
    assert (
        f"Interrupted ({name}): the requests in flight finished and are stored; 34 request(s) were "
        f"not sent. Every reply that arrived is in {tmp_path / 'cache'}; rerun the same command to "
        "continue."
    ) in " ".join(stderr.split())
    for label in ("systemone:a", "systemone:b"):  # each model's last progress line says it too
        assert re.search(
            rf"{label}: 13/30 43% .* stopped .* failed 0 cached 5 not sent 17\n", stdout
        ), stdout
    assert rerun == 34  # the rerun sends what was counted not sent, and nothing else


@pytest.mark.process
@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["INT", "TERM"])
def test_a_drained_run_writes_what_arrived_marked_interrupted_and_says_its_stopped_provider(
    tmp_path: Path, sig: signal.Signals
):
    """Two models on 30 tasks: ``fake`` answers in 1.5 s, 8 at a time; ``gone``'s server cannot be
    reached, so its provider stops at the start (its 30 requests not sent). The signal comes as
    fake's second wave reaches the server: fake sent 16 and left 14. The run writes summary.json
    and answers.parquet of what arrived, marked ``interrupted``, each missing answer counted as for
    any incomplete run (provisional, with bounds; not accepted), and prints the stopped provider's
    line as a run that ends does. They used to be missing: no summary.json, no line."""
    from .helpers.servers import free_port

    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    data = data_dir(tmp_path / "data", 30)
    with serve(model="fake", p_first=None, p_yes=None, latency="1.5") as server:
        models = [f"systemone:fake@{server.url}", f"systemone:gone@{dead}"]
        cmd = dxi_command(
            data, tmp_path / "cache", tmp_path / "out", "--max-in-flight", "8", models=models
        )
        proc = started(cmd, tmp_path)
        try:
            wait_for(lambda: server.stats()["arrivals"] >= 16, 60, "the second wave")
            proc.send_signal(sig)
            code = proc.wait(60)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert server.stats()["arrivals"] == 16
    terminated = sig == signal.SIGTERM
    assert code == (143 if terminated else 130)
    stdout, stderr = output(tmp_path)
    out = tmp_path / "out"
    summary = orjson.loads((out / "summary.json").read_bytes())
    (line,) = [orjson.loads(raw) for raw in (out / "run-history.jsonl").open("rb")]
    name = "SIGTERM" if terminated else "Ctrl-C"
    assert summary["interrupted"] == {"signal": name, "exit_code": code, "not_sent": 44}
    assert (summary["complete"], summary["accepted"]) == (False, False)
    requests = {m["model"]: m["requests"] for m in summary["models"]}
    assert requests == line["requests"]  # the run's counts, as its line in run-history.jsonl
    counted = ("sent", "cache_hits", "not_sent", "refused")
    assert {label: [block[k] for k in counted] for label, block in requests.items()} == {
        "systemone:fake": [16, 0, 14, 0],
        "systemone:gone": [0, 0, 30, 0],
    }
    (stopped,) = summary["stopped_providers"]
    assert (stopped["provider"], stopped["models"], stopped["not_sent"]) == (
        f"systemone@{dead}",
        ["systemone:gone"],
        30,
    )
    fake, gone = (m["evals"]["when2call"] for m in summary["models"])
    keys = ("n", "replied", "missing", "complete", "rerun")
    assert [fake[k] for k in keys] == [30, 16, 14, False, 14]
    assert [gone[k] for k in keys] == [30, 0, 30, False, 30]
    correct = round(fake["accuracy"] * 16 / 100)  # of the 16 answers; the 14 missing: any outcome
    assert fake["accuracy_bounds"] == [
        round(100 * correct / 30, 6),
        round(100 * (correct + 14) / 30, 6),
    ]
    assert (gone["accuracy"], "accuracy_bounds" in gone) == (None, False)
    answers = pl.read_parquet(out / "answers.parquet")
    assert answers.group_by("model", "status").len().sort("model", "status").rows() == [
        ("systemone:fake", "missing", 14),
        ("systemone:fake", "ok", 16),
        ("systemone:gone", "missing", 30),
    ]
    assert sorted(p.name for p in out.iterdir()) == [
        "answers.parquet",
        "run-history.jsonl",
        "summary.json",
    ]
    said = " ".join(stdout.split())
    assert (
        f"Provider stopped: systemone@{dead} stopped at " in said
        and "server unreachable. 0 request(s) refused, 30 not sent (systemone:gone); the next run "
        "sends them."
        in said
    )
    assert (
        f"Interrupted ({name}): the requests in flight finished and are stored; 44 request(s) were "
        f"not sent. Every reply that arrived is in {tmp_path / 'cache'}; rerun the same command to "
        f"continue. What arrived is scored in {out}/summary.json, marked interrupted: partial, the "
        "answers not there counted missing (provisional figures, with their bounds)."
    ) in " ".join(stderr.split())
    assert "Traceback" not in stderr


def test_writing_cut_by_the_end_of_the_grace_period_leaves_the_outputs_there_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """The grace period ends while a stopped run writes what arrived (here: its summary takes 5 s
    to encode, 0.3 s are left): the writing stops at the deadline, the summary.json and
    answers.parquet of before are left byte for byte, and no temporary file is left beside them;
    with time enough, both are replaced."""
    from types import SimpleNamespace

    from dxi.runner import signals
    from dxi.runner.outputs import files

    out = tmp_path / "out"
    out.mkdir()
    (out / "summary.json").write_bytes(b'{"before": true}')
    (out / "answers.parquet").write_bytes(b"the answers before")
    answers = pl.DataFrame({"model": ["m"], "status": ["ok"]})
    monkeypatch.setattr(
        files, "summarize", lambda *a, **k: ("summary", SimpleNamespace(answers=answers))
    )
    monkeypatch.setattr(files.scoring, "export", lambda frame: frame)
    slow = 5.0
    monkeypatch.setattr(files.records, "to_json", lambda s: time.sleep(slow) or b'{"after": true}')
    started_at = time.monotonic()
    result = signals.within(started_at + 0.3, lambda: files.score_all(None, None, None, out, None))
    assert (result, time.monotonic() - started_at < 2) == ((None, "grace"), True)
    assert (out / "summary.json").read_bytes() == b'{"before": true}'
    assert (out / "answers.parquet").read_bytes() == b"the answers before"
    assert sorted(p.name for p in out.iterdir()) == ["answers.parquet", "summary.json"]
    assert signals.within(time.monotonic() - 1, lambda: 1 / 0) == (None, "grace")  # none left
    slow = 0.0
    scored, why = signals.within(
        time.monotonic() + 10, lambda: files.score_all(None, None, None, out, None)
    )
    assert (scored.summary, why) == ("summary", None)
    assert (out / "summary.json").read_bytes() == b'{"after": true}'
    assert pl.read_parquet(out / "answers.parquet").equals(answers)
    assert sorted(p.name for p in out.iterdir()) == ["answers.parquet", "summary.json"]


def test_the_end_of_the_grace_period_while_the_outputs_are_put_in_place_comes_after_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """The grace period ends (SIGALRM) inside the step that puts a stopped run's outputs in place,
    the earlier ones already moved away: it is held until the new ones are all in place, then ends
    the writing; the folder holds the new summary.json and answers.parquet, and the run's last line
    says what arrived is scored there (not "was not written")."""
    from types import SimpleNamespace

    from dxi.runner import signals
    from dxi.runner.outputs import files, staging

    out = tmp_path / "out"
    out.mkdir()
    (out / "summary.json").write_bytes(b'{"before": true}')
    (out / "answers.parquet").write_bytes(b"the answers before")
    answers = pl.DataFrame({"model": ["m"], "status": ["ok"]})
    monkeypatch.setattr(
        files, "summarize", lambda *a, **k: ("summary", SimpleNamespace(answers=answers))
    )
    monkeypatch.setattr(files.scoring, "export", lambda frame: frame)
    monkeypatch.setattr(files.records, "to_json", lambda s: b'{"after": true}')
    monkeypatch.setattr(staging, "_state", {})
    clear = staging._clear

    def grace_over(where: Path, old: Path) -> list[str]:
        moved = clear(where, old)
        signal.raise_signal(signal.SIGALRM)  # as the grace period's timer fires here
        return moved

    monkeypatch.setattr(staging, "_clear", grace_over)
    result = signals.within(
        time.monotonic() + 30, lambda: files.score_all(None, None, None, out, None)
    )
    assert result == (None, "grace")
    assert (out / "summary.json").read_bytes() == b'{"after": true}'
    assert pl.read_parquet(out / "answers.parquet").equals(answers)
    assert sorted(p.name for p in out.iterdir()) == ["answers.parquet", "summary.json"]
    stop = signals.Interrupted(signal.SIGTERM, True, counts=SimpleNamespace(not_sent=3))
    stop.unwritten = "grace"
    assert signals.written(stop, out) == (
        f" What arrived is scored in {out}/summary.json, marked interrupted: partial, the answers "
        "not there counted missing (provisional figures, with their bounds)."
    )


@pytest.mark.process
@pytest.mark.slow
def test_a_model_sent_after_waiting_for_another_process_drains_as_the_others_do(tmp_path: Path):
    """Run a holds the model's claim on the cache (16 of the 40 tasks, 2 in flight, 1.5 s a reply:
    12 s); run b, started meanwhile, waits for it, then sends the 24 a left, 8 in flight. The first
    Ctrl-C to b as its first wave reaches the server lets those 8 finish and stores them, as for a
    model claimed at once: it used to cancel b's sending, the 8 replies paid for and lost (aborted
    at the provider, not in the cache) and the run counting none of the 16 it left."""
    data = data_dir(tmp_path / "data", 40)
    rows = (data / "when2call" / "when2call_test_mcq.jsonl").read_bytes().splitlines(keepends=True)
    first = data_dir(tmp_path / "first", 0)
    (first / "when2call" / "when2call_test_mcq.jsonl").write_bytes(b"".join(rows[:16]))
    cache = tmp_path / "cache"
    with serve(model="fake", p_first=None, p_yes=None, latency="1.5") as server:
        url = [f"systemone:fake@{server.url}"]
        a = subprocess.Popen(
            dxi_command(first, cache, tmp_path / "a", "--max-in-flight", "2", "-q", models=url),
            stdout=subprocess.DEVNULL,
        )
        cmd = dxi_command(data, cache, tmp_path / "out", "--max-in-flight", "8", models=url)
        b = None
        try:
            wait_for(lambda: server.stats()["arrivals"] >= 2, 60, "run a sending")
            b = started(cmd, tmp_path)
            wait_for(lambda: "waiting for it to end" in output(tmp_path)[0], 60, "b waiting")
            assert a.poll() is None, "run a ended before b waited for it"
            assert a.wait(60) == 0
            at_signal = wait_for(
                lambda: (s := server.stats())["arrivals"] >= 24 and s, 60, "b's first wave"
            )
            b.send_signal(signal.SIGINT)
            assert b.wait(60) == 130
        finally:
            for proc in (a, b):
                if proc is not None and proc.poll() is None:
                    proc.kill()
        stopped = wait_for(  # every arrival replied to, or found gone when its reply was due
            lambda: (s := server.stats())["ok"] + s["aborted"] == s["arrivals"] and s, 10, "replies"
        )
        with Cache(cache) as c:
            stored = c.scan().collect()
        (line,) = [orjson.loads(raw) for raw in (tmp_path / "out" / "run-history.jsonl").open("rb")]
        stdout, stderr = output(tmp_path)
        assert subprocess.run(cmd + ["-q"], timeout=120, stdout=subprocess.DEVNULL).returncode == 0
        after = server.stats()
    assert (at_signal["arrivals"], at_signal["ok"]) == (24, 16)  # b's first wave on the wire
    # none abandoned: b's 8 answered whole and stored, nothing new sent
    assert (stopped["arrivals"], stopped["ok"], stopped["aborted"]) == (24, 24, 0)
    assert stored.height == stored["key"].n_unique() == 24
    counted = ("sent", "cache_hits", "not_sent", "refused")
    assert {k: line["requests"]["systemone:fake"][k] for k in counted} == {
        "sent": 8,
        "cache_hits": 16,
        "not_sent": 16,
        "refused": 0,
    }
    assert "stopping (Ctrl-C): nothing new is sent; 8 request(s) in flight finish" in stdout
    assert (
        "Interrupted (Ctrl-C): the requests in flight finished and are stored; 16 request(s) were "
        "not sent."
    ) in stderr
    # the rerun sends the 16 left, once each
    assert (after["arrivals"], after["keys_ok"], after["duplicates"]) == (40, 40, 0)


@pytest.mark.process
def test_a_model_still_waiting_for_another_process_counts_its_requests_not_sent(tmp_path: Path):
    """Run a holds the model's claim (its 2 requests in flight never answered); run b waits for it.
    The first Ctrl-C to b ends the wait: b sends nothing and counts its 40 requests not sent
    (sent + cache_hits + not_sent = 40, as for a model claimed at once), where it counted none."""
    data = data_dir(tmp_path / "data", 40)
    cache = tmp_path / "cache"
    with serve(model="fake", p_first=None, p_yes=None, default="sleep:60") as server:
        url = [f"systemone:fake@{server.url}"]
        a = subprocess.Popen(
            dxi_command(data, cache, tmp_path / "a", "--max-in-flight", "2", "-q", models=url),
            stdout=subprocess.DEVNULL,
        )
        b = None
        try:
            wait_for(lambda: server.stats()["arrivals"] >= 2, 60, "run a sending")
            b = started(
                dxi_command(data, cache, tmp_path / "out", "--max-in-flight", "8", models=url),
                tmp_path,
            )
            wait_for(lambda: "waiting for it to end" in output(tmp_path)[0], 60, "b waiting")
            b.send_signal(signal.SIGINT)
            assert b.wait(60) == 130
            assert a.poll() is None  # still holding the claim
            assert server.stats()["arrivals"] == 2  # a's: b sent nothing
        finally:
            for proc in (a, b):
                if proc is not None and proc.poll() is None:
                    proc.kill()
                    proc.wait()
    (line,) = [orjson.loads(raw) for raw in (tmp_path / "out" / "run-history.jsonl").open("rb")]
    stdout, stderr = output(tmp_path)
    counted = ("sent", "cache_hits", "not_sent", "refused")
    assert {k: line["requests"]["systemone:fake"][k] for k in counted} == {
        "sent": 0,
        "cache_hits": 0,
        "not_sent": 40,
        "refused": 0,
    }
    assert re.search(r"systemone:fake: 0/40 0% .* stopped .* cached 0 not sent 40\n", stdout), (
        stdout
    )
    assert (
        "Interrupted (Ctrl-C): the requests in flight finished and are stored; 40 request(s) were "
        "not sent."
    ) in stderr


@pytest.mark.process
@pytest.mark.parametrize("how", ["again", "grace"])
def test_a_second_signal_or_the_end_of_the_grace_period_stops_at_once(tmp_path: Path, how: str):
    """Replies that take a minute: a second Ctrl-C, or the end of --grace, stops the run without
    them, saying how many were abandoned: sent (the next run sends them again). Its line in
    run-history.jsonl counts them (the old code: ``requests`` null): 8 sent, all abandoned, and the
    other 22 not sent, counted at the first signal although no slot came free."""
    with serve(model="fake", p_first=None, p_yes=None, default="sleep:60") as server:
        grace = "3" if how == "grace" else "600"  # 3 s: time to count the 22 left
        proc = started(
            served_run(server.url, data_dir(tmp_path / "data", 30), tmp_path, "--grace", grace),
            tmp_path,
        )
        try:
            wait_for(lambda: server.stats()["arrivals"] >= 8, 60, "8 requests in flight")
            proc.send_signal(signal.SIGINT if how == "again" else signal.SIGTERM)
            if how == "again":
                wait_for(lambda: "not sent 22" in output(tmp_path)[0], 30, "the rest counted")
                proc.send_signal(signal.SIGINT)
            assert proc.wait(30) == (130 if how == "again" else 143)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert (server.stats()["ok"], server.stats()["arrivals"]) == (
            0,
            8,
        )  # none answered yet, nothing new sent
    stdout, stderr = output(tmp_path)
    cut = "a second signal came" if how == "again" else "they took longer than --grace 3 s"
    name = "Ctrl-C" if how == "again" else "SIGTERM"
    assert (
        f"Interrupted ({name}): {cut}, so 8 request(s) still in flight were abandoned: sent (their "
        "replies were not stored; the next run sends them again)."
    ) in " ".join(stderr.split())
    # it ends with where the outputs are and what they hold: nothing of this run's (it said
    # nothing of the --out folder)
    assert " ".join(stderr.split()).endswith(
        f"Every reply that arrived is in {tmp_path / 'cache'}; rerun the same command to continue. "
        f"{tmp_path / 'out'} is left as it was: none of this scoring's outputs was written there."
    ), stderr
    assert "Traceback" not in stderr, stderr
    (line,) = [orjson.loads(raw) for raw in (tmp_path / "out" / "run-history.jsonl").open("rb")]
    block = line["requests"]["systemone:fake"]
    counted = ("sent", "cache_hits", "not_sent", "refused", "attempts", "cost_usd", "abandoned")
    assert {k: block.get(k) for k in counted} == {
        "sent": 8,
        "cache_hits": 0,
        "not_sent": 22,
        "refused": 0,
        "attempts": 8,
        "cost_usd": None,  # no price: not tracked
        "abandoned": {"requests": 8, "cost_at_reservation_usd": None},
    }
    assert "incomplete" not in block


@pytest.mark.process
@pytest.mark.slow
@pytest.mark.parametrize("case", ["capped", "bound", "uncapped"])
def test_the_spend_of_requests_abandoned_at_the_end_of_the_grace_period_is_recorded(
    tmp_path: Path, case: str
):
    """A priced model (output $10 per million tokens, input free) whose 3 replies take a minute:
    the grace period (1 s) ends with all 3 on the wire. They went out and may be billed, so they
    are counted sent and charged their reservation, as a reply that never came whole is: with
    ``max_completion_tokens=20000``, 3 x 20,000 x $10 / 1e6 = $0.60 at most, in the model's
    ``cost_usd`` and ``cost_at_reservation_usd``, in its ``abandoned`` block, in the cost bound's
    ``spent_usd`` under ``--max-cost 5``, and in the last line; with nothing capping the output
    their cost is unknown, with no upper bound (``cost_reason``). The old code recorded
    ``requests: null`` and ``cost_bound: null``: the spend was nowhere."""
    flags = {
        "capped": ["--param", "max_completion_tokens=20000"],
        "bound": ["--param", "max_completion_tokens=20000", "--max-cost", "5"],
        "uncapped": [],
    }[case]
    with serve(model=None, p_first=None, p_yes=None, default="sleep:60") as server:
        cmd = dxi_command(
            data_dir(tmp_path / "data", 10),
            tmp_path / "cache",
            tmp_path / "out",
            "--limit",
            "3",
            "--evals",
            "when2call",
            "--price",
            "openai:m=0/10",
            "--grace",
            "1",
            *flags,
            models=[f"openai:m@{server.url}/v1"],
        )
        proc = started(cmd, tmp_path)
        try:
            wait_for(lambda: server.stats()["arrivals"] >= 3, 60, "3 requests in flight")
            proc.send_signal(signal.SIGINT)
            assert proc.wait(30) == 130
        finally:
            if proc.poll() is None:
                proc.kill()
        assert (server.stats()["arrivals"], server.stats()["ok"]) == (3, 0)
    with Cache(tmp_path / "cache") as cache:
        assert cache.scan().collect().height == 0  # none of them stored: the next run sends them
    stderr = " ".join(output(tmp_path)[1].split())
    (line,) = [orjson.loads(raw) for raw in (tmp_path / "out" / "run-history.jsonl").open("rb")]
    block = line["requests"]["openai:m"]
    assert {k: block[k] for k in ("sent", "cache_hits", "not_sent", "refused", "attempts")} == {
        "sent": 3,
        "cache_hits": 0,
        "not_sent": 0,
        "refused": 0,
        "attempts": 3,
    }
    assert "incomplete" not in block
    cut = "Interrupted (Ctrl-C): they took longer than --grace 1 s, so 3 request(s) still in flight"
    tail = "(their replies were not stored; the next run sends them again)."
    if case == "uncapped":
        assert (block["cost_usd"], block.get("cost_at_reservation_usd")) == (None, None)
        assert block["cost_reason"] == UNBOUNDED.format(n=3)
        assert block["abandoned"] == {"requests": 3, "cost_at_reservation_usd": None}
        assert (
            f"{cut} were abandoned: sent, their cost unknown, with no upper bound: nothing caps "
            f"their output tokens {tail}"
        ) in stderr
    else:
        assert (block["cost_usd"], block["cost_at_reservation_usd"]) == (0.6, 0.6)
        assert block["abandoned"] == {"requests": 3, "cost_at_reservation_usd": 0.6}
        assert f"{cut} were abandoned: sent, at most $0.6000 spent {tail}" in stderr
    if case == "bound":  # the bound held the reservations: its spend and the records agree
        assert line["cost_bound"] == {
            "max_cost_usd": 5.0,
            "spent_usd": 0.6,
            "cost_at_reservation_usd": 0.6,
            "stopped": False,
        }
    else:
        assert line["cost_bound"] is None


# ---- a signal while Python is still importing: one line, no traceback ----------------------------
SIGNAL_ON_IMPORT = '''
import os, signal, sys

class SignalOnImport:
    """Sends this process {sig} when {module} is first imported: a Ctrl-C (or kill) that lands inside an import."""
    def find_spec(self, name, path=None, target=None):
        if name == {module!r}:
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.{sig})
        return None

sys.meta_path.insert(0, SignalOnImport())
'''


@pytest.mark.process
@pytest.mark.parametrize(
    "module",
    [
        "dxi.runner",
        "asyncio",
        "dxi.runner.cli",
        "dxi.adapters",
        "rich.console",
        "dxi.runner.planning.plan",
    ],
)
@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_signal_during_an_import_stops_dxi_with_one_line(tmp_path: Path, module: str, sig: str):
    """The installed ``dxi`` command, signalled while it imports ``runner.signals`` (``dxi.runner``,
    and the asyncio it needs, before ``take_signals`` has run: ``dxi.__main__``'s early handler),
    the command line (``dxi.runner.cli``), the adapters it needs, Rich (its output), or the planning
    of the run: exit 130 (143), "Interrupted (...)." and no traceback (a sitecustomize on PYTHONPATH
    sends the signal from inside the import)."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(SIGNAL_ON_IMPORT.format(sig=sig, module=module))
    data = data_dir(tmp_path / "data", 3)
    env = dict(os.environ, PYTHONPATH=str(hook))
    done = subprocess.run(
        [
            DXI,
            "run",
            "--model",
            "embedded",
            "--data-dir",
            str(data),
            "--evals",
            "when2call",  # the synthetic data: When2Call only
            "--cache-dir",
            str(tmp_path / "c"),
            "--out",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    name = "Ctrl-C" if sig == "SIGINT" else "SIGTERM"
    assert (done.returncode, done.stderr, done.stdout) == (
        130 if sig == "SIGINT" else 143,
        f"Interrupted ({name}).\n",
        "",
    )
    assert not (tmp_path / "c").exists()  # stopped before anything was written


def _caught(pid: int, sig: signal.Signals) -> bool:
    """Whether process ``pid`` has a handler of its own for ``sig`` (``SigCgt`` of /proc/PID/status;
    False once it is gone). Python installs one for SIGINT as it starts, none for SIGTERM: a SIGTERM
    handler means ``dxi.__main__`` has begun to run (its first statement installs one)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    lines = status.splitlines()
    caught = next((line.split()[1] for line in lines if line.startswith("SigCgt:")), "0")
    return bool(int(caught, 16) >> (sig - 1) & 1)


def _interrupted(proc: subprocess.Popen, tmp_path: Path) -> tuple[int, str, str]:
    """SIGINT to ``proc`` (``started`` in ``tmp_path``) now; its exit code and output, which never
    holds a traceback."""
    try:
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    stdout, stderr = output(tmp_path)
    assert "Traceback" not in stdout + stderr, stdout + stderr
    return code, stdout, stderr


# the embedded model's tasks in a run that cannot end before the start-up's last SIGINT (0.6 s):
# about 2.5 ms each on an idle machine, so some 50 s of answers (it stops at the signal: its
# requests in flight are stored, the rest never sent); written in 0.35 s
LONG_RUN = 20_000


@pytest.mark.process
@pytest.mark.parametrize(
    "delay",
    [
        *(0.0, 0.005, 0.02, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.6),
        pytest.param(3.0, marks=pytest.mark.slow),  # 0.6 s as a loaded machine may deliver it
    ],
)
def test_ctrl_c_at_any_moment_of_the_start_up_prints_one_line(tmp_path: Path, delay: float):
    """A real ``dxi run`` sent SIGINT ``delay`` s after dxi's own code began to run (while it still
    imports the command line, Rich, the adapters, Polars; plans; starts the embedded model): exit
    130 and one line, never a traceback (before issue 32: 21 to 25 lines of KeyboardInterrupt and
    exit -2 in the first 0.1-0.3 s). What comes before dxi's code (the interpreter's start-up,
    ``site``) is out of its reach: the module docstring of ``dxi.__main__``. The run is of
    ``LONG_RUN`` tasks, so that it cannot end before the signal however late a loaded machine
    delivers it (a run of 3 tasks ended 2 to 3 s in on an idle machine, and sometimes before the
    0.6 s signal on a loaded one: exit 0; [3.0] is that late signal)."""
    data = data_dir(tmp_path / "data", LONG_RUN)
    proc = started(
        [
            DXI,
            "run",
            "--model",
            "embedded",
            "--data-dir",
            str(data),
            "--evals",
            "when2call",  # the synthetic data: When2Call only
            "--cache-dir",
            str(tmp_path / "c"),
            "--out",
            str(tmp_path / "out"),
        ],
        tmp_path,
    )
    wait_for(
        lambda: _caught(proc.pid, signal.SIGTERM) or proc.poll() is not None, 30, "dxi to start"
    )
    time.sleep(delay)
    code, stdout, stderr = _interrupted(proc, tmp_path)
    assert code == 130, (stdout, stderr)
    # one line of its own: "Interrupted (Ctrl-C)." before the run began, else the run's resume
    # message, after whatever the run had printed by then (its "Running N model..." line, progress
    # lines, the progress's "stopping (Ctrl-C)": a quiet machine gets that far within 0.6 s)
    lines = (stdout + stderr).splitlines()
    assert [line for line in lines if line.startswith("Interrupted")] == lines[-1:], lines
    assert lines[-1].startswith("Interrupted (Ctrl-C)"), lines
    if delay < 0.1:  # dxi's own start-up: nothing else printed yet
        assert len(lines) == 1, lines


def _runs_python(pid: int) -> bool:
    """Whether process ``pid`` runs the interpreter (``env`` has exec'd it)."""
    try:
        return "python" in os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return False


# the events of the start-up of ``dxi``, in order: each is polled for as fast as /proc can be read,
# and SIGINT sent the moment it is seen
START_UP = {
    "spawned": lambda pid: True,  # the command's process exists (exec'd, nothing of it run yet)
    "interpreter": _runs_python,  # the Python interpreter is starting
    "interpreter's handler": lambda pid: _caught(pid, signal.SIGINT),  # its frozen modules, site
    "dxi's handler": lambda pid: _caught(pid, signal.SIGTERM),  # dxi.__main__ has begun
}


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc")
@pytest.mark.parametrize("event", list(START_UP))
def test_ctrl_c_while_python_itself_starts_prints_one_line(tmp_path: Path, event: str):
    """SIGINT sent the moment an event of the start-up is seen: the process exists; the interpreter
    runs; it has installed its own SIGINT handler (and imports its frozen modules, ``site`` and the
    editable install's finder: before issue 32's last fix, a KeyboardInterrupt traceback from inside
    ``site`` and exit 1 in the first ~30 ms); ``dxi.__main__`` has installed dxi's. Each time: exit
    130 and "Interrupted (Ctrl-C)." alone, never a traceback. The ``dxi`` script ``make install``
    writes starts Python with SIGINT and SIGTERM blocked (GNU env's ``--block-signal``) until dxi's
    handler is in place. Only a signal that lands before ``env`` has blocked them (the first event)
    may end the process by the signal itself, with no output (a shell reports 130)."""
    if subprocess.run(["env", "--block-signal=INT", "true"], capture_output=True).returncode:
        pytest.skip(
            "env has no --block-signal (GNU coreutils 9 and later): make install "
            "leaves the script as the installer wrote it"
        )
    seen = START_UP[event]
    for _ in range(20):
        proc = started([DXI, "run", "--help"], tmp_path)
        deadline = time.monotonic() + 30
        while not seen(proc.pid) and proc.poll() is None and time.monotonic() < deadline:
            pass  # as fast as /proc answers: these windows last milliseconds
        if (
            event == "dxi's handler"
            or proc.poll() is not None
            or not _caught(proc.pid, signal.SIGTERM)
        ):
            break
        # a loaded machine polled past the window (dxi's handler is in already, and the command
        # may have returned its code, after which a signal changes nothing): again, with a new one
        proc.kill()
        proc.wait()
    code, stdout, stderr = _interrupted(proc, tmp_path)
    if event == "spawned" and code == -signal.SIGINT:
        assert (stdout, stderr) == ("", "")
    else:
        assert (code, stdout, stderr) == (130, "", "Interrupted (Ctrl-C).\n")


# a terminal's Ctrl-C (a scheduler's SIGTERM) reaches the whole process group: the embedded model's
# workers too, while they start (their interpreter, then the dxi script's module, then their
# initializer): sent by the worker itself, from inside an import, to its group
SIGNAL_FROM_A_WORKER = '''
import os, signal, sys

WORKER = "--multiprocessing-fork" in sys.argv  # a process multiprocessing spawned

class GroupSignalOnImport:
    """In a spawned worker, sends the whole process group {sig} when {module} is first imported:
    once, by the first worker there (the mark made exclusively: one signal, not one a worker)."""
    def find_spec(self, name, path=None, target=None):
        if WORKER and name == {module!r}:
            sys.meta_path.remove(self)
            try:
                os.close(os.open({mark!r}, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                return None
            os.killpg(os.getpgid(0), signal.{sig})
        return None

sys.meta_path.insert(0, GroupSignalOnImport())
'''


@pytest.mark.process
@pytest.mark.parametrize("module", ["socket", "dxi.__main__", "dxi.embedded_worker"])
@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_signal_to_the_group_while_the_embedded_workers_start_stops_the_run_with_one_line(
    tmp_path: Path, module: str, sig: str
):
    """Ctrl-C (or SIGTERM) to `dxi run`'s process group while an embedded worker is still
    starting: in its interpreter's start-up (multiprocessing imports ``socket``), as it imports
    the dxi script's module (``dxi.__main__``: spawn runs the script as ``__mp_main__``), or as
    it unpickles its initializer (``dxi.embedded_worker``). The workers start with both signals
    held (``adapters.embedded``) and ignore them (``dxi.__main__`` leaves a worker's to
    ``embedded_worker.load``), so the run drains as after any first signal: exit 130 (143), one
    line, no traceback. Before, the worker printed a KeyboardInterrupt traceback ("Fatal Python
    error: init_import_site" in ``site``) or a bare "Interrupted (Ctrl-C)." and died, and the run
    ended on "unexpected error: BrokenProcessPool", exit 70."""
    hook = tmp_path / "hook"
    hook.mkdir()
    mark = tmp_path / "signalled"
    (hook / "sitecustomize.py").write_text(
        SIGNAL_FROM_A_WORKER.format(sig=sig, module=module, mark=str(mark))
    )
    data = data_dir(tmp_path / "data", 3)
    cmd = dxi_command(data, tmp_path / "cache", tmp_path / "out", "-q", models=["embedded"])
    with (tmp_path / "stdout").open("wb") as out, (tmp_path / "stderr").open("wb") as err:
        proc = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=err,
            start_new_session=True,
            env=dict(os.environ, PYTHONPATH=str(hook)),
        )
    try:
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in group(proc.pid):
            os.kill(pid, signal.SIGKILL)
    stdout, stderr = output(tmp_path)
    name = "Ctrl-C" if sig == "SIGINT" else "SIGTERM"
    assert mark.exists()  # the worker reached the import and signalled the group
    assert code == (130 if sig == "SIGINT" else 143), (code, stdout, stderr)
    assert "Traceback" not in stdout + stderr and "Fatal Python error" not in stderr, stderr
    lines = stderr.splitlines()  # stdout: the tables of what arrived, scored (-q: no progress)
    # drained (the worker answers once started): how many requests were in flight by then is the
    # machine's (each spawns a worker as it is sent), so the count is not compared
    assert len(lines) == 1, stderr
    assert lines[0].startswith(
        f"Interrupted ({name}): the requests in flight finished and are stored; "
    ), stderr
    assert (
        f"Every reply that arrived is in {tmp_path / 'cache'}; rerun the same command to "
        "continue." in lines[0]
    ), stderr


def test_the_progress_says_the_run_is_stopping_and_counts_down():
    from io import StringIO

    from rich.console import Console

    from dxi.runner.sending.progress import RunProgress

    logs = StringIO()
    p = RunProgress(Console(file=logs, width=200), {"m": 10}, interval_s=3600)
    for n in (
        8,
        7,
        6,
        0,
    ):  # in logs: at once, then at most once a second while it falls, and when none is left
        p.stopping("SIGTERM", n, 25)
    lines = [line.split(" ", 1)[1] for line in logs.getvalue().splitlines()]
    assert lines == [
        "stopping (SIGTERM): nothing new is sent; 8 request(s) in flight finish and are stored (at most 25 s; "
        "again to stop at once)",
        "stopping (SIGTERM): every request that was in flight is stored",
    ]
    screen = StringIO()
    with RunProgress(
        Console(file=screen, width=200, force_terminal=True), {"m": 10}
    ) as p:  # a terminal: under the bars
        p.stopping("Ctrl-C", 3, 25)
        p.stopping("Ctrl-C", 2, 25)
    shown = screen.getvalue()
    assert (
        "stopping (Ctrl-C): nothing new is sent; 2 request(s) in flight" in shown
        and shown.count("0/10") >= 1
    )


async def test_a_signal_delivered_while_nothing_waited_is_handled_before_the_handlers_go():
    """A run whose work never waits on the event loop (every request cached) leaves a Ctrl-C unread
    in the loop's wake-up fd; ``Graceful.settle`` lets the loop read it, so the run is interrupted
    (before: the signal was dropped with the handlers, and the run finished with exit 0)."""
    from dxi.runner.signals import Graceful

    drained: list[int] = []
    with Graceful(drained.append, grace_s=60) as graceful:
        os.kill(os.getpid(), signal.SIGINT)  # delivered; no await follows it before settle
        unread = graceful.signum
        await graceful.settle()
    assert unread is None  # the loop had not read it: what was lost before
    assert (graceful.signum, drained, graceful.aborted) == (signal.SIGINT, [signal.SIGINT], None)


def test_the_message_of_a_stop_cut_short_says_what_was_abandoned_and_what_was_not_counted():
    """``resume_message`` of a run cut short, from its counts: the requests abandoned and what they
    were charged at most (two models: $0.25 + $0.35), a count left incomplete, or nothing on the
    wire."""
    from dxi.runner.counts import Counts
    from dxi.runner.signals import Interrupted, resume_message

    def cut(requests: dict) -> str:
        stop = Interrupted(signal.SIGTERM, False, 9, "grace", Counts(requests))
        head, rest = resume_message(stop, "c", 25)
        assert head == "Interrupted (SIGTERM):"
        return rest.removesuffix(
            " Every reply that arrived is in c; rerun the same command to continue."
        )

    a = {"cost_usd": 0.5, "abandoned": {"requests": 2, "cost_at_reservation_usd": 0.25}}
    b = {"cost_usd": 0.35, "abandoned": {"requests": 1, "cost_at_reservation_usd": 0.35}}
    assert cut({"a": a, "b": b}) == (
        "they took longer than --grace 25 s, so 3 request(s) still in flight were abandoned: sent, "
        "at most $0.6000 spent (their replies were not stored; the next run sends them again)."
    )
    idle = {"cost_usd": 0.0, "incomplete": ["cache_hits", "not_sent"]}
    assert cut({"a": idle}) == (
        "they took longer than --grace 25 s, so the run stopped at once (no request was on the "
        "wire). The rest was not all counted in time: the run's line in run-history.jsonl marks "
        "the counts that are incomplete."
    )


@pytest.mark.process
def test_a_signal_once_the_command_has_returned_its_code_changes_nothing(tmp_path: Path):
    """SIGINT sent the moment ``runner.cli.main`` has returned the command's exit code (the
    ``returned`` event: its work done, the process only ending): the process ends with the command's
    own code and output, no "Interrupted" line, no traceback (it printed "Interrupted (Ctrl-C)."
    and exited 130; landing in a weakref callback as objects were freed, "Exception ignored in:
    ... raise KeyboardInterrupt")."""
    from .helpers import events

    data = data_dir(tmp_path / "data", 3)
    argv = [DXI, "data", "check", "--data-dir", str(data)]
    plain = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    log = tmp_path / "events.jsonl"
    late = subprocess.run(
        argv, env=events.env(log, "returned:1/INT"), capture_output=True, text=True, timeout=120
    )
    # `dxi data check` of a folder holding When2Call alone: exit 1 (three evaluations missing)
    assert [e[3] for e in events.read(log, "returned")] == [1]
    assert (plain.returncode, plain.stderr) == (1, "")
    assert (late.returncode, late.stdout, late.stderr) == (1, plain.stdout, "")


def test_a_keyboard_interrupt_python_cannot_raise_is_delivered_again_not_printed(
    monkeypatch: pytest.MonkeyPatch, capsys
):
    """A KeyboardInterrupt raised by dxi's handler inside a weakref callback (``sys.unraisablehook``
    once ``take_signals`` has run): not printed, the signal delivered again; any other exception is
    printed as Python prints it."""
    import sys
    from types import SimpleNamespace

    from dxi.runner import signals

    sent: list[int] = []
    monkeypatch.setattr(signals, "_received", [signal.SIGINT])
    monkeypatch.setattr(signal, "raise_signal", sent.append)
    signals._unraisable(SimpleNamespace(exc_value=KeyboardInterrupt()))
    assert sent == [signal.SIGINT]
    printed: list[object] = []
    monkeypatch.setattr(sys, "__unraisablehook__", printed.append)
    other = SimpleNamespace(exc_value=ValueError("x"))
    signals._unraisable(other)
    assert (sent, printed) == ([signal.SIGINT], [other])
