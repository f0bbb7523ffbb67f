"""A sampled or limited run is remembered (issue 23, item 8): ``dxi run`` records what it selected
in the cache folder (``runs.jsonl``); with no selection given, ``dxi score``, ``report``, ``export``
and ``view`` score what the runs selected (``runner.planning.selection``); where answers are missing
the reason names the flags the model's runs used; ``export`` counts the rows missing and exits 1
unless ``--include-missing``.

The fixture data: 4 Omniscience, 2 HLE, 3 When2Call and 3 agreed WildGuardTest tasks."""

from __future__ import annotations

from pathlib import Path

import orjson
import polars as pl
import pytest

from dxi.cache import runs
from dxi.cache.runs import RunRecord
from dxi.evals import EVALS, Suite, discover
from dxi.runner import export, rescore, session
from dxi.runner.cli import main
from dxi.runner.errors import EXIT_FAILED_REQUESTS, EXIT_USAGE
from dxi.runner.planning import plan
from dxi.runner.planning.inputs import PlanInputs
from dxi.runner.planning.sample import choose
from dxi.scoring import records

from .helpers.runs import MODEL
from .helpers.selection import ROBOT, summary, where
from .helpers.view import caught_view, view_of

QUESTIONS = {"aa_omniscience_decision": 1, "hle_multichoice": 1, "when2call": 1, "wildguardtest": 3}


def run(data: Path, tmp: Path, out: str, model: str = MODEL, **fields) -> int:
    """``dxi run -q``'s work (``session.run``) of ``model`` with ``fields`` (``PlanInputs``): its
    exit code."""
    return session.run(
        plan.build(models=[model], data_dir=data, cache_dir=tmp / "cache", out=tmp / out, **fields)
    ).exit_code


def score(data: Path, tmp: Path, out: str, html: bool = False, **fields) -> rescore.Rescored:
    """``dxi score``'s work (``dxi report``'s with ``html``) over the selection ``fields`` make."""
    inputs = PlanInputs(data_dir=data, cache_dir=tmp / "cache", out=tmp / out, **fields)
    return rescore.rescore(rescore.select(inputs), html=html)


def exported(
    data: Path, tmp: Path, fmt: str, target: Path, include_missing: bool = False, **fields
) -> export.Exported:
    """``dxi export``'s work over the selection ``fields`` make."""
    inputs = PlanInputs(data_dir=data, cache_dir=tmp / "cache", **fields)
    return export.export(rescore.select(inputs), fmt, target, include_missing=include_missing)


@pytest.mark.slow
def test_a_sampled_run_is_scored_as_it_ran_by_score_report_export_and_view(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.chdir(tmp_path)  # export and view read ./out: not the checkout's
    assert run(data_dir, tmp_path, "run", sample=2) == 0
    capsys.readouterr()
    assert (
        main(["score", *where(data_dir, tmp_path, "plain")]) == 0
    )  # the command line prints the note
    out = capsys.readouterr().out
    assert (
        f"note: scoring the tasks the runs recorded in this cache selected (--sample 2; {tmp_path / 'cache'}/"
        "runs.jsonl); give --limit, --sample or --all-tasks to score others"
    ) in " ".join(out.split())
    assert score(data_dir, tmp_path, "given", sample=2).exit_code == 0
    # exactly what `dxi score --sample 2` writes, and what the run wrote
    for name in ("summary.json", "answers.parquet"):
        assert (tmp_path / "plain" / name).read_bytes() == (
            tmp_path / "given" / name
        ).read_bytes(), name
    plain = summary(tmp_path, "plain")
    ran = summary(tmp_path, "run")
    assert [m["evals"] for m in plain["models"]] == [m["evals"] for m in ran["models"]]
    assert (
        plain["models"][0]["decision_index"] is not None
        and "runs" not in plain["data"]["when2call"]
    )
    assert {k: v["tasks"] for k, v in plain["data"].items()} == dict.fromkeys(EVALS, 2)
    # the report and the export take the same tasks
    reported = score(data_dir, tmp_path, "report", html=True)
    assert reported.exit_code == 0 and reported.report == tmp_path / "report" / "report.html"
    assert summary(tmp_path, "report") == plain
    capsys.readouterr()
    assert (
        main(
            [
                "export",
                "--format",
                "csv",
                *where(data_dir, tmp_path, "x")[:4],
                str(tmp_path / "a.csv"),
            ]
        )
        == 0
    )
    assert capsys.readouterr().err == ""
    exported = pl.read_csv(tmp_path / "a.csv")
    assert exported.height == 2 * sum(QUESTIONS.values()) and set(exported["status"]) == {"ok"}
    # the view too
    b = view_of(data_dir=data_dir, cache_dir=tmp_path / "cache")
    try:
        assert records.to_builtins(b.summary) == plain and len(b.tasks) == 8
    finally:
        b.close()
    # --all-tasks: every task, and the answers the sample did not send are missing, with the flags
    # to add (a provisional result, SPEC §6: those answers are left out, the figures marked with
    # bounds, exit code 1)
    assert score(data_dir, tmp_path, "all", all_tasks=True).exit_code == EXIT_FAILED_REQUESTS
    every = summary(tmp_path, "all")["models"][0]["evals"]
    assert every["when2call"]["missing"] == 1 and every["when2call"]["reason"] == (
        "1 answer(s) not in the cache: this model's runs selected --sample 2 here, not --all-tasks; score with "
        "--sample 2 to see what they answered, or `dxi run` with --all-tasks to send what is missing"
    )
    # a WildGuardTest task's request holds its 3 answers: the line counts answers, as every other
    # count of missing answers does (summary.json's missing, --allow-failed), and says the tasks
    assert every["wildguardtest"]["missing"] == 3 and every["wildguardtest"]["reason"] == (
        "3 answer(s), of 1 task(s), not in the cache: this model's runs selected --sample 2 here, "
        "not --all-tasks; score with --sample 2 to see what they answered, or `dxi run` with "
        "--all-tasks to send what is missing; f1_response_harm: undefined (no positive gold label "
        "and no positive prediction); mean_f1 is the mean of the defined F1 scores"
    )
    assert summary(tmp_path, "all")["data"]["when2call"]["runs"] == {MODEL: "--sample 2"}
    assert (
        main(["score", "--all-tasks", "--limit", "2", *where(data_dir, tmp_path, "x")])
        == EXIT_USAGE
    )
    assert "--all-tasks and --limit do not combine" in capsys.readouterr().err


def test_a_cache_without_records_scores_every_task_and_the_reason_names_sample(
    data_dir: Path, tmp_path: Path
):
    assert run(data_dir, tmp_path, "run", sample=2) == 0
    (tmp_path / "cache" / runs.RUNS_FILE).unlink()  # a cache an older version wrote
    assert (
        score(data_dir, tmp_path, "plain").exit_code == EXIT_FAILED_REQUESTS
    )  # missing: provisional
    block = summary(tmp_path, "plain")["models"][0]["evals"]["aa_omniscience_decision"]
    assert (block["n"], block["missing"]) == (4, 2)
    assert block["reason"] == (
        "2 answer(s) not in the cache: the run is incomplete (interrupted, or it ran fewer "
        "epochs than scored here, or it ran other tasks (--limit, --sample)); `dxi run` with "
        "--all-tasks sends what is missing"
    )


@pytest.mark.slow
def test_export_counts_the_missing_rows_and_exits_1_unless_asked_to_include_them(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
):
    assert run(data_dir, tmp_path, "run", sample=2) == 0
    at = where(data_dir, tmp_path, "x")[:4]
    # --limit 3 asks for the first three tasks of each; the run sampled two of each
    missing = {
        name: len(_ids(data_dir, name, limit=3) - _ids(data_dir, name, sample=2)) * QUESTIONS[name]
        for name in EVALS
    }
    total, rows = (
        sum(missing.values()),
        sum(len(_ids(data_dir, n, limit=3)) * QUESTIONS[n] for n in EVALS),
    )
    assert total >= 4 and missing["hle_multichoice"] == 0
    capsys.readouterr()
    assert (
        main(["export", "--format", "csv", "--limit", "3", *at, str(tmp_path / "a.csv")])
        == EXIT_FAILED_REQUESTS
    )
    said = " ".join(capsys.readouterr().out.split())
    first = next(n for n in EVALS if missing[n])
    counts = "; ".join(f"{MODEL} {EVALS[n].title}: {k}" for n, k in missing.items() if k)
    assert said.startswith("Exported 1 file(s) (csv)")
    assert (
        f"{total} answer(s) missing from the cache ({counts}): left out of the export (--include-missing writes "
        f"them as rows of status missing). {MODEL} {EVALS[first].title}: {missing[first]} answer(s) not in the "
        "cache: this model's runs selected --sample 2 here, not --limit 3; score with --sample 2"
    ) in said
    left = pl.read_csv(tmp_path / "a.csv")
    assert left.height == rows - total and "missing" not in set(left["status"])
    included = exported(
        data_dir, tmp_path, "csv", tmp_path / "b.csv", include_missing=True, limit=3
    )
    assert (
        included.exit_code == 0
        and included.written == [tmp_path / "b.csv"]
        and included.missing.total == total
    )
    whole = pl.read_csv(tmp_path / "b.csv")
    assert whole.height == rows and whole.filter(pl.col("status") == "missing").height == total
    assert (
        whole.filter(pl.col("status") != "missing")
        .sort("task_id", "question_id")
        .equals(left.sort("task_id", "question_id"))
    )
    # eee writes the evaluations with missing answers, their figures marked provisional (SPEC §6);
    # it exits 1 all the same, 0 when asked
    assert (
        exported(data_dir, tmp_path, "eee", tmp_path / "eee", limit=3).exit_code
        == EXIT_FAILED_REQUESTS
    )
    assert (
        exported(
            data_dir, tmp_path, "eee", tmp_path / "eee", include_missing=True, limit=3
        ).exit_code
        == 0
    )
    marked = [orjson.loads(p.read_bytes()) for p in (tmp_path / "eee").rglob("*.json")]
    assert {
        log["evaluation_results"][0]["evaluation_name"]
        for log in marked
        if "provisional" in log["source_metadata"].get("additional_details", {})
    } >= {first, "decision_index"}


def _ids(data: Path, name: str, limit: int | None = None, sample: int | None = None) -> set[str]:
    tasks = list(Suite(discover(data, {}, None)).tasks(name))
    return {t.id for t in tasks[:limit]} if sample is None else choose(tasks, sample, 0)


@pytest.mark.slow
def test_runs_of_two_selections_are_scored_as_their_union(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
):
    assert run(data_dir, tmp_path, "a", limit=1) == 0
    assert (
        run(
            data_dir, tmp_path, "b", ROBOT, sample=2, evals=["when2call", "aa_omniscience_decision"]
        )
        == 0
    )
    capsys.readouterr()
    assert (
        main(["score", *where(data_dir, tmp_path, "plain")]) == EXIT_FAILED_REQUESTS
    )  # missing: provisional
    assert (
        "(aa_omniscience_decision: --limit 1 + --sample 2; hle_multichoice: --limit 1; when2call: --limit 1 + "
        "--sample 2; wildguardtest: --limit 1;"
    ) in " ".join(capsys.readouterr().out.split())
    s = summary(tmp_path, "plain")
    for name in EVALS:
        union = _ids(data_dir, name, limit=1) | (
            _ids(data_dir, name, sample=2)
            if name in ("when2call", "aa_omniscience_decision")
            else set()
        )
        assert s["data"][name]["tasks"] == len(union), name
        by = {m["model"]: m["evals"][name] for m in s["models"]}
        assert by[MODEL]["missing"] == (len(union) - 1) * QUESTIONS[name]
        assert by[ROBOT]["missing"] == (
            (len(union) - 2) * QUESTIONS[name]
            if name in ("when2call", "aa_omniscience_decision")
            else len(union) * QUESTIONS[name]
        )
    assert s["data"]["when2call"]["union"] == [{"limit": 1}, {"sample": {"tasks": 2, "seed": 0}}]
    assert s["data"]["when2call"]["runs"] == {MODEL: "--limit 1", ROBOT: "--sample 2"}
    assert (
        "runs" not in s["data"]["hle_multichoice"]
    )  # the one run that read it selected what is scored
    assert s["models"][0]["evals"]["when2call"]["reason"].startswith(
        f"{s['models'][0]['evals']['when2call']['missing']} answer(s) not in the cache: this model's runs selected "
        "--limit 1 here, not --limit 1 + --sample 2; score with --limit 1"
    )
    # one model named: its own runs' selection, complete
    assert score(data_dir, tmp_path, "robot", models=[ROBOT]).exit_code == 0
    robot = summary(tmp_path, "robot")
    assert [k for k, v in robot["data"].items() if "files" in v] == [
        "aa_omniscience_decision",
        "when2call",
    ]
    assert robot["data"]["when2call"]["sample"] == {"tasks": 2, "seed": 0}
    assert all(e.get("missing", 0) == 0 for e in robot["models"][0]["evals"].values())
    # a run of every task absorbs the smaller selections: scored as every task, and said (not
    # widened unseen)
    assert run(data_dir, tmp_path, "full") == 0
    mine = score(data_dir, tmp_path, "mine", models=[MODEL])
    assert mine.exit_code == 0 and mine.notes == [
        f"scoring every task: a run recorded in this cache ({tmp_path / 'cache' / runs.RUNS_FILE}) selected every "
        "task, which holds the other runs' --limit 1; give --limit 1 (the latest) to score only those"
    ]
    assert summary(tmp_path, "mine")["data"]["when2call"]["tasks"] == 3


@pytest.mark.slow
def test_the_run_record(data_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture):
    cache = tmp_path / "cache"
    assert (
        run(data_dir, tmp_path, "run", sample=2, seed=3, evals=["when2call", "hle_multichoice"])
        == 0
    )
    (line,) = (cache / runs.RUNS_FILE).read_bytes().splitlines()
    doc = orjson.loads(line)
    assert doc.pop("at") > 0
    assert doc == {
        "prompt_version": "dxi-prompt-1",
        "models": [
            {
                "provider": "embedded",
                "model": "sparrow-nano-general-v1.1",
                "endpoint": "/v1/systemone",
                "params": "{}",
            }
        ],
        "evals": ["hle_multichoice", "when2call"],
        "limit": None,
        "sample": 2,
        "seed": 3,
        "wildguard_subset": "agreed",
    }
    # the same selection again adds nothing; another adds its line
    assert run(data_dir, tmp_path, "run", sample=2, seed=3, evals="when2call,hle_multichoice") == 0
    assert len((cache / runs.RUNS_FILE).read_bytes().splitlines()) == 1
    assert run(data_dir, tmp_path, "run", limit=1) == 0
    records, warnings = runs.read(cache)
    assert [(r.limit, r.sample, r.seed) for r in records] == [
        (None, 2, 3),
        (1, None, 0),
    ] and warnings == []
    # a damaged line is skipped with a warning naming it; the rest is read
    with open(cache / runs.RUNS_FILE, "ab") as f:
        f.write(b'{"prompt_version": "dxi-prompt-1", "models": 3}\n{"at": 1, "trunc')
    records, warnings = runs.read(cache)
    assert len(records) == 2 and warnings == [
        f"{cache / runs.RUNS_FILE} line 3 is not a run record (field 'models' is missing or not list); skipped it.",
        f"{cache / runs.RUNS_FILE} line 4 is not a run record (unexpected end of data: line 1 column 17 (char 16)); "
        "skipped it.",
    ]
    assert RunRecord.from_json(orjson.loads(line)).as_json() == orjson.loads(line)


def test_evaluations_the_runs_did_not_read_are_not_selected(data_dir: Path, tmp_path: Path):
    assert run(data_dir, tmp_path, "run", evals=["hle_multichoice"], limit=1) == 0
    assert score(data_dir, tmp_path, "plain").exit_code == 0
    s = summary(tmp_path, "plain")
    assert s["data"]["hle_multichoice"]["tasks"] == 1 and s["data"]["hle_multichoice"]["limit"] == 1
    assert [v.get("missing") for k, v in s["data"].items() if k != "hle_multichoice"] == [
        "not selected (--evals)"
    ] * 3
    assert s["models"][0]["evals"]["hle_multichoice"]["missing"] == 0
    # --evals given: those evaluations, with the runs' selection where they have one, every task
    # elsewhere
    assert (
        score(data_dir, tmp_path, "two", evals=["hle_multichoice", "when2call"]).exit_code
        == EXIT_FAILED_REQUESTS
    )  # When2Call's answers are missing: provisional
    two = summary(tmp_path, "two")
    assert (two["data"]["hle_multichoice"]["tasks"], two["data"]["when2call"]["tasks"]) == (1, 3)
    assert "union" not in two["data"]["when2call"] and "limit" not in two["data"]["when2call"]
    assert two["models"][0]["evals"]["when2call"]["missing"] == 3


def test_answers_missing_from_a_selection_one_of_the_runs_made_are_an_incomplete_run_not_another_selection():
    """The scored tasks are one of the selections the model's runs made (a run cut by its deadline,
    say): the reason is that run being incomplete, not the tasks the other runs selected."""
    from dxi.scoring.missing import missing_reason

    assert missing_reason(5, {"limit": 30, "runs": {"m": "--limit 30 + --sample 5"}}, "m") == (
        "5 answer(s) not in the cache: the run is incomplete (interrupted, or it ran fewer epochs than scored here); "
        "`dxi run` with --limit 30 sends what is missing"
    )
    assert missing_reason(5, {"limit": 30, "runs": {"m": "--sample 5"}}, "m").startswith(
        "5 answer(s) not in the cache: this model's runs selected --sample 5 here, not --limit 30; score with --sample 5"
    )


@pytest.mark.slow
def test_after_several_samples_the_hint_is_the_latest_and_the_list_is_in_numeric_order(
    tmp_path: Path,
):
    """Runs of every task, then of --sample 5, 8, 14, 20 and 30 (in that order) on one cache:
    ``dxi score`` scores every task and says which samples the cache holds in numeric order, hinting
    at the latest run's (issue 32: "give --sample 14", the first alphabetically)."""
    from .helpers.synthetic import data_dir as synthetic

    data = synthetic(tmp_path / "data", 40)
    assert run(data, tmp_path, "full") == 0
    for n in (5, 8, 14, 20, 30):
        assert run(data, tmp_path, f"s{n}", sample=n) == 0
    done = score(data, tmp_path, "all", evals="when2call")  # the synthetic data's one evaluation
    assert done.notes == [
        f"scoring every task: a run recorded in this cache ({tmp_path / 'cache' / runs.RUNS_FILE}) selected every "
        "task, which holds the other runs' --sample 5, --sample 8, --sample 14, --sample 20, --sample 30; give "
        "--sample 30 (the latest) to score only those"
    ]


def test_a_torn_last_line_does_not_swallow_the_next_runs_record(tmp_path: Path):
    """Issue 32: a run killed mid-write left ``runs.jsonl`` ending in a cut line; the next run's
    record was appended to it and the two read as one damaged line (the next run's selection lost).
    The next record is written after a newline, as the batch ledger does (``cache.lines``)."""
    first = RunRecord(
        "dxi-prompt-1",
        (("embedded", "m", "/v1/systemone", "{}"),),
        ("when2call",),
        sample=2,
        at=1.0,
    )
    second = RunRecord(
        "dxi-prompt-1",
        (("embedded", "m", "/v1/systemone", "{}"),),
        ("hle_multichoice",),
        limit=3,
        at=2.0,
    )
    assert runs.append(tmp_path, first)
    whole = (tmp_path / runs.RUNS_FILE).read_bytes()
    with open(
        tmp_path / runs.RUNS_FILE, "ab"
    ) as f:  # a third run killed in the middle of its write(2)
        f.write(whole[:25])
    assert runs.append(tmp_path, second)
    data = (tmp_path / runs.RUNS_FILE).read_bytes()
    assert data == whole + whole[:25] + b"\n" + orjson.dumps(second.as_json()) + b"\n"
    records, warnings = runs.read(tmp_path)
    assert records == [first, second]
    assert len(warnings) == 1 and warnings[0].startswith(
        f"{tmp_path / runs.RUNS_FILE} line 2 is not a run record"
    )
    assert not runs.append(tmp_path, second)  # read back whole: the same selection adds nothing


@pytest.mark.slow
def test_a_rescoring_of_other_tasks_than_the_last_run_asked_says_so(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
):
    """The recipe's `dxi score runs/tonight.toml` after `dxi run runs/tonight.toml --limit 2`: the
    run file's `limit = 1` still wins (documented), but standard error says the last run asked
    --limit 2 and how to score that, and summary.json's provenance records it; `dxi export` says the
    same, and `dxi view`; scoring what the run asked says nothing."""
    file = tmp_path / "tonight.toml"
    file.write_text(
        'data_dir = "data"\ncache_dir = "cache"\nout = "out"\n[evals]\nlimit = 1\n'
        '[[models]]\nname = "nano"\nprovider = "embedded"\nmodel = "sparrow-nano-general-v1.1"\n'
    )
    assert main(["run", str(file), "--limit", "2", "-q"]) == 0
    (line,) = (tmp_path / "out" / "run-history.jsonl").read_bytes().splitlines()
    ended = orjson.loads(line)["ended"]
    history = tmp_path / "out" / "run-history.jsonl"
    capsys.readouterr()
    said = (
        f"warning: the last dxi run here ({history}, ended {ended}) asked --limit 2; this scoring "
        "uses --limit 1 (the run file's): add --limit 2 to score what it asked\n"
    )
    assert main(["score", str(file)]) == 0
    assert capsys.readouterr().err == said
    scored = summary(tmp_path, "out")
    assert scored["data"]["when2call"]["tasks"] == 1  # the run file's limit, as before
    assert scored["provenance"]["selection_differs"] == {
        "scored": "--limit 1",
        "why": "the run file's",
        "last_run": "--limit 2",
        "last_run_ended": ended,
        "run_history": str(history),
    }
    assert main(["export", str(file), "--format", "csv", str(tmp_path / "a.csv"), "-q"]) == 0
    assert capsys.readouterr().err == said
    caught_view(monkeypatch, str(file), "-q").close()  # dxi view (its server caught)
    assert capsys.readouterr().err == said
    # on the command line, other evaluations too: both named, and "instead"
    assert main(["score", str(file), "--limit", "1", "--evals", "when2call"]) == 0
    assert capsys.readouterr().err == (
        f"warning: the last dxi run here ({history}, ended {ended}) asked --limit 2 --evals "
        "aa_omniscience_decision,hle_multichoice,when2call,wildguardtest; this scoring uses --limit 1 "
        "--evals when2call (given on the command line): give --limit 2 --evals "
        "aa_omniscience_decision,hle_multichoice,when2call,wildguardtest instead to score what it asked\n"
    )
    # what the run asked: nothing said, nothing recorded
    assert main(["score", str(file), "--limit", "2"]) == 0
    assert capsys.readouterr().err == ""
    scored = summary(tmp_path, "out")
    assert scored["data"]["when2call"]["tasks"] == 2
    assert "selection_differs" not in scored["provenance"]


def test_answers_missing_from_exactly_what_the_runs_selected_are_not_put_down_to_other_tasks(
    data_dir: Path, tmp_path: Path
):
    """The cache's runs.jsonl records a run of --limit 2 (it was cut short: only --limit 1's
    answers are in the cache), and that is what is scored: the reason for the missing answers says
    the run is incomplete, without "or it ran other tasks (--limit, --sample)" (the old reason had
    it: ``data["runs"]`` holds only selections that differ, so the model looked unrecorded). A
    model whose runs the cache did not record keeps the clause."""
    from dxi.scoring.missing import missing_reason

    assert run(data_dir, tmp_path, "one", limit=1) == 0
    path = tmp_path / "cache" / runs.RUNS_FILE
    (line,) = path.read_bytes().splitlines()
    path.write_bytes(line + b"\n" + orjson.dumps(orjson.loads(line) | {"limit": 2}) + b"\n")
    assert score(data_dir, tmp_path, "two", limit=2).exit_code == EXIT_FAILED_REQUESTS
    s = summary(tmp_path, "two")
    assert "runs" not in s["data"]["when2call"]  # the run of --limit 2 selected what is scored
    assert s["models"][0]["evals"]["when2call"]["reason"] == (
        "1 answer(s) not in the cache: the run is incomplete (interrupted, or it ran fewer epochs "
        "than scored here); `dxi run` with --limit 2 sends what is missing"
    )
    assert missing_reason(1, {"limit": 2}, "m") == (
        "1 answer(s) not in the cache: the run is incomplete (interrupted, or it ran fewer epochs "
        "than scored here, or it ran other tasks (--limit, --sample)); `dxi run` with --limit 2 "
        "sends what is missing"
    )
