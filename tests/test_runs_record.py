"""OUT/run-history.jsonl (``runner.outputs.history``): each ``dxi run`` appends its line (its
selection, exit code, ``cost_bound``, ``stopped_providers`` and ``requests`` blocks as its
summary.json had them); ``dxi score`` rewrites summary.json from the cache but leaves the file as it
was, and points at it.

The fake System One provider (a proxy: it serves every model named) answers one request per
When2Call task (``tests.fakes.fake_provider``)."""

from __future__ import annotations

import asyncio
import logging
import re
from pathlib import Path

import orjson
import pytest

from dxi.runner.cli import main
from dxi.runner.errors import EXIT_COST_BOUND
from dxi.runner.outputs import history

from .fakes.fake_provider import FakeProvider
from .helpers.synthetic import data_dir

TASKS = 24
WHEN = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")


def _lines(path: Path) -> list[dict]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


async def test_runs_jsonl_keeps_each_runs_spend_which_score_leaves_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture
):
    data_dir(tmp_path / "data", TASKS)
    out = tmp_path / "out"
    folders = ["--data-dir", str(tmp_path / "data"), "--cache-dir", str(tmp_path / "cache")]
    async with FakeProvider(model=None) as server:
        model = f"systemone:m1@{server.url}"
        flags = [*folders, "--out", str(out), "--model", model]
        price = ["--price", f"{model}=1000/2000"]  # dxi run's (dxi score uses it: recorded)

        def dxi(*args: str) -> int:
            return main([*args, *flags, "-q"])

        # a run the cost bound stops
        when2call = ["--evals", "when2call"]  # the synthetic data: When2Call only
        assert (
            await asyncio.to_thread(dxi, "run", *price, *when2call, "--max-cost", "1.5")
            == EXIT_COST_BOUND
        )
        sent = server.stats()["arrivals"]
        run1 = orjson.loads((out / "summary.json").read_bytes())
        (line,) = _lines(out / "run-history.jsonl")
        assert WHEN.fullmatch(line.pop("started")) and WHEN.fullmatch(line.pop("ended"))
        block = line["requests"]["systemone:m1"]
        assert line == {
            "exit_code": 3,
            "outcome": "cost_bound",
            "selection": {
                "run_file": None,
                "models": ["systemone:m1"],
                "configs": [
                    {
                        "provider": "systemone",
                        "model": "m1",
                        "endpoint": f"{server.url}/v1/systemone",
                        "params": "{}",
                    }
                ],
                "cache_dir": str((tmp_path / "cache").resolve()),  # what a rescoring compares
                "evals": ["when2call"],
                "max_cost_usd": 1.5,
                "prices": {"systemone:m1": [1000.0, 2000.0]},  # what dxi score prices it at
            },
            "cost_bound": run1["cost_bound"],  # as the run's summary.json had it
            "stopped_providers": [],
            "requests": {"systemone:m1": run1["models"][0]["requests"]},
        }
        assert line["cost_bound"]["stopped"] is True and line["cost_bound"]["max_cost_usd"] == 1.5
        assert line["cost_bound"]["remaining_requests"] == TASKS - sent
        assert (block["sent"], block["cache_hits"], block["failed"], block["not_sent"]) == (
            sent,
            0,
            0,
            TASKS - sent,
        )
        assert 0 < sent < TASKS and block["cost_usd"] == line["cost_bound"]["spent_usd"]
        before = (out / "run-history.jsonl").read_bytes()
        capsys.readouterr()

        # dxi score to the same out: summary.json rewritten from the cache, run-history.jsonl as it
        # was
        # (--evals as the run: a selected evaluation without data is refused, as dxi run does)
        assert await asyncio.to_thread(dxi, "score", *when2call) == 1  # the ones not sent: missing
        scored = orjson.loads((out / "summary.json").read_bytes())
        assert "cost_bound" not in scored and scored["models"][0]["requests"]["sent"] == 0
        assert (out / "run-history.jsonl").read_bytes() == before
        said = capsys.readouterr().out
        assert (
            f"note: what each run sent and spent: {out / 'run-history.jsonl'} (1 run; the last stopped "
            "at the cost bound)"
        ) in said

        # a second run appends its own line after the first
        assert await asyncio.to_thread(dxi, "run", *price, *when2call, "--max-cost", "1000") == 0
        assert server.stats()["arrivals"] == TASKS
        run2 = orjson.loads((out / "summary.json").read_bytes())
    data = (out / "run-history.jsonl").read_bytes()
    assert data.startswith(before) and data.count(b"\n") == 2
    second = orjson.loads(data[len(before) :])
    assert (second["exit_code"], second["outcome"]) == (0, "done")
    assert second["cost_bound"] == run2["cost_bound"] and second["cost_bound"]["stopped"] is False
    assert second["requests"] == {"systemone:m1": run2["models"][0]["requests"]}
    again = second["requests"]["systemone:m1"]
    assert (again["sent"], again["cache_hits"], again["not_sent"]) == (TASKS - sent, sent, 0)
    capsys.readouterr()
    assert main(["report", *folders, "--out", str(out), *when2call, "-q"]) == 0
    assert (out / "run-history.jsonl").read_bytes() == data
    assert (
        f"note: what each run sent and spent: {out / 'run-history.jsonl'} (2 runs; the last finished)"
        in capsys.readouterr().out
    )


async def test_a_stopped_provider_is_kept_in_the_line_after_score(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-quota-0123456789")
    data_dir(tmp_path / "data", 8)
    out = tmp_path / "out"
    folders = ["--data-dir", str(tmp_path / "data"), "--cache-dir", str(tmp_path / "cache")]
    async with FakeProvider(default="quota") as down, FakeProvider(model=None) as up:
        models = ["--model", f"openai:gpt-fake@{down.url}/v1", "--model", f"systemone:m1@{up.url}"]
        run = ["run", *models, *folders, "--out", str(out), "--max-in-flight", "1", "-q"]
        run += ["--evals", "when2call"]  # the synthetic data: When2Call only
        assert await asyncio.to_thread(main, run) == 6
    summary = orjson.loads((out / "summary.json").read_bytes())
    (line,) = _lines(out / "run-history.jsonl")
    (block,) = line["stopped_providers"]
    assert line["stopped_providers"] == summary["stopped_providers"]
    assert (line["exit_code"], line["outcome"], line["cost_bound"]) == (6, "provider_stopped", None)
    assert line["requests"] == {e["model"]: e["requests"] for e in summary["models"]}
    stopped, answered = line["requests"]["openai:gpt-fake"], line["requests"]["systemone:m1"]
    assert (stopped["refused"], stopped["not_sent"]) == (block["refused"], block["not_sent"])
    assert block["refused"] + block["not_sent"] == 8 and (
        answered["sent"],
        answered["not_sent"],
    ) == (
        8,
        0,
    )
    before = (out / "run-history.jsonl").read_bytes()
    capsys.readouterr()
    score = ["score", *folders, "--out", str(out), "--evals", "when2call", "-q"]
    assert main(score) == 0  # the cache's one model
    assert "stopped_providers" not in orjson.loads((out / "summary.json").read_bytes())
    assert (out / "run-history.jsonl").read_bytes() == before
    assert (
        f"note: what each run sent and spent: {out / 'run-history.jsonl'} (1 run; the last had a "
        "provider stopped)" in capsys.readouterr().out
    )


def test_a_folder_that_cannot_take_the_line_costs_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    (tmp_path / "out" / "run-history.jsonl").mkdir(parents=True)  # not a file: the append fails
    with caplog.at_level(logging.WARNING, "dxi.runs"):
        history.append(tmp_path / "out", {"outcome": "done"})
    (record,) = caplog.records
    assert record.getMessage().startswith(
        f"could not record this run in {tmp_path / 'out' / 'run-history.jsonl'} ("
    )
    assert history.note(tmp_path / "out") is None


def test_a_run_stopped_before_scoring_has_a_line_without_counts(tmp_path: Path):
    """Ctrl-C or SIGTERM before its counts were known (while it planned): its line says how it
    ended and what it selected, with no counts (null, never zeros)."""
    from dxi.runner.cli import parser
    from dxi.runner.commands import options

    data_dir(tmp_path / "data", 4)
    args = parser().parse_args(
        ["run", "--model", "systemone:m@http://127.0.0.1:9", "--data-dir", str(tmp_path / "data")]
        + ["--sample", "3", "--seed", "7", "--max-cost", "2", "--price", "systemone:m=1/2"]
    )
    from dxi.runner.planning.selection import selection_of

    line = history.line_of(selection_of(options.plan_of(args)), "2026-12-04T21:00:00Z", 130)
    assert WHEN.fullmatch(line.pop("ended"))
    assert line == {
        "started": "2026-12-04T21:00:00Z",
        "exit_code": 130,
        "outcome": "interrupted",
        "selection": {
            "run_file": None,
            "models": ["systemone:m"],
            "configs": [
                {
                    "provider": "systemone",
                    "model": "m",
                    "endpoint": "http://127.0.0.1:9/v1/systemone",
                    "params": "{}",
                }
            ],
            "cache_dir": str(Path(".dxi-cache").resolve()),  # the default, from the current folder
            "evals": ["when2call"],
            "sample": {"tasks": 3, "seed": 7},
            "max_cost_usd": 2.0,
            "prices": {"systemone:m": [1.0, 2.0]},
        },
        "cost_bound": None,
        "stopped_providers": [],
        "requests": None,
    }


async def test_a_run_stopped_while_scoring_keeps_what_it_sent_and_spent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
):
    """Ctrl-C once every request was sent, while the run scores: the sending is over, so its line
    has its counts and spend. 24 When2Call requests, each one question; the fake reports 1 output
    token per question, priced $1,000,000 per million (input free): $1.00 a request.

    Expected, by hand: exit code 130; ``sent`` 24, ``not_sent`` 0, ``cost_usd`` $24.00,
    ``cost_bound`` {$100, spent $24.00, not stopped} (the old code: ``requests`` and ``cost_bound``
    null, so no line ever had the $24); the last line says every request had been sent."""
    from dxi.runner import session

    def cut(*args, **kwargs):
        raise KeyboardInterrupt

    data_dir(tmp_path / "data", TASKS)
    out = tmp_path / "out"
    async with FakeProvider(model=None) as server:
        model = f"systemone:m1@{server.url}"
        flags = ["--data-dir", str(tmp_path / "data"), "--cache-dir", str(tmp_path / "cache")]
        flags += ["--out", str(out), "--model", model, "--price", f"{model}=0/1000000"]
        flags += ["--evals", "when2call"]  # the synthetic data: When2Call only
        monkeypatch.setattr(session, "_scored", cut)
        code = await asyncio.to_thread(main, ["run", *flags, "--max-cost", "100", "-q"])
        assert server.stats()["arrivals"] == TASKS
    assert code == 130
    (line,) = _lines(out / "run-history.jsonl")
    block = line["requests"]["systemone:m1"]
    assert (block["sent"], block["cache_hits"], block["not_sent"], block["cost_usd"]) == (
        TASKS,
        0,
        0,
        24.0,
    )
    assert line["cost_bound"] == {"max_cost_usd": 100.0, "spent_usd": 24.0, "stopped": False}
    assert (line["outcome"], line["stopped_providers"]) == ("interrupted", [])
    err = " ".join(capsys.readouterr().err.split())
    assert "Interrupted (Ctrl-C). Every request had been sent and every reply that arrived" in err


async def test_a_run_the_cache_stops_records_what_it_sent_and_the_replies_it_could_not_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
):
    """A full disk (as ``tests/test_cli.py`` makes one): the 6th row's write(2) takes half of it,
    then the disk refuses. One request at a time, $1.00 each (as above), under a bound of $100.

    Expected, by hand: exit code 4; the line records ``sent`` 6 and ``cost_usd`` $6.00, of which
    the 6th reply, paid for and not stored, is ``unstored`` {1, $1.00}, and the rest of the model
    ``incomplete``; ``cost_bound`` spent $6.00 (the old code: ``requests`` and ``cost_bound`` null,
    and the $1.00 paid for a reply lost silently); the stop's line says what was sent and spent."""
    import os

    from dxi.cache import store

    calls = []

    def full_after_five(fd: int, data: bytes) -> int:
        calls.append(len(data))
        if len(calls) <= 5:
            return os.write(fd, data)
        if len(calls) == 6:
            return os.write(fd, data[: len(data) // 2])
        raise OSError(28, "No space left on device")

    data_dir(tmp_path / "data", TASKS)
    out = tmp_path / "out"
    async with FakeProvider(model=None) as server:
        model = f"systemone:m1@{server.url}"
        flags = ["--data-dir", str(tmp_path / "data"), "--cache-dir", str(tmp_path / "cache")]
        flags += ["--out", str(out), "--model", model, "--price", f"{model}=0/1000000"]
        flags += ["--evals", "when2call"]  # the synthetic data: When2Call only
        monkeypatch.setattr(store, "_write", full_after_five)
        code = await asyncio.to_thread(
            main, ["run", *flags, "--max-cost", "100", "--max-in-flight", "1", "-q"]
        )
        assert server.stats()["arrivals"] == 6
    assert code == 4
    (line,) = _lines(out / "run-history.jsonl")
    block = line["requests"]["systemone:m1"]
    assert (block["sent"], block["cost_usd"], block["unstored"]) == (
        6,
        6.0,
        {"requests": 1, "cost_usd": 1.0},
    )
    assert block["incomplete"] == ["cache_hits", "not_sent"]
    assert line["cost_bound"] == {"max_cost_usd": 100.0, "spent_usd": 6.0, "stopped": False}
    assert line["outcome"] == "cache_write_failed"
    err = " ".join(capsys.readouterr().err.split())
    assert (
        "This run sent 6 request(s) and spent $6.0000; 1 of them ($1.0000) were paid for but "
        "could not be stored: the next run sends them again. Every reply stored before it is in"
    ) in err


def test_a_line_of_dxi_batches_collect_is_counted_apart_and_is_not_the_last_run(tmp_path: Path):
    """A run of ``--limit 30``, then a ``dxi batches collect`` of every task: the note of ``dxi
    score`` counts 1 run and 1 collect and tells how the run ended (the collect's outcome is not a
    run's), and the last run's selection is the run's, ``--limit 30`` (the old code: the collect's,
    every task, so ``dxi score --limit 30`` was told it scored other tasks than the last run)."""
    from dxi.runner.planning.selection import Pick, last_run

    out = tmp_path / "out"
    out.mkdir()
    ran = {"run_file": None, "models": ["m"], "evals": ["when2call"], "limit": 30}
    history.append(out, history.line_of(ran, "2026-12-04T21:00:00Z", 130))
    collected = {"run_file": None, "models": ["m"], "evals": ["when2call"]}
    line = history.line_of(collected, "2026-12-04T22:00:00Z", 0, command=history.COLLECT)
    assert next(iter(line)) == "command" and line["command"] == "batches collect"
    history.append(out, line)
    assert history.note(out) == (
        f"what each run sent and spent: {out / 'run-history.jsonl'} (1 run and 1 dxi batches "
        "collect; the last run was interrupted)"
    )
    last = last_run(out, {}, tmp_path / "cache", {"m": ("systemone", "m", "", "{}")})
    assert (last.pick, last.evals) == (Pick(30, None, 0), ("when2call",))
    assert [line.get("command") for line in history.read(out)] == [None, "batches collect"]
    assert len(history.runs(out)) == 1


def test_dxi_batches_collect_stopped_by_a_full_disk_records_what_it_stored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
):
    """A collection the cache stops (a full disk) after it stored 3 answers costing $0.75: exit
    code 4 with one line saying what to do (the old code: 70, an unexpected error), and its line
    records the 3 answers and their $0.75, ``outcome`` ``cache_write_failed``."""
    from dxi.cache import CacheWriteError
    from dxi.runner import open_batches
    from dxi.runner.batch.options import BatchStats

    def collect(plan, *, wait, poll_s, say, stats):
        s = stats["openai:m"] = BatchStats(cost_usd=0.75, ok=3, attempts=3, from_earlier=3)
        s.from_earlier_usd, s.earlier_entries = 0.75, {"dxi-1"}
        raise CacheWriteError("No space left on device")

    monkeypatch.setattr(open_batches, "collect", collect)
    data_dir(tmp_path / "data", 4)
    (tmp_path / "cache" / "batches").mkdir(parents=True)
    out = tmp_path / "out"
    args = ["batches", "collect", "--model", "openai:m@http://127.0.0.1:9/v1", "--evals"]
    args += ["when2call", "--data-dir", str(tmp_path / "data"), "--cache-dir"]
    args += [str(tmp_path / "cache"), "--out", str(out)]
    assert main(args) == 4
    assert "make room (or fix the directory) and collect again" in capsys.readouterr().err
    (line,) = _lines(out / "run-history.jsonl")
    r = line["requests"]["openai:m"]
    assert (line["command"], line["outcome"], line["collected"]) == (
        "batches collect",
        "cache_write_failed",
        [],
    )
    assert (r["sent"], r["cost_usd"], r["batches"]["from_earlier_entries"]) == (0, 0.75, ["dxi-1"])
