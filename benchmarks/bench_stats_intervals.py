"""Coverage of every per-model interval (``scoring.intervals``), by seeded simulation scored with
dxi's own functions: ``python -m benchmarks stats_intervals``.

For each sample size (20 and 60 tasks of each evaluation, and the whole index:
``evals.INDEX_TASKS``) and each true value v (50, 70, 90, 95, 99, 99.5 % and the mirrored 30, 10, 5,
1, 0.5 %), ``REPLICATES`` simulated models are drawn as the labels of one set of cubes
(``scoring.sums.Cube``), tasks drawn independently from a superpopulation where every figure's true
value is v:

* HLE-MultiChoice, When2Call, AA-Omniscience-Decision: each task right with probability v; on
  Omniscience a wrong answer is an abstention ("I don't know") with probability v, so the
  non-hallucination rate's true value is v too; a second Omniscience set at 50% accuracy checks the
  non-hallucination interval where its denominator is large (``non_hallucination_rate@acc50``);
* WildGuardTest: per row and question a confusion cell with P(TP) = πv, P(FN) = P(FP) = π(1 − v)
  (recall = precision = v, so F1 = v; prevalences π = 0.45, 0.35, 0.3), the three questions of a row
  correlated (each question's cell drawn from the row's uniform with probability ½, else from its
  own);
* the Decision Index, then, is v.

Each model is scored by ``sums.eval_metrics`` and ``sums.score_intervals`` (the intervals dxi
writes, the breakdown rows' included: they are the same function over a group's tasks) and
``decision_index.index_interval``; an interval covers when low ≤ v ≤ high. Figures: per metric and
size, the smallest coverage over the true values (goal ≥ 0.93 at nominal 0.95), the intervals of
zero width (goal 0) and bounds that do not hold their point (goal 0); the whole grid goes to
``GRID_FILE``. For comparison, accuracy's plain Wilson interval (the interval before) over the same
draws.
"""

from __future__ import annotations

import time
from pathlib import Path
from statistics import NormalDist

import numpy as np
import orjson
import polars as pl

from dxi.evals import INDEX_TASKS
from dxi.scoring.calibration import LOG_LOSS_FLOOR, auroc
from dxi.scoring.decision_index import index_interval
from dxi.scoring.intervals import wilson
from dxi.scoring.sums import FLAGS, WILDGUARD_F1, Cube, eval_metrics, score_intervals

from . import Result

SEED = 31
# simulated models per cell, by size: 2,000 at 20 and 60 tasks (where coverage is hardest and a cell
# costs ~0.2 s; Monte-Carlo s.e. of a coverage of 0.95: 0.005), 500 on the whole index (the
# intervals' asymptotic regime; a cell is 7.4 million answers and ~10 s; s.e. 0.010)
REPLICATES = {"20": 2000, "60": 2000, "full": 500}
CONFIDENCE = 0.95
GOAL = 0.93
HIGH = (50.0, 70.0, 90.0, 95.0, 99.0, 99.5)
TRUE_VALUES = (*HIGH, *(100 - v for v in HIGH if v != 50))
SIZES = ("20", "60", "full")
PREVALENCE = (0.45, 0.35, 0.3)
ROW_SHARED = 0.5
GRID_FILE = Path("out/bench/stats_intervals.json")
METRICS = (
    "accuracy:hle_multichoice",
    "accuracy:when2call",
    "accuracy:aa_omniscience_decision",
    "non_hallucination_rate",
    "non_hallucination_rate@acc50",
    *WILDGUARD_F1.values(),
    "mean_f1",
    "decision_index",
    "brier",
    "log_loss",
    "auroc",
    "accuracy (plain Wilson, before)",
)


def _bits(**flags: np.ndarray) -> np.ndarray:
    out = np.zeros(len(next(iter(flags.values()))), np.uint16)
    for name, on in flags.items():
        out |= on.astype(np.uint16) << FLAGS.index(name)
    return out


def _cube(
    name: str,
    labels: list[str],
    units: list[str],
    n_tasks: int,
    t: np.ndarray,
    l: np.ndarray,  # noqa: E741
    u: np.ndarray,
    flags: np.ndarray,
    brier: np.ndarray | None = None,
    log_loss: np.ndarray | None = None,
) -> Cube:
    size = len(t)
    return Cube(
        name,
        labels,
        units,
        n_tasks,
        1,
        t,
        l,
        np.zeros(size, np.int64),
        u,
        flags,
        np.zeros(size) if brier is None else brier,
        np.zeros(size) if log_loss is None else log_loss,
        np.full(size, -1, np.int64),
        np.zeros(size),
    )


def choice_cube(
    rng: np.random.Generator,
    name: str,
    labels: list[str],
    n: int,
    accuracy: float,
    abstain: float = 0.0,
) -> Cube:
    """``len(labels)`` simulated models answering ``n`` tasks: right with probability ``accuracy``;
    a wrong answer an abstention with probability ``abstain`` (else a hallucination)."""
    r = len(labels)
    right = rng.random((r, n)) < accuracy
    abstains = ~right & (rng.random((r, n)) < abstain)
    l, t = np.divmod(np.arange(r * n), n)  # noqa: E741
    # calibrated probabilities over two options: the answer given has probability ``accuracy``, so
    # p(gold) = accuracy when right, 1 − accuracy when wrong; Brier ½Σ(p − y)² = (1 − p(gold))², its
    # true mean accuracy·(1 − accuracy); log loss −ln p(gold), true mean the binary entropy
    p_gold = np.where(right, accuracy, 1 - accuracy).ravel()
    flags = _bits(
        correct=right.ravel(), hallucinated=(~right & ~abstains).ravel(), pn=np.ones(r * n, bool)
    )
    return _cube(
        name,
        labels,
        ["all"],
        n,
        t,
        l,
        np.zeros(r * n, np.int64),
        flags,
        (1 - p_gold) ** 2,
        -np.log(np.maximum(p_gold, LOG_LOSS_FLOOR)),
    )


def auroc_frame(rng: np.random.Generator, labels: list[str], n: int, auroc: float) -> pl.DataFrame:
    """``len(labels)`` models' P(yes) over ``n`` yes/no questions (gold yes on a share
    ``PREVALENCE[0]``, at least one of each class): a positive's score ~ N(δ, 1), a negative's
    ~ N(0, 1), δ = √2·Φ⁻¹(``auroc``), so the true AUROC is ``auroc``; P(yes) the logistic function
    of the score (AUROC is a rank statistic: any monotone map gives the same)."""
    r = len(labels)
    positives = min(max(1, round(PREVALENCE[0] * n)), n - 1)
    gold = np.arange(n) < positives
    delta = np.sqrt(2) * NormalDist().inv_cdf(auroc)
    score = rng.standard_normal((r, n)) + np.where(gold, delta, 0.0)
    p_yes = 1 / (1 + np.exp(-score))
    model = np.repeat(np.arange(r), n)
    return pl.DataFrame(
        {  # strings by gathering (building r·n Python strings is the slow part)
            "label": pl.Series(labels).gather(model),
            "eval": "wildguardtest",
            "question_id": "prompt_harmful",
            "sample": 0,
            "kind": "yes_no",
            "status": "ok",
            "task_id": np.tile(np.arange(n), r),
            "gold": pl.Series(["no", "yes"]).gather(np.tile(gold.astype(np.int64), r)),
            "p_yes": p_yes.ravel(),
        }
    )


def wildguard_cube(rng: np.random.Generator, labels: list[str], n: int, f1: float) -> Cube:
    """``len(labels)`` simulated models over ``n`` WildGuardTest rows, each of the three questions
    with recall = precision = ``f1`` at its prevalence (``PREVALENCE``), a row's questions
    correlated."""
    r, q = len(labels), len(WILDGUARD_F1)
    shared = rng.random((r, n, 1))
    own = rng.random((r, n, q))
    uniform = np.where(rng.random((r, n, q)) < ROW_SHARED, shared, own)
    pi = np.array(PREVALENCE)
    edges = np.cumsum(
        np.stack([pi * f1, pi * (1 - f1), pi * (1 - f1)]), axis=0
    )  # tp | fn | fp | tn
    tp, fn = uniform < edges[0], (uniform >= edges[0]) & (uniform < edges[1])
    fp = (uniform >= edges[1]) & (uniform < edges[2])
    l, t, u = np.unravel_index(np.arange(r * n * q), (r, n, q))  # noqa: E741
    flags = _bits(correct=~(fn | fp).ravel(), tp=tp.ravel(), fp=fp.ravel(), fn=fn.ravel())
    return _cube("wildguardtest", labels, list(WILDGUARD_F1), n, t, l, u, flags)


def simulate(
    size: str, v: float, rng: np.random.Generator, replicates: int
) -> dict[str, dict[str, float]]:
    """Coverage, zero-width count and point-outside count of every metric's interval for one
    cell."""
    labels = [f"m{i}" for i in range(replicates)]
    n = {name: (INDEX_TASKS[name] if size == "full" else int(size)) for name in INDEX_TASKS}
    p = v / 100
    cubes = {
        "hle_multichoice": choice_cube(rng, "hle_multichoice", labels, n["hle_multichoice"], p),
        "when2call": choice_cube(rng, "when2call", labels, n["when2call"], p),
        "aa_omniscience_decision": choice_cube(
            rng, "aa_omniscience_decision", labels, n["aa_omniscience_decision"], p, abstain=p
        ),
        "wildguardtest": wildguard_cube(rng, labels, n["wildguardtest"], p),
    }
    estimates = {}
    for name, cube in cubes.items():
        est = eval_metrics(cube)
        score_intervals(cube, est, cube.sums(), CONFIDENCE)
        estimates[name] = est
    omni50 = choice_cube(
        rng, "aa_omniscience_decision", labels, n["aa_omniscience_decision"], 0.5, abstain=p
    )
    est50 = eval_metrics(omni50)
    score_intervals(omni50, est50, omni50.sums(), CONFIDENCE)
    index_point = sum(
        0.125 * estimates["aa_omniscience_decision"].point[m]
        for m in ("accuracy", "non_hallucination_rate")
    )
    index_point = index_point + 0.25 * (
        estimates["hle_multichoice"].point["accuracy"]
        + estimates["when2call"].point["accuracy"]
        + estimates["wildguardtest"].point["mean_f1"]
    )
    figures = {
        f"accuracy:{name}": (
            estimates[name].point["accuracy"],
            estimates[name].low["accuracy"],
            estimates[name].high["accuracy"],
        )
        for name in ("hle_multichoice", "when2call", "aa_omniscience_decision")
    }
    omni = estimates["aa_omniscience_decision"]
    figures["non_hallucination_rate"] = (
        omni.point["non_hallucination_rate"],
        omni.low["non_hallucination_rate"],
        omni.high["non_hallucination_rate"],
    )
    figures["non_hallucination_rate@acc50"] = (
        est50.point["non_hallucination_rate"],
        est50.low["non_hallucination_rate"],
        est50.high["non_hallucination_rate"],
    )
    wg = estimates["wildguardtest"]
    for m in (*WILDGUARD_F1.values(), "mean_f1"):
        figures[m] = (wg.point[m], wg.low[m], wg.high[m])
    figures["decision_index"] = (index_point, *index_interval(estimates, replicates, index_point))
    hle = estimates["hle_multichoice"]
    truth = {m: v for m in figures}
    for m in ("brier", "log_loss"):
        figures[m] = (hle.point[m], hle.low[m], hle.high[m])
    truth["brier"] = p * (1 - p)
    truth["log_loss"] = -p * np.log(p) - (1 - p) * np.log(1 - p)
    if v != 50:  # AUROC 0.5-0.995 and the mirrored 0.005-0.3 (50% is 0.5 from each side)
        table = auroc(auroc_frame(rng, labels, n["wildguardtest"], p), CONFIDENCE)
        figures["auroc"] = tuple(
            table[c].to_numpy().astype(np.float64) for c in ("auroc", "auroc_low", "auroc_high")
        )
        truth["auroc"] = p
    figures["accuracy (plain Wilson, before)"] = (
        hle.point["accuracy"],
        *wilson(hle.point["accuracy"], n["hle_multichoice"], CONFIDENCE),
    )
    out = {}
    for metric, (point, low, high) in figures.items():
        defined = ~np.isnan(point)
        point, low, high = point[defined], low[defined], high[defined]
        true = truth.get(metric, v)
        out[metric] = {
            "coverage": (
                float(np.mean((low <= true) & (true <= high))) if len(point) else float("nan")
            ),
            "zero_width": int(np.sum(high <= low)),
            "outside": int(np.sum((low > point) | (point > high))),
            "defined": int(defined.sum()),
        }
    return out


def grid(
    replicates: dict[str, int] | None = None, seed: int = SEED
) -> dict[str, dict[str, dict[str, dict[str, float]]]]:
    """The whole grid: size -> true value (as text) -> metric -> figures (``simulate``); seeded;
    ``replicates`` the simulated models per cell by size (default ``REPLICATES``)."""
    rng = np.random.default_rng(seed)
    per_size = REPLICATES if replicates is None else replicates
    return {
        size: {f"{v:g}": simulate(size, v, rng, per_size[size]) for v in TRUE_VALUES}
        for size in SIZES
    }


def run() -> list[Result]:
    started, cpu = time.perf_counter(), time.process_time()
    cells = grid()
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    GRID_FILE.parent.mkdir(parents=True, exist_ok=True)
    GRID_FILE.write_bytes(
        orjson.dumps(
            {"replicates": REPLICATES, "seed": SEED, "confidence": CONFIDENCE, "grid": cells},
            option=orjson.OPT_INDENT_2,
        )
    )
    results = []
    for metric in METRICS:
        for size in SIZES:
            by_value = {v: cells[size][v][metric] for v in cells[size] if metric in cells[size][v]}
            worst = min(by_value, key=lambda v: by_value[v]["coverage"])
            zero = sum(c["zero_width"] for c in by_value.values())
            outside = sum(c["outside"] for c in by_value.values())
            before = "before" in metric
            results.append(
                Result(
                    "stats_intervals",
                    f"{metric} coverage, n = {size}, lowest over the true values",
                    by_value[worst]["coverage"],
                    "share",
                    "" if before else f"≥ {GOAL}",
                    None
                    if before
                    else by_value[worst]["coverage"] >= GOAL and zero == 0 and outside == 0,
                    f"at a true {worst}%; {zero} of zero width, {outside} not holding the point "
                    f"({REPLICATES[size]:,} models a cell, s.e. "
                    f"{(0.95 * 0.05 / REPLICATES[size]) ** 0.5:.3f})",
                )
            )
    results.append(
        Result(
            "stats_intervals",
            "simulation time (the whole grid, CPU)",
            cpu,
            "s",
            "≤ 60 s",
            cpu <= 60,
            f"seed {SEED}; wall {elapsed:.0f} s (a shared machine's); grid in {GRID_FILE}",
        )
    )
    return results
