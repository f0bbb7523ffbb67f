"""Bootstrap intervals, the index's interval and spread, breakdowns and degenerate cases."""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np
import orjson
import polars as pl
import pyarrow.parquet as pq
import pytest
from scipy.optimize import brentq
from scipy.stats import binomtest

from dxi.cache.layout import read_nested
from dxi.cache.schema import SCHEMA
from dxi.evals import Suite, discover
from dxi.runner.cli import main
from dxi.scoring import Bootstrap, build_summary, records, score
from dxi.scoring.bootstrap import nan_quantiles
from dxi.scoring.intervals import contain, mover, score_interval, wilson
from dxi.scoring.metrics import accuracy_from, f1_from, non_hallucination_from
from dxi.scoring.sums import ALL_STATS, RESAMPLED, build_cubes, eval_metrics

from .conftest import REAL_DATA, requires_real_data
from .helpers.answers import choice, frame, yes_no

M, N = "systemone:m", "systemone:n"
MODEL = "embedded:sparrow-nano-general-v1.1"
EVALS = ("aa_omniscience_decision", "hle_multichoice", "when2call", "wildguardtest")
DATA = {name: {"files": []} for name in EVALS}


def suite_answers(label: str, right: dict[str, list[bool]], sample: int = 0) -> list[dict]:
    """Choice answers (right or wrong) for the three choice evaluations and WildGuardTest rows whose
    three questions are right or wrong together (gold yes for even rows)."""
    rows = []
    for name in EVALS[:3]:
        for i, ok in enumerate(right[name]):
            rows.append(
                choice(
                    label,
                    name,
                    f"{name}/{i}",
                    "A",
                    {"A": 0.8, "B": 0.2} if ok else {"A": 0.3, "B": 0.7},
                    sample=sample,
                )
            )
    for i, ok in enumerate(right["wildguardtest"]):
        gold = "yes" if i % 2 == 0 else "no"
        for q in ("prompt_harmful", "response_refusal", "response_harmful"):
            p = 0.9 if (gold == "yes") == ok else 0.1
            rows.append(yes_no(label, f"wildguardtest/{i}", q, gold, p, sample=sample))
    return rows


def test_bootstrap_weights_are_seeded_resamples():
    boot = Bootstrap(resamples=200, seed=5)
    w = boot.weights("hle_multichoice", 7)
    assert w.shape == (200, 7) and (w.sum(axis=1) == 7).all() and w.dtype == np.float32
    assert np.array_equal(w, Bootstrap(resamples=200, seed=5).weights("hle_multichoice", 7))
    assert not np.array_equal(w, Bootstrap(resamples=200, seed=6).weights("hle_multichoice", 7))
    assert not np.array_equal(w, boot.weights("when2call", 7))  # each evaluation its own stream


def test_intervals_are_reproducible_with_a_seed_and_change_with_it():
    rng = np.random.default_rng(1)
    rows = suite_answers(M, {name: list(rng.random(40) < 0.6) for name in EVALS})
    first = score(frame(rows), Bootstrap(resamples=300, seed=9))
    again = score(frame(rows), Bootstrap(resamples=300, seed=9))
    other = score(frame(rows), Bootstrap(resamples=300, seed=10))
    assert first.metrics.equals(again.metrics) and first.index.equals(again.index)
    # every interval the metrics table writes is now a score-type one (the calibration metrics'
    # too): none depends on the resamples; the bootstrap-based figures (the spread of the
    # resampled metrics, what the comparisons use) do
    assert first.metrics.equals(other.metrics) and first.calibration.equals(other.calibration)
    many = [*rows, *suite_answers("m:b", {name: list(rng.random(40) < 0.6) for name in EVALS})]
    seeded = [
        score(frame(many), Bootstrap(resamples=300, seed=s), with_comparisons=True)
        for s in (9, 9, 10)
    ]
    assert seeded[0].comparisons.equals(seeded[1].comparisons)
    assert not seeded[0].comparisons.equals(seeded[2].comparisons)
    row = first.metrics.filter(pl.col("eval") == "hle_multichoice").row(0, named=True)
    assert row["accuracy_low"] < row["accuracy"] < row["accuracy_high"]
    idx = first.index.row(0, named=True)
    assert idx["decision_index_low"] < idx["decision_index"] < idx["decision_index_high"]


def test_a_models_interval_does_not_depend_on_the_other_models():
    rng = np.random.default_rng(2)
    mine = suite_answers(M, {name: list(rng.random(30) < 0.5) for name in EVALS})
    theirs = suite_answers(N, {name: list(rng.random(30) < 0.7) for name in EVALS})
    alone = score(frame(mine), Bootstrap(resamples=100)).index
    both = score(frame(mine + theirs), Bootstrap(resamples=100)).index.filter(pl.col("label") == M)
    assert alone.equals(both)


def test_resampling_with_unit_weights_gives_the_point_sums():
    rows = suite_answers(M, {name: [True, False, True] for name in EVALS})
    for cube in build_cubes(frame(rows)).values():
        names = RESAMPLED[cube.kind]
        once = cube.resampled(np.ones((1, cube.n_tasks), np.float32)).array[0]
        point = cube.sums().array[[ALL_STATS.index(n) for n in names]]
        assert np.allclose(once, point, atol=1e-6)


def test_percentile_interval_matches_numpy_with_and_without_undefined_resamples():
    rng = np.random.default_rng(4)
    a = rng.normal(size=(1000, 7))
    for q in (0.025, 0.5, 0.975):
        assert np.allclose(nan_quantiles(a, (q,))[0], np.quantile(a, q, axis=0))
    a[rng.random(a.shape) < 0.1] = np.nan
    a[:, 3] = np.nan
    low, high = nan_quantiles(a, (0.025, 0.975))
    expected = np.nanquantile(a[:, [0, 1, 2, 4, 5, 6]], [0.025, 0.975], axis=0)
    assert np.allclose(low[[0, 1, 2, 4, 5, 6]], expected[0]) and np.allclose(
        high[[0, 1, 2, 4, 5, 6]], expected[1]
    )
    assert np.isnan(low[3]) and np.isnan(high[3])


def wilson_oracle(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """scipy's Wilson score interval with continuity correction (a test-only reference), 0-100."""
    ci = binomtest(k, n).proportion_ci(confidence_level=confidence, method="wilsoncc")
    return 100 * ci.low, 100 * ci.high


def cc_oracle(x: float, n: float, z: float = 1.959963984540054) -> tuple[float, float]:
    """The continuity-corrected score interval solved from its definition (the p with
    |x − np| − ½ = z√(np(1 − p)), by scipy's root finder), for fractional counts too; 0-1."""
    low = (
        0.0
        if x <= 0
        else brentq(lambda p: x - 0.5 - n * p - z * np.sqrt(n * p * (1 - p)), 0, x / n)
    )
    high = (
        1.0
        if x >= n
        else brentq(lambda p: n * p - x - 0.5 - z * np.sqrt(n * p * (1 - p)), x / n, 1)
    )
    return low, high


def f1_bound(theta: float) -> float:
    """A bound of θ = TP / (TP + FP + FN) as a bound of F1 = 2θ / (1 + θ), 0-100."""
    return 200 * theta / (1 + theta)


def test_all_correct_gives_every_interval_width_below_100_and_the_index_the_mover_of_its_terms():
    rows = suite_answers(M, {name: [True] * 5 for name in EVALS})
    scored = score(frame(rows), Bootstrap(resamples=100))
    acc_low = wilson_oracle(5, 5)[0]
    # WildGuardTest: rows 0, 2, 4 gold yes and right (TP), rows 1, 3 gold no and right (TN): θ = 3/3
    f1_low = f1_bound(binomtest(3, 3).proportion_ci(method="wilsoncc").low)
    for r in scored.metrics.iter_rows(named=True):
        if r["accuracy"] is not None:  # a single proportion: it does not collapse at 100%
            assert (r["accuracy"], r["accuracy_high"]) == (100.0, 100.0)
            assert r["accuracy_low"] == pytest.approx(acc_low, abs=1e-9) and r["accuracy_low"] < 100
        if (
            r["non_hallucination_rate"] is not None
        ):  # nothing wrong: nothing known of hallucinations
            assert (
                r["non_hallucination_rate"],
                r["non_hallucination_rate_low"],
                r["non_hallucination_rate_high"],
            ) == (100.0, 0.0, 100.0)
        if r["mean_f1"] is not None:  # each F1 [f1_low, 100]; mean F1 the mean of their bounds
            for m in ("f1_prompt_harm", "f1_response_refusal", "f1_response_harm", "mean_f1"):
                assert (r[m], r[f"{m}_high"]) == (100.0, 100.0) and r[f"{m}_low"] == pytest.approx(
                    f1_low, abs=1e-9
                )
    # the index: MOVER of its terms' lower distances, 0.125 (100 − acc_low), 0.125 · 100, 0.25 (100
    # − acc_low) twice, 0.25 (100 − f1_low)
    d = 100 - acc_low
    expected = 100 - np.sqrt(
        (0.125 * d) ** 2 + 12.5**2 + 2 * (0.25 * d) ** 2 + (0.25 * (100 - f1_low)) ** 2
    )
    idx = scored.index.row(0, named=True)
    assert (idx["decision_index"], idx["decision_index_high"]) == (100.0, 100.0)
    assert idx["decision_index_low"] == pytest.approx(expected, abs=1e-9)
    summary = records.to_builtins(build_summary(scored.metrics, [M], DATA, "p", 1, {}, scored))
    assert summary["models"][0]["decision_index_ci"] == [round(expected, 6), 100.0]
    assert summary["models"][0]["evals"]["hle_multichoice"]["accuracy_ci"] == [
        round(acc_low, 6),
        100.0,
    ]
    methods = summary["intervals"]["methods"]
    # the bootstrap's resamples are the comparisons' and ranks', no metric's interval: said so
    assert summary["intervals"]["method"] == (
        "bootstrap over tasks (resampled with replacement within each evaluation, the same "
        "resamples for every model), for the paired comparisons and the ranks' intervals; each "
        "metric's own interval is the one `methods` names"
    )
    assert (
        methods["accuracy"]
        == "Wilson score interval with continuity correction over tasks (Newcombe 1998)"
    )
    assert methods["non_hallucination_rate"].startswith(
        "Wilson score interval with continuity correction of the"
    )
    assert methods["mean_f1"].startswith("MOVER") and methods["decision_index"].startswith("MOVER")
    assert methods["brier"].startswith("Wilson score interval with continuity correction of")
    assert methods["ece"].startswith("none (null)")
    assert methods["auroc"].startswith("hull of DeLong's")


@pytest.mark.parametrize("right", [0, 7, 20])
def test_accuracy_gets_the_continuity_corrected_wilson_interval_over_its_tasks(right: int):
    # 0% over 20 tasks: the percentile bootstrap gave [0.0, 0.0]; plain Wilson [0.0, 16.1] (which
    # covers a true 99.5% or 0.5% only 90.5% of the time over 20 tasks); with the continuity
    # correction [0.0, 20.05]
    rows = [
        choice(
            M,
            "hle_multichoice",
            f"h/{i}",
            "A",
            {"A": 0.9, "B": 0.1} if i < right else {"A": 0.1, "B": 0.9},
        )
        for i in range(20)
    ]
    row = score(frame(rows), Bootstrap(resamples=50)).metrics.row(0, named=True)
    low, high = wilson_oracle(right, 20)
    by_definition = cc_oracle(right, 20)
    assert (100 * by_definition[0], 100 * by_definition[1]) == (
        pytest.approx(low, abs=1e-9),
        pytest.approx(high, abs=1e-9),
    )
    assert row["accuracy"] == 100 * right / 20
    assert (row["accuracy_low"], row["accuracy_high"]) == (
        pytest.approx(low, abs=1e-9),
        pytest.approx(high, abs=1e-9),
    )
    if right == 0:
        assert round(row["accuracy_high"], 2) == 20.05


def test_one_task_gives_accuracy_the_interval_of_one_trial():
    rows = [choice(M, "when2call", "w/1", "A", {"A": 0.1, "B": 0.9})]
    row = score(frame(rows), Bootstrap(resamples=20)).metrics.row(0, named=True)
    assert (row["accuracy"], row["accuracy_low"]) == (0.0, 0.0)
    assert row["accuracy_high"] == pytest.approx(wilson_oracle(0, 1)[1], abs=1e-9)


def test_non_hallucination_gets_the_interval_of_its_share_among_the_answers_not_correct():
    # 10 tasks: 4 right, 6 wrong of which 2 abstain ("I don't know", E) and 4 guess: 2 of 6 not
    # hallucinated
    rows = [
        choice(
            M,
            "aa_omniscience_decision",
            f"o/{i}",
            "A",
            {"A": 0.9, "C": 0.1}
            if i < 4
            else {"A": 0.1, "E": 0.9}
            if i < 6
            else {"A": 0.1, "C": 0.9},
        )
        for i in range(10)
    ]
    row = score(frame(rows), Bootstrap(resamples=20)).metrics.row(0, named=True)
    low, high = wilson_oracle(2, 6)
    assert row["non_hallucination_rate"] == pytest.approx(100 * 2 / 6)
    assert (row["non_hallucination_rate_low"], row["non_hallucination_rate_high"]) == (
        pytest.approx(low, abs=1e-9),
        pytest.approx(high, abs=1e-9),
    )
    assert (row["accuracy_low"], row["accuracy_high"]) == tuple(
        pytest.approx(v, abs=1e-9) for v in wilson_oracle(4, 10)
    )


def test_each_f1_gets_the_interval_of_tp_over_tp_fp_fn_mapped_and_mean_f1_the_mean_of_bounds():
    rows = []
    # prompt_harmful: TP 3, FN 2, FP 1, TN 4 -> θ = 3/6, F1 = 6/9; response_harmful: TP 1, FN 1, TN
    # 8 -> θ = 1/2
    for i, (gold, p) in enumerate(
        [("yes", 0.9)] * 3 + [("yes", 0.1)] * 2 + [("no", 0.9)] + [("no", 0.1)] * 4
    ):
        rows.append(yes_no(M, f"g/{i}", "prompt_harmful", gold, p))
    for i, (gold, p) in enumerate([("yes", 0.9), ("yes", 0.2)] + [("no", 0.2)] * 8):
        rows.append(yes_no(M, f"g/{i}", "response_harmful", gold, p))
    row = score(frame(rows), Bootstrap(resamples=20)).metrics.row(0, named=True)
    prompt = binomtest(3, 6).proportion_ci(method="wilsoncc")
    response = binomtest(1, 2).proportion_ci(method="wilsoncc")
    assert row["f1_prompt_harm"] == pytest.approx(200 * 3 / 9)
    assert (row["f1_prompt_harm_low"], row["f1_prompt_harm_high"]) == (
        pytest.approx(f1_bound(prompt.low), abs=1e-9),
        pytest.approx(f1_bound(prompt.high), abs=1e-9),
    )
    assert (row["f1_response_harm_low"], row["f1_response_harm_high"]) == (
        pytest.approx(f1_bound(response.low), abs=1e-9),
        pytest.approx(f1_bound(response.high), abs=1e-9),
    )
    assert row["f1_response_refusal"] is None  # no answers: left out of the mean
    assert (row["mean_f1_low"], row["mean_f1_high"]) == (
        pytest.approx((f1_bound(prompt.low) + f1_bound(response.low)) / 2, abs=1e-9),
        pytest.approx((f1_bound(prompt.high) + f1_bound(response.high)) / 2, abs=1e-9),
    )


def test_the_index_interval_is_the_mover_of_its_terms_intervals():
    rng = np.random.default_rng(12)
    rows = suite_answers(M, {name: list(rng.random(30) < 0.7) for name in EVALS})
    scored = score(frame(rows), Bootstrap(resamples=50))
    terms = {r["eval"]: r for r in scored.metrics.iter_rows(named=True)}
    weighted = [
        (0.125, terms["aa_omniscience_decision"], "accuracy"),
        (0.125, terms["aa_omniscience_decision"], "non_hallucination_rate"),
        (0.25, terms["hle_multichoice"], "accuracy"),
        (0.25, terms["when2call"], "accuracy"),
        (0.25, terms["wildguardtest"], "mean_f1"),
    ]
    point = sum(w * r[m] for w, r, m in weighted)
    low = point - np.sqrt(sum((w * (r[m] - r[f"{m}_low"])) ** 2 for w, r, m in weighted))
    high = point + np.sqrt(sum((w * (r[f"{m}_high"] - r[m])) ** 2 for w, r, m in weighted))
    idx = scored.index.row(0, named=True)
    assert (idx["decision_index"], idx["decision_index_low"], idx["decision_index_high"]) == (
        pytest.approx(point),
        pytest.approx(low, abs=1e-9),
        pytest.approx(high, abs=1e-9),
    )


def test_bounds_hold_their_point_exactly_where_floating_point_escaped():
    # plain Wilson computed as centre ± half: at 100% over 60 trials the high bound is
    # 99.99999999999997
    assert wilson(np.array(100.0), 60, 0.95)[1] < 100.0
    n = np.arange(1, 2001)
    escaped = {
        p: int((wilson(np.full(n.shape, p), n, 0.95)[int(p == 100)] != p).sum())
        for p in (0.0, 100.0)
    }
    assert escaped == {0.0: 445, 100.0: 603}  # the counts
    for x in (np.zeros(n.shape), n.astype(float)):
        point = 100 * x / n
        low, high = score_interval(x, n, 0.95)
        low, high = contain(point, 100 * low, 100 * high)
        assert (low <= point).all() and (point <= high).all() and (high > low).all()
    low, high = contain(
        np.array([50.0, 100.0, np.nan]), np.array([50.1, 90.0, 1.0]), np.array([60.0, 99.9, 2.0])
    )
    assert low[:2].tolist() == [50.0, 90.0] and high[:2].tolist() == [60.0, 100.0]
    assert np.isnan(low[2]) and np.isnan(high[2])


@pytest.mark.parametrize("n", [1, 20, 60, 500])
def test_no_interval_has_zero_width_or_leaves_its_point_at_0_and_100(n: int):
    rows = suite_answers(M, {name: [True] * n for name in EVALS})
    rows += suite_answers(N, {name: [False] * n for name in EVALS})
    scored = score(frame(rows), Bootstrap(resamples=20))
    for r in [*scored.metrics.iter_rows(named=True), *scored.index.iter_rows(named=True)]:
        for m in (
            "accuracy",
            "non_hallucination_rate",
            "f1_prompt_harm",
            "f1_response_refusal",
            "f1_response_harm",
            "mean_f1",
            "decision_index",
        ):
            if r.get(m) is not None:
                assert r[f"{m}_low"] <= r[m] <= r[f"{m}_high"] and r[f"{m}_low"] < r[f"{m}_high"], (
                    r["label"],
                    m,
                )


def test_score_interval_against_scipy_and_its_definition():
    for k, n in (
        (0, 20),
        (7, 20),
        (20, 20),
        (1, 1),
        (59, 60),
        (60, 60),
        (250, 500),
        (1, 60),
        (3423, 3423),
    ):
        ci = binomtest(k, n).proportion_ci(method="wilsoncc")
        low, high = score_interval(np.array(k), np.array(n), 0.95)
        assert (float(low), float(high)) == (
            pytest.approx(ci.low, abs=1e-12),
            pytest.approx(ci.high, abs=1e-12),
        )
    # fractional counts (means over epochs): the definition solved numerically
    low, high = score_interval(np.array(2.5), np.array(4.0), 0.95)
    assert (float(low), float(high)) == tuple(
        pytest.approx(v, abs=1e-9) for v in cc_oracle(2.5, 4.0)
    )
    assert tuple(map(float, score_interval(np.array(0.0), np.array(0.0), 0.95))) == (
        0.0,
        1.0,
    )  # no trial


def test_mover_combines_independent_and_fully_correlated_terms():
    points, lows, highs = np.array([50.0, 80.0]), np.array([40.0, 77.0]), np.array([62.0, 82.0])
    low, high = mover(np.array(65.0), points, lows, highs, np.array([0.5, 0.5]))
    assert (float(low), float(high)) == (
        pytest.approx(65 - np.hypot(5, 1.5)),
        pytest.approx(65 + np.hypot(6, 1)),
    )
    low, high = mover(np.array(65.0), points, lows, highs, np.array([0.5, 0.5]), np.ones((2, 2)))
    assert (float(low), float(high)) == (
        pytest.approx(58.5),
        pytest.approx(72.0),
    )  # the mean of the bounds


def test_f1_of_one_positive_has_an_interval_and_null_when_undefined_throughout():
    # prompt_harmful: one positive (right) among 20 rows: resamples without it have no positive ->
    # undefined
    rows = [
        yes_no(M, f"g/{i}", "prompt_harmful", "yes" if i == 0 else "no", 0.9 if i == 0 else 0.1)
        for i in range(20)
    ]
    # response_harmful: no positive gold, no positive prediction -> undefined everywhere
    rows += [yes_no(M, f"g/{i}", "response_harmful", "no", 0.2) for i in range(20)]
    scored = score(frame(rows), Bootstrap(resamples=200))
    row = scored.metrics.row(0, named=True)
    # one TP and nothing else: θ = 1/1, its interval [0.0546, 1] mapped to F1 (not a collapsed [100,
    # 100])
    one = binomtest(1, 1).proportion_ci(method="wilsoncc").low
    assert (row["f1_prompt_harm"], row["f1_prompt_harm_high"]) == (100.0, 100.0)
    assert row["f1_prompt_harm_low"] == pytest.approx(f1_bound(one), abs=1e-9)
    assert row["f1_response_harm"] is None and row["f1_response_harm_low"] is None
    assert row["mean_f1"] == 100.0  # the mean of the defined F1 scores
    block = (
        build_summary(scored.metrics, [M], DATA, "p", 1, {}, scored)
        .models[0]
        .evals["wildguardtest"]
    )
    assert block["f1_response_harm_ci"] is None and "undefined" in block["reason"]


def test_epochs_give_the_index_a_spread():
    a = suite_answers(M, {name: [True, True, False, False] for name in EVALS}, sample=0)
    b = suite_answers(M, {name: [True, True, True, False] for name in EVALS}, sample=1)
    scored = score(frame(a + b), Bootstrap(resamples=50))
    # epoch 0: accuracies 50, Omniscience non-hallucination 0 (every wrong answer is a guess),
    # WildGuardTest TP TN FN FP per question -> F1 50: index .125·50 + .125·0 + .25·(50 + 50 + 50) =
    # 43.75 epoch 1: accuracies 75, non-hallucination 0, TP TN TP FP -> F1 80: .125·75 + .25·(75 +
    # 75 + 80) = 66.875
    idx = scored.index.row(0, named=True)
    assert idx["decision_index"] == pytest.approx((43.75 + 66.875) / 2)
    assert idx["decision_index_sd"] == pytest.approx(np.std([43.75, 66.875], ddof=1))
    summary = records.to_builtins(build_summary(scored.metrics, [M], DATA, "p", 2, {}, scored))
    assert summary["models"][0]["decision_index"] == 55.3125
    assert summary["models"][0]["decision_index_sd"] == pytest.approx(16.351844, abs=1e-6)
    assert summary["models"][0]["evals"]["when2call"]["accuracy_sd"] == pytest.approx(
        17.677670, abs=1e-6
    )
    assert summary["models"][0]["evals"]["wildguardtest"]["mean_f1"] == 65.0


def test_a_missing_answer_is_left_out_and_only_no_reply_at_all_makes_a_metric_null():
    rows = suite_answers(M, {name: [True, False] for name in EVALS})
    rows[0] = {
        **rows[0],
        "status": "missing",
        "predicted": None,
        "probabilities": None,
        "p_predicted": None,
    }
    rows += [
        choice(N, "hle_multichoice", f"hle_multichoice/{i}", "A", None, status=s)
        for i, s in enumerate(("missing", "failed"))
    ]
    scored = score(frame(rows), Bootstrap(resamples=20))
    omni = scored.metrics.filter(pl.col("eval") == "aa_omniscience_decision").row(0, named=True)
    # Omniscience: task 0 (right) missing, left out; task 1 wrong, a hallucination: over the one
    # answered, accuracy 0 and non-hallucination 0; bounds: accuracy [0, 50], non-hallucination
    # [1 − 2/2, 1 − 1/2]
    assert (omni["accuracy"], omni["non_hallucination_rate"]) == (0.0, 0.0)
    assert (omni["missing"], omni["rerun"]) == (1, 1)
    assert (omni["accuracy_lowest"], omni["accuracy_highest"]) == (0.0, 50.0)
    nh = (omni["non_hallucination_rate_lowest"], omni["non_hallucination_rate_highest"])
    assert nh == (0.0, 50.0)
    assert omni["accuracy_low"] is not None
    idx = scored.index.row(0, named=True)
    # HLE and When2Call 50; WildGuardTest: each question one TP and one FP, F1 = 2 / 3
    assert idx["decision_index"] == pytest.approx(0.25 * 50 + 0.25 * 50 + 0.25 * 200 / 3)
    assert (idx["decision_index_lowest"], idx["decision_index_highest"]) == pytest.approx(
        (idx["decision_index"], idx["decision_index"] + 0.125 * 50 + 0.125 * 50)
    )
    nothing = scored.metrics.filter(pl.col("label") == N).row(
        0, named=True
    )  # no reply: null, with the reason
    assert (
        nothing["accuracy"] is None
        and nothing["reason"] == "no reply: every answer failed or is missing"
    )


def test_an_empty_answers_frame_scores_to_empty_tables():
    scored = score(frame([]), Bootstrap(resamples=10))
    assert scored.metrics.is_empty() and scored.index.is_empty() and scored.calibration.is_empty()
    assert scored.breakdowns.is_empty() and scored.statuses.is_empty()
    summary = records.to_builtins(build_summary(scored.metrics, [M], DATA, "p", 1, {}, scored))
    assert summary["models"][0]["decision_index"] is None
    assert summary["models"][0]["evals"]["when2call"]["reason"] == "no answers for this evaluation"


def test_formulas_work_on_arrays_as_on_expressions():
    assert accuracy_from(np.array([3.0]), np.array([4.0]))[0] == 75.0
    assert non_hallucination_from(np.array([0.0, 1.0]), np.array([0.0, 4.0])).tolist() == [
        100.0,
        75.0,
    ]
    with np.errstate(invalid="ignore"):
        assert np.isnan(f1_from(np.array([0.0]), np.array([0.0]), np.array([0.0]))[0])
    assert f1_from(np.array([1.0]), np.array([1.0]), np.array([1.0]))[0] == 50.0


def test_resample_counts_are_the_draws_of_one_integers_call_counted_per_resample():
    # the reference: one (resamples, n_tasks) draw, counted with one bincount over every resample's
    # bins (how the counts were made before issue 14); block boundaries of the faster draw included
    # (n = 5,000: 838 resamples a block)
    for n, b in ((1, 5), (3, 1), (7, 1000), (880, 1000), (5_000, 1000)):
        boot = Bootstrap(resamples=b)
        rng = np.random.default_rng([boot.seed, zlib.crc32(b"hle_multichoice")])
        drawn = rng.integers(0, n, size=(b, n)) + np.arange(b)[:, None] * n
        expected = np.bincount(drawn.ravel(), minlength=b * n).reshape(b, n).astype(np.float32)
        got = boot.weights("hle_multichoice", n)
        assert got.dtype == np.float32 and np.array_equal(got, expected)
        assert (got.sum(axis=1) == n).all()


def test_resample_counts_are_kept_small_and_give_the_same_weights():
    boot = Bootstrap(resamples=300, seed=3)
    counts = boot.counts("when2call", 400)
    assert counts.dtype == np.uint8 and counts.shape == (300, 400) and not counts.flags.writeable
    assert boot.counts("when2call", 400) is counts  # drawn once
    assert (counts.sum(axis=1, dtype=np.int64) == 400).all()
    w = boot.weights("when2call", 400)
    assert w.dtype == np.float32 and np.array_equal(w, counts.astype(np.float32))
    # the draws of one integers() call over the whole (resamples, tasks) matrix, counted per
    # resample
    rng = np.random.default_rng([3, zlib.crc32(b"when2call")])
    drawn = rng.integers(0, 400, size=(300, 400), dtype=np.uint32)
    assert np.array_equal(counts, np.stack([np.bincount(row, minlength=400) for row in drawn]))


def test_a_run_prepares_the_float32_matrix_in_blocks_with_the_same_values_and_the_same_sums():
    boot = Bootstrap(resamples=300, seed=4)
    counts = boot.counts("hle_multichoice", 50)
    boot.prepare(
        "hle_multichoice", 50, block_bytes=4 * 50 * 7
    )  # 7 resamples a block: the last block is short
    prepared = boot.counts("hle_multichoice", 50)
    assert (
        prepared.dtype == np.float32
        and prepared.shape == (300, 50)
        and not prepared.flags.writeable
    )
    assert np.array_equal(prepared, counts.astype(np.float32))
    boot.prepare("hle_multichoice", 50)
    assert boot.counts("hle_multichoice", 50) is prepared  # kept, not made again
    assert (
        Bootstrap(resamples=300, seed=5).counts("hle_multichoice", 50).dtype == np.uint8
    )  # another bootstrap's
    x = np.random.default_rng(0).random((50, 6), dtype=np.float32)
    assert np.array_equal(
        counts.astype(np.float32) @ x, prepared @ x
    )  # the product's bits do not change


def test_request_counts_per_label_from_integer_codes():
    from dxi.scoring.pipeline import request_counts

    ans = pl.DataFrame(
        {  # two labels; task t1 has two questions; epochs 0 and 1
            "label": ["b", "b", "b", "b", "a", "a", "a", "a", "a"],
            "task_id": ["t1", "t1", "t2", "t1", "t1", "t1", "t2", "t3", "t3"],
            "sample": [0, 0, 0, 1, 0, 0, 0, 0, 1],
            "status": [
                "ok",
                "invalid",
                "missing",
                "failed",
                "ok",
                "ok",
                "invalid",
                "ok",
                "missing",
            ],
            "repaired": [True, False, False, False, False, None, False, True, False],
        }
    )
    assert request_counts(ans) == {
        "a": {
            "sent": 0,
            "cache_hits": 3,
            "failed": 0,
            "invalid": 1,
            "repaired": 1,
        },  # (t3, 1) missing
        "b": {
            "sent": 0,
            "cache_hits": 2,
            "failed": 1,
            "invalid": 1,
            "repaired": 1,
        },  # (t2, 0) missing
    }
    assert list(request_counts(ans)["a"]) == ["sent", "cache_hits", "failed", "invalid", "repaired"]
    assert request_counts(ans.head(0)) == {}


def test_resampled_metrics_from_counts_are_exact_in_float64():
    # 3 of 7 right: every resample's accuracy is 100 k / 7 as float64 computes it (float32
    # arithmetic gave values like 42.857143 where float64 gives 42.857142857142854), and the bounds
    # are such values or their interpolation
    rows = [
        choice(
            M,
            "hle_multichoice",
            f"h/{i}",
            "A",
            {"A": 0.9, "B": 0.1} if i < 3 else {"A": 0.1, "B": 0.9},
        )
        for i in range(7)
    ]
    rows += [
        choice(
            M,
            "aa_omniscience_decision",
            f"o/{i}",
            "A",
            {"A": 0.1, "E": 0.9} if i < 2 else {"A": 0.1, "C": 0.9},
        )
        for i in range(7)
    ]
    cubes = build_cubes(frame(rows))
    boot = Bootstrap(resamples=200)
    for name, cube in cubes.items():
        est = eval_metrics(cube, boot, boot.counts(name, cube.n_tasks))
        reps = est.replicates["accuracy"][:, 0]
        assert reps.dtype == np.float64 and set(reps.tolist()) <= {100 * k / 7 for k in range(8)}
    nonhalluc = eval_metrics(
        cubes["aa_omniscience_decision"], boot, boot.counts("aa_omniscience_decision", 7)
    )
    exact = {100 * (1 - h / w) for w in range(1, 8) for h in range(w + 1)} | {100.0}
    assert set(nonhalluc.replicates["non_hallucination_rate"][:, 0].tolist()) <= exact


def test_with_epochs_accuracys_interval_is_over_the_tasks_at_the_mean_over_epochs():
    a = suite_answers(M, {name: [True, True, False, False] for name in EVALS}, sample=0)
    b = suite_answers(M, {name: [True, True, True, False] for name in EVALS}, sample=1)
    row = (
        score(frame(a + b), Bootstrap(resamples=50))
        .metrics.filter(pl.col("eval") == "when2call")
        .row(0, named=True)
    )
    # 2.5 right on average over n = 4 tasks (not 8 answers: a task's epochs are not independent)
    low, high = cc_oracle(2.5, 4)
    assert row["accuracy"] == 62.5
    assert (row["accuracy_low"], row["accuracy_high"]) == (
        pytest.approx(100 * low),
        pytest.approx(100 * high),
    )


def test_an_epoch_without_any_reply_takes_no_share_of_the_intervals_n():
    # Omniscience, 4 tasks: 1 right, 1 "I don't know", 2 wrong picks (accuracy 25, non-hallucination
    # 100/3), then a second epoch whose every answer is missing. The figures are epoch 0's, and so
    # are the intervals: accuracy's continuity-corrected Wilson interval of 1 of n = 4, by hand
    # (z = 1.959964): lower (2 + z^2 - 1 - z*sqrt(z^2 - 2 - 1/4 + 4)) / (2(4 + z^2)) = 0.013191,
    # upper (2 + z^2 + 1 + z*sqrt(z^2 + 2 - 1/4 + 2)) / (2(4 + z^2)) = 0.780573. Averaged over
    # both epochs (the empty one counted) the counts were 0.5 of n = 2: [0.0, 90.5]
    picks = [
        ("o/1", "A", {"A": 0.7, "E": 0.3}),
        ("o/2", "B", {"A": 0.2, "E": 0.8}),
        ("o/3", "D", {"C": 0.6, "E": 0.4}),
        ("o/4", "A", {"B": 0.9, "E": 0.1}),
    ]
    one = [choice(M, "aa_omniscience_decision", t, g, p) for t, g, p in picks]
    gone = [
        choice(M, "aa_omniscience_decision", t, g, None, sample=1, status="missing")
        for t, g, _ in picks
    ]
    rows = [
        score(frame(answers), Bootstrap(resamples=50)).metrics.row(0, named=True)
        for answers in (one, one + gone)
    ]
    for row in rows:
        assert (row["accuracy"], row["non_hallucination_rate"]) == (25.0, pytest.approx(100 / 3))
        assert (row["accuracy_low"], row["accuracy_high"]) == (
            pytest.approx(1.3191, abs=1e-4),
            pytest.approx(78.0573, abs=1e-4),
        )
    low, high = cc_oracle(1, 3)  # not hallucinated: 1 ("I don't know") of the 3 not correct
    for row in rows:
        assert (row["non_hallucination_rate_low"], row["non_hallucination_rate_high"]) == (
            pytest.approx(100 * low),
            pytest.approx(100 * high),
        )
    assert (rows[1]["accuracy_lowest"], rows[1]["accuracy_highest"]) == (12.5, 62.5)


def _data(n: int) -> dict[str, dict]:
    """A data block as ``dxi report`` gets it: each evaluation's tasks and file."""
    return {
        name: {"tasks": n, "files": [{"path": f"{name}.jsonl", "rows": n, "sha256": "0" * 64}]}
        for name in EVALS
    }


def _held(summary: dict) -> int:
    """How many intervals of summary.json were checked to hold their point (asserting each)."""
    checked = 0
    for model in summary["models"]:
        pairs = [(model["decision_index"], model.get("decision_index_ci"))]
        for block in model["evals"].values():
            pairs += [
                (block[k[:-3]], v)
                for k, v in block.items()
                if k.endswith("_ci") and k[:-3] in block
            ]
        for point, ci in pairs:
            if point is not None and ci is not None:
                assert ci[0] <= point <= ci[1] and ci[0] < ci[1], (model["model"], point, ci)
                checked += 1
    return checked


@pytest.mark.slow
@pytest.mark.parametrize("n", [60, 500])
def test_the_report_of_a_100_and_a_0_percent_model_is_written_and_every_bound_holds_its_point(
    n: int, tmp_path
):
    # the issue: at 100% over 60 (or 500) questions Wilson's bound fell below the point, the chart
    # got a negative error bar and `dxi report` died; the report is what `dxi report` writes after
    # scoring (report.html.write)
    from dxi.report import html

    rows = suite_answers(M, {name: [True] * n for name in EVALS}) + suite_answers(
        N, {name: [False] * n for name in EVALS}
    )
    scored = score(frame(rows), Bootstrap(resamples=50), with_comparisons=True)
    summary = build_summary(scored.metrics, [M, N], _data(n), "p", 1, {}, scored)
    path = html.write(summary, scored, tmp_path)
    assert path.exists() and "<img" in path.read_text()
    plain = records.to_builtins(summary)
    assert [m["decision_index"] for m in plain["models"]] == [100.0, 0.0]
    assert (
        _held(plain) == 2 * 9
    )  # per model: the index, 3 accuracies, non-hallucination, 3 F1s and mean F1
    high = plain["models"][0]["evals"]["hle_multichoice"]["accuracy_ci"]
    assert high[1] == 100.0 and high[0] == round(wilson_oracle(n, n)[0], 6)


def test_the_report_of_one_model_with_one_question_is_written(tmp_path):
    from dxi.report import html

    rows = [choice(M, "hle_multichoice", "h/1", "A", {"A": 0.9, "B": 0.1})]
    scored = score(frame(rows), Bootstrap(resamples=20), with_comparisons=True)
    summary = build_summary(scored.metrics, [M], _data(1), "p", 1, {}, scored)
    assert html.write(summary, scored, tmp_path).exists()
    assert records.to_builtins(summary)["models"][0]["evals"]["hle_multichoice"]["accuracy_ci"] == [
        round(wilson_oracle(1, 1)[0], 6),
        100.0,
    ]


def _extreme_models(cache: Path, data: Path) -> None:
    """Beside the cached model's rows, the same requests answered by ``embedded:perfect`` (every
    answer its gold, probability 1) and ``embedded:zero`` (every answer a wrong option that is not
    "I don't know")."""
    gold, _ = Suite(discover(data, selected=["aa_omniscience_decision"])).gold_frames()
    right = {(r["task_id"], r["question_id"]): r["gold"] for r in gold.iter_rows(named=True)}
    rows = pl.concat(
        [
            pl.from_arrow(read_nested(p, SCHEMA.names))
            for p in sorted(cache.glob("shards/*.parquet"))
        ]
    )
    for name, correct in (("perfect", True), ("zero", False)):
        out = []
        for r in rows.iter_rows(named=True):
            answers = []
            for a in r["answers"]:
                options = [p["option"] for p in a["probabilities"]]
                gold_id = right[(r["task_id"], a["question_id"])]
                pick = gold_id if correct else next(o for o in options if o not in (gold_id, "E"))
                answers.append(
                    {
                        **a,
                        "status": "ok",
                        "predicted": pick,
                        "p_predicted": 1.0,
                        "error": None,
                        "probabilities": [{"option": o, "p": float(o == pick)} for o in options],
                    }
                )
            out.append(
                {
                    **r,
                    "model": name,
                    "served_model": name,
                    "key": f"{r['key']}-{name}",
                    "answers": answers,
                }
            )
        pq.write_table(
            pl.DataFrame(out, schema=rows.schema).to_arrow().cast(SCHEMA),
            cache / "shards" / f"{name}.parquet",
        )


@pytest.mark.slow
@requires_real_data
def test_dxi_report_exits_0_on_a_100_and_a_0_percent_model_over_60_and_500_questions(
    tmp_path: Path,
):
    # the issue: at 100% over 60 (or 500) questions Wilson's bound fell below the point and `dxi
    # report` died (exit 1) on a negative error bar; the real Omniscience stand-in's 500 questions,
    # run once by the embedded model, then answered perfectly and all wrong by two more models
    cache = tmp_path / "cache"
    assert (
        main(
            [
                "run",
                "--model",
                MODEL,
                "--data-dir",
                str(REAL_DATA),
                "--cache-dir",
                str(cache),
                "--out",
                str(tmp_path / "run"),
                "--evals",
                "aa_omniscience_decision",
                "--all-tasks",
            ]
        )
        == 0
    )
    _extreme_models(cache, REAL_DATA)
    for flags, n in ((["--sample", "60"], 60), (["--all-tasks"], 500)):
        out = tmp_path / f"report{n}"
        assert (
            main(
                [
                    "report",
                    "--data-dir",
                    str(REAL_DATA),
                    "--cache-dir",
                    str(cache),
                    "--out",
                    str(out),
                    "--evals",
                    "aa_omniscience_decision",
                    *flags,
                ]
            )
            == 0
        )
        assert (out / "report.html").exists()
        summary = orjson.loads((out / "summary.json").read_bytes())
        blocks = {m["model"]: m["evals"]["aa_omniscience_decision"] for m in summary["models"]}
        perfect, zero = blocks["embedded:perfect"], blocks["embedded:zero"]
        assert (perfect["n"], perfect["accuracy"], perfect["non_hallucination_rate"]) == (
            n,
            100.0,
            100.0,
        )
        assert perfect["accuracy_ci"] == [round(wilson_oracle(n, n)[0], 6), 100.0]
        assert perfect["non_hallucination_rate_ci"] == [0.0, 100.0]  # nothing wrong: nothing known
        assert (zero["accuracy"], zero["non_hallucination_rate"]) == (0.0, 0.0)
        assert (
            zero["accuracy_ci"]
            == zero["non_hallucination_rate_ci"]
            == [0.0, round(wilson_oracle(0, n)[1], 6)]
        )
        assert _held(summary) >= 6


@pytest.mark.parametrize("n", [1, 5, 20, 60, 137, 500, 3423])
def test_the_plain_wilson_interval_is_statsmodels(n: int):
    """``wilson`` (in percent) against statsmodels' ``proportion_confint(method="wilson")`` (as a
    fraction) for every count of ``n`` trials, 99% and 95%: equal to 1e-12."""
    from statsmodels.stats.proportion import proportion_confint

    x = np.arange(n + 1)
    for confidence in (0.95, 0.99):
        low, high = wilson(100 * x / n, n, confidence)
        sm_low, sm_high = proportion_confint(x, n, 1 - confidence, method="wilson")
        assert np.abs(low / 100 - sm_low).max() < 1e-12
        assert np.abs(high / 100 - sm_high).max() < 1e-12
