"""``provenance.selection_differs`` (``runner.planning.selection.against_last_run``): what
``dxi score``, ``report``, ``export`` and ``view`` given no selection say when the tasks they score
are not those the last ``dxi run`` asked. Its gaps closed here: the WildGuardTest subset is
compared (the run's line records it), the tasks are compared rather than the flags' spelling
(``--limit 1000`` is ``--all-tasks`` on small evaluations), the eee export records it, and an
output folder without OUT/run-history.jsonl falls back on the cache's one unambiguous record.

The fixture data: 4 Omniscience, 2 HLE, 3 When2Call and 3 agreed WildGuardTest tasks (5 of
them in all)."""

from __future__ import annotations

from pathlib import Path

import jsonschema
import orjson
import pytest

from dxi.runner.cli import main

from .helpers.runs import MODEL
from .helpers.selection import ROBOT, summary, where

SCHEMAS = Path(__file__).parent / "eee_schema"
ALL = "aa_omniscience_decision,hle_multichoice,when2call,wildguardtest"


def run_file(tmp: Path, limit: int | None = None) -> Path:
    file = tmp / "tonight.toml"
    file.write_text(
        'data_dir = "data"\ncache_dir = "cache"\nout = "out"\n[evals]\n'
        + ("" if limit is None else f"limit = {limit}\n")
        + '[[models]]\nname = "nano"\nprovider = "embedded"\nmodel = "sparrow-nano-general-v1.1"\n'
    )
    return file


def last_line(out: Path) -> dict:
    return orjson.loads((out / "run-history.jsonl").read_bytes().splitlines()[-1])


@pytest.mark.slow
def test_a_rescoring_with_another_wildguardtest_subset_says_so(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
):
    """`dxi run tonight.toml --wildguard-subset all`, then `dxi score tonight.toml`: the run file's
    subset (agreed, 3 WildGuardTest tasks of 5) is scored, as documented, but no longer silently.
    The run's line records its subset; a line without it (written before) is not compared."""
    file = run_file(tmp_path)
    history = tmp_path / "out" / "run-history.jsonl"
    assert main(["run", str(file), "--wildguard-subset", "all", "-q"]) == 0
    line = last_line(tmp_path / "out")
    assert line["selection"] == {
        "run_file": str(file),
        "models": ["nano"],
        "configs": [
            {
                "provider": "embedded",
                "model": "sparrow-nano-general-v1.1",
                "endpoint": "/v1/systemone",
                "params": "{}",
            }
        ],
        "cache_dir": str((tmp_path / "cache").resolve()),
        "evals": ALL.split(","),
        "wildguard_subset": "all",
        "max_cost_usd": None,
        "prices": {"nano": [0.0, 0.0]},
    }
    ended = line["ended"]
    assert summary(tmp_path, "out")["data"]["wildguardtest"]["tasks"] == 5
    capsys.readouterr()
    assert main(["score", str(file)]) == 0
    assert capsys.readouterr().err == (
        f"warning: the last dxi run here ({history}, ended {ended}) asked --all-tasks "
        "--wildguard-subset all; this scoring uses --all-tasks --wildguard-subset agreed (the run "
        "file's): add --all-tasks --wildguard-subset all to score what it asked\n"
    )
    scored = summary(tmp_path, "out")
    assert scored["data"]["wildguardtest"]["tasks"] == 3
    assert scored["provenance"]["selection_differs"] == {
        "scored": "--all-tasks --wildguard-subset agreed",
        "why": "the run file's",
        "last_run": "--all-tasks --wildguard-subset all",
        "last_run_ended": ended,
        "run_history": str(history),
    }
    # the flag's subset: "instead"; and with other tasks too, both sources named
    assert main(["score", str(file), "--wildguard-subset", "agreed"]) == 0
    assert capsys.readouterr().err == (
        f"warning: the last dxi run here ({history}, ended {ended}) asked --all-tasks "
        "--wildguard-subset all; this scoring uses --all-tasks --wildguard-subset agreed (given on "
        "the command line): give --all-tasks --wildguard-subset all instead to score what it asked\n"
    )
    file = run_file(tmp_path, limit=2)
    assert main(["score", str(file)]) == 0
    assert capsys.readouterr().err == (
        f"warning: the last dxi run here ({history}, ended {ended}) asked --all-tasks "
        "--wildguard-subset all; this scoring uses --limit 2 --wildguard-subset agreed (the run "
        "file's): add --all-tasks --wildguard-subset all to score what it asked\n"
    )
    assert main(["score", str(file), "--all-tasks", "--wildguard-subset", "agreed"]) == 0
    assert capsys.readouterr().err == (
        f"warning: the last dxi run here ({history}, ended {ended}) asked --all-tasks "
        "--wildguard-subset all; this scoring uses --all-tasks --wildguard-subset agreed (given on "
        "the command line): give --all-tasks --wildguard-subset all instead to score what it asked\n"
    )
    # what the run asked: nothing said
    assert main(["score", str(file), "--all-tasks", "--wildguard-subset", "all"]) == 0
    assert capsys.readouterr().err == ""
    assert "selection_differs" not in summary(tmp_path, "out")["provenance"]
    # a line written before the subset was recorded: the subset is not compared
    old = line | {
        "selection": {k: v for k, v in line["selection"].items() if k != "wildguard_subset"}
    }
    history.write_bytes(orjson.dumps(old) + b"\n")
    assert main(["score", str(file), "--all-tasks"]) == 0
    assert capsys.readouterr().err == ""


@pytest.mark.slow
def test_limits_that_take_every_task_are_every_task(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
):
    """`dxi run --limit 1000` on evaluations of at most 4 tasks took every task: scoring
    --all-tasks, --limit 4 or --sample 4 scores the same tasks and says nothing (it said the
    selections differ); --limit 3 leaves out an Omniscience task, and says so."""
    flags = where(data_dir, tmp_path, "out")
    assert main(["run", "--model", MODEL, "--limit", "1000", *flags]) == 0
    ended = last_line(tmp_path / "out")["ended"]
    capsys.readouterr()
    for given in (["--all-tasks"], ["--limit", "4"], ["--sample", "4"], ["--limit", "1000"]):
        assert main(["score", *given, *flags]) == 0, given
        assert capsys.readouterr().err == "", given
        assert "selection_differs" not in summary(tmp_path, "out")["provenance"]
    assert main(["score", "--limit", "3", *flags]) == 0
    history = tmp_path / "out" / "run-history.jsonl"
    assert capsys.readouterr().err == (
        f"warning: the last dxi run here ({history}, ended {ended}) asked --limit 1000; this "
        "scoring uses --limit 3 (given on the command line): give --limit 1000 instead to score "
        "what it asked\n"
    )


@pytest.mark.slow
def test_the_eee_export_records_what_summary_json_does(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
):
    """`dxi export --format eee` of other tasks than the last run asked records the warning it
    prints: each record's ``eval_library.additional_details.selection_differs``, summary.json's
    block as JSON text (the schema's details are strings); none when the tasks are the same."""
    file = run_file(tmp_path, limit=2)
    history = tmp_path / "out" / "run-history.jsonl"
    assert main(["run", str(file), "--limit", "3", "-q"]) == 0
    ended = last_line(tmp_path / "out")["ended"]
    capsys.readouterr()
    assert main(["export", str(file), "--format", "eee", str(tmp_path / "eee"), "-q"]) == 0
    assert capsys.readouterr().err == (
        f"warning: the last dxi run here ({history}, ended {ended}) asked --limit 3; this scoring "
        "uses --limit 2 (the run file's): add --limit 3 to score what it asked\n"
    )
    schema = orjson.loads((SCHEMAS / "eval.schema.json").read_bytes())
    logs = [orjson.loads(p.read_bytes()) for p in sorted((tmp_path / "eee").rglob("*.json"))]
    assert len(logs) == 5  # four evaluations and the index
    block = (
        f'{{"scored":"--limit 2","why":"the run file\'s","last_run":"--limit 3","last_run_ended":'
        f'"{ended}","run_history":"{history}"}}'
    )
    for log in logs:
        assert list(jsonschema.Draft7Validator(schema).iter_errors(log)) == []
        assert log["eval_library"]["additional_details"]["selection_differs"] == block
    assert (
        main(["export", str(file), "--limit", "3", "--format", "eee", str(tmp_path / "same")]) == 0
    )
    assert capsys.readouterr().err == ""
    for path in (tmp_path / "same").rglob("*.json"):
        assert (
            "selection_differs"
            not in orjson.loads(path.read_bytes())["eval_library"]["additional_details"]
        )


@pytest.mark.slow
def test_without_run_history_the_caches_one_record_of_these_models_is_compared(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
):
    """A new --out (or a folder from before run-history.jsonl): the cache's runs.jsonl is the last
    run when it holds one selection of the models scored, run by each of them; several (the file
    keeps one line per distinct selection: the latest cannot be told) say nothing."""
    assert main(["run", "--model", MODEL, "--limit", "2", *where(data_dir, tmp_path, "a")]) == 0
    assert main(["run", "--model", ROBOT, "--limit", "1", *where(data_dir, tmp_path, "b")]) == 0
    records = tmp_path / "cache" / "runs.jsonl"
    capsys.readouterr()
    new = where(data_dir, tmp_path, "new")
    assert main(["score", "--model", MODEL, "--limit", "1", *new]) == 0
    assert capsys.readouterr().err == (
        f"warning: the one dxi run of these models recorded in this cache ({records}; the output "
        "folder records none with this cache and these models) asked --limit 2; this scoring "
        "uses --limit 1 (given on the command "
        "line): give --limit 2 instead to score what it asked\n"
    )
    assert summary(tmp_path, "new")["provenance"]["selection_differs"] == {
        "scored": "--limit 1",
        "why": "given on the command line",
        "last_run": "--limit 2",
        "last_run_ended": None,
        "run_history": str(records),
    }
    # what it selected, given or remembered: nothing said
    for given in (["--limit", "2"], []):
        assert main(["score", "--model", MODEL, *given, *new]) == 0
        assert capsys.readouterr().err == ""
    # both models: two runs recorded, which was the last is unknown: nothing said
    assert main(["score", "--limit", "1", *new]) == 0
    assert capsys.readouterr().err == ""
    assert "selection_differs" not in summary(tmp_path, "new")["provenance"]


@pytest.mark.slow
def test_model_flags_score_the_runs_wildguardtest_subset(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
):
    """`dxi run --model M --wildguard-subset all`, then `dxi score --model M`: no subset given, so
    the runs' (as `dxi score` without --model took it, and the docs say), not agreed: 5
    WildGuardTest tasks, nothing to warn of. (It scored 3, agreed, taking --model for a run
    file.)"""
    flags = where(data_dir, tmp_path, "out")
    assert main(["run", "--model", MODEL, "--wildguard-subset", "all", *flags]) == 0
    capsys.readouterr()
    for models in (["--model", MODEL], []):
        assert main(["score", *models, *flags]) == 0, models
        said = capsys.readouterr()
        assert said.err == "", models
        assert (
            f"note: scoring the tasks the runs recorded in this cache selected (--all-tasks "
            f"--wildguard-subset all; {tmp_path / 'cache' / 'runs.jsonl'}); give --limit, --sample or "
            "--all-tasks to score others"
        ) in " ".join(said.out.split()), models
        assert summary(tmp_path, "out")["data"]["wildguardtest"]["tasks"] == 5, models


@pytest.mark.slow
def test_a_run_on_another_cache_or_of_other_models_is_not_compared(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
):
    """The trial's case: `make run` (every task, its own cache) wrote out/run-history.jsonl, then
    `dxi score`, `report`, `export` (and `view`, the same code) of a sample of another cache into
    that folder warned that the last run asked --all-tasks and told to give it (every task scored
    against a cache of a few answers). Only a line about this cache (where it records it) and one
    of these models is compared; of several, the last such, named as such."""
    assert main(["run", "--model", MODEL, *where(data_dir, tmp_path, "out")]) == 0
    ended = last_line(tmp_path / "out")["ended"]
    other = ["--data-dir", str(data_dir), "--cache-dir", str(tmp_path / "c5"), "-q"]
    assert (
        main(["run", "--model", MODEL, "--limit", "1", *other, "--out", str(tmp_path / "x")]) == 0
    )
    assert (
        main(["run", "--model", ROBOT, "--limit", "1", *other, "--out", str(tmp_path / "y")]) == 0
    )
    capsys.readouterr()
    into = [*other, "--out", str(tmp_path / "out")]
    monkeypatch.chdir(tmp_path)  # dxi export (no --out) compares with ./out, as dxi view does
    for command in (["score", *into], ["report", *into], ["export", *other, "--format", "csv"]):
        target = ["a.csv"] if command[0] == "export" else []
        for model in (MODEL, ROBOT):  # the same model on another cache; another model
            given = ["--model", model, "--limit", "1", *target]
            assert main([*command, *given]) == 0, (command, model)
            assert capsys.readouterr().err == "", (command, model)
    # a line of an older dxi (no cache recorded): compared only where it names a model scored
    history = tmp_path / "out" / "run-history.jsonl"
    line = last_line(tmp_path / "out")
    old = line | {
        "selection": {
            k: v for k, v in line["selection"].items() if k not in ("cache_dir", "configs")
        }
    }
    history.write_bytes(orjson.dumps(old) + b"\n")
    assert main(["score", "--model", ROBOT, "--limit", "1", *into]) == 0
    assert capsys.readouterr().err == ""
    assert main(["score", "--model", MODEL, "--limit", "1", *into]) == 0
    assert capsys.readouterr().err == (
        f"warning: the last dxi run here ({history}, ended {ended}) asked --all-tasks; this "
        "scoring uses --limit 1 (given on the command line): give --all-tasks instead to score "
        "what it asked\n"
    )
    # a later run of another cache into the folder: the last run of this cache is compared
    history.write_bytes(orjson.dumps(line) + b"\n")
    assert main(["run", "--model", ROBOT, "--limit", "1", *into]) == 0
    capsys.readouterr()
    assert main(["score", "--model", MODEL, "--limit", "2", *where(data_dir, tmp_path, "out")]) == 0
    assert capsys.readouterr().err == (
        f"warning: the last dxi run here with this cache and these models ({history}, ended "
        f"{ended}) asked --all-tasks; this scoring uses --limit 2 (given on the command line): "
        "give --all-tasks instead to score what it asked\n"
    )
