"""An audit of the conclusions ``dxi score`` publishes, by seeded simulation through the product's
own functions (``scoring.compare.compare`` over ``scoring.sums`` cubes):
``python -m benchmarks stats_audit``, about 4 minutes on one core. Models have known true
per-question probabilities (tasks of varying difficulty: a model of logit skill s is right on a task
of difficulty b with probability 1 / (1 + e^(b − s)), b ~ N(0, 1) drawn per task; a wrong
Omniscience answer a hallucination with probability ½, so every non-hallucination rate is truly 50;
WildGuardTest's questions with gold yes at 0.4), and every interval is of the superpopulation, as
documented (``docs/outputs.md``).

Figures:

* **family-wise error rate** of the claims (``significant``) per family (the index; each
  evaluation metric): a claim is false where the two models' true values are equal or ordered the
  other way. 20 models all alike (every pair null), 20 and 50 models half alike and half 0.4 logit
  apart (partly null), 20 near copies (one model's answers, each question flipped with probability
  0.02 per model: null, with few discordant answers a pair) — goal ≤ 0.05 for the largest family;
* **rank sets**: each model's ``rank_ci`` holding its true rank (1 + the models truly above), the
  lowest model's share (goal ≥ 0.95 within Monte-Carlo error), and every model's ``rank_set`` at
  once (goal ≥ 0.95): 20 models all alike, half an accuracy point apart, five tied at the top;
* **agreement** with scipy and statsmodels where they compute the same: the continuity-corrected
  Wilson interval (``scipy.stats.binomtest(...).proportion_ci(method="wilsoncc")``), the plain
  Wilson interval (``statsmodels.stats.proportion.proportion_confint(method="wilson")``) and the
  exact McNemar test (``statsmodels.stats.contingency_tables.mcnemar(exact=True)``; statsmodels is
  a test dependency, the ``test`` extra: skipped when absent; tests/test_intervals.py and
  test_compare.py hold the same checks);
* **per-model coverage and width** with three epochs (a task's score the mean of its epochs): the
  intervals' width over the spread of the estimates (2 × 1.96 × their standard deviation), a
  width above 1 being the conservative side the docs state.
"""

from __future__ import annotations

import time

import numpy as np
import polars as pl
from scipy import stats

from dxi.scoring.bootstrap import Bootstrap
from dxi.scoring.compare import compare, discordant
from dxi.scoring.intervals import score_interval, wilson
from dxi.scoring.simultaneous import mcnemar_p
from dxi.scoring.sums import WILDGUARD_F1, Cube, eval_metrics, eval_metrics_all, score_intervals

from . import Result
from .bench_stats_intervals import _bits

SEED = 20261205
CHOICE = ("aa_omniscience_decision", "hle_multichoice", "when2call")
PREVALENCE = 0.4


def _cube(name: str, units: list[str], right: np.ndarray, flags: dict[str, np.ndarray]) -> Cube:
    """A cube of labels × tasks × epochs × units answers (``right`` that shape)."""
    r, n, e, _ = right.shape
    t_l_s_u = np.unravel_index(np.arange(right.size), right.shape)
    zero = np.zeros(right.size)
    return Cube(
        name,
        [f"m{i:02d}" for i in range(r)],
        units,
        n,
        e,
        t_l_s_u[1],
        t_l_s_u[0],
        t_l_s_u[2],
        t_l_s_u[3],
        _bits(**{k: v.ravel() for k, v in flags.items()}),
        zero,
        zero,
        np.full(right.size, -1, np.int64),
        zero,
    )


def _draw(
    rng: np.random.Generator, skill: np.ndarray, n: int, epochs: int = 1, shared: bool = True
) -> dict:
    """Cubes of models of logit ``skill`` (labels,) over ``n`` tasks of every evaluation, the same
    tasks for every model (``shared``) or each model's own draw of them (independent replicates)."""
    s = skill[:, None, None, None]
    k = 1 if shared else len(skill)
    cubes = {}
    for name in CHOICE:
        p = 1 / (1 + np.exp(rng.normal(0, 1, (k, n, 1, 1)) - s))
        right = rng.random((len(skill), n, epochs, 1)) < p
        hallucinated = ~right & (rng.random(right.shape) < 0.5)
        cubes[name] = _cube(
            name,
            ["all"],
            right,
            {"correct": right, "hallucinated": hallucinated, "pn": np.ones_like(right)},
        )
    p = 1 / (1 + np.exp(rng.normal(0, 1, (k, n, 1, 3)) - s))
    gold = rng.random((k, n, 1, 3)) < PREVALENCE
    right = rng.random((len(skill), n, epochs, 3)) < p
    said = np.where(right, gold, ~gold)
    flags = {"correct": right, "tp": said & gold, "fp": said & ~gold, "fn": ~said & gold}
    cubes["wildguardtest"] = _cube("wildguardtest", list(WILDGUARD_F1), right, flags)
    return cubes


def _copies(rng: np.random.Generator, models: int, n: int, flip: float) -> dict:
    """Cubes of ``models`` near copies of one model: its answers, each question answered the other
    way with probability ``flip`` per model (the same true values: every pair null)."""
    cubes = {}
    for name in CHOICE:
        base = rng.random((1, n, 1, 1)) < 0.8
        flipped = rng.random((models, n, 1, 1)) < flip
        right = base ^ flipped
        hallucinated = ~right & np.where(
            flipped, rng.random(right.shape) < 0.5, rng.random(base.shape) < 0.5
        )
        cubes[name] = _cube(
            name,
            ["all"],
            right,
            {"correct": right, "hallucinated": hallucinated, "pn": np.ones_like(right)},
        )
    gold = rng.random((1, n, 1, 3)) < PREVALENCE
    right = (rng.random((1, n, 1, 3)) < 0.85) ^ (rng.random((models, n, 1, 3)) < flip)
    said = np.where(right, gold, ~gold)
    flags = {"correct": right, "tp": said & gold, "fp": said & ~gold, "fn": ~said & gold}
    cubes["wildguardtest"] = _cube("wildguardtest", list(WILDGUARD_F1), right, flags)
    return cubes


def _scored(cubes: dict, seed: int) -> tuple[pl.DataFrame, pl.DataFrame]:
    boot = Bootstrap(resamples=1000, seed=seed)
    estimates = eval_metrics_all(cubes, boot)
    labels = next(iter(cubes.values())).labels
    return compare(estimates, labels, boot, {k: discordant(c) for k, c in cubes.items()})


def _errors(
    rng: np.random.Generator, skill: np.ndarray | None, datasets: int, n: int = 100
) -> tuple[dict[str, float], float, np.ndarray]:
    """Per family the share of ``datasets`` with a false claim; the share with a model outside its
    simultaneous rank set; each model's share inside its marginal rank set. ``skill`` None: 20
    near copies."""
    false: dict[str, int] = {}
    outside, inside = 0, None
    for k in range(datasets):
        if skill is None:
            cubes, truth = _copies(rng, 20, n, 0.02), np.zeros(20)
        else:
            cubes, truth = _draw(rng, skill, n), skill
        pairs, ranks = _scored(cubes, SEED + k)
        place = {f"m{i:02d}": i for i in range(len(truth))}
        a = truth[[place[x] for x in pairs["a"]]]
        b = truth[[place[x] for x in pairs["b"]]]
        true_d = np.where(pairs["metric"].to_numpy() == "non_hallucination_rate", 0.0, a - b)
        d = pairs["difference"].to_numpy()
        wrong = pairs["significant"].to_numpy() & ((true_d == 0) | (np.sign(true_d) != np.sign(d)))
        family = (pairs["eval"].fill_null("index") + ":" + pairs["metric"]).to_numpy()
        for f in set(family):
            false[f] = false.get(f, 0) + bool(wrong[family == f].any())
        rank = 1 + (truth[None, :] > truth[:, None]).sum(1)
        true_rank = rank[[place[x] for x in ranks["label"]]]
        set_low, set_high = ranks["rank_set_low"].to_numpy(), ranks["rank_set_high"].to_numpy()
        outside += bool(((true_rank < set_low) | (true_rank > set_high)).any())
        held = (ranks["rank_low"].to_numpy() <= true_rank) & (
            true_rank <= ranks["rank_high"].to_numpy()
        )
        inside = held.astype(int) if inside is None else inside + held
    return {f: v / datasets for f, v in false.items()}, outside / datasets, inside / datasets


def _agreement() -> tuple[float, float | None, float | None]:
    """The largest absolute differences against scipy and statsmodels over a grid of counts."""
    cc = plain = mcnemar = 0.0
    try:
        from statsmodels.stats.contingency_tables import mcnemar as sm_mcnemar
        from statsmodels.stats.proportion import proportion_confint
    except ImportError:  # not a dependency
        proportion_confint = sm_mcnemar = None
    for n in (1, 5, 20, 60, 137, 500, 3423):
        for x in range(0, n + 1, max(1, n // 97)):
            low, high = score_interval(np.array(x), np.array(n), 0.95)
            ci = stats.binomtest(x, n).proportion_ci(0.95, method="wilsoncc")
            cc = max(cc, abs(float(low) - ci.low), abs(float(high) - ci.high))
            if proportion_confint is not None:
                wl, wh = wilson(np.array(100 * x / n), np.array(n), 0.95)
                sl, sh = proportion_confint(x, n, 0.05, method="wilson")
                plain = max(plain, abs(float(wl) / 100 - sl), abs(float(wh) / 100 - sh))
    if sm_mcnemar is not None:
        for a in range(40):
            for b in range(40):
                p = sm_mcnemar([[0, a], [b, 0]], exact=True).pvalue
                mcnemar = max(mcnemar, abs(float(mcnemar_p(np.array([a]), np.array([b]))[0]) - p))
    return (
        float(cc),
        float(plain) if proportion_confint else None,
        float(mcnemar) if sm_mcnemar else None,
    )


def _epochs(rng: np.random.Generator, replicates: int = 2000, n: int = 60) -> dict[str, tuple]:
    """Coverage and width / (2 · 1.96 · sd of the estimates) of accuracy (HLE), mean F1 and the
    non-hallucination rate, one and three epochs, ``replicates`` models of skill 1 over ``n``
    tasks."""
    b = rng.normal(0, 1, 2_000_000)
    accuracy = 100 * float(np.mean(1 / (1 + np.exp(b - 1.0))))
    q = accuracy / 100
    f1 = 100 * 2 * PREVALENCE * q / (PREVALENCE * q + PREVALENCE + (1 - PREVALENCE) * (1 - q))
    truth = {"accuracy": accuracy, "non_hallucination_rate": 50.0, "mean_f1": f1}
    out = {}
    for epochs in (1, 3):
        cubes = _draw(rng, np.full(replicates, 1.0), n, epochs, shared=False)
        for metric, name in (
            ("accuracy", "hle_multichoice"),
            ("non_hallucination_rate", "aa_omniscience_decision"),
            ("mean_f1", "wildguardtest"),
        ):
            est = eval_metrics(cubes[name])
            score_intervals(cubes[name], est, cubes[name].sums(), 0.95)
            point, low, high = est.point[metric], est.low[metric], est.high[metric]
            ok = ~np.isnan(point)
            covered = float(np.mean((low[ok] <= truth[metric]) & (truth[metric] <= high[ok])))
            ratio = float(np.mean(high[ok] - low[ok]) / (2 * 1.96 * np.std(point[ok])))
            out[f"{metric}, {epochs} epoch(s)"] = (covered, ratio)
    return out


def run() -> list[Result]:
    started = time.perf_counter()
    rng = np.random.default_rng(SEED)
    out = []
    configs = {
        "20 models alike, 100 tasks, 200 datasets": (np.zeros(20), 200),
        "20 models half alike, half 0.4 logit apart, 100 tasks, 150 datasets": (
            np.concatenate([np.zeros(10), 0.4 * np.arange(1, 11)]),
            150,
        ),
        "50 models half alike, half 0.4 logit apart, 100 tasks, 40 datasets": (
            np.concatenate([np.zeros(25), 0.4 * np.arange(1, 26)]),
            40,
        ),
        "20 near copies (2% of answers flipped each), 100 tasks, 150 datasets": (None, 150),
    }
    for what, (skill, datasets) in configs.items():
        errors, outside, _ = _errors(rng, skill, datasets)
        worst = max(errors, key=errors.get)
        se = 0.05 if datasets < 100 else 0.025
        out.append(
            Result(
                "stats_audit",
                f"family-wise error, {what}: the largest family",
                errors[worst],
                "share",
                "≤ 0.05",
                errors[worst] <= 0.05 + 2 * (0.05 * 0.95 / datasets) ** 0.5,
                f"{worst}; the index {errors['index:decision_index']:.3f}, a model outside its "
                f"rank set {outside:.3f}; goal met within 2 Monte-Carlo s.e. (±{se:.3f})",
            )
        )
    ranks = {
        "alike": np.zeros(20),
        "half an accuracy point apart": 0.02 * np.arange(20),
        "five tied at the top": np.where(np.arange(20) < 5, 1.0, -0.3 * np.arange(20)),
    }
    for what, skill in ranks.items():
        _, outside, inside = _errors(rng, skill, 100)
        out.append(
            Result(
                "stats_audit",
                f"rank_ci holding the true rank, 20 models {what}: the lowest model's share",
                float(inside.min()),
                "share",
                "≥ 0.95",
                float(inside.min()) >= 0.95 - 2 * 0.022,
                f"mean over the models {inside.mean():.3f}; every model inside its rank_set "
                f"{1 - outside:.3f}; 100 datasets (s.e. 0.022)",
            )
        )
    cc, plain, mcnemar = _agreement()
    out.append(
        Result(
            "stats_audit",
            "agreement: continuity-corrected Wilson vs scipy's wilsoncc (largest |difference|)",
            cc,
            "",
            "≤ 1e-12",
            cc <= 1e-12,
            "plain Wilson vs statsmodels: "
            + ("skipped (not installed)" if plain is None else f"{plain:.1e}")
            + "; exact McNemar vs statsmodels: "
            + ("skipped" if mcnemar is None else f"{mcnemar:.1e}"),
        )
    )
    for what, (covered, ratio) in _epochs(rng).items():
        out.append(
            Result(
                "stats_audit",
                f"per-model coverage, {what}, 60 tasks",
                covered,
                "share",
                "≥ 0.95",
                covered >= 0.95 - 2 * 0.005,
                f"width {ratio:.2f}× the estimates' spread (2,000 models)",
            )
        )
    out.append(Result("stats_audit", "wall time", time.perf_counter() - started, "s", "", None, ""))
    return out
