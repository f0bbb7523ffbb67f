"""Paired comparisons of models and their ranks (``scoring.compare``), by hand and against scipy (a
test-only reference: scikit-learn's dependency, never the product's)."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest
from scipy.stats import binomtest

from dxi.scoring import Bootstrap, build_summary, compare, records, score
from dxi.scoring.compare import mcnemar_p, tied_groups
from dxi.scoring.simultaneous import correlation, max_t, mover_difference, newcombe, rank_sets
from dxi.scoring.summary import in_order, p_text

from .helpers.answers import choice, frame, yes_no

MOVER = "identical answers: Wilson bound of the tasks that could differ and MOVER hull"
EVALS = ("aa_omniscience_decision", "hle_multichoice", "when2call", "wildguardtest")
DATA = {name: {"files": []} for name in EVALS}
N_TASKS = 40


def answers(label: str, right: list[bool], name: str = "hle_multichoice") -> list[dict]:
    return [
        choice(
            label,
            name,
            f"{name}/{i:03d}",
            "A",
            {"A": 0.8, "B": 0.2} if ok else {"A": 0.3, "B": 0.7},
        )
        for i, ok in enumerate(right)
    ]


def suite(label: str, right: list[bool]) -> list[dict]:
    """Every evaluation answered with the same right/wrong pattern over its tasks (WildGuardTest: a
    row's three questions right or wrong together; gold yes on even rows)."""
    rows = [r for name in EVALS[:3] for r in answers(label, right, name)]
    for i, ok in enumerate(right):
        gold = "yes" if i % 2 == 0 else "no"
        for q in ("prompt_harmful", "response_refusal", "response_harmful"):
            rows.append(
                yes_no(
                    label, f"wildguardtest/{i:03d}", q, gold, 0.9 if (gold == "yes") == ok else 0.1
                )
            )
    return rows


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (0, 0),
        (1, 0),
        (0, 3),
        (5, 5),
        (7, 2),
        (12, 30),
        (150, 171),
        (1000, 1100),
        (2400, 2000),
        (3, 3000),
    ],
)
def test_mcnemar_is_scipys_exact_two_sided_binomial_test(a: int, b: int):
    expected = binomtest(a, a + b, 0.5).pvalue if a + b else 1.0
    assert mcnemar_p(np.array([a]), np.array([b]))[0] == pytest.approx(
        expected, rel=1e-9, abs=1e-300
    )


def test_mcnemar_vectorised_matches_one_at_a_time():
    rng = np.random.default_rng(3)
    a, b = rng.integers(0, 400, 200), rng.integers(0, 400, 200)
    together = mcnemar_p(a, b)
    assert all(
        together[k]
        == pytest.approx(
            binomtest(int(a[k]), int(a[k] + b[k])).pvalue if a[k] + b[k] else 1.0,
            rel=1e-9,
            abs=1e-300,
        )
        for k in range(200)
    )


def test_two_models_difference_interval_p_value_and_mcnemar_by_hand():
    rng = np.random.default_rng(11)
    a_right = rng.random(N_TASKS) < 0.7
    b_right = np.where(rng.random(N_TASKS) < 0.8, a_right, ~a_right)  # mostly the same answers
    boot = Bootstrap(resamples=500, seed=4)
    scored = score(
        frame(answers("m:a", list(a_right)) + answers("m:b", list(b_right))),
        boot,
        with_comparisons=True,
    )
    row = scored.comparisons.filter(pl.col("metric") == "accuracy").row(0, named=True)
    assert (row["a"], row["b"], row["eval"]) == ("m:a", "m:b", "hle_multichoice")
    # the point difference, and the same resamples for both: resample b's accuracy is counts[b] @
    # right / n
    w = boot.counts("hle_multichoice", N_TASKS).astype(np.float64)
    diff = 100 * (w @ a_right - w @ b_right) / N_TASKS
    d = 100 * (a_right.mean() - b_right.mean())
    assert row["difference"] == pytest.approx(d)
    assert row["se"] == pytest.approx(diff.std(ddof=1))
    # McNemar on the discordant answers (a right and b wrong, and the other way) is the raw p-value
    a_only, b_only = int((a_right & ~b_right).sum()), int((~a_right & b_right).sum())
    both_right, both_wrong = int((a_right & b_right).sum()), int((~a_right & ~b_right).sum())
    assert (row["a_only"], row["b_only"]) == (a_only, b_only)
    assert row["mcnemar_p"] == pytest.approx(binomtest(a_only, a_only + b_only).pvalue, rel=1e-9)
    assert row["p_value"] == row["mcnemar_p"] and row["test"] == "McNemar exact"
    # the hull of Newcombe's interval (method 10) and Bonett & Price's, by hand from the 2x2 table
    (n_low, n_high), (b_low, b_high) = (
        _newcombe(both_right, a_only, b_only, both_wrong),
        _bonett_price(a_only, b_only),
    )
    assert (row["low"], row["high"]) == pytest.approx((min(n_low, b_low), max(n_high, b_high)))
    assert row["interval"] == "Newcombe (method 10) and Bonett-Price hull"
    # one pair: the step-down is the bootstrap test (1 + #{|D* - d| >= |d|}) / (B + 1); accuracy
    # takes the larger of it and McNemar's
    step = (1 + (np.abs(diff - d) >= abs(d) - 1e-9).sum()) / 501
    assert row["p_adjusted"] == pytest.approx(max(step, row["mcnemar_p"]))
    assert (
        row["significant"] is (row["p_adjusted"] < 0.05)
        and row["adjustment"] == "max-T step-down and McNemar exact"
    )
    assert row["complete"] is True
    # a metric without McNemar's test: the symmetric bootstrap interval d +- q, q the 95% quantile
    # of |D* - d|
    omni = scored.comparisons.filter(pl.col("metric") == "decision_index")
    assert omni.is_empty()  # one evaluation only: no index


def _newcombe(a: int, b: int, c: int, d: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """Newcombe (1998) method 10, written out from the paper for the test: the 2x2 table a (both
    right), b (first only), c (second only), d (both wrong); the difference in points."""
    n = a + b + c + d

    def wilson(x: int) -> tuple[float, float]:
        p = x / n
        centre, half = p + z * z / (2 * n), z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
        return (centre - half) / (1 + z * z / n), (centre + half) / (1 + z * z / n)

    p1, p2 = (a + b) / n, (a + c) / n
    (l1, u1), (l2, u2) = wilson(a + b), wilson(a + c)
    margins = (a + b) * (c + d) * (a + c) * (b + d)
    cross = a * d - b * c  # continuity-corrected: less N/2 above N/2, none from 0 to N/2
    cross = cross - n / 2 if cross > n / 2 else cross if cross < 0 else 0
    phi = cross / np.sqrt(margins) if margins else 0.0
    delta = np.sqrt((p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2)
    eps = np.sqrt((u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2)
    return 100 * (p1 - p2 - delta), 100 * (p1 - p2 + eps)


def _bonett_price(
    b: int, c: int, n: int = N_TASKS, z: float = 1.959963984540054
) -> tuple[float, float]:
    """Bonett & Price (2012)'s adjusted Wald interval, in points, written out for the test."""
    first, second = (b + 1) / (n + 2), (c + 1) / (n + 2)
    half = z * np.sqrt((first + second - (first - second) ** 2) / (n + 2))
    return 100 * (first - second - half), 100 * (first - second + half)


def test_two_discordant_answers_one_way_get_an_interval_around_zero_not_a_bound_stuck_at_it():
    # the case: 60 questions, b right on two more (a: 30 right, b: 32), so 0 and 2
    # discordant answers; the percentile bootstrap gave [-8.33, 0.0]; Newcombe's method 10 gives
    # [-8.72, +2.14] (φ continuity-corrected: AD - BC = 840 less N/2 = 30; R's biostatUZH
    # confIntPairedProportion gives the same), Bonett & Price's [-9.50, +3.05]: the hull of the two
    # (hand-computed: centre -2/62, se sqrt((4/62 - (2/62)**2)/62))
    assert tuple(round(v, 4) for v in _newcombe(30, 0, 2, 28)) == (-8.7175, 2.1378)
    assert tuple(round(v, 4) for v in _bonett_price(0, 2, 60)) == (-9.4971, 3.0455)
    low, high = newcombe(
        np.array([0]), np.array([2]), np.array([30]), np.array([28]), 0.95, hull=False
    )
    assert (round(low[0], 4), round(high[0], 4)) == (
        -8.7175,
        2.1378,
    )  # method 10 alone, as the paper gives it
    a_right = [i < 30 for i in range(60)]
    b_right = [i < 32 for i in range(60)]
    scored = score(
        frame(answers("m:a", a_right) + answers("m:b", b_right)), Bootstrap(), with_comparisons=True
    )
    row = scored.comparisons.row(0, named=True)
    assert row["difference"] == pytest.approx(-100 / 30)
    assert (round(row["low"], 4), round(row["high"], 4)) == (-9.4971, 3.0455)
    assert row["p_value"] == pytest.approx(0.5) and row["significant"] is False


def test_newcombe_never_has_zero_width_and_contains_its_point():
    # no discordant answer: method 10's width collapses (phi = 1; zero at exactly 1/2), so even
    # without the hull the interval is then the hull with Bonett & Price's adjusted Wald interval:
    # (b + 1)/(n + 2) - (c + 1)/(n + 2) +- z * sqrt((p12 + p21 - theta**2)/(n + 2)) = 0 +- 1.96 *
    # sqrt(2/62/62)
    low, high = newcombe(
        np.array([0, 0, 0, 60, 0]),
        np.array([0, 0, 0, 0, 60]),
        np.array([30, 60, 0, 0, 0]),
        np.array([30, 0, 60, 0, 0]),
        0.95,
        hull=False,
    )
    assert (high - low > 0).all()
    half = 100 * 1.959963984540054 * np.sqrt(2 / 62 / 62)
    assert (low[0], high[0]) == (pytest.approx(-half), pytest.approx(half))
    point = np.array([0, 0, 0, 100, -100])
    assert (low <= point).all() and (point <= high).all() and low[3] < 100 and high[4] > -100


def test_the_paired_accuracy_interval_covers_at_least_093_by_seeded_simulation():
    rng = np.random.default_rng(5)
    for n, p1, p2, same in [
        (20, 0.9, 0.85, 0.8),
        (60, 0.95, 0.9, 0.8),
        (60, 0.5, 0.5, 0.8),
        (60, 0.995, 0.99, 0.8),
        (500, 0.7, 0.68, 0.8),
        (20, 0.5, 0.45, 0.95),
        (60, 0.9, 0.89, 0.95),
        (20, 0.5, 0.49, 0.5),
        (500, 0.5, 0.45, 0.95),
    ]:  # method 10 alone: 0.917, 0.923
        # correlated pairs: the second model repeats the first's answer on most questions (``same``
        # of them)
        first = rng.random((4000, n)) < p1
        other = np.clip((p2 - same * p1) / (1 - same), 0, 1)
        second = np.where(rng.random((4000, n)) < same, first, rng.random((4000, n)) < other)
        truth = 100 * (p1 - (same * p1 + (1 - same) * other))
        low, high = newcombe(
            (first & ~second).sum(1),
            (~first & second).sum(1),
            (first & second).sum(1),
            (~first & ~second).sum(1),
            0.95,
        )
        covered = ((low <= truth) & (truth <= high)).mean()
        assert covered >= 0.93, (n, p1, p2, covered)


def test_an_identical_pair_differs_by_nothing_and_is_never_separated():
    right = list(np.random.default_rng(1).random(N_TASKS) < 0.5)
    scored = score(
        frame(suite("m:a", right) + suite("m:b", right)),
        Bootstrap(resamples=200),
        with_comparisons=True,
    )
    for row in scored.comparisons.iter_rows(named=True):
        assert (row["difference"], row["p_value"], row["p_adjusted"], row["significant"]) == (
            0.0,
            1.0,
            1.0,
            False,
        )
        assert row["low"] < 0 < row["high"] and row["low"] == -row["high"]  # never of zero width
    # the interval is over the tasks the source could give: on none of the 40 tasks do the two
    # differ, so the share of tasks where they would is at most Wilson's 100 z²/(40 + z²); accuracy
    # keeps Newcombe's and Bonett & Price's hull (no discordant answer: 0 ± z √2 / 42)
    z = 1.959963984540054
    wilson, bonett_price = 100 * z * z / (40 + z * z), 100 * z * 2**0.5 / 42
    assert (wilson, bonett_price) == (pytest.approx(8.762160), pytest.approx(6.599542))
    rows = {(r["eval"], r["metric"]): r for r in scored.comparisons.iter_rows(named=True)}
    omni = scored.metrics.filter(pl.col("eval") == "aa_omniscience_decision").row(0, named=True)
    nh = omni["non_hallucination_rate"]  # its MOVER (correlation 1): the asymmetry of its interval
    mover = abs(
        (nh - omni["non_hallucination_rate_low"]) - (omni["non_hallucination_rate_high"] - nh)
    )
    expected = {
        ("aa_omniscience_decision", "accuracy"): (bonett_price, compare.NEWCOMBE),
        ("aa_omniscience_decision", "non_hallucination_rate"): (max(wilson, mover), MOVER),
        ("hle_multichoice", "accuracy"): (bonett_price, compare.NEWCOMBE),
        ("when2call", "accuracy"): (bonett_price, compare.NEWCOMBE),
        **{
            ("wildguardtest", m): (wilson, MOVER) for m in ("f1_prompt_harm", "f1_response_refusal")
        },
        **{("wildguardtest", m): (wilson, MOVER) for m in ("f1_response_harm", "mean_f1")},
    }
    assert mover == pytest.approx(20.045335, abs=1e-6)
    for key, (half, interval) in expected.items():
        assert (rows[key]["high"], rows[key]["interval"]) == (pytest.approx(half), interval), key
    # the index: its terms weighed, added within an evaluation (Omniscience's two share its tasks)
    # and square-and-added over the four (independent samples of tasks); was the weighted sum of
    # the Wilson bounds, 8.76, wider than any of its terms' weighed
    index = (
        (0.125 * bonett_price + 0.125 * max(wilson, mover)) ** 2
        + 2 * (0.25 * bonett_price) ** 2
        + (0.25 * wilson) ** 2
    ) ** 0.5
    assert index == pytest.approx(4.619055, abs=1e-6)
    assert (rows[(None, "decision_index")]["high"], rows[(None, "decision_index")]["interval"]) == (
        pytest.approx(index),
        "identical answers: its terms' intervals, square-and-add over the evaluations",
    )
    assert scored.comparisons["se"].to_list() == [0.0] * 9
    # turned round (b before a, as the report's order may have it) a tie stays 0.0, not −0.0
    turned = in_order(scored.comparisons, ["m:b", "m:a"])
    assert turned["a"].to_list() == ["m:b"] * 9
    assert [math.copysign(1, d) for d in turned["difference"]] == [1.0] * 9
    ranks = {r["label"]: r for r in scored.index.iter_rows(named=True)}
    assert [
        (r["tied_group"], r["rank"], r["rank_high"], r["rank_set_low"], r["rank_set_high"])
        for r in ranks.values()
    ] == [(1, 1, 2, 1, 2), (1, 1, 2, 1, 2)]  # rank_high 2: agreeing on 40 tasks proves no tie


def test_the_symmetric_interval_by_hand():
    # an index difference: d +- the 95% quantile of |D* - d| over the resamples (linear
    # interpolation), the inversion of its own bootstrap test (no MOVER hull for the index: its
    # hull covered every time and showed pairs the test separated with intervals holding 0)
    rng = np.random.default_rng(2)
    a, b = list(rng.random(N_TASKS) < 0.6), list(rng.random(N_TASKS) < 0.6)
    boot = Bootstrap(resamples=300, seed=9)
    scored = score(frame(suite("m:a", a) + suite("m:b", b)), boot, with_comparisons=True)
    from dxi.scoring.compare import figures
    from dxi.scoring.scored import Scorer

    scorer = Scorer(boot)
    scorer.add(frame(suite("m:a", a) + suite("m:b", b)))
    index = figures(scorer.estimates, scorer.labels, boot)[0]
    assert index.low is None and index.high is None
    d = index.point[0] - index.point[1]
    spread = np.abs(index.replicates[:, 0] - index.replicates[:, 1] - d)
    q = np.quantile(spread, 0.95)
    row = scored.comparisons.filter(pl.col("metric") == "decision_index").row(0, named=True)
    assert (row["low"], row["high"]) == (pytest.approx(d - q), pytest.approx(d + q))
    assert row["interval"] == "symmetric bootstrap"
    assert row["test"] == "paired bootstrap"
    # the test and the interval agree: p = (1 + #{|D* - d| >= |d|}) / (B + 1) is below 0.05
    # exactly when the interval leaves 0 out (ties aside)
    assert row["p_value"] == pytest.approx((1 + (spread >= abs(d) - 1e-9).sum()) / 301)
    assert (row["p_value"] < 0.05) == (row["low"] > 0 or row["high"] < 0)


def test_mover_difference_by_hand_and_as_newcombes_method_10():
    # a = (90, 80, 95), b = (85, 75, 92), r = 0.5: low = 5 - sqrt(10² + 7² - 2·0.5·10·7)
    # = 5 - sqrt(79), high = 5 + sqrt(5² + 10² - 2·0.5·5·10) = 5 + sqrt(75)
    def arrays(*values: float) -> tuple[np.ndarray, ...]:
        return tuple(np.array([v]) for v in values)

    low, high = mover_difference(arrays(90, 80, 95), arrays(85, 75, 92), np.array([0.5]))
    assert (low[0], high[0]) == (pytest.approx(5 - 79**0.5), pytest.approx(5 + 75**0.5))
    # with each model's Wilson interval and the 2x2 table's (corrected) phi it is Newcombe's
    # method 10
    both_right, a_only, b_only, both_wrong = 30, 6, 2, 22
    n = 60
    z = 1.959963984540054
    p1, p2 = (both_right + a_only) / n, (both_right + b_only) / n

    def wilson(p):
        c = (p + z * z / (2 * n)) / (1 + z * z / n)
        h = z / (1 + z * z / n) * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
        return 100 * (c - h), 100 * (c + h)

    margins = (
        (both_right + a_only)
        * (b_only + both_wrong)
        * (both_right + b_only)
        * (a_only + both_wrong)
    )
    # φ continuity-corrected as method 10 has it: AD − BC = 648 less N/2
    phi = (both_right * both_wrong - a_only * b_only - n / 2) / np.sqrt(margins)
    (l1, u1), (l2, u2) = wilson(p1), wilson(p2)
    low, high = mover_difference(
        arrays(100 * p1, l1, u1), arrays(100 * p2, l2, u2), np.array([phi])
    )
    n_low, n_high = newcombe(*arrays(a_only, b_only, both_right, both_wrong), 0.95, hull=False)
    assert (low[0], high[0]) == (pytest.approx(n_low[0]), pytest.approx(n_high[0]))


def test_correlation_is_pearsons_over_the_defined_resamples():
    rng = np.random.default_rng(5)
    a, b = rng.random((3, 50)), rng.random((3, 50))
    b[0] = a[0] * 2 + rng.random(50) * 0.1
    a[1, 7] = np.nan
    b[2] = 4.0  # no spread: 0
    r = correlation(a, b)
    keep = ~np.isnan(a[1])
    assert r[0] == pytest.approx(np.corrcoef(a[0], b[0])[0, 1])
    assert r[1] == pytest.approx(np.corrcoef(a[1, keep], b[1, keep])[0, 1])
    assert r[2] == 0.0


def test_max_t_step_down_by_hand():
    # three pairs, four resamples: |d| = 5, 3, 1; centred |D* - d| per pair and resample below
    d = np.array([3.0, -5.0, 1.0])
    dev = np.array([[1.0, 4.0, 0.5, 2.0], [2.0, 6.0, 1.0, 0.0], [0.2, 0.1, 1.5, 0.3]])
    reps = d[:, None] + dev * np.array([1, -1, 1, -1])
    _, raw, adjusted = max_t(d, lambda rows: reps[rows], 3, 4)
    # raw: (1 + #{dev >= |d|}) / 5 -> pair 0: 4 >= 3 once; pair 1: 6 >= 5 once; pair 2: 1.5 >= 1
    # once
    assert raw.tolist() == pytest.approx([0.4, 0.4, 0.4])
    # step 1 (pair 1, |d| 5): max over all pairs per resample = 2, 6, 1.5, 2 -> one >= 5: 2/5
    # step 2 (pair 0, |d| 3): max over pairs 0, 2 = 1, 4, 1.5, 2 -> one >= 3: 2/5, kept >= step 1's
    # step 3 (pair 2, |d| 1): pair 2 alone = 0.2, 0.1, 1.5, 0.3 -> one >= 1: 2/5
    assert adjusted.tolist() == pytest.approx([0.4, 0.4, 0.4])
    _, _, adjusted = max_t(np.array([3.0, -5.0, 0.1]), lambda rows: reps[rows], 3, 4)
    assert adjusted.tolist() == pytest.approx(
        [0.4, 0.4, 1.0]
    )  # |d| 0.1: all four resamples reach it


def test_rank_sets_by_hand():
    point = np.array([10.0, 8.0, 5.0, 1.0])
    first, second = np.triu_indices(4, 1)  # (0,1) (0,2) (0,3) (1,2) (1,3) (2,3)
    low, high = rank_sets(point, first, second, np.array([False, True, True, False, True, False]))
    # 0 is above 2 and 3; 1 above 3; 0-1, 1-2 and 2-3 not separated
    assert low.tolist() == [1, 1, 2, 3] and high.tolist() == [2, 3, 4, 4]


def _nested(models: int, step: int, n_tasks: int, block: int = 1) -> tuple[pl.DataFrame, list[str]]:
    """``models`` models on every evaluation, model k right on the first n_tasks − step·(k // block)
    tasks (so models of one block answer alike and the blocks are ``step`` tasks apart, all one
    way)."""
    labels = [f"m:{k:02d}" for k in range(models)]
    rows = [
        r
        for k, label in enumerate(labels)
        for r in suite(label, [i < n_tasks - step * (k // block) for i in range(n_tasks)])
    ]
    return frame(rows), labels


def test_21_models_fall_into_the_groups_a_bonferroni_bound_guarantees():
    # 7 blocks of 3 models answering alike, blocks 25 tasks of 200 apart (all one way). Within a
    # block the differences are 0: never separated. Between blocks, HLE accuracy's McNemar p is at
    # most 2 * 0.5**25, so a Bonferroni bound over the 210 pairs (210 * 6e-8 < 0.05) separates every
    # two blocks: the groups must be the blocks, each model's rank set its block's ranks.
    answers_, labels = _nested(21, 25, 200, block=3)
    scored = score(answers_, Bootstrap(), with_breakdowns=False, with_comparisons=True)
    hle = scored.comparisons.filter(pl.col("eval") == "hle_multichoice")
    bonferroni = hle["mcnemar_p"].to_numpy() * len(hle) < 0.05
    assert bonferroni.sum() == 210 - 7 * 3
    assert (hle["significant"].to_numpy() >= bonferroni).all()
    index = {r["label"]: r for r in scored.index.iter_rows(named=True)}
    assert [index[lb]["tied_group"] for lb in labels] == [k // 3 + 1 for k in range(21)]
    assert [(index[lb]["rank_set_low"], index[lb]["rank_set_high"]) for lb in labels] == [
        (3 * (k // 3) + 1, 3 * (k // 3) + 3) for k in range(21)
    ]


@pytest.mark.slow
@pytest.mark.parametrize("models", [8, 11, 20, 50])
def test_models_with_large_differences_are_all_separated(models: int):
    # models 8 tasks of 400 apart on every evaluation (2 index points, all one way): every model its
    # own group and rank set. Holm over the resampling p-values could not do this (28 pairs x 2/1001
    # > 0.05 already at 8).
    answers_, labels = _nested(models, 8, 400)
    scored = score(answers_, Bootstrap(), with_breakdowns=False, with_comparisons=True)
    index = {r["label"]: r for r in scored.index.iter_rows(named=True)}
    assert [index[lb]["tied_group"] for lb in labels] == list(range(1, models + 1))
    assert [(index[lb]["rank_set_low"], index[lb]["rank_set_high"]) for lb in labels] == [
        (k, k) for k in range(1, models + 1)
    ]
    pairs = scored.comparisons.filter(pl.col("metric") == "decision_index")
    assert pairs["significant"].all() and pairs["p_adjusted"].max() < 0.05


def test_a_100_percent_model_and_a_0_percent_one_among_eleven_are_separated():
    # the run: 11 models, one right everywhere, one wrong everywhere, the rest between
    answers_, labels = _nested(11, 6, 60)
    scored = score(answers_, Bootstrap(), with_breakdowns=False, with_comparisons=True)
    top = scored.comparisons.filter(
        (pl.col("metric") == "decision_index") & (pl.col("a") == "m:00") & (pl.col("b") == "m:10")
    ).row(0, named=True)
    assert top["difference"] == pytest.approx(100.0) and top["significant"] is True
    assert top["p_adjusted"] == pytest.approx(1 / 1001)


@pytest.mark.parametrize(("tasks", "separated"), [(2, False), (60, True)])
def test_a_difference_no_resample_moves_falls_back_to_the_sign_test(tasks: int, separated: bool):
    # 100% against 0% everywhere: every resample gives 100, so the bootstrap cannot judge; the sign
    # test over the tasks can (2 * 0.5**2 = 0.5 on 2 tasks), and the interval runs from 100 (n -
    # z^2)/(n + z^2) to 100
    scored = score(
        frame(suite("m:a", [True] * tasks) + suite("m:b", [False] * tasks)),
        Bootstrap(),
        with_comparisons=True,
    )
    z2 = 1.959963984540054**2
    for row in scored.comparisons.iter_rows(named=True):
        assert row["difference"] == 100.0 and row["significant"] is separated
        assert -100 <= row["low"] <= row["difference"] <= row["high"] == 100.0
        if row["metric"] != "accuracy":  # accuracy: McNemar's exact test and the paired interval
            assert row["p_adjusted"] == pytest.approx(max(2 * 0.5**tasks, 1 / 1001))
            assert row["low"] == pytest.approx(100 * (tasks - z2) / (tasks + z2))
            assert row["interval"] == "every task favours one model: Wilson bound"
    one = score(frame(suite("m:a", [True] * tasks)), Bootstrap(resamples=50), with_comparisons=True)
    assert one.comparisons.is_empty()
    assert one.index.select("rank", "rank_set_low", "rank_set_high", "tied_group").row(0) == (
        1,
        1,
        1,
        1,
    )


@pytest.mark.slow
def test_the_family_wise_error_rate_with_identical_models_by_seeded_simulation():
    # 10 models of the same accuracy (answers drawn independently), 60 questions, 200 datasets: how
    # often is any of the 45 pairs separated (max-T step-down over the resamples and McNemar's exact
    # p)? Goal 5%.
    rng = np.random.default_rng(7)
    first, second = np.triu_indices(10, 1)
    wrong = 0
    for _ in range(200):
        right = (rng.random((10, 60)) < 0.7).astype(np.float64)
        counts = rng.multinomial(60, np.full(60, 1 / 60), size=1000).astype(np.float64)
        per_model = (100 * counts @ right.T / 60).T
        d = 100 * (right[first].mean(1) - right[second].mean(1))
        _, _, adjusted = max_t(
            d, lambda rows, m=per_model: m[first[rows]] - m[second[rows]], len(d), 1000
        )
        a_only = (right[first] * (1 - right[second])).sum(1).astype(int)
        b_only = (right[second] * (1 - right[first])).sum(1).astype(int)
        wrong += bool((np.fmax(adjusted, mcnemar_p(a_only, b_only)) < 0.05).any())
    assert wrong / 200 <= 0.06


def test_summary_carries_the_comparisons_and_each_models_rank():
    base = [i % 4 != 0 for i in range(N_TASKS)]
    far = [i % 4 == 0 for i in range(N_TASKS)]
    scored = score(
        frame(suite("m:a", base) + suite("m:c", far)),
        Bootstrap(resamples=100),
        with_comparisons=True,
    )
    summary = records.to_builtins(
        build_summary(scored.metrics, ["m:a", "m:c"], DATA, "p", 1, {}, scored)
    )
    assert [(m["rank"], m["rank_ci"], m["tied_group"]) for m in summary["models"]] == [
        (1, [1, 1], 1),
        (2, [2, 2], 2),
    ]
    metrics = [(c["eval"], c["metric"]) for c in summary["comparisons"]]
    assert metrics == [
        (None, "decision_index"),
        ("aa_omniscience_decision", "accuracy"),
        ("aa_omniscience_decision", "non_hallucination_rate"),
        ("hle_multichoice", "accuracy"),
        ("when2call", "accuracy"),
        ("wildguardtest", "f1_prompt_harm"),
        ("wildguardtest", "f1_response_refusal"),
        ("wildguardtest", "f1_response_harm"),
        ("wildguardtest", "mean_f1"),
    ]
    first = summary["comparisons"][0]
    assert set(first) == {
        "a",
        "b",
        "eval",
        "metric",
        "difference",
        "ci",
        "p_value",
        "p_adjusted",
        "significant",
        "complete",
    }
    hle = next(c for c in summary["comparisons"] if c["eval"] == "hle_multichoice")
    assert set(hle) == set(first) | {"discordant", "mcnemar_p"} and hle["discordant"] == [30, 10]
    assert summary["ranking"]["groups"] == [["m:a"], ["m:c"]]
    assert [m["rank_set"] for m in summary["models"]] == [[1, 1], [2, 2]]
    assert summary["comparison_method"]["adjustment"].startswith("max-T step-down")
    # the summary's model order, not the labels' sorted order: c before a, every pair turned round
    turned = records.to_builtins(
        build_summary(scored.metrics, ["m:c", "m:a"], DATA, "p", 1, {}, scored)
    )
    assert [(c["a"], c["b"]) for c in turned["comparisons"]] == [("m:c", "m:a")] * 9
    again = next(c for c in turned["comparisons"] if c["eval"] == "hle_multichoice")
    assert again["difference"] == -hle["difference"] and again["ci"] == [
        -hle["ci"][1],
        -hle["ci"][0],
    ]
    assert again["discordant"] == [10, 30] and again["p_adjusted"] == hle["p_adjusted"]


def test_mcnemar_is_left_out_for_a_model_of_several_epochs_and_kept_for_the_others():
    right = [i % 3 != 0 for i in range(N_TASKS)]
    other = [i % 2 == 0 for i in range(N_TASKS)]
    epochs = [{**r, "sample": s} for s in (0, 1) for r in answers("m:c", right)]  # two epochs
    scored = score(
        frame(answers("m:a", right) + answers("m:b", other) + epochs),
        Bootstrap(resamples=50),
        with_comparisons=True,
    )
    tests = {
        (r["a"], r["b"]): (r["a_only"], r["b_only"], r["mcnemar_p"])
        for r in scored.comparisons.iter_rows(named=True)
    }
    a_only = sum(x and not y for x, y in zip(right, other, strict=True))
    b_only = sum(y and not x for x, y in zip(right, other, strict=True))
    assert tests[("m:a", "m:b")] == (
        a_only,
        b_only,
        pytest.approx(binomtest(a_only, a_only + b_only).pvalue),
    )
    assert tests[("m:a", "m:c")] == (None, None, None) and tests[("m:b", "m:c")] == (
        None,
        None,
        None,
    )


def test_mcnemar_on_a_provisional_pair_holds_whatever_the_failed_answers_would_have_been():
    # 30 HLE questions. q0-9 both right; q10-21 a right, b wrong (12); q22 a wrong, b right (1);
    # q23-26 a wrong, b failed (4: b's answers could have been right); q27-29 both wrong.
    # Counting b's failed answers as wrong gives 12 against 1: p = 2 * 14 / 2**13 = 0.0034.
    # The worst case makes b right on all 4: 12 against 5, p = 2 * P(Bin(17, 1/2) <= 5)
    # = 2 * (1 + 17 + 136 + 680 + 2380 + 6188) / 2**17 = 18804 / 131072 = 0.1435: not claimed.
    rows = []
    for i in range(30):
        a_right = i < 22
        b_right = i < 10 or i == 22
        rows.append(
            choice(
                "m:a",
                "hle_multichoice",
                f"h/{i:02d}",
                "A",
                {"A": 0.8, "B": 0.2} if a_right else {"A": 0.2, "B": 0.8},
            )
        )
        if 23 <= i <= 26:
            rows.append(
                choice(
                    "m:b", "hle_multichoice", f"h/{i:02d}", "A", None, status="failed", error="x"
                )
            )
        else:
            rows.append(
                choice(
                    "m:b",
                    "hle_multichoice",
                    f"h/{i:02d}",
                    "A",
                    {"A": 0.8, "B": 0.2} if b_right else {"A": 0.2, "B": 0.8},
                )
            )
    scored = score(frame(rows), Bootstrap(resamples=200), with_comparisons=True)
    row = scored.comparisons.filter(pl.col("metric") == "accuracy").row(0, named=True)
    assert (row["a_only"], row["b_only"]) == (12, 1)  # the counts, failed answers as not right
    assert 2 * 14 / 2**13 == pytest.approx(binomtest(1, 13).pvalue)  # the counts alone
    assert row["mcnemar_p"] == pytest.approx(18804 / 131072)
    assert row["mcnemar_p"] == pytest.approx(binomtest(5, 17).pvalue)
    assert row["p_value"] == row["mcnemar_p"] and row["p_adjusted"] >= row["mcnemar_p"]
    assert row["significant"] is False and row["complete"] is False


def _asked(pattern: str, label: str) -> list[dict]:
    """Rows of ``label`` on hle_multichoice: R right, W wrong, F failed, ``.`` never asked (no row:
    an adaptive run stopped before the question, ``scoring.adaptive.asked_part``)."""
    rows = []
    for i, s in enumerate(pattern):
        if s == ".":
            continue
        probs = {"A": 0.9, "B": 0.1} if s == "R" else {"A": 0.1, "B": 0.9}
        rows.append(
            choice(
                label,
                "hle_multichoice",
                f"h/{i:02d}",
                "A",
                None if s == "F" else probs,
                status="failed" if s == "F" else "ok",
                error="x" if s == "F" else None,
            )
        )
    return rows


def test_open_pairs_and_the_worst_mcnemar_by_hand():
    from dxi.scoring.compare import open_pairs, worst_mcnemar
    from dxi.scoring.sums import build_cubes

    # a: R R W F F ; b: W F R R F  (R right, W wrong reply, F failed)
    rows = [*_asked("RRWFF", "m:a"), *_asked("WFRRF", "m:b")]
    o = open_pairs(build_cubes(frame(rows))["hle_multichoice"])
    # surely a-only: q0 (R, W) = 1; surely b-only: q2 (W, R) = 1
    # could be a-only: a open & b wrong (none) + a right & b open (q1) = 1; could be b-only: b
    # open & a wrong (none) + b right & a open (q3) = 1; both open: q4 = 1
    assert o[:, 0, 1].tolist() == [1, 1, 1] and o[:, 1, 0].tolist() == [1, 1, 1]

    def counts(*values: int) -> list[np.ndarray]:
        return [np.array([v]) for v in values]

    assert worst_mcnemar(*counts(8, 2, 0, 6, 0))[0] == 1.0
    # 2 + 1 + 2 on the smaller side; a's 9 never added
    assert worst_mcnemar(*counts(8, 2, 9, 1, 2))[0] == pytest.approx(binomtest(5, 13).pvalue)
    complete = frame(
        [
            choice(lb, "hle_multichoice", f"h/{i}", "A", {"A": 0.9, "B": 0.1})
            for lb in ("m:a", "m:b")
            for i in range(3)
        ]
    )
    assert open_pairs(build_cubes(complete)["hle_multichoice"]) is None


def test_questions_a_model_was_not_asked_are_neither_wrong_nor_open_in_its_pairs():
    """An adaptive run's parts (issue 35): c was asked all 12 questions, a and b the first 8,
    d the first 6. A question with no row of a model was never asked it: not a wrong answer in
    a pair's discordant counts, not an open one for the worst McNemar p."""
    from dxi.scoring.compare import discordant, open_pairs
    from dxi.scoring.sums import build_cubes

    patterns = {
        "m:a": "RRRRRRWW....",
        "m:b": "RRWWWWRW....",
        "m:c": "RRRRRRRRRRRR",
        "m:d": "RWRWRW......",
    }
    rows = [r for label, p in patterns.items() for r in _asked(p, label)]
    cube = build_cubes(frame(rows))["hle_multichoice"]
    d = discordant(cube)
    a, b, c, e = (cube.labels.index(x) for x in ("m:a", "m:b", "m:c", "m:d"))
    # a and b were asked the same 8: a-only q2..q5 = 4, b-only q6 = 1 (q7 both wrong)
    assert (d[a, b], d[b, a]) == (4, 1)
    assert (d[a, a], d[b, b], d[c, c], d[e, e]) == (6, 3, 12, 3)  # right answers, own part
    # parts that differ: no paired test (each figure is over its own part)
    assert d[a, c] == d[c, a] == d[a, e] == d[c, e] == d[e, c] == -1
    assert open_pairs(cube) is None  # every answer asked is a reply: nothing open
    scored = score(frame(rows), Bootstrap(resamples=200), with_comparisons=True)
    acc = scored.comparisons.filter(pl.col("metric") == "accuracy")
    ab = acc.filter((pl.col("a") == "m:a") & (pl.col("b") == "m:b")).row(0, named=True)
    assert (ab["a_only"], ab["b_only"], ab["test"]) == (4, 1, "McNemar exact")
    assert ab["mcnemar_p"] == pytest.approx(binomtest(1, 5).pvalue)  # 2·6/32 = 0.375
    assert ab["difference"] == pytest.approx(100 * (6 - 3) / 8)
    # Newcombe's table over the 8 questions both were asked: 2 both right, 1 both wrong
    lo, hi = newcombe(np.array([4]), np.array([1]), np.array([2]), np.array([1]), 0.95)
    assert (ab["low"], ab["high"]) == (pytest.approx(lo[0]), pytest.approx(hi[0]))
    ac = acc.filter((pl.col("a") == "m:a") & (pl.col("b") == "m:c")).row(0, named=True)
    assert ac["test"] != "McNemar exact" and ac["mcnemar_p"] is None and ac["a_only"] is None
    assert ac["difference"] == pytest.approx(100 * (6 / 8 - 1))


def test_an_open_answer_inside_the_part_stays_open_beside_questions_never_asked():
    """a asked 6 questions, one failed (q5); b asked 3 more (a part of its own); e the same 6 as
    a, all right: a's failed answer stays open in the pair (a, e), and the 3 questions only b was
    asked are open for no one."""
    from dxi.scoring.compare import open_pairs
    from dxi.scoring.sums import build_cubes

    rows = [
        *_asked("RWRWRF...", "m:a"),
        *_asked("RRRRRRRRR", "m:b"),
        *_asked("RRRRRR...", "m:e"),
    ]
    cube = build_cubes(frame(rows))["hle_multichoice"]
    o = open_pairs(cube)
    a, e = cube.labels.index("m:a"), cube.labels.index("m:e")
    # surely e-only: q1, q3 (a wrong, e right) = 2; could be e-only: e right and a open (q5) = 1;
    # nothing both open; the questions never asked count nowhere
    assert o[:, e, a].tolist() == [2, 1, 0] and o[:, a, e].tolist() == [0, 0, 0]
    scored = score(frame(rows), Bootstrap(resamples=200), with_comparisons=True)
    ae = (
        scored.comparisons.filter(pl.col("metric") == "accuracy")
        .filter((pl.col("a") == "m:a") & (pl.col("b") == "m:e"))
        .row(0, named=True)
    )
    # the counts with the failed answer as not right: 0 against 3 (p 2 · ½³ = 0.25); its worst
    # outcome is a right answer, concordant: 0 against the 2 sure ones, p = 2 · ½² = 0.5
    assert (ae["a_only"], ae["b_only"]) == (0, 3)
    assert ae["mcnemar_p"] == pytest.approx(0.5)


def test_newcombe_corrects_phi_for_continuity_as_method_10_does():
    """Method 10's φ is continuity-corrected (Newcombe 1998; Fagerland, Lydersen & Laake 2014):
    the tables a trial met, checked against R's biostatUZH::confIntPairedProportion (the same
    formula): (28 both right, 46, 46, 393 both wrong) of 513 gives ±3.7086 (uncorrected φ:
    ±3.6890, narrower than the method, so Bonett & Price's ±3.6898 won the hull); (5, 5, 1, 19)
    of 30 gives [-3.4791, +29.5861], whose hull with Bonett & Price's is [-4.2737, +29.5861]."""
    low, high = newcombe(
        np.array([46, 5]),
        np.array([46, 1]),
        np.array([28, 5]),
        np.array([393, 19]),
        0.95,
        hull=False,
    )
    assert [round(v, 4) for v in (*low, *high)] == [-3.7086, -3.4791, 3.7086, 29.5861]
    low, high = newcombe(
        np.array([46, 5]), np.array([46, 1]), np.array([28, 5]), np.array([393, 19]), 0.95
    )
    assert [round(v, 4) for v in (*low, *high)] == [-3.7086, -4.2737, 3.7086, 29.5861]


def test_no_pair_is_separated_beside_an_interval_that_holds_0():
    """20 tasks, a right on 80% and b on 40% (seeded): WildGuardTest's F1 difference is +43.1, its
    bootstrap step-down p_adjusted 0.012, but its interval (the hull with MOVER, there because the
    bootstrap alone undercovers an F1 difference at few questions) is [−2.6, +78.0]: the two
    disagree, and the pair is not separated (a trial met "F1 prompt harm +28.9 [−3.1, +53.1] †").
    Every separated pair's interval leaves 0 out."""
    rng = np.random.default_rng(0)
    a, b = list(rng.random(20) < 0.8), list(rng.random(20) < 0.4)
    scored = score(
        frame(suite("m:a", a) + suite("m:b", b)),
        Bootstrap(resamples=500, seed=0),
        with_comparisons=True,
    )
    rows = scored.comparisons
    mean_f1 = rows.filter(pl.col("metric") == "mean_f1").row(0, named=True)
    assert round(mean_f1["difference"], 1) == 43.1
    assert mean_f1["p_adjusted"] < 0.05 and mean_f1["low"] < 0 < mean_f1["high"]
    assert mean_f1["significant"] is False
    separated = rows.filter(pl.col("significant"))
    assert separated.height > 0  # the index and the choice evaluations' accuracies, here
    assert ((separated["low"] > 0) | (separated["high"] < 0)).all()


def test_the_views_compare_counts_open_answers_as_summary_json_does():
    """``dxi view``'s compare page takes McNemar's test at the worst outcome of the open answers
    with scoring's own counts (``compare.open_counts``, which ``open_pairs`` sums): the same p as
    summary.json's. a: R R R R R R R W F F R W, b: W W W W W R W R R F W R (F failed). Surely a
    only: q0-q4, q6, q10 = 7; surely b only: q7, q11 = 2; could be b only: q8 (b right, a open) =
    1; both open: q9 = 1. Worst outcome: 7 against 2 + 1 + 1 = 4, p = 2 · P(X ≤ 4 | 11, ½) = 2 ·
    562 / 2048 = 0.548828125; the counts as they stand (failed as not right): 7 against 3, p =
    2 · 176 / 1024 = 0.34375."""
    from dxi.scoring.compare import open_counts, open_pairs
    from dxi.scoring.sums import build_cubes
    from dxi.view.data import Browser

    patterns = {"m:a": "RRRRRRRWFFRW", "m:b": "WWWWWRWRRFWR"}
    rows = [r for label, p in patterns.items() for r in _asked(p, label)]
    cube = build_cubes(frame(rows))["hle_multichoice"]
    a, b = cube.labels.index("m:a"), cube.labels.index("m:b")
    o = open_pairs(cube)
    assert (o[:, a, b].tolist(), o[:, b, a].tolist()) == ([7, 0, 1], [2, 1, 1])
    is_open = np.array([[s == "F" for s in p] for p in patterns.values()])
    right = np.array([[s == "R" for s in p] for p in patterns.values()])
    assert open_counts(right, ~right & ~is_open, is_open)[:, 0, 1].tolist() == [7, 0, 1]
    scored = score(frame(rows), Bootstrap(resamples=200), with_comparisons=True)
    stored = (
        scored.comparisons.filter(pl.col("metric") == "accuracy")
        .filter((pl.col("a") == "m:a") & (pl.col("b") == "m:b"))
        .row(0, named=True)
    )
    assert stored["mcnemar_p"] == pytest.approx(0.548828125)
    # the view's wide frame of the same answers (``view.data._wide``): one row per question
    n = len(patterns["m:a"])
    wide = pl.DataFrame(
        {
            "task_id": [f"h/{i:02d}" for i in range(n)],
            "question_id": [f"h/{i:02d}" for i in range(n)],
            "category": ["c"] * n,
            "gold": ["A"] * n,
            "order": list(range(n)),
            **{
                f"{column}{k}": values
                for k, p in enumerate(patterns.values())
                for column, values in (
                    ("pick", [None if s == "F" else "A" if s == "R" else "B" for s in p]),
                    ("status", ["failed" if s == "F" else "ok" for s in p]),
                    ("correct", [s == "R" for s in p]),
                    ("pgold", [None] * n),
                    ("conf", [None] * n),
                )
            },
        }
    )
    view = Browser.__new__(Browser)
    view.labels, view.tasks, view.wide = list(patterns), {}, {("hle_multichoice", 0): wide}
    table, page = view.compare("hle_multichoice", "m:a", "m:b")
    assert table == {
        "both_right": 1,
        "a_only": 7,
        "b_only": 3,
        "both_wrong": 1,
        "one_asked": 0,
        "open": 2,
        "mcnemar_p": pytest.approx(0.548828125),
    }
    assert page.total == 10  # the discordant questions, listed
    assert binomtest(3, 10).pvalue == pytest.approx(0.34375)  # not the p the page takes


def test_mcnemar_is_statsmodels_exact_mcnemar():
    """``mcnemar_p`` against statsmodels' ``mcnemar(table, exact=True)`` on every pair of
    discordant counts below 40: equal to 1e-12."""
    from statsmodels.stats.contingency_tables import mcnemar

    a, b = np.meshgrid(np.arange(40), np.arange(40))
    ours = mcnemar_p(a.ravel(), b.ravel())
    theirs = [
        mcnemar([[0, x], [y, 0]], exact=True).pvalue
        for x, y in zip(a.ravel(), b.ravel(), strict=True)
    ]
    assert np.abs(ours - np.array(theirs)).max() < 1e-12


def test_a_chain_of_claims_is_one_tied_group_when_its_ends_alone_are_claimed():
    """a > b > c, with a above c claimed (8 tasks apart, all one way, on every evaluation) but
    neither a vs b nor b vs c (4 tasks net among 44 that differ, on each): the groups may
    part only where every model above is claimed above every model below, so the three are one
    group. The leader rule ({a, b} above {c}) said b is above c, which nothing claimed, and
    disagreed with b's rank set [1, 3]."""
    a = [i < 300 for i in range(400)]
    t1, t2, d, e = range(0, 4), range(4, 8), range(100, 120), range(300, 320)
    b = [(x and i not in t1 and i not in d) or i in e for i, x in enumerate(a)]
    c = [x and i not in t1 and i not in t2 for i, x in enumerate(a)]
    rows = [r for label, v in (("m:a", a), ("m:b", b), ("m:c", c)) for r in suite(label, v)]
    scored = score(frame(rows), Bootstrap(), with_breakdowns=False, with_comparisons=True)
    pairs = scored.comparisons.filter(
        (pl.col("metric") == "decision_index") & pl.col("eval").is_null()
    )
    assert pairs.select("a", "b", "significant").rows() == [
        ("m:a", "m:b", False),
        ("m:a", "m:c", True),
        ("m:b", "m:c", False),
    ]
    assert scored.index.select("label", "tied_group", "rank_set_low", "rank_set_high").rows() == [
        ("m:a", 1, 1, 2),
        ("m:b", 1, 1, 3),
        ("m:c", 1, 2, 3),
    ]


@pytest.mark.parametrize(
    ("point", "claimed", "groups"),
    [
        ([60.0, 55.0, 50.0], [(0, 2)], [1, 1, 1]),  # a chain whose ends alone are claimed
        ([60.0, 58.0, 40.0, 39.0], [(0, 2), (0, 3), (1, 2), (1, 3)], [1, 1, 2, 2]),
        ([60.0, 58.0, 40.0, 39.0], [(0, 2), (0, 3), (1, 3)], [1, 1, 1, 1]),  # 58 vs 40 not claimed
        ([39.0, 60.0, 40.0, 58.0], [(1, 2), (1, 0), (3, 2), (3, 0)], [2, 1, 2, 1]),  # any order
        ([50.0, 40.0, 30.0], [(0, 1), (0, 2), (1, 2)], [1, 2, 3]),
        ([50.0, 50.0, 30.0], [(0, 1), (0, 2), (1, 2)], [1, 1, 2]),  # equal placing: not parted
        ([50.0], [], [1]),
        ([], [], []),
    ],
)
def test_tied_groups_part_only_where_every_pair_across_is_claimed(
    point: list[float], claimed: list[tuple[int, int]], groups: list[int]
):
    a = np.array([i for i, _ in claimed], np.int64)
    b = np.array([j for _, j in claimed], np.int64)
    assert tied_groups(np.array(point, np.float64), a, b).tolist() == groups


@pytest.mark.parametrize(
    ("p", "text"),
    [
        (None, "—"),
        (0.0005, "< 0.001"),
        (0.001, "0.001"),
        (0.04995, "0.04995"),  # below 0.05, with its †: not "0.050" beside a legend of p < 0.05
        (0.0496, "0.0496"),
        (0.05, "0.050"),
        (0.0504, "0.050"),
        (0.12345, "0.123"),
    ],
)
def test_an_adjusted_p_below_the_threshold_never_shows_as_the_threshold(p: float | None, text: str):
    assert p_text(p) == text


@pytest.mark.parametrize(
    ("p", "text"),
    [(0.04995, "0.04995"), (0.0496, "0.0496"), (0.05, "0.05"), (0.00123, "0.00123"), (0.5, "0.5")],
)
def test_dxi_views_p_values_keep_three_significant_digits_but_never_read_as_the_threshold(
    p: float, text: str
):
    """``dxi view``'s form (3 significant digits) showed 0.04995 as "0.05"."""
    assert p_text(p, significant=True) == text
