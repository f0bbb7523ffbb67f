"""An adaptive run's figures in the exports and the report's tables (docs/outputs.md, "Exports";
docs/adaptive.md, "What an adaptive run records"): a model stopped before the end
(``scoring.adaptive.estimated``) is marked as an estimate of the whole set in every format (the
Every Eval Ever records: ``estimate``, the tasks asked of the whole set's, the rule; the answer
tables: the ``estimate`` column; ``tables/index.csv`` and ``metrics.csv``: ``estimate``, ``asked``,
``whole_set``, ``stopped_by``, ``interval``), each interval named by the method that produced it
(the anytime-valid confidence sequence for an estimate, the fixed-sample one kept beside it), and a
model whose figures are exact (asked everything, or marked ``exact``) is not marked.

The three models of ``tests.helpers.adaptive_models`` on 40 tasks of each evaluation: under
``--until precision=4`` m00 (never right) stops after 31 tasks of each, m50 and m100 are asked all
40 (``exhausted``)."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import jsonschema
import orjson
import pytest

from dxi.runner.cli import main
from dxi.scoring.intervals import ANYTIME_INDEX, ANYTIME_METRIC, METHODS

from .fakes.fake_provider import serve
from .helpers.adaptive_models import DATA_ENV, write_data
from .helpers.adaptive_outputs import SMALL, THREE
from .helpers.adaptive_runs import ROUTE, dxi_run, served, summary
from .helpers.runs import dxi_args

pytestmark = [pytest.mark.process, pytest.mark.slow]

SCHEMA = Path(__file__).parent / "eee_schema" / "eval.schema.json"  # the one test_export checks

WILSON_0_OF_31 = 13.727065  # the fixed-sample accuracy interval's high of 0 right of 31, below
ESTIMATE_NOTE = (
    "an estimate of the whole set: an adaptive run (--until precision=4, order seed 0) asked this "
    "model {} of the {} tasks{} (a seeded random part), stopped by precision=4 after round 8; the "
    "scores are over the tasks asked and estimate the whole set's, their intervals the "
    "anytime-valid ones, which hold although the run chose when to stop (the fixed-sample ones "
    "over the tasks asked, not valid after stopping, are in score_details.details); a run without "
    "--until asks the others"
)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_data(tmp_path_factory.mktemp("adaptive-export") / "data", SMALL)


@pytest.fixture
def server(data: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(DATA_ENV, str(data))
    with serve(model=None, route_factories=ROUTE, record=False) as served_:
        yield served_


def export(url: str, data: Path, cache: Path, fmt: str, target: Path, quiet: bool = True) -> int:
    """``dxi export --format FMT TARGET`` of the three models over ``cache`` (``-q`` if
    ``quiet``)."""
    return main(
        dxi_args(
            data,
            cache,
            None,
            "--format",
            fmt,
            str(target),
            *(("-q",) if quiet else ()),
            models=served(url, THREE),
            command="export",
        )
    )


def records(folder: Path) -> dict[tuple[str, str], dict]:
    """(model label, evaluation_result_id) -> (the record, its result), every aggregate record of
    an eee export, each validated against the vendored schema."""
    schema = jsonschema.Draft7Validator(orjson.loads(SCHEMA.read_bytes()))
    out = {}
    for path in sorted(folder.rglob("*.json")):
        log = orjson.loads(path.read_bytes())
        assert list(schema.iter_errors(log)) == [], path
        for result in log["evaluation_results"]:
            out[log["model_info"]["name"], result["evaluation_result_id"]] = (log, result)
    return out


def rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_a_stopped_model_s_exports_and_tables_say_estimate_and_name_the_anytime_interval(
    data: Path, server, tmp_path: Path, capsys: pytest.CaptureFixture
):
    cache = tmp_path / "cache"
    until = ("--until", "precision=4")
    assert dxi_run(server.url, data, cache, tmp_path / "out", *until, models=THREE) == 0
    s = summary(tmp_path / "out")
    m00, m50, m100 = s["models"]
    assert [sum(m["adaptive"]["asked"].values()) for m in s["models"]] == [124, 160, 160]
    assert [m["adaptive"]["rule"] for m in s["models"]] == [
        "precision=4",
        "exhausted",
        "exhausted",
    ]
    assert m00["adaptive"]["round"] == 8
    # the fixed-sample interval of 0 right of 31 (continuity-corrected Wilson, by hand: x = 0,
    # high = (z² + 1 + z·√(z² + 2 − 1/n)) / (2(n + z²))), which the anytime one replaced
    z = 1.959963984540054
    assert round(100 * (z * z + 1 + z * math.sqrt(z * z + 2 - 1 / 31)) / (2 * (31 + z * z)), 6) == (
        WILSON_0_OF_31
    )
    fixed = m00["adaptive"]["fixed_sample_ci"]
    assert fixed["hle_multichoice.accuracy"] == [0.0, WILSON_0_OF_31]

    assert export(server.url, data, cache, "eee", tmp_path / "eee") == 0
    got = records(tmp_path / "eee")
    # m00's index: the anytime-valid interval, named so; the estimate, the tasks asked of the whole
    # set's (4 × 31 of 4 × 40), the rule; the fixed-sample interval beside it
    log, index = got["systemone:m00", "decision_index"]
    assert index["score_details"]["score"] == 0.0
    assert index["score_details"]["uncertainty"] == {
        "num_samples": 124,
        "confidence_interval": {
            "lower": 0.0,
            "upper": 7.0786,
            "confidence_level": 0.95,
            "method": ANYTIME_INDEX,
        },
    }
    assert [0.0, 7.0786] == m00["decision_index_ci"] != fixed["index"]
    assert index["score_details"]["details"] == {
        "complete": "true",
        "estimate": "true",
        "asked": "124",
        "whole_set": "160",
        "until": "precision=4",
        "stopped_by": "precision=4",
        "round": "8",
        "fixed_sample_ci_lower": "0.0",
        "fixed_sample_ci_upper": str(fixed["index"][1]),
        "fixed_sample_ci_method": METHODS["decision_index"]
        + "; over the tasks asked, not valid after the adaptive run chose when to stop",
        "num_samples_counts": "tasks with a reply, summed over its evaluations: 124 of 124, the "
        "part an adaptive run asked of the whole set's 160 (the score estimates the whole set's); "
        "the score and its interval are over them, failed and missing answers left out",
    }
    assert log["source_metadata"]["additional_details"] == {
        "estimate": ESTIMATE_NOTE.format(124, 160, " of its evaluations")
    }
    # a metric: HLE-MultiChoice's accuracy, its anytime interval (the model's block) and Wilson's
    log, hle = got["systemone:m00", "hle_multichoice.accuracy"]
    assert hle["score_details"]["uncertainty"]["confidence_interval"] == {
        "lower": 0.0,
        "upper": m00["adaptive"]["metrics"]["hle_multichoice.accuracy"]["high"],
        "confidence_level": 0.95,
        "method": ANYTIME_METRIC,
    }
    details = hle["score_details"]["details"]
    assert {k: details[k] for k in ("estimate", "asked", "whole_set", "stopped_by")} == {
        "estimate": "true",
        "asked": "31",
        "whole_set": "40",
        "stopped_by": "precision=4",
    }
    assert (details["fixed_sample_ci_lower"], details["fixed_sample_ci_upper"]) == (
        "0.0",
        str(WILSON_0_OF_31),
    )
    assert details["fixed_sample_ci_method"].startswith(METHODS["accuracy"] + "; over the tasks")
    assert details["num_samples_counts"] == (
        "tasks with a reply: 31 of 31, the part an adaptive run asked of the whole set's 40 (the "
        "score estimates the whole set's); the score and its interval are over them, failed and "
        "missing answers left out"
    )
    assert log["source_metadata"]["additional_details"] == {
        "estimate": ESTIMATE_NOTE.format(31, 40, "")
    }
    # every one of m00's 9 results is marked and named; m50's and m100's (asked everything: exact)
    # carry no mark, their intervals the fixed-sample ones, named as summary.json names them
    ours = {key: r for key, r in got.items() if key[0] == "systemone:m00"}
    assert len(ours) == 9
    for (_, result_id), (_, result) in ours.items():
        method = result["score_details"]["uncertainty"]["confidence_interval"]["method"]
        assert method == (ANYTIME_INDEX if result_id == "decision_index" else ANYTIME_METRIC)
        assert result["score_details"]["details"]["estimate"] == "true"
    exact = {key: r for key, r in got.items() if key[0] != "systemone:m00"}
    assert len(exact) == 18
    for (_, result_id), (log, result) in exact.items():
        metric = result_id.split(".")[-1]
        assert (
            result["score_details"]["uncertainty"]["confidence_interval"]["method"]
            == (METHODS[metric])
        )
        assert not {"estimate", "asked", "fixed_sample_ci_lower"} & set(
            result["score_details"]["details"]
        )
        assert "estimate" not in log["source_metadata"].get("additional_details", {})

    # the answer table: the estimate column, true on every row of m00 (the questions of the 31
    # tasks of each evaluation it was asked), false on the others'
    assert export(server.url, data, cache, "csv", tmp_path / "answers.csv", quiet=False) == 0
    # and says which models were asked part of the set
    assert (
        "note: an adaptive run asked the models (systemone:m00: 31 tasks per evaluation; "
        "systemone:m50: the whole set; systemone:m100: the whole set): the figures of a model "
        "asked part of the set are estimates of the whole set, marked so (the eee records' "
        "estimate, the answer tables' estimate column)"
    ) in " ".join(capsys.readouterr().out.split())
    table = rows(tmp_path / "answers.csv")
    marked = {(r["model"], r["estimate"]) for r in table}
    assert marked == {
        ("systemone:m00", "true"),
        ("systemone:m50", "false"),
        ("systemone:m100", "false"),
    }
    assert {r["task_id"].split("/")[0] for r in table if r["model"] == "systemone:m00"} == set(
        s["adaptive"]["populations"]
    )
    assert len({r["task_id"] for r in table if r["model"] == "systemone:m00"}) == 4 * 31

    # the report's tables
    assert (
        main(
            dxi_args(
                data,
                cache,
                tmp_path / "report",
                "-q",
                models=served(server.url, THREE),
                command="report",
            )
        )
        == 0
    )
    index_rows = rows(tmp_path / "report" / "tables" / "index.csv")
    # m00's interval, the anytime one; the others' their own (unrounded in the tables)
    assert (index_rows[0]["decision_index_low"], index_rows[0]["decision_index_high"]) == (
        "0.0",
        "7.0786",
    )
    cols = ("model", "estimate", "asked", "whole_set", "stopped_by", "interval")
    cols += ("fixed_sample_low", "fixed_sample_high")
    assert [tuple(r[c] for c in cols) for r in index_rows] == [
        ("systemone:m00", "true", "124", "160", "precision=4", "anytime-valid")
        + ("0.0", str(fixed["index"][1])),
        ("systemone:m50", "false", "160", "160", "exhausted", "fixed sample", "", ""),
        ("systemone:m100", "false", "160", "160", "exhausted", "fixed sample", "", ""),
    ]
    metric_rows = rows(tmp_path / "report" / "tables" / "metrics.csv")
    hle_rows = [r for r in metric_rows if r["eval"] == "hle_multichoice"]
    high = m00["adaptive"]["metrics"]["hle_multichoice.accuracy"]["high"]
    assert hle_rows[0]["accuracy_high"] == str(high)
    # the index terms' interval method, named as such (Brier's stays fixed-sample); no `interval`
    assert "interval" not in metric_rows[0]
    cols = ("model", "n", "estimate", "asked", "whole_set", "stopped_by", "index_terms_interval")
    cols += ("accuracy_fixed_sample_low", "accuracy_fixed_sample_high")
    assert [tuple(r[c] for c in cols) for r in hle_rows] == [
        ("systemone:m00", "31", "true", "31", "40", "precision=4", "anytime-valid")
        + ("0.0", str(WILSON_0_OF_31)),
        ("systemone:m50", "40", "false", "40", "40", "exhausted", "fixed sample", "", ""),
        ("systemone:m100", "40", "false", "40", "40", "exhausted", "fixed sample", "", ""),
    ]


def test_a_model_an_adaptive_run_found_complete_in_the_cache_is_exported_exact(
    data: Path, server, tmp_path: Path
):
    """A plain run fills the cache, the adaptive run after it stops each model early, but its
    figures are over the whole set (marked ``exact``): nothing in the export or the tables calls
    them estimates, and their intervals are the fixed-sample ones."""
    cache = tmp_path / "cache"
    assert dxi_run(server.url, data, cache, tmp_path / "plain", models=THREE) == 0
    until = ("--until", "precision=20")
    assert dxi_run(server.url, data, cache, tmp_path / "out", *until, models=THREE) == 0
    assert all(m["adaptive"]["exact"] for m in summary(tmp_path / "out")["models"])
    assert export(server.url, data, cache, "eee", tmp_path / "eee") == 0
    got = records(tmp_path / "eee")
    assert len(got) == 27
    for (_, result_id), (log, result) in got.items():
        assert (
            result["score_details"]["uncertainty"]["confidence_interval"]["method"]
            == (METHODS[result_id.split(".")[-1]])
        )
        assert "estimate" not in result["score_details"]["details"]
        assert "estimate" not in log["source_metadata"].get("additional_details", {})
    assert export(server.url, data, cache, "jsonl", tmp_path / "answers.jsonl") == 0
    lines = (tmp_path / "answers.jsonl").read_bytes().splitlines()
    assert {orjson.loads(line)["estimate"] for line in lines} == {False}
    assert (
        main(
            dxi_args(
                data,
                cache,
                tmp_path / "report",
                "-q",
                models=served(server.url, THREE),
                command="report",
            )
        )
        == 0
    )
    index_rows = rows(tmp_path / "report" / "tables" / "index.csv")
    assert [
        (r["estimate"], r["asked"], r["whole_set"], r["stopped_by"], r["interval"])
        for r in index_rows
    ] == [("false", str(4 * n), "160", "precision=20", "fixed sample") for n in (7, 20, 15)]
