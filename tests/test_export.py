"""``dxi export``: the per-answer table as CSV, Parquet and JSON Lines, and the Every Eval Ever
records, validated against the schema files vendored from evaleval/every_eval_ever
(``tests/eee_schema/``)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import jsonschema
import orjson
import polars as pl
import pytest

from dxi.runner import export, rescore
from dxi.runner.cli import main
from dxi.runner.export import ANSWER_COLUMNS, EXPORT_COLUMNS
from dxi.runner.planning.inputs import PlanInputs
from dxi.scoring.intervals import METHODS

from .conftest import fixture_data
from .helpers.four_models import FourModels, four_models
from .helpers.runs import fail_rows, run_plan

SCHEMAS = Path(__file__).parent / "eee_schema"
DOCS = Path(__file__).parents[1] / "docs" / "outputs.md"
ANSWERS = {
    "aa_omniscience_decision": 4,
    "hle_multichoice": 2,
    "when2call": 3,
    "wildguardtest": 9,
}  # questions


def validator(name: str) -> jsonschema.Draft7Validator:
    schema = orjson.loads((SCHEMAS / name).read_bytes())
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


@pytest.fixture(scope="module")
def four(tmp_path_factory: pytest.TempPathFactory) -> FourModels:
    root = tmp_path_factory.mktemp("four")
    return four_models(fixture_data(root / "data"), root)


@pytest.fixture(scope="module")
def scored(four: FourModels) -> tuple[dict, pl.DataFrame]:
    """``dxi score``'s summary.json and answers.parquet for the four models."""
    out = four.cache.parent / "scored"
    assert four.rescore(out).exit_code == 0
    return orjson.loads((out / "summary.json").read_bytes()), pl.read_parquet(
        out / "answers.parquet"
    )


@pytest.fixture(scope="module")
def eee(four: FourModels) -> Path:
    out = four.cache.parent / "eee"
    assert four.export("eee", out).exit_code == 0
    return out


def test_eee_records_validate_against_the_vendored_schema(
    eee: Path, scored: tuple[dict, pl.DataFrame]
):
    aggregate, instance = (
        validator("eval.schema.json"),
        validator("instance_level_eval.schema.json"),
    )
    summary, answers = scored
    logs = [orjson.loads(p.read_bytes()) for p in sorted(eee.rglob("*.json"))]
    for log in logs:
        assert list(aggregate.iter_errors(log)) == [], log["evaluation_id"]
    # one record per model and evaluation, and one per model for its Decision Index
    names = sorted(
        (log["model_info"]["name"], log["evaluation_results"][0]["evaluation_name"]) for log in logs
    )
    labels = [m["model"] for m in summary["models"]]
    assert names == sorted((lb, e) for lb in labels for e in (*ANSWERS, "decision_index"))
    lines = 0
    for log in logs:
        detail = log.get("detailed_evaluation_results")
        if log["evaluation_results"][0]["evaluation_name"] == "decision_index":
            assert detail is None
            continue
        samples = eee / detail["file_path"]
        body = samples.read_bytes()
        assert (
            hashlib.sha256(body).hexdigest() == detail["checksum"]
            and detail["hash_algorithm"] == "sha256"
        )
        records = [orjson.loads(line) for line in body.splitlines()]
        assert (
            detail["total_rows"]
            == len(records)
            == ANSWERS[log["evaluation_results"][0]["evaluation_name"]]
        )
        results = {r["evaluation_result_id"] for r in log["evaluation_results"]}
        for record in records:
            assert list(instance.iter_errors(record)) == [], record["sample_id"]
            assert (
                record["evaluation_id"] == log["evaluation_id"]
                and record["model_id"] == log["model_info"]["id"]
            )
            assert record["evaluation_result_id"] in results
        lines += len(records)
    assert lines == answers.height == 4 * sum(ANSWERS.values())
    # the validator does check: a key the schema does not know is refused
    assert list(aggregate.iter_errors({**logs[0], "extra": 1})) and list(
        instance.iter_errors({**records[0], "x": 1})
    )


def test_eee_scores_intervals_and_instances_are_the_scored_ones(
    eee: Path, scored: tuple[dict, pl.DataFrame]
):
    summary, answers = scored
    by_model = {m["model"]: m for m in summary["models"]}
    checked = 0
    for path in eee.rglob("*.json"):
        log = orjson.loads(path.read_bytes())
        entry = by_model[log["model_info"]["name"]]
        for result in log["evaluation_results"]:
            name, metric = result["evaluation_name"], result["metric_config"]["metric_name"]
            score, ci = (
                result["score_details"]["score"],
                result["score_details"]["uncertainty"]["confidence_interval"],
            )
            if name == "decision_index":
                assert (score, [ci["lower"], ci["upper"]]) == (
                    entry["decision_index"],
                    entry["decision_index_ci"],
                )
            else:
                block = entry["evals"][name]
                assert (score, [ci["lower"], ci["upper"]]) == (block[metric], block[f"{metric}_ci"])
                assert result["score_details"]["uncertainty"]["num_samples"] == block["n"]
            uncertainty = result["score_details"]["uncertainty"]
            # each metric's own method (summary.json's intervals.methods); none of the index's
            # metrics is a bootstrap's, so none names a resample count
            assert ci["method"] == summary["intervals"]["methods"][metric] == METHODS[metric]
            assert "bootstrap" not in ci["method"] and "num_bootstrap_samples" not in uncertainty
            assert ci["confidence_level"] == 0.95
            checked += 1
        detail = log.get("detailed_evaluation_results")
        if detail:
            for line in (eee / detail["file_path"]).read_bytes().splitlines():
                record = orjson.loads(line)
                meta = record["metadata"]
                row = answers.filter(
                    (pl.col("model") == log["model_info"]["name"])
                    & (pl.col("task_id") == meta["task_id"])
                    & (pl.col("question_id") == meta["question_id"])
                ).row(0, named=True)
                assert record["evaluation"]["is_correct"] == row["correct"] and record["input"][
                    "reference"
                ] == [row["gold"]]
                assert record["answer_attribution"][0]["extracted_value"] == (
                    row["predicted"] or ""
                )
    # Omniscience 2 metrics, HLE 1, When2Call 1, WildGuardTest 4 (one F1 may be undefined), the
    # index 1
    assert 4 * (2 + 1 + 1 + 3 + 1) <= checked <= 4 * (2 + 1 + 1 + 4 + 1)


def test_wildguard_instances_point_at_their_questions_f1(eee: Path):
    for path in eee.rglob("*_samples.jsonl"):
        for line in path.read_bytes().splitlines():
            record = orjson.loads(line)
            if record["evaluation_name"] == "wildguardtest":
                q = record["metadata"]["question_id"]
                metric = {
                    "prompt_harmful": "f1_prompt_harm",
                    "response_refusal": "f1_response_refusal",
                    "response_harmful": "f1_response_harm",
                }[q]
                assert record["evaluation_result_id"] in (
                    f"wildguardtest.{metric}",
                    "wildguardtest.mean_f1",
                )


@pytest.mark.parametrize("fmt", ["csv", "parquet", "jsonl"])
def test_the_answer_table_exports_as_documented(
    four: FourModels, scored: tuple[dict, pl.DataFrame], fmt: str
):
    _, answers = scored
    target = four.cache.parent / f"answers.{fmt}"
    assert four.export(fmt, target).exit_code == 0
    assert answers.columns == list(ANSWER_COLUMNS)
    if fmt == "parquet":
        back = pl.read_parquet(target)
    elif fmt == "jsonl":
        back = pl.read_ndjson(
            target, schema={**answers.schema, "effort": pl.String, "estimate": pl.Boolean}
        )
    else:
        back = pl.read_csv(
            target,
            schema={
                **answers.schema,
                "probabilities": pl.String,
                "effort": pl.String,
                "estimate": pl.Boolean,
            },
        )
        back = back.with_columns(
            pl.col("probabilities").str.json_decode(answers.schema["probabilities"])
        )
    # the answers, then each model's effort (none of these models has one: null) and whether its
    # figures are an adaptive run's estimates (none is: false)
    assert (
        back.columns == [*ANSWER_COLUMNS, "effort", "estimate"]
        and back["effort"].null_count() == back.height
    )
    assert back["estimate"].to_list() == [False] * back.height
    assert back.drop("effort", "estimate").equals(answers)
    docs = DOCS.read_text()
    assert all(f"`{column}`" in docs[docs.index("## Exports") :] for column in EXPORT_COLUMNS)


def test_export_takes_the_selection_of_dxi_score(
    four: FourModels, tmp_path: Path, capsys: pytest.CaptureFixture
):
    target = tmp_path / "hle.parquet"
    done = four.export("parquet", target, evals=["hle_multichoice"], models=[four.models[1]])
    assert (done.exit_code, done.written, done.missing.total) == (0, [target], 0)
    got = pl.read_parquet(target)
    assert got.select("model", "eval").unique().rows() == [(four.labels[1], "hle_multichoice")]
    assert got.height == ANSWERS["hle_multichoice"]
    assert main([*four.args("export", "--format", "csv"), str(tmp_path)]) == 2
    assert f"{tmp_path} is a folder: give the file to write" in capsys.readouterr().err
    assert (
        main(
            [
                *four.args(
                    "export", "--format", "csv", "--model", "openai:nope@http://127.0.0.1:1/v1"
                ),
                str(tmp_path / "x.csv"),
            ]
        )
        == 2
    )
    assert (
        "openai:nope: no such model in" in capsys.readouterr().err
        and not (tmp_path / "x.csv").exists()
    )


@pytest.mark.parametrize("limit", ["1", "2"])
def test_eee_leaves_out_null_metrics_and_says_why(four: FourModels, tmp_path: Path, limit: str):
    # one or two tasks per evaluation: some WildGuardTest F1 scores are undefined (no positive gold
    # label and no positive prediction): with one task every F1 of some models, with two only the
    # response-harm one
    assert four.rescore(tmp_path / "s", limit=int(limit)).exit_code == 0
    summary = orjson.loads((tmp_path / "s" / "summary.json").read_bytes())
    assert four.export("eee", tmp_path / "eee", limit=int(limit)).exit_code == 0
    aggregate = validator("eval.schema.json")
    logs = {}
    for path in (tmp_path / "eee").rglob("*.json"):
        log = orjson.loads(path.read_bytes())
        assert list(aggregate.iter_errors(log)) == []
        logs[log["model_info"]["name"], log["evaluation_results"][0]["evaluation_name"]] = log
    nulls = partial = 0
    for entry in summary["models"]:
        block = entry["evals"]["wildguardtest"]
        defined = [
            m
            for m in ("f1_prompt_harm", "f1_response_refusal", "f1_response_harm", "mean_f1")
            if block[m] is not None
        ]
        log = logs.get((entry["model"], "wildguardtest"))
        assert ((entry["model"], "decision_index") in logs) == (entry["decision_index"] is not None)
        if not defined:
            assert log is None
            nulls += 1
            continue
        assert [r["metric_config"]["metric_name"] for r in log["evaluation_results"]] == defined
        reasons = log["source_metadata"].get("additional_details", {})
        assert sorted(reasons) == sorted(
            f"{m}_reason"
            for m in ("f1_prompt_harm", "f1_response_refusal", "f1_response_harm", "mean_f1")
            if m not in defined
        )
        assert all(
            "undefined (no positive gold label and no positive prediction)" in r
            for r in reasons.values()
        )
        partial += bool(reasons)
    assert (nulls >= 1) if limit == "1" else (partial >= 1)


def test_eee_marks_provisional_figures(data_dir: Path, tmp_path: Path):
    assert run_plan(data_dir, tmp_path).exit_code == 0
    fail_rows(tmp_path / "cache", "when2call", 2)
    selection = rescore.select(PlanInputs(data_dir=data_dir, cache_dir=tmp_path / "cache"))
    assert export.export(selection, "eee", tmp_path / "eee").exit_code == 0  # marked, not refused
    aggregate = validator("eval.schema.json")
    logs = {}
    for path in (tmp_path / "eee").rglob("*.json"):
        log = orjson.loads(path.read_bytes())
        assert list(aggregate.iter_errors(log)) == []
        logs[log["evaluation_results"][0]["evaluation_name"]] = log
    note = (
        "provisional: 2 failed and 0 missing answer(s) are left out (the figures are over the "
        "answered questions, with their bounds whatever those answers turn out to be in "
        "score_details.details); the figure is not final (summary.json: complete false)"
    )
    for name in ("when2call", "decision_index"):
        assert logs[name]["source_metadata"]["additional_details"]["provisional"] == note
        assert (
            logs[name]["evaluation_results"][0]["score_details"]["details"]["complete"] == "false"
        )
    assert logs["when2call"]["evaluation_results"][0]["score_details"]["details"]["rerun"] == "2"
    for name in ("when2call", "decision_index"):  # each provisional figure with its bounds
        result = logs[name]["evaluation_results"][0]["score_details"]
        details = result["details"]
        low, high = float(details["bounds_lowest"]), float(details["bounds_highest"])
        assert low <= result["score"] <= high and low < high
    hle = logs["hle_multichoice"]
    assert "provisional" not in hle["source_metadata"].get("additional_details", {})
    assert hle["evaluation_results"][0]["score_details"]["details"]["complete"] == "true"
    # num_samples is what the score and its interval are over: the tasks with a reply (When2Call:
    # 3 tasks, 2 failed; the index: 4 + 2 + 3 + 3 tasks, 2 failed), and the record says so; only
    # WildGuardTest's tasks are rows, and the index's are its evaluations' summed
    rest = "; the score and its interval are over them, failed and missing answers left out"
    for name, replied, counts in (
        ("when2call", 1, "tasks with a reply: 1 of 3"),
        ("hle_multichoice", 2, "tasks with a reply: 2 of 2"),
        ("aa_omniscience_decision", 4, "tasks with a reply: 4 of 4"),
        ("wildguardtest", 3, "tasks with a reply: 3 of 3 (WildGuardTest: rows)"),
        ("decision_index", 10, "tasks with a reply, summed over its evaluations: 10 of 12"),
    ):
        result = logs[name]["evaluation_results"][0]["score_details"]
        assert result["uncertainty"]["num_samples"] == replied, name
        assert result["details"]["num_samples_counts"] == counts + rest, name
