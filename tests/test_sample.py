"""``--sample N [--seed S]``: the allocation by stratum, the seeded choice, and a run on the real
data."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import orjson
import pytest

from dxi.evals import discover
from dxi.evals.task import CHOICE, Option, Question, Task
from dxi.runner import session
from dxi.runner.cli import main
from dxi.runner.errors import EXIT_USAGE
from dxi.runner.planning import plan
from dxi.runner.planning.sample import SampledSuite, allocate, choose, stratum

from .conftest import REAL_DATA, requires_real_data


def test_allocation_is_proportional_with_every_stratum_present():
    assert allocate({"a": 100, "b": 100, "c": 100}, 10) == {"a": 4, "b": 3, "c": 3}
    assert allocate({"big": 90, "small": 10}, 10) == {"big": 9, "small": 1}
    assert allocate({"big": 98, "tiny": 1, "small": 1}, 10) == {"big": 8, "tiny": 1, "small": 1}
    assert allocate({"a": 50, "b": 30, "c": 20}, 2) == {
        "a": 1,
        "b": 1,
        "c": 0,
    }  # fewer than strata: largest
    assert allocate({"a": 3, "b": 2}, 10) == {"a": 3, "b": 2}  # more than there are: all of them
    assert sum(allocate({f"s{i}": i + 1 for i in range(37)}, 10).values()) == 10


def task(i: int, reply: str) -> Task:
    options = (Option("A", "x"), Option("B", "y"))
    return Task(
        f"when2call/{i}",
        "when2call",
        "state",
        (Question("answer", CHOICE, "q", options),),
        {"answer": "A"},
        {"categories": {"A": reply, "B": "other"}},
    )


def test_the_choice_depends_on_the_seed_and_the_ids_only():
    tasks = [task(i, "tool_call" if i % 2 else "cannot_answer") for i in range(40)]
    assert stratum(tasks[1]) == "tool_call"
    first = choose(tasks, 6, seed=1)
    assert len(first) == 6 and choose(list(reversed(tasks)), 6, seed=1) == first
    assert Counter(stratum(t) for t in tasks if t.id in first) == {
        "tool_call": 3,
        "cannot_answer": 3,
    }
    assert choose(tasks, 6, seed=2) != first


@pytest.mark.slow
def test_a_sampled_run_and_its_rescoring(data_dir: Path, tmp_path: Path, capsys):
    where = [
        "--data-dir",
        str(data_dir),
        "--cache-dir",
        str(tmp_path / "c"),
        "--out",
        str(tmp_path / "o"),
        "-q",
    ]
    assert main(["run", "--model", "embedded", "--sample", "2", "--seed", "3", *where]) == 0
    s = orjson.loads((tmp_path / "o" / "summary.json").read_bytes())
    assert {k: v["tasks"] for k, v in s["data"].items()} == {
        "aa_omniscience_decision": 2,
        "hle_multichoice": 2,
        "when2call": 2,
        "wildguardtest": 2,
    }
    assert s["data"]["when2call"]["sample"] == {"tasks": 2, "seed": 3}
    assert "When2Call: 2 tasks from" in capsys.readouterr().out
    assert main(["score", "--sample", "2", "--seed", "3", *where]) == 0
    out = capsys.readouterr().out
    assert "sample 2 (seed 3)" in out
    assert s["models"][0]["requests"]["sent"] == 8
    assert (
        main(["run", "--model", "embedded", "--sample", "2", "--limit", "2", *where]) == EXIT_USAGE
    )
    assert "--sample and --limit do not combine" in capsys.readouterr().err
    assert main(["run", "--model", "embedded", "--seed", "2", *where]) == EXIT_USAGE


def test_a_run_file_can_sample(data_dir: Path, tmp_path: Path):
    run_file = tmp_path / "r.toml"
    run_file.write_text(
        f'data_dir = "{data_dir}"\ncache_dir = "c"\nout = "o"\n[evals]\nsample = 1\nseed = 4\n'
        '[[models]]\nprovider = "embedded"\nmodel = "sparrow-nano-general-v1.1"\n'
    )
    assert session.run(plan.build(run_file=run_file)).exit_code == 0
    s = orjson.loads((tmp_path / "o" / "summary.json").read_bytes())
    assert {v["tasks"] for v in s["data"].values()} == {1}
    assert s["data"]["hle_multichoice"]["sample"] == {"tasks": 1, "seed": 4}


@requires_real_data
def test_ten_when2call_tasks_hold_every_reply_type():
    suite = SampledSuite(
        discover(REAL_DATA, selected=["when2call", "wildguardtest"]), sample=10, seed=0
    )
    replies = Counter(stratum(t) for t in suite.tasks("when2call"))
    assert replies == {"cannot_answer": 4, "request_for_info": 3, "tool_call": 3}
    labels = Counter(stratum(t) for t in suite.tasks("wildguardtest"))
    assert (
        sum(labels.values()) == 10 and len(labels) == 6
    )  # every combination of labels in the data


@pytest.mark.parametrize("n", [1, 7])
def test_sampling_takes_exactly_n(data_dir: Path, n: int):
    suite = SampledSuite(discover(data_dir), sample=n, seed=0)
    counts = Counter(t.eval for t in suite.tasks())
    full = Counter(t.eval for t in SampledSuite(discover(data_dir), sample=10**6).tasks())
    assert counts == {e: min(n, k) for e, k in full.items()}
