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
        assert await asyncio.to_thread(dxi, "score") == 1  # the answers not sent are missing
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
    assert main(["report", *folders, "--out", str(out), "-q"]) == 0
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
    assert main(["score", *folders, "--out", str(out), "-q"]) == 0  # the cache's one model
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
    """Ctrl-C, SIGTERM or a cache that cannot be written: the run scores nothing, so its line says
    how it ended and what it selected, with no counts (null, never zeros)."""
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
            "evals": ["when2call"],
            "sample": {"tasks": 3, "seed": 7},
            "max_cost_usd": 2.0,
            "prices": {"systemone:m": [1.0, 2.0]},
        },
        "cost_bound": None,
        "stopped_providers": [],
        "requests": None,
    }
