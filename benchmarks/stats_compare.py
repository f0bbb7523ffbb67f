"""The statistics of the paired comparisons (``scoring.compare``, ``scoring.simultaneous``), by
seeded simulation: ``python -m benchmarks stats_compare`` (and ``make bench``), about 40 s.

Figures:

* **family-wise error rate** with identical models (the same true accuracy, answers drawn
  independently): the share of simulated datasets in which any pair is separated, for accuracy (the
  max-T step-down and the exact McNemar p, as ``compare`` decides) with 10 models on 60 questions,
  and for a metric without McNemar's test (the step-down alone) with 50 models on 100 questions —
  goal ≤ 5%; beside it the studentised variant of the step-down (``max_t(studentise=True)``), which
  compare does not use;
* **coverage** of the paired-difference intervals at nominal 95%: Newcombe's (accuracy) over a grid
  of sizes (20, 60, 500) and accuracies (50% to 99.5%), and the symmetric bootstrap interval for a
  difference of F1 scores (sizes 20, 60, 500; F1 near 90% and 99%) — goal ≥ 0.93 (the lowest cell);
* **groups for 50 models whose true indices are 1 point apart**, scored on the whole data's sizes
  (500, 513, 3,423 and 835 tasks) with 1,000 resamples: the tied groups found (a border needs every
  pair across it claimed, and no pair 1 point apart is at these sizes: one group) and the rank sets'
  mean width;
* **time added to scoring** by the comparisons and ranks for those 50 models (``Scorer.result`` with
  comparisons minus without, plus the discordant counts) — goal ≤ 1 s.
"""

from __future__ import annotations

import time

import numpy as np
import polars as pl

from dxi import scoring
from dxi.scoring.compare import discordant, mcnemar_p
from dxi.scoring.intervals import contain, f1_interval
from dxi.scoring.simultaneous import (
    correlation,
    floor_width,
    max_t,
    mover_difference,
    newcombe,
    symmetric_interval,
)
from dxi.scoring.sums import build_cubes
from tests.helpers.answers import SCHEMA

from . import Result

SEED = 20250607
RESAMPLES = 1000
WHOLE = {
    "aa_omniscience_decision": 500,
    "hle_multichoice": 513,
    "when2call": 3423,
    "wildguardtest": 835,
}
INDEX_STEP = (
    1 / 0.875
)  # accuracy points per model: the index moves 0.875 x the accuracies here (module docs)


def _fwer(
    models: int,
    n: int,
    p: float,
    sims: int,
    mcnemar: bool,
    studentise: bool,
    rng: np.random.Generator,
) -> float:
    """The share of ``sims`` datasets of ``models`` identical models (accuracy ``p``, ``n``
    questions) in which any pair is separated at 5%."""
    first, second = np.triu_indices(models, 1)
    wrong = 0
    for _ in range(sims):
        right = (rng.random((models, n)) < p).astype(np.float64)
        counts = rng.multinomial(n, np.full(n, 1 / n), size=RESAMPLES).astype(np.float64)
        per_model = (100 * counts @ right.T / n).T
        d = 100 * (right[first].mean(1) - right[second].mean(1))
        _, _, adjusted = max_t(
            d,
            lambda rows, m=per_model: m[first[rows]] - m[second[rows]],
            len(d),
            RESAMPLES,
            studentise=studentise,
        )
        if mcnemar:
            a_only = (right[first] * (1 - right[second])).sum(1).astype(np.int64)
            b_only = (right[second] * (1 - right[first])).sum(1).astype(np.int64)
            adjusted = np.fmax(adjusted, mcnemar_p(a_only, b_only))
        wrong += bool((np.nan_to_num(adjusted, nan=1.0) < 0.05).any())
    return wrong / sims


def _fwer_bootstrap_t(models: int, n: int, p: float, sims: int, rng: np.random.Generator) -> float:
    """The family-wise error of the max-T step-down studentised per resample (each resample's
    difference over its own standard error, the bootstrap-t of Romano & Wolf 2005, §4), for
    accuracy, where that standard error is cheap: √((Σ w·δ² / n − (Σ w·δ / n)²) / n) from the
    resampled sums of each pair's per-question differences δ ∈ {−1, 0, 1} (floored at 1/n, one
    question's), a (resamples × questions) by (questions × pairs) product per figure. ``compare``
    does not use it: for an index or an F1 the same needs every pair's per-task influence values,
    resamples × tasks × pairs work (docs/benchmarks.md)."""
    first, second = np.triu_indices(models, 1)
    wrong = 0
    for _ in range(sims):
        right = (rng.random((models, n)) < p).astype(np.float64)
        counts = rng.multinomial(n, np.full(n, 1 / n), size=RESAMPLES).astype(np.float64)
        delta = right[first] - right[second]  # (pairs, questions)
        d = delta.mean(1)
        floor = 1 / n
        se = np.maximum(np.sqrt(np.maximum((delta**2).mean(1) - d**2, 0) / n), floor)
        m1, m2 = counts @ delta.T / n, counts @ (delta**2).T / n  # (resamples, pairs)
        se_star = np.maximum(np.sqrt(np.maximum(m2 - m1**2, 0) / n), floor)
        t = np.abs(d) / se
        z = (np.abs(m1 - d) / se_star).T  # (pairs, resamples)
        order = np.argsort(-t, kind="stable")
        suffix = np.maximum.accumulate(z[order][::-1], axis=0)[::-1]
        p_adj = np.maximum.accumulate((1 + (suffix >= t[order][:, None]).sum(1)) / (RESAMPLES + 1))
        wrong += bool((p_adj < 0.05).any())
    return wrong / sims


def _newcombe_coverage(rng: np.random.Generator, sims: int = 2000) -> tuple[float, str]:
    """The lowest coverage of Newcombe's interval over the grid, and where."""
    worst, where = 1.0, ""
    for n in (20, 60, 500):
        for p1 in (0.5, 0.7, 0.9, 0.95, 0.99, 0.995):
            for gap in (0.0, 0.01, 0.05):
                for same in (0.5, 0.8, 0.95):
                    p2 = max(p1 - gap, 0.0)
                    # correlated answers: the second model repeats the first's on a share
                    # ``same`` of the questions
                    first = rng.random((sims, n)) < p1
                    other = np.clip((p2 - same * p1) / (1 - same), 0, 1)
                    second = np.where(
                        rng.random((sims, n)) < same, first, rng.random((sims, n)) < other
                    )
                    truth = 100 * (p1 - (same * p1 + (1 - same) * other))
                    low, high = newcombe(
                        (first & ~second).sum(1),
                        (~first & second).sum(1),
                        (first & second).sum(1),
                        (~first & ~second).sum(1),
                        0.95,
                    )
                    covered = float(((low <= truth + 1e-9) & (truth - 1e-9 <= high)).mean())
                    if covered < worst:
                        worst, where = (
                            covered,
                            f"n {n}, p {p1:g} vs {p2:g}, {same:.0%} answered alike",
                        )
    return worst, where


def _index_coverage(rng: np.random.Generator, tasks: int, sims: int) -> tuple[float, float, float]:
    """The interval ``dxi score`` gives a difference of two models' Decision Indices, over ``sims``
    simulated datasets of ``tasks`` per evaluation (``scoring.planner.synthetic``: models of skill
    0.15 and 0.10, ``stats_adaptive.skill``: index about 23 and 19, tasks hard for both alike): its
    coverage of the true difference (the same models on 40,000 tasks per evaluation), the share of
    datasets whose pair is separated (``significant``) and the share separated with an interval
    holding 0 (the test and the interval disagreeing; goal 0). Each dataset is scored by
    ``scoring.score`` with its own resamples (``RESAMPLES``)."""
    from dxi.scoring.planner import synthetic

    from .stats_adaptive import skill

    models = [skill(0.15, "m:a"), skill(0.10, "m:b")]

    def scored(per_eval: int, seed: int):
        frame = synthetic(models, dict.fromkeys(WHOLE, per_eval), rng)
        filled = frame.select(
            [
                pl.col(c).cast(t)
                if c in frame.columns
                else pl.when(pl.col("eval") == "wildguardtest")
                .then(pl.lit("yes_no"))
                .otherwise(pl.lit("choice"))
                .alias(c)
                if c == "kind"
                else pl.lit(None, t).alias(c)
                for c, t in SCHEMA.items()
            ]
        )
        return scoring.score(
            filled,
            None if seed < 0 else scoring.Bootstrap(resamples=RESAMPLES, seed=seed),
            with_comparisons=seed >= 0,
        )

    whole = {
        r["label"]: r["decision_index"] for r in scored(40_000, -1).index.iter_rows(named=True)
    }
    truth = whole["m:a"] - whole["m:b"]
    covered = separated = disagree = 0
    for k in range(sims):
        row = (
            scored(tasks, SEED + k)
            .comparisons.filter(pl.col("metric") == "decision_index")
            .row(0, named=True)
        )
        covered += row["low"] <= truth <= row["high"]
        separated += row["significant"]
        disagree += row["p_adjusted"] < 0.05 and row["low"] <= 0 <= row["high"]
    return covered / sims, separated / sims, disagree / sims


def _f1_coverage(rng: np.random.Generator, sims: int = 1000) -> tuple[float, str]:
    """The lowest coverage of the interval ``compare`` gives a difference of F1 scores (the hull of
    the symmetric bootstrap interval and the MOVER interval of the two models' score-type F1
    intervals, ``simultaneous.mover_difference``) over a grid of sizes and F1 values (yes/no
    questions, half of them yes; each model right on a question with its own probability, the two
    models correlated). The ``sims`` datasets of a cell are resampled with one set of resample
    counts, as ``dxi score`` resamples every model with the same counts; one matrix product gives
    every dataset's resampled sums."""
    worst, where = 1.0, ""
    for n in (20, 60, 500):
        counts = rng.multinomial(n, np.full(n, 1 / n), size=RESAMPLES).astype(np.float32)
        for q1, q2 in ((0.9, 0.88), (0.99, 0.98), (0.995, 0.995), (0.7, 0.6)):
            # F1 = 2q / (2q + 2(1 − q)) = q: errors independent of gold, half the gold yes
            truth = 100 * (q1 - q2)
            gold = (np.arange(n) % 2 == 0)[None, :]
            a = rng.random((sims, n)) < q1
            b = np.where(
                rng.random((sims, n)) < 0.8,
                a & (rng.random((sims, n)) < q2 / q1),
                rng.random((sims, n)) < q2,
            )
            pred_a, pred_b = np.where(a, gold, ~gold), np.where(b, gold, ~gold)
            cells = [
                pred_a & gold,
                pred_a & ~gold,
                ~pred_a & gold,
                pred_b & gold,
                pred_b & ~gold,
                ~pred_b & gold,
            ]  # tp fp fn of a, then of b
            x = np.stack(cells, 0).astype(np.float32)  # (6, sims, n)
            total = x.sum(2, dtype=np.float64)  # (6, sims)
            # (6, sims, resamples): the resampled sums
            # float32 is exact (integer sums below 2**24), and F1 from them to ~1e-7 relative
            s = (x.reshape(-1, n) @ counts.T).reshape(6, sims, RESAMPLES)

            def f1(tp, fp, fn):
                with np.errstate(invalid="ignore", divide="ignore"):
                    return np.where(2 * tp + fp + fn > 0, 200 * tp / (2 * tp + fp + fn), np.nan)

            pa, pb = f1(*total[:3]), f1(*total[3:])
            reps_a, reps_b = f1(*s[:3]), f1(*s[3:])
            d = pa - pb
            low, high = symmetric_interval(d, reps_a - reps_b, 0.95, floor_width(n, 0.95))
            la, ha = contain(pa, *f1_interval(*total[:3], 0.95))
            lb, hb = contain(pb, *f1_interval(*total[3:], 0.95))
            m_low, m_high = mover_difference(
                (pa, la, ha), (pb, lb, hb), correlation(reps_a, reps_b)
            )
            low, high = np.fmin(low, m_low), np.fmax(high, m_high)
            covered = float(np.mean((low <= truth + 1e-9) & (truth - 1e-9 <= high)))
            if covered < worst:
                worst, where = covered, f"n {n}, F1 {100 * q1:g} − {100 * q2:g}"
    return worst, where


def _one_point_apart(models: int, rng: np.random.Generator) -> pl.DataFrame:
    """An answers frame (``tests.helpers.answers.SCHEMA``) of ``models`` models over ``WHOLE``'s
    task counts, model k right on each question with probability 0.97 − k·INDEX_STEP/100, so the
    true indices are 1 point apart (wrong answers are never the abstention: non-hallucination is 0
    for all; F1 at half the gold yes equals the accuracy)."""
    parts = []
    for name, n in WHOLE.items():
        questions = (
            ["prompt_harmful", "response_refusal", "response_harmful"]
            if name == "wildguardtest"
            else ["answer"]
        )
        tasks = np.repeat([f"{name}/{i:05d}" for i in range(n)], len(questions))
        qids = np.tile(questions, n)
        k = len(tasks)
        for m in range(models):
            right = rng.random(k) < 0.97 - m * INDEX_STEP / 100
            if name == "wildguardtest":
                gold = np.where(np.arange(k) // 3 % 2 == 0, "yes", "no")
                other = np.where(gold == "yes", "no", "yes")
                kind, p_right = "yes_no", 0.9
            else:
                gold, other, kind, p_right = np.full(k, "A"), np.full(k, "B"), "choice", 0.8
            predicted = np.where(right, gold, other)
            p_pred = np.full(k, p_right)
            p_yes = np.where(predicted == "yes", p_pred, 1 - p_pred) if kind == "yes_no" else None
            parts.append(
                pl.DataFrame(
                    {
                        "label": f"m:{m:02d}",
                        "eval": name,
                        "task_id": tasks,
                        "question_id": qids,
                        "sample": 0,
                        "kind": kind,
                        "status": "ok",
                        "predicted": predicted,
                        "gold": gold,
                        "p_predicted": p_pred,
                        "p_yes": p_yes,
                    }
                ).with_columns(
                    pl.concat_list(
                        pl.struct(
                            pl.col("predicted").alias("option"), pl.col("p_predicted").alias("p")
                        ),
                        pl.struct(
                            pl.when(pl.col("predicted") == pl.col("gold"))
                            .then(pl.Series(other))
                            .otherwise(pl.col("gold"))
                            .alias("option"),
                            (1 - pl.col("p_predicted")).alias("p"),
                        ),
                    ).alias("probabilities")
                )
            )
    frame = pl.concat(parts, how="diagonal_relaxed")
    frame = frame.with_columns(
        *(pl.lit(None, dtype).alias(c) for c, dtype in SCHEMA.items() if c not in frame.columns)
    )
    return frame.select(pl.col(c).cast(t) for c, t in SCHEMA.items()).with_columns(
        pl.col("predicted").eq_missing(pl.col("gold")).alias("correct")
    )


def run() -> list[Result]:
    rng = np.random.default_rng(SEED)
    started = time.perf_counter()
    whole, whole_cpu = started, time.process_time()
    fwer_acc = _fwer(10, 60, 0.7, 200, True, False, rng)
    fwer_mean = _fwer(50, 100, 0.8, 40, False, False, rng)
    fwer_studentised = _fwer(10, 60, 0.5, 100, False, True, rng)
    fwer_studentised_20 = _fwer(10, 20, 0.7, 100, False, True, rng)
    fwer_bootstrap_t = _fwer_bootstrap_t(10, 60, 0.5, 100, rng)
    fwer_bootstrap_t_20 = _fwer_bootstrap_t(10, 20, 0.7, 100, rng)
    fwer_time = time.perf_counter() - started
    newcombe_worst, newcombe_where = _newcombe_coverage(rng)
    f1_worst, f1_where = _f1_coverage(rng)
    index_50 = _index_coverage(rng, 50, 200)
    index_200 = _index_coverage(rng, 200, 150)

    answers = _one_point_apart(50, rng)
    boot = scoring.Bootstrap(resamples=RESAMPLES, seed=SEED)
    scorer = scoring.Scorer(boot)
    scorer.add(answers)
    cubes = build_cubes(answers)
    best = {"plain": (np.inf, np.inf), "compared": (np.inf, np.inf), "counted": (np.inf, np.inf)}

    def timed(name: str, work):  # keeps the best (wall, CPU) of the repeats: the machine is shared
        wall, cpu = time.perf_counter(), time.process_time()
        out = work()
        best[name] = (
            min(best[name][0], time.perf_counter() - wall),
            min(best[name][1], time.process_time() - cpu),
        )
        return out

    for _ in range(2):
        timed("plain", lambda: scorer.result(comparisons=False))
        with_ = timed("compared", lambda: scorer.result(comparisons=True))
        timed("counted", lambda: [discordant(cube) for cube in cubes.values()])
    added = best["compared"][0] - best["plain"][0] + best["counted"][0]
    added_cpu = best["compared"][1] - best["plain"][1] + best["counted"][1]
    index = with_.index
    groups = index["tied_group"].n_unique()
    width = float((index["rank_set_high"] - index["rank_set_low"] + 1).mean())
    marginal = float((index["rank_high"] - index["rank_low"] + 1).mean())
    return [
        Result(
            "stats_compare",
            "family-wise error, 10 identical models, accuracy (step-down + McNemar)",
            fwer_acc,
            "share",
            "≤ 0.05",
            fwer_acc <= 0.05,
            "60 questions at 70%, 200 seeded datasets, 1,000 resamples "
            f"(binomial s.e. ≈ 0.015); {fwer_time:.0f} s for the three error-rate figures",
        ),
        Result(
            "stats_compare",
            "family-wise error, 50 identical models, step-down alone",
            fwer_mean,
            "share",
            "≤ 0.05",
            fwer_mean <= 0.05,
            "100 questions at 80%, 1,225 pairs, 40 seeded datasets (s.e. ≈ 0.035)",
        ),
        Result(
            "stats_compare",
            "… the step-down studentised by each pair's bootstrap s.e. (not used), 10 models",
            fwer_studentised,
            "share",
            "",
            None,
            f"60 questions at 50% (100 datasets); {fwer_studentised_20:.2f} at 20 questions at "
            "70%: the standard error fixed over the resamples understates the tails of d / se",
        ),
        Result(
            "stats_compare",
            "… the step-down studentised per resample (bootstrap-t; not used), 10 models",
            fwer_bootstrap_t,
            "share",
            "",
            None,
            f"60 questions at 50% (100 datasets); {fwer_bootstrap_t_20:.2f} at 20 questions at "
            "70%: valid, but its cost grows with resamples × tasks × pairs (docs/benchmarks.md)",
        ),
        Result(
            "stats_compare",
            "coverage of the paired accuracy interval, Newcombe ∪ Bonett-Price (lowest cell)",
            newcombe_worst,
            "share",
            "≥ 0.93",
            newcombe_worst >= 0.93,
            f"nominal 0.95; n 20/60/500 × p 50-99.5% × gap 0/1/5 points × "
            f"50/80/95% answered alike, 2,000 datasets each (s.e. 0.005); lowest at "
            f"{newcombe_where}",
        ),
        Result(
            "stats_compare",
            "coverage of the F1 difference's interval, symmetric bootstrap ∪ MOVER (lowest cell)",
            f1_worst,
            "share",
            "≥ 0.93",
            f1_worst >= 0.93,
            f"nominal 0.95; n 20/60/500 × F1 90−88, 99−98, 99.5−99.5, 70−60, 1,000 datasets "
            f"each (s.e. 0.007); lowest at {f1_where}",
        ),
        Result(
            "stats_compare",
            "coverage of the Decision Index difference's interval (symmetric bootstrap), 50 tasks",
            index_50[0],
            "share",
            "",
            None,
            f"nominal 0.95; two models about 4 points apart (skill 0.15 and 0.10, tasks hard for "
            f"both alike), 50 tasks per evaluation, 200 datasets (s.e. 0.015); separated in "
            f"{index_50[1]:.2f}, its test separating it beside an interval holding 0 in {index_50[2]:.2f} "
            f"(goal 0, checked with the next figure); the test is this interval's inversion, so "
            f"at 50 tasks it errs as often as the interval misses",
        ),
        Result(
            "stats_compare",
            "coverage of the Decision Index difference's interval (symmetric bootstrap), 200 tasks",
            index_200[0],
            "share",
            "≥ 0.93",
            index_200[0] >= 0.93 and index_200[2] == 0 and index_50[2] == 0,
            f"nominal 0.95; the same models, 200 tasks per evaluation, 150 datasets (s.e. 0.018); "
            f"separated in {index_200[1]:.2f}, its test separating it beside an interval holding 0 in "
            f"{index_200[2]:.2f} (goal 0; the MOVER hull it replaced: 0.21 at 50 tasks, 0.29 at "
            f"200, coverage 1.00)",
        ),
        Result(
            "stats_compare",
            "tied groups, 50 models with true indices 1 point apart",
            groups,
            "groups",
            "",
            None,
            f"whole-data sizes ({sum(WHOLE.values()):,} tasks), 1,000 resamples; rank sets "
            f"{width:.1f} ranks wide on average (marginal rank intervals {marginal:.1f}); a border "
            "only where every pair across it is claimed",
        ),
        Result(
            "stats_compare",
            "comparisons and ranks added to scoring, 50 models (CPU)",
            added_cpu,
            "s",
            "≤ 1 s",
            added_cpu <= 1.0,
            f"{with_.comparisons.height:,} comparisons; wall {added:.3f} s (a shared machine's "
            f"wall time; CPU is the figure to read), discordant counts "
            f"{best['counted'][1]:.3f} s CPU; best of 2",
        ),
        Result(
            "stats_compare",
            "the whole statistics of the comparisons (CPU)",
            time.process_time() - whole_cpu,
            "s",
            "≤ 120 s",
            time.process_time() - whole_cpu <= 120,
            f"wall {time.perf_counter() - whole:.0f} s (a shared machine's)",
        ),
    ]


if __name__ == "__main__":
    for r in run():
        met = "" if r.met is None else r.met
        print(f"{r.figure}: {r.value:.4g} {r.unit} {r.goal} {met} — {r.note}")
