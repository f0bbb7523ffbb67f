"""The measures a decision-model user reads (``scoring.measures``): latency percentiles, the cost of
1,000 decisions, the risk–coverage curve, AURC and accuracy at confidence ≥ τ, each checked against
figures computed by hand for a small case; AURC's tie rule against the mean over every order of the
ties; the measures in summary.json through ``runner.outputs.files.summarize``."""

from __future__ import annotations

import itertools
import tempfile
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from dxi import scoring
from dxi.cache import Cache
from dxi.evals import PROMPT_VERSION
from dxi.runner.outputs.files import summarize
from dxi.scoring import measures
from tests.helpers import records
from tests.helpers.synthetic import SyntheticSuite, suite, write_cache


def _answers(rows: list[tuple]) -> pl.DataFrame:
    """An answers frame of (label, eval, status, correct, p_predicted) rows."""
    return pl.DataFrame(
        rows,
        schema={
            "label": pl.String,
            "eval": pl.String,
            "status": pl.String,
            "correct": pl.Boolean,
            "p_predicted": pl.Float64,
        },
        orient="row",
    )


SMALL = _answers(
    [
        ("a", "hle_multichoice", "ok", True, 0.9),
        ("a", "hle_multichoice", "ok", False, 0.8),
        ("a", "hle_multichoice", "ok", True, 0.8),
        ("a", "hle_multichoice", "ok", False, 0.6),
        ("a", "hle_multichoice", "invalid", False, None),
        ("a", "hle_multichoice", "failed", False, None),
    ]
)


def _row(table: pl.DataFrame, label: str, name: str) -> dict:
    return table.filter((pl.col("label") == label) & (pl.col("eval") == name)).row(0, named=True)


def test_risk_coverage_of_a_small_case_by_hand():
    # sorted by confidence: 0.9 right; 0.8 one right, one wrong (a tie); 0.6 wrong. n = 4 ranked
    # answers. risk(1) = 0/1; risk(2) = (0 + 1 x 1/2)/2 = 1/4 (the tie's expected errors); risk(3) =
    # 1/3; risk(4) = 2/4 AURC = (0 + 1/4 + 1/3 + 1/2) / 4 = 13/48
    table = measures.confidence_measures(measures.confidence_groups(SMALL))
    row = _row(table, "a", "hle_multichoice")
    assert (row["answers"], row["excluded"], row["valid"]) == (4, 2, 4)
    assert row["aurc"] == pytest.approx(13 / 48, abs=1e-15)
    # coverage j/20 -> k = ceil(4j/20): k = 1 for j 1..5, 2 for 6..10, 3 for 11..15, 4 for 16..20
    expected = [[j / 20, [0.0, 0.25, 1 / 3, 0.5][(j - 1) // 5]] for j in range(1, 21)]
    assert np.allclose(row["curve"], expected, rtol=0, atol=1e-15)
    # tau 0.5: all 4, 2 right; 0.8: 0.9, 0.8, 0.8 (3), 2 right; 0.9: 1, right; 0.95: none
    assert [(row[f"covered_{t}"], row[f"correct_{t}"]) for t in measures.TAUS] == [
        (4, 2),
        (3, 2),
        (1, 1),
        (0, 0),
    ]
    block = measures.block(None, row, None, None)["risk_coverage"]
    assert block == {
        "answers": 4,
        "excluded": 2,
        "aurc": 0.270833,
        "curve": [[round(c, 6), round(r, 6)] for c, r in expected],
        "at": [
            {"tau": 0.5, "answers": 4, "coverage": 1.0, "accuracy": 50.0},
            {"tau": 0.8, "answers": 3, "coverage": 0.75, "accuracy": 66.666667},
            {"tau": 0.9, "answers": 1, "coverage": 0.25, "accuracy": 100.0},
            {"tau": 0.95, "answers": 0, "coverage": 0.0, "accuracy": None},
        ],
    }
    # the pooled row of the model ("all") is the same here: one evaluation
    assert _row(table, "a", measures.ALL)["aurc"] == row["aurc"]


def _aurc_of_order(correct: list[bool]) -> float:
    errors = np.cumsum([not c for c in correct])
    return float(np.mean(errors / np.arange(1, len(correct) + 1)))


def test_ties_count_as_the_mean_over_every_order_of_them():
    rng = np.random.default_rng(3)
    conf = rng.choice([0.5, 0.7, 0.9], size=7)
    correct = rng.random(7) < 0.6
    frame = _answers(
        [("m", "when2call", "ok", bool(c), float(p)) for c, p in zip(correct, conf, strict=True)]
    )
    got = _row(measures.confidence_measures(measures.confidence_groups(frame)), "m", "when2call")[
        "aurc"
    ]
    # every order of the answers that sorts them by confidence (descending), each equally likely
    orders = [
        p
        for p in itertools.permutations(range(7))
        if all(conf[p[i]] >= conf[p[i + 1]] for i in range(6))
    ]
    want = np.mean([_aurc_of_order([bool(correct[i]) for i in p]) for p in orders])
    assert got == pytest.approx(want, abs=1e-12)
    # the order the rows arrive in does not matter
    again = frame.reverse()
    assert (
        _row(measures.confidence_measures(measures.confidence_groups(again)), "m", "when2call")[
            "aurc"
        ]
        == got
    )


def test_without_ties_the_curve_is_the_sorted_error_rate():
    rng = np.random.default_rng(9)
    conf = rng.permutation(50) / 100 + 0.3
    correct = rng.random(50) < conf
    frame = _answers(
        [
            ("m", "hle_multichoice", "ok", bool(c), float(p))
            for c, p in zip(correct, conf, strict=True)
        ]
    )
    row = _row(
        measures.confidence_measures(measures.confidence_groups(frame)), "m", "hle_multichoice"
    )
    order = np.argsort(-conf)
    assert row["aurc"] == pytest.approx(_aurc_of_order(list(correct[order])), abs=1e-12)
    errors = np.cumsum(~correct[order])
    for (coverage, risk), j in zip(row["curve"], range(1, 21), strict=True):
        k = -(-50 * j // 20)
        assert coverage == j / 20 and risk == pytest.approx(errors[k - 1] / k, abs=1e-12)


def test_a_language_model_without_probabilities_has_no_curve_and_says_so():
    frame = _answers(
        [
            ("llm", "hle_multichoice", "ok", True, None),
            ("llm", "hle_multichoice", "invalid", False, None),
            ("bad", "hle_multichoice", "invalid", False, None),
        ]
    )
    table = measures.confidence_measures(measures.confidence_groups(frame))
    llm = measures.block(None, _row(table, "llm", "hle_multichoice"), None, None)
    assert llm["risk_coverage"] is None and llm["risk_coverage_reason"] == measures.NO_CONFIDENCE
    bad = measures.block(None, _row(table, "bad", "hle_multichoice"), None, None)
    assert bad["risk_coverage"] is None and bad["risk_coverage_reason"] == measures.NO_ANSWER


def _calls(rows: list[tuple]) -> pl.DataFrame:
    """A calls table of (label, eval, status, latency_s, ttft_s, batch, questions) rows."""
    return pl.DataFrame(rows, schema=measures.CALLS_SCHEMA, orient="row")


CALLS = _calls(
    [
        ("a", "wildguardtest", "ok", 0.1, None, False, 3),
        ("a", "wildguardtest", "ok", 0.2, 0.05, False, 3),
        ("a", "wildguardtest", "invalid", 0.3, None, False, 3),
        ("a", "wildguardtest", "ok", 0.4, 0.15, False, 2),
        ("a", "wildguardtest", "ok", 1.0, None, False, 3),
        ("a", "wildguardtest", "ok", 30.0, None, True, 3),  # a batch answer: no per-call latency
        ("a", "wildguardtest", "failed", 9.0, None, False, 3),  # no reply: not timed, no decision
    ]
)


def test_latency_percentiles_and_the_cost_of_1000_decisions_by_hand():
    row = _row(measures.call_measures(CALLS), "a", "wildguardtest")
    # five timed calls 0.1 0.2 0.3 0.4 1.0 s; linear (numpy's default): p at rank (5 - 1) q
    # p50 = rank 2 = 0.3; p95 = rank 3.8 = 0.4 + 0.8 x 0.6 = 0.88; p99 = rank 3.96 = 0.4 + 0.96 x
    # 0.6 = 0.976
    assert (row["calls"], row["batch_excluded"], row["failed_excluded"]) == (5, 1, 1)
    assert [row[f"p{q}_s"] for q in measures.PERCENTILES] == pytest.approx(
        [0.3, 0.88, 0.976], abs=1e-12
    )
    assert [row[f"p{q}_s"] for q in measures.PERCENTILES] == pytest.approx(
        list(np.percentile([0.1, 0.2, 0.3, 0.4, 1.0], measures.PERCENTILES)), abs=1e-12
    )
    # time to first token of the two streamed calls: 0.05 and 0.15 -> p50 0.1, p95 0.145, p99 0.149
    assert row["ttft_calls"] == 2
    assert [row[f"ttft_p{q}_s"] for q in measures.PERCENTILES] == pytest.approx(
        [0.1, 0.145, 0.149], abs=1e-12
    )
    # decisions: the questions of the calls with a reply, the batch one included: 3+3+3+2+3+3 = 17
    assert row["decisions"] == 17
    block = measures.block(row, None, 0.0034, None)
    assert block["cost_per_1000_decisions_usd"] == 0.2  # 1000 x 0.0034 / 17
    assert block["latency"] == {
        "calls": 5,
        "p50_s": 0.3,
        "p95_s": 0.88,
        "p99_s": 0.976,
        "batch_excluded": 1,
        "failed_excluded": 1,
        "ttft": {"calls": 2, "p50_s": 0.1, "p95_s": 0.145, "p99_s": 0.149},
        "note": "1 answer call(s) from a provider batch are left out: a batch's time is "
        "not a per-call latency",
    }
    unpriced = measures.block(row, None, None, "no price for this model")
    assert (
        unpriced["cost_per_1000_decisions_usd"] is None
        and unpriced["cost_reason"] == "no price for this model"
    )


def test_a_model_answered_only_by_batches_has_no_latency_and_says_why():
    row = _row(measures.call_measures(CALLS.filter(pl.col("batch"))), "a", "wildguardtest")
    latency = measures.block(row, None, None, None)["latency"]
    assert latency["calls"] == 0 and latency["p50_s"] is None and latency["batch_excluded"] == 1
    assert "provider batch" in latency["reason"]


def test_add_measures_fills_the_model_and_its_evaluations():
    entry = records.entry(
        "a",
        evals={"wildguardtest": {"n": 5}, "hle_multichoice": {"n": 0}},
        usage={"cost_usd": 0.0068, "evals": {"wildguardtest": {"cost_usd": 0.0034}}},
    )
    summary = records.summary([entry])
    measures.add_measures(
        summary,
        measures.call_measures(CALLS),
        measures.confidence_measures(measures.confidence_groups(SMALL)),
    )
    assert entry.evals["wildguardtest"]["measures"]["cost_per_1000_decisions_usd"] == 0.2
    assert "measures" not in entry.evals["hle_multichoice"]  # no tasks: no block
    assert entry.measures["cost_per_1000_decisions_usd"] == 0.4  # 1000 x 0.0068 / 17
    assert entry.measures["risk_coverage"]["aurc"] == 0.270833
    assert summary.measures["taus"] == [0.5, 0.8, 0.9, 0.95]


def test_an_unknown_cost_gives_each_evaluation_its_own_reason_and_the_report_a_note():
    """A priced model whose server counted no tokens in one evaluation (``scoring.cost``): that
    evaluation's cost of 1,000 decisions is null with its own reason (not the model's), and the
    report's measures section notes the model's reason under its table (it printed $0.0000)."""
    from dxi.report import html

    unknown = "3 replies reported 0 tokens (a server that counts none): their cost is unknown"
    entry = records.entry(
        "a",
        evals={"wildguardtest": {"n": 5}},
        usage={
            "cost_usd": None,
            "cost_reason": "6 replies reported 0 tokens (a server that counts none): their cost "
            "is unknown",
            "evals": {"wildguardtest": {"cost_usd": None, "cost_reason": unknown}},
        },
    )
    summary = records.summary([entry])
    measures.add_measures(
        summary,
        measures.call_measures(CALLS),
        measures.confidence_measures(measures.confidence_groups(SMALL)),
    )
    pooled, evaluation = entry.measures, entry.evals["wildguardtest"]["measures"]
    assert (evaluation["cost_per_1000_decisions_usd"], evaluation["cost_reason"]) == (None, unknown)
    assert (pooled["cost_per_1000_decisions_usd"], pooled["cost_reason"]) == (
        None,
        "6 replies reported 0 tokens (a server that counts none): their cost is unknown",
    )
    assert html._measures_section(summary, ["a"])["notes"] == [
        "a: no cost of 1,000 decisions: 6 replies reported 0 tokens (a server that counts none): "
        "their cost is unknown",
        "a: 1 call(s) answered in a provider batch are left out of the latency figures (a batch's "
        "time is not a per-call latency)",
    ]


@pytest.mark.slow
def test_summary_json_has_the_measures_of_each_model_and_evaluation():
    sizes = {
        "aa_omniscience_decision": 12,
        "hle_multichoice": 10,
        "when2call": 8,
        "wildguardtest": 6,
    }
    root = Path(tempfile.mkdtemp())
    write_cache(root, suite(sizes), 1, invalid_rate=0.1, failed_rate=0.05)
    with Cache(root, read_only=True) as cache:
        models = cache.read(lambda rows: scoring.models_in_cache(rows, PROMPT_VERSION))
        label = models["label"][0]
        summary, scored = summarize(
            cache, SyntheticSuite(sizes), models, None, prices={label: (1.0, 2.0)}
        )
        rows = cache.read(
            lambda r: r.select(
                "eval", "status", "latency_ms", "input_tokens", "output_tokens", "answers"
            ).collect()
        )
    entry = summary.entry(label)
    replied = rows.filter(pl.col("status") != "failed")
    # every request of the synthetic cache is current (one epoch, one row per task): the latency by
    # numpy
    expected = np.percentile(replied["latency_ms"].to_numpy() / 1000, measures.PERCENTILES)
    got = entry.measures["latency"]
    assert got["calls"] == replied.height and got["failed_excluded"] == rows.height - replied.height
    assert [got[f"p{q}_s"] for q in measures.PERCENTILES] == pytest.approx(list(expected), abs=1e-6)
    # cost of 1,000 decisions: the usage cost over the questions of the replied requests
    decisions = int(replied["answers"].list.len().sum())
    assert entry.measures["decisions"] == decisions
    assert entry.measures["cost_per_1000_decisions_usd"] == pytest.approx(
        1000 * entry.usage["cost_usd"] / decisions, abs=1e-9
    )
    # the risk-coverage block counts every answer of the model: ranked + excluded
    rc = entry.measures["risk_coverage"]
    assert rc["answers"] + rc["excluded"] == scored.answers.height
    for name, block in entry.evals.items():
        assert (
            block["measures"]["risk_coverage"]["answers"]
            == scored.answers.filter(
                (pl.col("eval").cast(pl.String) == name)
                & (pl.col("status").cast(pl.String) == "ok")
            ).height
        )


def test_the_terminal_shows_one_row_per_model_and_says_what_is_left_out():
    import io

    from rich.console import Console

    from dxi.runner.outputs.terminal import print_measures

    entry = records.entry(
        "a",
        evals={"wildguardtest": {"n": 5}},
        usage={"cost_usd": 0.0068, "evals": {}},
    )
    llm = records.entry(
        "llm",
        evals={"wildguardtest": {"n": 5}},
        usage={"cost_usd": None, "evals": {}},
    )
    summary = records.summary([entry, llm])
    confidence = measures.confidence_measures(
        measures.confidence_groups(
            pl.concat([SMALL, _answers([("llm", "wildguardtest", "ok", True, None)])])
        )
    )
    calls = pl.concat([CALLS, _calls([("llm", "wildguardtest", "ok", 2.5, None, False, 3)])])
    measures.add_measures(summary, measures.call_measures(calls), confidence)
    console = Console(width=200, record=True, file=io.StringIO(), color_system=None)
    print_measures(summary, console)
    text = console.export_text()
    # a: p50 0.3 s, p95 0.88 s, $0.4 per 1,000 decisions, AURC 13/48, at 0.9: 100% of 1 in 4 (25%)
    assert "│ a     │ 0.300 │ 0.880 │          $0.4000 │ 0.271 │" in text and "100.0 (25%)" in text
    # llm: 2.5 s, no price, no confidence
    assert "│ llm   │  2.50 │  2.50 │                — │     — │" in text and "no conf." in text
    assert "latency: 1 answer call(s) from provider batches are left out" in text
    assert "no conf.: the model's answers carry no probability (structured outputs)" in text
    # a model without a valid answer (its server was down): "—", not "no conf." and its note
    none = records.entry("down", evals={"wildguardtest": {"n": 0}})
    summary = records.summary([none])
    measures.add_measures(summary, measures.call_measures(CALLS.clear()), confidence.clear())
    assert summary.models[0].measures["risk_coverage_reason"] == measures.NO_ANSWER
    console = Console(width=200, record=True, file=io.StringIO(), color_system=None)
    print_measures(summary, console)
    text = console.export_text()
    assert "│ down  │     — │     — │                — │    — │" in text and "no conf." not in text


def test_time_to_first_token_is_read_where_the_cache_has_the_column_and_null_otherwise():
    models = pl.DataFrame({"label": ["a"]})
    found = pl.DataFrame(
        {
            "eval": ["when2call", "when2call"],
            "status": ["ok", "ok"],
            "transport": ["sync", None],
            "latency_ms": [1500.0, 250.0],
        }
    )
    m, t, questions = np.array([0, 0]), np.array([0, 1]), np.array([1, 3])
    plain = measures.calls_table(found, m, t, models, questions)
    assert plain.to_dicts() == [
        {
            "label": "a",
            "eval": "when2call",
            "status": "ok",
            "latency_s": 1.5,
            "ttft_s": None,
            "batch": False,
            "questions": 1,
        },
        {
            "label": "a",
            "eval": "when2call",
            "status": "ok",
            "latency_s": 0.25,
            "ttft_s": None,
            "batch": False,
            "questions": 3,
        },
    ]
    with_ttft = found.with_columns(pl.Series("ttft_s", [0.4, None]))
    streamed = measures.calls_table(with_ttft, m, t, models, questions)
    assert streamed["ttft_s"].to_list() == [0.4, None]
    assert measures.has_column(found.lazy(), "latency_ms")
    assert not measures.has_column([found.lazy()], measures.TTFT)
    assert not measures.has_column([], "x")
