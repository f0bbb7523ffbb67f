"""Paired comparisons of models and their ranks (``scoring.compare``), by hand and against scipy (a test-only
reference: scikit-learn's dependency, never the product's)."""
from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from scipy.stats import binomtest

from dxi.scoring import Bootstrap, build_summary, records, score
from dxi.scoring.compare import holm, mcnemar_p

from .answers import choice, frame, yes_no

EVALS = ("aa_omniscience_decision", "hle_multichoice", "when2call", "wildguardtest")
DATA = {name: {"files": []} for name in EVALS}
N_TASKS = 40


def answers(label: str, right: list[bool], name: str = "hle_multichoice") -> list[dict]:
    return [choice(label, name, f"{name}/{i:03d}", "A", {"A": 0.8, "B": 0.2} if ok else {"A": 0.3, "B": 0.7})
            for i, ok in enumerate(right)]


def suite(label: str, right: list[bool]) -> list[dict]:
    """Every evaluation answered with the same right/wrong pattern over its tasks (WildGuardTest: a row's
    three questions right or wrong together; gold yes on even rows)."""
    rows = [r for name in EVALS[:3] for r in answers(label, right, name)]
    for i, ok in enumerate(right):
        gold = "yes" if i % 2 == 0 else "no"
        for q in ("prompt_harmful", "response_refusal", "response_harmful"):
            rows.append(yes_no(label, f"wildguardtest/{i:03d}", q, gold, 0.9 if (gold == "yes") == ok else 0.1))
    return rows


@pytest.mark.parametrize(("a", "b"), [(0, 0), (1, 0), (0, 3), (5, 5), (7, 2), (12, 30), (150, 171), (1000, 1100),
                                      (2400, 2000), (3, 3000)])
def test_mcnemar_is_scipys_exact_two_sided_binomial_test(a: int, b: int):
    expected = binomtest(a, a + b, 0.5).pvalue if a + b else 1.0
    assert mcnemar_p(np.array([a]), np.array([b]))[0] == pytest.approx(expected, rel=1e-9, abs=1e-300)


def test_mcnemar_vectorised_matches_one_at_a_time():
    rng = np.random.default_rng(3)
    a, b = rng.integers(0, 400, 200), rng.integers(0, 400, 200)
    together = mcnemar_p(a, b)
    assert all(together[k] == pytest.approx(binomtest(int(a[k]), int(a[k] + b[k])).pvalue if a[k] + b[k] else 1.0,
                                             rel=1e-9, abs=1e-300) for k in range(200))


def test_holm_by_hand():
    # sorted: 0.005 (x4 = 0.02), 0.01 (x3 = 0.03), 0.03 (x2 = 0.06), 0.04 (x1 = 0.04, raised to 0.06: monotone)
    assert holm(np.array([0.01, 0.04, 0.03, 0.005])).tolist() == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm(np.array([0.5, np.nan, 0.6])).tolist()[0] == 1.0 and np.isnan(holm(np.array([np.nan]))[0])


def test_two_models_difference_interval_p_value_and_mcnemar_by_hand():
    rng = np.random.default_rng(11)
    a_right = rng.random(N_TASKS) < 0.7
    b_right = np.where(rng.random(N_TASKS) < 0.8, a_right, ~a_right)  # mostly the same answers
    boot = Bootstrap(resamples=500, seed=4)
    scored = score(frame(answers("m:a", list(a_right)) + answers("m:b", list(b_right))), boot, with_comparisons=True)
    row = scored.comparisons.filter(pl.col("metric") == "accuracy").row(0, named=True)
    assert (row["a"], row["b"], row["eval"]) == ("m:a", "m:b", "hle_multichoice")
    # the point difference, and the same resamples for both: resample b's accuracy is counts[b] @ right / n
    w = boot.counts("hle_multichoice", N_TASKS).astype(np.float64)
    diff = 100 * (w @ a_right - w @ b_right) / N_TASKS
    assert row["difference"] == pytest.approx(100 * (a_right.mean() - b_right.mean()))
    assert (row["low"], row["high"]) == (pytest.approx(np.quantile(diff, 0.025)), pytest.approx(np.quantile(diff, 0.975)))
    p = min(1.0, 2 * (1 + min((diff <= 0).sum(), (diff >= 0).sum())) / (500 + 1))
    assert row["p_value"] == pytest.approx(p) and row["p_holm"] == pytest.approx(p)  # one pair: Holm changes nothing
    # McNemar on the discordant answers: a right and b wrong, and the other way
    a_only, b_only = int((a_right & ~b_right).sum()), int((~a_right & b_right).sum())
    assert (row["a_only"], row["b_only"]) == (a_only, b_only)
    assert row["mcnemar_p"] == pytest.approx(binomtest(a_only, a_only + b_only).pvalue, rel=1e-9)
    assert row["complete"] is True


def test_an_identical_pair_differs_by_nothing_and_is_tied():
    right = list(np.random.default_rng(1).random(N_TASKS) < 0.5)
    scored = score(frame(suite("m:a", right) + suite("m:b", right)), Bootstrap(resamples=200), with_comparisons=True)
    for row in scored.comparisons.iter_rows(named=True):
        assert (row["difference"], row["low"], row["high"], row["p_value"], row["p_holm"]) == (0.0, 0.0, 0.0, 1.0, 1.0)
    ranks = dict(scored.index.select("label", "tied_group").iter_rows())
    assert ranks == {"m:a": 1, "m:b": 1}
    assert scored.index["rank"].to_list() == [1, 1] and scored.index["rank_high"].to_list() == [1, 1]


def test_ranks_intervals_and_tied_groups():
    # a and b close (one HLE task apart), c far below both: c is its own group, ranked 3 in every resample
    base = [i % 4 != 0 for i in range(N_TASKS)]  # 75% right
    near = list(base)
    near[1] = False  # one task fewer right
    far = [i % 4 == 0 for i in range(N_TASKS)]  # 25% right, wrong wherever the others are right
    b_rows = [r for r in suite("m:b", base) if r["eval"] != "hle_multichoice"] + answers("m:b", near)  # HLE only
    scored = score(frame(suite("m:a", base) + b_rows + suite("m:c", far)), Bootstrap(resamples=300),
                   with_comparisons=True)
    index = {r["label"]: r for r in scored.index.iter_rows(named=True)}
    assert [index[m]["rank"] for m in ("m:a", "m:b", "m:c")] == [1, 2, 3]
    # b is never above a (a tie when the one task between them is not drawn: both rank 1 then)
    assert (index["m:a"]["rank_low"], index["m:a"]["rank_high"]) == (1, 1)
    assert (index["m:b"]["rank_low"], index["m:b"]["rank_high"]) == (1, 2)
    assert (index["m:c"]["rank_low"], index["m:c"]["rank_high"]) == (3, 3)
    assert [index[m]["tied_group"] for m in ("m:a", "m:b", "m:c")] == [1, 1, 2]
    pairs = scored.comparisons.filter(pl.col("metric") == "decision_index")
    assert pairs.select("a", "b").rows() == [("m:a", "m:b"), ("m:a", "m:c"), ("m:b", "m:c")]
    holm_by_hand = holm(pairs["p_value"].to_numpy())
    assert pairs["p_holm"].to_list() == pytest.approx(holm_by_hand.tolist())
    assert pairs.filter(pl.col("b") == "m:c")["p_holm"].max() < 0.05
    # the index's difference is the difference of the two indices, each as the index table has it
    assert pairs["difference"][0] == pytest.approx(index["m:a"]["decision_index"] - index["m:b"]["decision_index"])


def test_summary_carries_the_comparisons_and_each_models_rank():
    base = [i % 4 != 0 for i in range(N_TASKS)]
    far = [i % 4 == 0 for i in range(N_TASKS)]
    scored = score(frame(suite("m:a", base) + suite("m:c", far)), Bootstrap(resamples=100), with_comparisons=True)
    summary = records.to_builtins(build_summary(scored.metrics, ["m:a", "m:c"], DATA, "p", 1, {}, scored))
    assert [(m["rank"], m["rank_ci"], m["tied_group"]) for m in summary["models"]] == [(1, [1, 1], 1), (2, [2, 2], 2)]
    metrics = [(c["eval"], c["metric"]) for c in summary["comparisons"]]
    assert metrics == [(None, "decision_index"), ("aa_omniscience_decision", "accuracy"),
                       ("aa_omniscience_decision", "non_hallucination_rate"), ("hle_multichoice", "accuracy"),
                       ("when2call", "accuracy"), ("wildguardtest", "f1_prompt_harm"), ("wildguardtest", "f1_response_refusal"),
                       ("wildguardtest", "f1_response_harm"), ("wildguardtest", "mean_f1")]
    first = summary["comparisons"][0]
    assert set(first) == {"a", "b", "eval", "metric", "difference", "ci", "p_value", "p_holm", "complete"}
    hle = next(c for c in summary["comparisons"] if c["eval"] == "hle_multichoice")
    assert set(hle) == set(first) | {"discordant", "mcnemar_p"} and hle["discordant"] == [30, 10]
    assert summary["ranking"]["groups"] == [["m:a"], ["m:c"]]


def test_mcnemar_is_left_out_for_a_model_of_several_epochs_and_kept_for_the_others():
    right = [i % 3 != 0 for i in range(N_TASKS)]
    other = [i % 2 == 0 for i in range(N_TASKS)]
    epochs = [{**r, "sample": s} for s in (0, 1) for r in answers("m:c", right)]  # two epochs
    scored = score(frame(answers("m:a", right) + answers("m:b", other) + epochs), Bootstrap(resamples=50),
                   with_comparisons=True)
    tests = {(r["a"], r["b"]): (r["a_only"], r["b_only"], r["mcnemar_p"]) for r in scored.comparisons.iter_rows(named=True)}
    a_only = sum(x and not y for x, y in zip(right, other, strict=True))
    b_only = sum(y and not x for x, y in zip(right, other, strict=True))
    assert tests[("m:a", "m:b")] == (a_only, b_only, pytest.approx(binomtest(a_only, a_only + b_only).pvalue))
    assert tests[("m:a", "m:c")] == (None, None, None) and tests[("m:b", "m:c")] == (None, None, None)
