"""Batch mode under kill -9 (docs/batch.md, "What the ledger guarantees"): ``dxi run --batch``
killed at each step of a batch's life, then run again, checked at the fake server: zero lost answers
(every request ends in the cache) and zero requests submitted twice (each key in one batch only),
with the summary of a synchronous run. Also two ``dxi run --batch`` started together on one cache,
and kill -9 at ten points of a run of many batches, each chosen from the run's events.

Steps: ``DXI_FAILPOINT`` (``runner.batch.driver.failpoint``) kills the process right after a named
step; the fake's ``hold`` stalls the first arrival at a step (the upload, a status read, the
download of the results half read) while the test kills the process there. ``created`` is the window
between the provider's reply to the create and the ledger's record of it: OpenAI and Gemini find the
batch again by its tag; Anthropic, which has none, by its creation time and size (the window no tag
closes, tested here with a kill inside it)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import orjson
import pytest

from dxi.cache import Cache
from dxi.cache.ledger import Ledger
from dxi.runner.cli import main

from .fakes.fake_provider import serve
from .helpers import events
from .helpers.batches import URLS, command, same_answers
from .helpers.runs import select_flags
from .helpers.synthetic import data_dir as synthetic_data

pytestmark = pytest.mark.process

_REFERENCE: dict[tuple, dict] = {}


def reference(kind: str, data: Path, tmp: Path) -> dict:
    """The summary of a synchronous run of the same model and data (answers depend on the request
    only)."""
    key = (kind, str(data))
    if key not in _REFERENCE:
        with serve(model=None, record=False) as server:
            assert (
                main(
                    [
                        "run",
                        "--model",
                        f"{kind}:m@{URLS[kind].format(server.url)}",
                        "--data-dir",
                        str(data),
                        *select_flags(data),  # what the data holds (the synthetic: When2Call)
                        "--cache-dir",
                        str(tmp / "ref-cache"),
                        "--out",
                        str(tmp / "ref"),
                        "-q",
                    ]
                )
                == 0
            )
        _REFERENCE[key] = same_answers(orjson.loads((tmp / "ref" / "summary.json").read_bytes()))
    return _REFERENCE[key]


def wait_for(
    server, counter: str, proc: subprocess.Popen, at_least: int = 1, timeout: float = 120
) -> None:
    deadline = time.monotonic() + timeout
    while server.stats().get(counter, 0) < at_least:
        assert proc.poll() is None, f"the run ended before {counter}"
        assert time.monotonic() < deadline, f"no {counter} within {timeout} s"
        time.sleep(0.02)


def check(server, tmp: Path, kind: str, data: Path, tasks: int) -> dict:
    stats = server.stats()
    assert stats["sdk_problems"] == 0, stats["sdk_problem_lines"]
    assert (
        stats["batch_keys"] == tasks and stats["batch_resubmitted"] == 0
    )  # each request submitted once
    rows = Cache(tmp / "cache").scan().select("key", "transport").collect()
    assert rows.height == rows["key"].n_unique() == tasks  # every answer in the cache, once
    assert same_answers(orjson.loads((tmp / "out" / "summary.json").read_bytes())) == reference(
        kind, data, tmp
    )
    assert not [e for e in Ledger(tmp / "cache").entries().values() if not e.closed]
    return stats


FAILPOINTS = [
    ("openai", "intent"),
    ("openai", "uploaded"),
    ("openai", "created"),
    ("openai", "submitted"),
    ("openai", "append:5"),
    ("anthropic", "intent"),
    ("anthropic", "created"),
    ("anthropic", "append:5"),
    ("gemini", "created"),
]


@pytest.mark.parametrize("kind, point", FAILPOINTS, ids=[f"{k}-{p}" for k, p in FAILPOINTS])
def test_kill_9_right_after_a_step_then_rerun(
    kind: str, point: str, data_dir: Path, tmp_path: Path
):
    # appends: the first download stalls after half the results, so the rows of that first piece are
    # stored (and the kill comes) before the rest is read
    hold = {"hold": {"download": 0.5}} if point.startswith("append") else {}
    with serve(model=None, record=False, batch={"polls": 1, **hold}) as server:
        killed = subprocess.run(
            command(kind, server.url, data_dir, tmp_path),
            env=dict(os.environ, DXI_FAILPOINT=point),
            timeout=300,
        )
        assert killed.returncode == -signal.SIGKILL
        at_kill = server.stats()
        rows_at_kill = Cache(tmp_path / "cache").scan().collect().height
        assert (
            subprocess.run(command(kind, server.url, data_dir, tmp_path), timeout=300).returncode
            == 0
        )
        stats = check(server, tmp_path, kind, data_dir, 12)
    entries = list(Ledger(tmp_path / "cache").entries().values())
    if point in (
        "intent",
        "uploaded",
    ):  # the intent was recorded, no batch made: found nowhere, abandoned, made anew
        assert at_kill["batch_creates"] == 0 and stats["batch_creates"] == 1
        assert sorted(e.phase for e in entries) == ["abandoned", "collected"]
    else:
        # the batch was made: the rerun found it (by tag, or for Anthropic by time and size) and
        # collected it
        assert at_kill["batch_creates"] == stats["batch_creates"] == 1
        assert [e.phase for e in entries] == ["collected"]
    if point.startswith(
        "append"
    ):  # the first half's 6 rows, appended before the kill, are skipped when read again
        assert rows_at_kill == 6 and entries[0].stored == 6


def test_a_batch_a_killed_run_stored_whole_is_said_to_be_in_the_cache_not_0_stored(
    tmp_path: Path,
):
    """Two batches of 16; the run killed right after it stored the first one's 16 results, before
    the ledger's record. The rerun reads that batch's results again and stores none of them: its
    line says they are in the cache already (it said "collected: 0 stored", as if none arrived),
    then it collects the other batch; each request submitted and stored once."""
    data = synthetic_data(tmp_path / "data", 32, seed=5)
    with serve(model=None, record=False, batch={"polls": 1}) as server:
        size = ("--batch-size", "16")
        killed = subprocess.run(
            command("openai", server.url, data, tmp_path, *size),
            env=dict(os.environ, DXI_FAILPOINT="append:16"),
            timeout=300,
        )
        assert killed.returncode == -signal.SIGKILL
        assert Cache(tmp_path / "cache").scan().collect().height == 16
        rerun = subprocess.run(
            command("openai", server.url, data, tmp_path, *size, quiet=False),
            capture_output=True,
            text=True,
            timeout=300,
        )
        stats = server.stats()
    assert rerun.returncode == 0, rerun.stdout[-2000:]
    said = [
        line.split(" collected: ")[1]
        for line in rerun.stdout.splitlines()
        if " collected: " in line
    ]
    assert said == ["0 stored, 16 already in the cache (not stored again)", "16 stored"]
    assert (stats["batch_keys"], stats["batch_resubmitted"]) == (32, 0)
    rows = Cache(tmp_path / "cache").scan().select("key").collect()
    assert rows.height == rows["key"].n_unique() == 32


@pytest.mark.parametrize("step", ["upload", "poll", "download"])
def test_kill_9_while_uploading_polling_or_downloading_then_rerun(step: str, tmp_path: Path):
    data = synthetic_data(tmp_path / "data", 40, seed=3)
    with serve(model=None, record=False, batch={"polls": 1, "hold": {step: 60}}) as server:
        log = tmp_path / "events.jsonl"
        proc = subprocess.Popen(command("openai", server.url, data, tmp_path), env=events.env(log))
        wait_for(server, f"arrived_{step}", proc)
        if step == "download":
            events.wait(log, "append:1", proc)  # the first half of the results read and appended
        proc.send_signal(signal.SIGKILL)
        assert proc.wait() == -signal.SIGKILL
        if step == "download":
            assert 0 < Cache(tmp_path / "cache").scan().collect().height < 40
        assert (
            subprocess.run(command("openai", server.url, data, tmp_path), timeout=300).returncode
            == 0
        )
        stats = check(server, tmp_path, "openai", data, 40)
    assert stats["batch_creates"] == 1 and stats["batch_uploads"] == 1


def test_two_batch_runs_started_together_on_one_cache_submit_each_request_once(tmp_path: Path):
    data = synthetic_data(tmp_path / "data", 60, seed=4)
    with serve(model=None, record=False, batch={"polls": 3}) as server:
        procs = [
            subprocess.Popen(
                command("anthropic", server.url, data, tmp_path, "--batch-size", "20", quiet=False),
                stdout=subprocess.PIPE,
                text=True,
            )
            for _ in range(2)
        ]
        outs = [p.communicate(timeout=300)[0] for p in procs]
        assert [p.returncode for p in procs] == [0, 0], outs
        stats = check(server, tmp_path, "anthropic", data, 60)
    assert stats["batch_creates"] == 3
    assert (
        sum("waiting for it to end" in o for o in outs) == 1
    )  # the second waited for the first, naming it


# Ten kills in a row, each chosen from the events of the run it cuts (each run is killed the first
# time it reaches its point; its rerun starts from what it left). First the steps of making a batch:
# before and after an upload, between the provider's create and its record, after a submit; a run
# killed there has made one batch at most, so 7 such runs leave work for every later point, whatever
# the timing. Then after the append that stored a run's N-th answer (mid-collection: more results
# still to read), and last, mid-compaction of the cache's log.
KILL_POINTS = [
    "intent",
    "uploaded",
    "upload_reply",
    "created",
    "submitted",
    "created",
    "submitted",
    "append:5",
    "append:20",
    "compaction:1",
]


def test_kill_9_at_ten_points_of_the_run_loses_no_answer_and_submits_nothing_twice(tmp_path: Path):
    """The acceptance test: 160 requests in batches of 16, ten runs each killed with SIGKILL at a
    point of its own run (``KILL_POINTS``: a batch step through ``DXI_FAILPOINT``, a compaction
    through ``tests.helpers.events``), each point asserted reached, then a last run to the end."""
    tasks = 160
    data = synthetic_data(tmp_path / "data", tasks, seed=8)
    log = tmp_path / "events.jsonl"
    with serve(
        model=None, record=False, batch={"polls": 4, "line_faults": {"transient": 0.03}}
    ) as server:
        for i, point in enumerate(KILL_POINTS):
            env = events.env(log, kill_at=point if point.startswith("compaction") else None)
            if not point.startswith("compaction"):
                env["DXI_FAILPOINT"] = point
            killed = subprocess.run(
                command("openai", server.url, data, tmp_path, "--batch-size", "16"),
                env=env,
                timeout=300,
            )
            assert killed.returncode == -signal.SIGKILL, (
                f"kill {i + 1} at {point}: the run ended before it"
            )
        assert events.reached(log, "compaction:1")
        final = subprocess.run(
            command("openai", server.url, data, tmp_path, "--batch-size", "16"), timeout=300
        )
        assert final.returncode == 0
        stats = server.stats()
        rows = Cache(tmp_path / "cache").scan().select("key").collect()
        assert rows.height == rows["key"].n_unique() == tasks
        assert stats["sdk_problems"] == 0
        # submitted twice only when a batch gave a request back (a transient error inside it): never
        # by a kill
        assert stats["batch_resubmitted"] == stats["batch_line_transient"]
        assert stats["batch_answers"] == tasks  # each request answered once
    assert same_answers(
        orjson.loads((tmp_path / "out" / "summary.json").read_bytes())
    ) == reference("openai", data, tmp_path)


def test_in_anthropics_window_two_batches_of_one_size_are_both_adopted(
    data_dir: Path, tmp_path: Path
):
    """The window no tag closes, at its worst: two runs (on two caches, one workspace) each killed
    between Anthropic's reply and the ledger's record. Found by time and size, each run's batch has
    a twin: the rerun adopts both (issue 32: abandoning them left them running and billed and sent
    the requests again); their results carry custom ids, so each answer is stored once and nothing
    is submitted again."""
    with serve(model=None, record=False, batch={"polls": 1}) as server:
        for name in ("a", "b"):
            killed = subprocess.run(
                command("anthropic", server.url, data_dir, tmp_path / name),
                env=dict(os.environ, DXI_FAILPOINT="created"),
                timeout=300,
            )
            assert killed.returncode == -signal.SIGKILL
        rerun = subprocess.run(
            command("anthropic", server.url, data_dir, tmp_path / "a", quiet=False),
            capture_output=True,
            text=True,
            timeout=300,
        )
        stats = server.stats()
    assert rerun.returncode == 0, rerun.stdout[-2000:]
    out = " ".join(rerun.stdout.split())
    assert "2 batches may be entry" in out and out.count("msgbatch_") >= 2
    # two batches of the same 12 requests, one by each killed run: none made again by the rerun
    assert stats["batch_creates"] == 2 and stats["batch_resubmitted"] == 12
    entries = Ledger(tmp_path / "a" / "cache").entries().values()
    assert sorted((e.phase, e.guessed, e.stored) for e in entries) == [
        ("collected", True, 0),
        ("collected", True, 12),
    ]
    rows = Cache(tmp_path / "a" / "cache").scan().select("key").collect()
    assert rows.height == rows["key"].n_unique() == 12
