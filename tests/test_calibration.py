"""Calibration metrics, by hand and against scikit-learn (a test-only reference)."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest
from sklearn.metrics import brier_score_loss, log_loss, roc_auc_score

from dxi.scoring import Bootstrap, score
from dxi.scoring.calibration import answer_calibration, auroc

from .helpers.answers import choice, frame, yes_no

M = "systemone:x"
HLE = "hle_multichoice"


def hle_three_plus_invalid():
    """Three HLE answers with probabilities and one invalid answer (no probabilities)."""
    return frame(
        [
            choice(
                M, HLE, "h/1", "A", {"A": 0.7, "B": 0.2, "C": 0.1}
            ),  # right, confidence 0.7 (bin 7)
            choice(M, HLE, "h/2", "B", {"A": 0.6, "B": 0.4}),  # wrong, confidence 0.6 (bin 6)
            choice(M, HLE, "h/3", "C", None, status="invalid", error="probabilities sum to 1.7"),
            choice(M, HLE, "h/4", "A", {"A": 0.75, "B": 0.25}),  # right, confidence 0.75 (bin 7)
        ]
    )


def test_brier_log_loss_and_ece_by_hand():
    row = score(hle_three_plus_invalid()).calibration.row(0, named=True)
    # Brier = 1/2 Σ (p − y)²: 1/2(0.09 + 0.04 + 0.01) = 0.07; 1/2(0.36 + 0.36) = 0.36; 1/2(0.0625 +
    # 0.0625) = 0.0625
    assert row["brier"] == pytest.approx((0.07 + 0.36 + 0.0625) / 3, abs=1e-12)
    assert row["log_loss"] == pytest.approx(
        (-math.log(0.7) - math.log(0.4) - math.log(0.75)) / 3, abs=1e-12
    )
    # ECE: bin [0.7, 0.8): 2 answers, accuracy 1, mean confidence 0.725 -> 2/3 · 0.275;
    #      bin [0.6, 0.7): 1 answer, accuracy 0, confidence 0.6 -> 1/3 · 0.6
    assert row["ece"] == pytest.approx(2 / 3 * 0.275 + 1 / 3 * 0.6, abs=1e-12)
    assert (row["question"], row["answers"], row["excluded"]) == (
        "all",
        3,
        1,
    )  # the invalid answer is excluded


def test_brier_and_log_loss_match_scikit_learn():
    rng = np.random.default_rng(3)
    options = ["A", "B", "C", "D"]
    rows, probs, golds = [], [], []
    for i in range(60):
        p = rng.dirichlet(np.ones(4))
        gold = options[int(rng.integers(4))]
        rows.append(
            choice(M, "when2call", f"w/{i}", gold, dict(zip(options, p.tolist(), strict=True)))
        )
        probs.append(p)
        golds.append(gold)
    row = score(frame(rows)).calibration.row(0, named=True)
    assert row["brier"] == pytest.approx(
        brier_score_loss(golds, np.array(probs), labels=options, scale_by_half=True), abs=1e-12
    )
    assert row["log_loss"] == pytest.approx(
        log_loss(golds, np.array(probs), labels=options), abs=1e-12
    )


def test_yes_no_brier_is_the_binary_brier_and_auroc_matches_scikit_learn():
    p_yes = [0.9, 0.8, 0.6, 0.4, 0.7, 0.3, 0.2, 0.1]
    gold = ["yes", "yes", "yes", "yes", "no", "no", "no", "no"]
    ans = frame(
        [
            yes_no(M, f"g/{i}", "prompt_harmful", g, p)
            for i, (g, p) in enumerate(zip(gold, p_yes, strict=True))
        ]
    )
    cal = score(ans).calibration
    row = cal.filter(cal["question"] == "prompt_harmful").row(0, named=True)
    y = [g == "yes" for g in gold]
    assert row["brier"] == pytest.approx(brier_score_loss(y, p_yes), abs=1e-12)
    assert row["auroc"] == pytest.approx(roc_auc_score(y, p_yes)) == 0.875


def test_auroc_delong_interval_by_hand():
    # positives 0.9 0.8 0.6 0.4, negatives 0.7 0.3 0.2 0.1: AUROC = 14/16 = 0.875.
    # placements: positives [1, 1, .75, .75] (var .0625/3); negatives [.5, 1, 1, 1] (var .1875/3)
    # Var = (.0625/3)/4 + (.1875/3)/4 = 1/48; 95% interval 0.875 ± 1.959964·sqrt(1/48), clipped at 1
    p_yes = [0.9, 0.8, 0.6, 0.4, 0.7, 0.3, 0.2, 0.1]
    gold = ["yes"] * 4 + ["no"] * 4
    ans = frame(
        [
            yes_no(M, f"g/{i}", "prompt_harmful", g, p)
            for i, (g, p) in enumerate(zip(gold, p_yes, strict=True))
        ]
    )
    row = auroc(ans).row(0, named=True)
    half = 1.959963984540054 * math.sqrt(1 / 48)
    assert row["auroc"] == 0.875
    assert 0.875 - half == pytest.approx(0.5921035664809571, abs=1e-12)  # DeLong's low
    # the hull with Newcombe's score interval (method 5): its low solves (0.875 - t)^2 = z^2 V(t),
    # V(t) = t(1 - t)(1 + (N* - 1)((1 - t)/(2 - t) + t/(1 + t))) / 16, N* = 4; here the lower
    # of the two
    z2 = 1.959963984540054**2

    def v(t: float) -> float:
        return t * (1 - t) * (1 + 3 * ((1 - t) / (2 - t) + t / (1 + t))) / 16

    low = row["auroc_low"]
    assert low < 0.875 - half and (0.875 - low) ** 2 == pytest.approx(z2 * v(low), rel=1e-9)
    assert low == pytest.approx(0.452827057, abs=1e-8)
    assert row["auroc_high"] == 1.0
    assert (row["positives"], row["negatives"]) == (4, 4)


def test_a_perfect_auroc_keeps_an_interval_of_nonzero_width():
    # every positive above every negative: DeLong's variance is 0 (an interval [1, 1]); the score
    # interval's low solves (1 - t)^2 = z^2 V(t) with N* = 3 (3 positives, 3 negatives)
    ans = frame(
        [
            yes_no(M, f"g/{i}", "prompt_harmful", g, p)
            for i, (g, p) in enumerate(
                [("yes", 0.9), ("yes", 0.8), ("yes", 0.7), ("no", 0.3), ("no", 0.2), ("no", 0.1)]
            )
        ]
    )
    row = auroc(ans).row(0, named=True)
    low = row["auroc_low"]
    t = low
    variance = t * (1 - t) * (1 + 2 * ((1 - t) / (2 - t) + t / (1 + t))) / 9
    assert (row["auroc"], row["auroc_high"]) == (1.0, 1.0)
    z2 = 1.959963984540054**2
    assert 0 < low < 1 and (1 - low) ** 2 == pytest.approx(z2 * variance, rel=1e-9)


def test_auroc_with_ties_counts_half():
    # positives 0.9 0.7 0.3, negatives 0.8 0.3: pairs won 1+1, 0+1, 0+0.5 -> 3.5 / 6
    ans = frame(
        [
            yes_no(M, f"g/{i}", "response_refusal", g, p)
            for i, (g, p) in enumerate(
                [("yes", 0.9), ("no", 0.8), ("yes", 0.7), ("no", 0.3), ("yes", 0.3)]
            )
        ]
    )
    assert auroc(ans)["auroc"].item() == pytest.approx(3.5 / 6, abs=1e-12)


def test_one_class_only_has_no_auroc():
    ans = frame(
        [yes_no(M, f"g/{i}", "response_harmful", "no", p) for i, p in enumerate([0.1, 0.6, 0.3])]
    )
    row = auroc(ans).row(0, named=True)
    assert (
        row["auroc"] is None
        and row["auroc_low"] is None
        and (row["positives"], row["negatives"]) == (0, 3)
    )


def test_all_correct_and_certain_is_perfectly_calibrated():
    ans = frame([choice(M, HLE, f"h/{i}", "B", {"A": 0.0, "B": 1.0}) for i in range(5)])
    row = score(ans, Bootstrap(resamples=50)).calibration.row(0, named=True)
    assert (row["brier"], row["ece"], row["brier_low"]) == (0.0, 0.0, 0.0)
    # every resample gives 0 (the percentile bootstrap's interval had zero width); the bounded-mean
    # score interval over 5 tasks: Wilson's with continuity correction at 0 of 5,
    # (z^2 + 1 + z sqrt(z^2 + 2 - 1/5)) / (2 (5 + z^2)); the log loss's the same times -ln 5e-5
    z = 1.959963984540054
    upper = (z * z + 1 + z * math.sqrt(z * z + 2 - 1 / 5)) / (2 * (5 + z * z))
    assert row["brier_high"] == pytest.approx(upper, rel=1e-12)
    assert upper == pytest.approx(0.537056, abs=1e-6)
    assert row["log_loss"] == 0.0 and row["log_loss_low"] == 0.0
    assert row["log_loss_high"] == pytest.approx(-math.log(5e-5) * upper, rel=1e-12)
    assert row["ece_low"] is None and row["ece_high"] is None  # no interval: biased estimator


def test_log_loss_clips_a_reported_zero():
    ans = frame([choice(M, HLE, "h/1", "A", {"A": 0.0, "B": 1.0})])
    assert score(ans).calibration["log_loss"].item() == pytest.approx(-math.log(5e-5), abs=1e-12)


def test_all_invalid_has_no_calibration_and_counts_them():
    ans = frame(
        [choice(M, HLE, f"h/{i}", "A", None, status="invalid", error="bad") for i in range(3)]
    )
    scored = score(ans)
    assert scored.calibration.is_empty()
    per_answer = answer_calibration(ans)
    assert per_answer["pn"].to_list() == [0.0, 0.0, 0.0] and per_answer["bin"].to_list() == [
        -1,
        -1,
        -1,
    ]
    assert (
        scored.metrics.row(0, named=True)["accuracy"] == 0.0
        and scored.metrics["invalid"].item() == 3
    )


def test_reliability_bins_by_hand():
    bins = score(hle_three_plus_invalid()).reliability
    assert bins.select("bin", "n", "accuracy").rows() == [(6, 1, 0.0), (7, 2, 1.0)]
    assert bins["confidence"].to_list() == pytest.approx([0.6, 0.725])
    assert bins["low"].to_list() == pytest.approx([0.6, 0.7]) and bins[
        "high"
    ].to_list() == pytest.approx([0.7, 0.8])


def test_gold_probability_matches_option_text_exactly_per_answer():
    """p(gold) is the probability of the option whose text equals this answer's gold: "A " and "a"
    are other options, and an option that is another answer's gold is not this one's."""
    ans = frame(
        [
            choice(M, HLE, "h/1", "A", {"A ": 0.5, "a": 0.3, "A": 0.2}),
            choice(M, HLE, "h/2", "B", {"A": 0.9, "B": 0.1}),
            choice(
                M, HLE, "h/3", "C", {"A": 0.6, "B": 0.4}
            ),  # gold absent (a valid reply lists every option)
        ]
    )
    per_answer = answer_calibration(ans)
    assert per_answer["pn"].to_list() == [1.0, 1.0, 0.0]  # no p(gold): not counted for calibration
    assert per_answer["log_loss"].to_list() == pytest.approx([-math.log(0.2), -math.log(0.1), 0.0])
    # Brier: 1/2 (Σ p² − 2 p_gold + 1)
    assert per_answer["brier"].to_list() == pytest.approx(
        [0.5 * (0.25 + 0.09 + 0.04 - 0.4 + 1), 0.5 * (0.81 + 0.01 - 0.2 + 1), 0.0]
    )


def test_gold_probability_in_chunks_is_the_same_as_in_one_pass(monkeypatch):
    """Matched ``GOLD_CHUNK`` answers at a time: the same p(gold) and Σ p² per answer, bit for bit,
    with chunk edges inside the list (2 answers per chunk over 5, a null list and an empty one among
    them)."""
    from dxi.scoring import calibration

    probabilities = pl.Series(
        [
            [{"option": "A", "p": 0.7}, {"option": "B", "p": 0.3}],
            None,
            [],
            [{"option": "B", "p": 0.125}, {"option": "C", "p": 0.875}],
            [{"option": "C", "p": 0.1}, {"option": "A", "p": 0.2}, {"option": "B", "p": 0.7}],
        ],
        dtype=pl.List(pl.Struct({"option": pl.String, "p": pl.Float64})),
    )
    gold = pl.Series(["A", "B", "A", "C", "B"])
    whole = calibration._gold_probability(probabilities, gold)
    monkeypatch.setattr(calibration, "GOLD_CHUNK", 2)
    parts = calibration._gold_probability(probabilities, gold)
    np.testing.assert_array_equal(parts[0], whole[0])
    np.testing.assert_array_equal(parts[1], whole[1])
    np.testing.assert_array_equal(parts[0], [0.7, np.nan, np.nan, 0.875, 0.7])
    np.testing.assert_array_equal(
        parts[1],
        [0.7 * 0.7 + 0.3 * 0.3, 0.0, 0.0, 0.125**2 + 0.875**2, 0.1 * 0.1 + 0.2 * 0.2 + 0.7 * 0.7],
    )


def test_an_incomplete_evaluation_is_calibrated_over_its_replies_and_one_without_replies_not_at_all():
    other, none = "systemone:y", "systemone:z"
    ans = frame(
        [
            *hle_three_plus_invalid().to_dicts(),
            choice(other, HLE, "h/1", "A", {"A": 0.9, "B": 0.1}),
            choice(other, HLE, "h/2", "B", None, status="missing", error="not in the cache"),
            choice(none, HLE, "h/1", "A", None, status="failed", error="HTTP 503"),
        ]
    )
    scored = score(ans)
    assert sorted(scored.calibration["label"].unique().to_list()) == [M, other]
    row = scored.calibration.filter(pl.col("label") == other).row(0, named=True)
    assert (row["answers"], row["excluded"], row["brier"]) == (
        1,
        1,
        pytest.approx(0.5 * (0.1**2 + 0.1**2)),
    )
    assert sorted(scored.reliability["label"].unique().to_list()) == [M, other]
    # provisional: over its 1 answered, right
    assert scored.metrics.filter(pl.col("label") == other)["accuracy"].item() == 100.0
    assert scored.metrics.filter(pl.col("label") == none)["accuracy"].item() is None
