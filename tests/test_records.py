"""The summary as a typed record (``scoring.records``): summary.json's bytes are those of the dict
it replaced, keys written only sometimes stay absent when unset, and a summary read back is the same
record."""

from __future__ import annotations

import inspect
from pathlib import Path

import msgspec
import orjson
import polars as pl
import pytest

from dxi.runner.outputs.files import summarize
from dxi.scoring import build_summary, records
from dxi.scoring.records import UNSET, Comparison, EvalBlock, ModelEntry, Ranking, Summary
from dxi.scoring.scored import ScoredRun
from dxi.scoring.sums import METRICS
from dxi.view.data import Summarize

from .helpers import records as made
from .helpers.realistic_summary import realistic

GOLDEN = Path(__file__).parent / "fixtures" / "summary_realistic.json"


@pytest.fixture(scope="module")
def summary(tmp_path_factory: pytest.TempPathFactory) -> Summary:
    return realistic(tmp_path_factory.mktemp("realistic"))


def test_summary_json_has_the_bytes_the_dict_based_summary_had(summary: Summary):
    # the golden file is what the code before the records wrote for the same scenario
    # (tests.helpers.realistic_summary), plus the keys added since: the measures
    # (``scoring.measures``: each model's and evaluation's ``measures`` and the top-level
    # description), each provisional evaluation block's ``replied`` (the tasks with a reply) and
    # ``comparison_method.ci``'s entry for identical answers, and WildGuardTest's missing answers'
    # reason naming their tasks ("18 answer(s), of 6 task(s), not in the cache"), nothing else
    # changed; and one fix: the two-epoch model's second epoch, every answer missing, no longer
    # counts as never hallucinating (its non-hallucination rate 14.3, not 57.1; its index 56.6,
    # not 62.0; and the comparisons that involve them) nor takes a share of its intervals' n (its
    # intervals narrower)
    golden = GOLDEN.read_bytes()
    assert records.to_json(summary) == golden
    doc = orjson.loads(golden)  # the scenario holds what the test is for
    assert list(doc) == [
        "prompt_version",
        "provenance",
        "epochs",
        "complete",
        "allow_failed",
        "accepted",
        "data",
        "intervals",
        "calibration",
        "usage",
        "models",
        "comparison_method",
        "comparisons",
        "ranking",
        "cost_bound",
        "stopped_providers",
        "measures",
    ]
    assert [m["complete"] for m in doc["models"]] == [False, False, False, False]
    # every index is provisional: placed by its lowest bound (26.53, 26.08, 24.68), not its point
    # value (26.94, 27.42, 62.00)
    assert [m.get("rank") for m in doc["models"]] == [1, 2, 3, None]
    assert doc["models"][3]["decision_index"] is None and doc["models"][3]["p_yes_range"] == [
        0.01,
        0.99,
    ]
    assert doc["models"][1]["requests"]["batches"] == {
        "submitted": 2,
        "collected": 1,
        "running": 1,
        "given_back": 3,
    }
    assert (
        sum("discordant" in c for c in doc["comparisons"]) == 3
    )  # accuracy of the two one-epoch models


def test_a_summary_read_back_is_the_same_record_and_the_same_bytes(summary: Summary):
    again = records.decode(records.to_json(summary))
    assert again == summary
    assert records.to_json(again) == GOLDEN.read_bytes()
    assert (
        records.decode(orjson.loads(GOLDEN.read_bytes())) == summary
    )  # the view's meta.json path: from a dict
    assert isinstance(again.models[0], ModelEntry) and isinstance(again.comparisons[0], Comparison)
    assert isinstance(again.ranking, Ranking)


def test_keys_written_only_sometimes_stay_absent_when_unset():
    # without scored tables: no intervals, calibration, usage, comparisons, ranking, provenance; a
    # model entry without its interval, spread, rank, usage, served models, effort
    data = {name: {"missing": "not selected (--evals)"} for name in METRICS}
    summary = build_summary(pl.DataFrame(), ["m"], data, "p1", 1, {})
    doc = records.to_builtins(summary)
    assert list(doc) == [
        "prompt_version",
        "epochs",
        "complete",
        "allow_failed",
        "accepted",
        "data",
        "models",
    ]
    assert list(doc["models"][0]) == [
        "model",
        "epochs",
        "decision_index",
        "decision_index_reason",
        "complete",
        "evals",
        "requests",
    ]
    assert summary.intervals is UNSET and summary.models[0].decision_index_ci is UNSET
    # set to None, a key is written as null (not left out)
    summary.models[0].usage = None
    assert records.to_builtins(summary)["models"][0]["usage"] is None


def test_a_document_that_is_not_a_summary_is_refused_naming_the_field():
    doc = orjson.loads(GOLDEN.read_bytes())
    doc["models"][0]["epochs"] = "two"
    with pytest.raises(msgspec.ValidationError, match=r"\$\.models\[0\]\.epochs"):
        records.decode(doc)
    doc["models"][0]["epochs"] = 1
    del doc["accepted"]
    with pytest.raises(msgspec.ValidationError, match="accepted"):
        records.decode(orjson.dumps(doc))


def test_the_views_scoring_pipeline_is_what_runner_outputs_summarize_is():
    # dxi view is handed ``runner.outputs.files.summarize`` as a ``view.data.Summarize``: every
    # parameter the protocol names, of the same kind and default, and the same result (a ScoredRun:
    # summary and tables)
    protocol = inspect.signature(Summarize.__call__)
    given = inspect.signature(summarize)
    for name, p in list(protocol.parameters.items())[1:]:
        mine = given.parameters[name]
        assert (mine.default, mine.annotation) == (p.default, p.annotation), name
        assert mine.kind == p.kind or (
            p.kind is p.KEYWORD_ONLY and mine.kind is mine.POSITIONAL_OR_KEYWORD
        ), name
    assert protocol.return_annotation == given.return_annotation == "ScoredRun"
    summary, scored = ScoredRun(
        made.summary([]),
        None,
    )
    assert summary.labels == [] and scored is None


def test_an_evaluation_blocks_type_names_every_metric_with_its_spread_and_interval():
    keys = set(EvalBlock.__annotations__)
    for metrics in METRICS.values():
        for m in metrics:
            assert {m, f"{m}_sd", f"{m}_ci"} <= keys, m
    doc = orjson.loads(GOLDEN.read_bytes())
    for m in doc["models"]:
        for block in m["evals"].values():
            assert (
                set(block) <= keys
            )  # every key summary.json writes is typed (their order: the bytes test)
    block = {"n": "many"}
    with pytest.raises(msgspec.ValidationError, match=r"\$\.models\[0\]\.evals\[\.\.\.\]\.n"):
        records.decode(doc | {"models": [doc["models"][0] | {"evals": {"hle_multichoice": block}}]})


OLD = Path(__file__).parent / "fixtures" / "summary_p_holm.json"


def test_a_summary_written_before_the_step_down_is_read_with_p_holm_mapped_and_marked():
    # tests/fixtures/summary_p_holm.json: the shape summary.json had with Holm's adjustment
    # (comparisons with ``p_holm``, no ``p_adjusted``, ``significant`` or ``comparison_method``)
    raw = OLD.read_bytes()
    with pytest.raises(msgspec.ValidationError):  # the record alone does not take it
        msgspec.json.decode(raw, type=Summary)
    for summary in (records.decode(raw), records.decode(orjson.loads(raw))):
        first, second = summary.comparisons
        assert (first.p_adjusted, first.significant) == (0.001998001998001998, True)
        assert (second.p_adjusted, second.significant) == (0.6, False)
        assert (first.discordant, first.mcnemar_p) == ([17, 1], 0.0001373291015625)
        assert first.settled is records.UNSET
        assert summary.comparison_method == {
            "adjustment": records.LEGACY_ADJUSTMENT,
            "read_from": "p_holm",
        }
        assert [m.rank for m in summary.models] == [1, 2]
        # written again, it is today's shape (no p_holm) and reads back the same
        again = records.to_json(summary)
        assert b'"p_holm":' not in again and records.decode(again) == summary
    # a summary of today's shape is left as it is
    doc = orjson.loads(GOLDEN.read_bytes())
    assert records.legacy(doc) is doc
