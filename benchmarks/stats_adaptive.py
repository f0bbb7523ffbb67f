"""Adaptive runs (issue 35, ``dxi run --until``): validity, saving and the planner's accuracy, by
seeded simulation over realistic models at this machine's populations (AA-Omniscience-Decision
stand-in 500, HLE-MultiChoice 513, When2Call 300 here (3,423 published), WildGuardTest 880 agreed
rows). Every simulated run calls ``scoring.sequential.standings`` and ``round_sizes`` through
``scoring.planner.simulate``, the loop ``dxi run --until`` follows.

Figures:

* **validity**: ``VALID_RUNS`` (1,000) runs of ``--until precision=5``: models of four skills,
  ``SETS_PER_SKILL`` fresh simulated whole sets each, every set asked in ``ORDERS_PER_SET``
  random orders (the sequence's guarantee is over the order, given the set): the share of runs
  whose whole-set index lies inside the interval at stopping (goal ≥ 0.95 for each model, met
  when the one-sided 95% Wilson lower bound is), and inside at *every* look (the stronger
  anytime statement); ``PAIR_RUNS`` (100) runs of two models about 2 index points apart under
  ``--until separated``, each on a fresh whole set: the share that ordered them wrongly (goal ≤
  0.05, met when the Wilson upper bound is; a run that settles them orders them by their
  estimates); ``EPOCH_SETS`` × ``ORDERS_PER_SET`` (200) runs of a typical model with 2 epochs:
  the share whose index and every metric lie inside their intervals at stopping, the truth being
  the scorer's own figure (``scoring.sums.eval_metrics``: the mean over the epochs of each
  epoch's figure). The runs go to ``WORKERS`` spawned processes, each with its own spawned seed.
* **saving**: ``GAP_RUNS`` runs of a pair of models 20, 10 and 5 skill points apart (about 15, 7
  and 4 index points) under ``--until separated``; ``LEADER_RUNS`` run of 20 models with indices
  from about 15 to 60 (the issue's example: three pairs within a point of each other) and of 10
  models 5 points apart, under ``--until separated``: requests against the whole index (goal ≤
  0.40), each beside a fixed-sample oracle's share (``fixed_sample_reference``: what a rule that
  knew every pair's true difference would need; no valid rule can be expected to do better);
  ``--until precision=5`` for a typical model (goal ≤ 0.40); the requests each P from 1 to 10
  needs beside the fixed-sample ideal (the share f of the set at which 1.96·S·sqrt((1 − f)/f) ≤
  P, S the superpopulation standard deviation of the whole-set index, measured over many whole
  sets); the index's half-width after 25%, 50% and 75% of the set.
* **planner**: ``dxi plan``'s predicted requests (``scoring.planner.plan`` from a profile measured
  on one whole set) against the mean the simulated runs spent on fresh whole sets (goal within
  20%); the cost follows the requests (same tokens per request). For ``--separate A B
  --difference 7``: the share of fresh runs that settled within the plan (80% power), and the
  plan's ``expected`` requests against the fresh runs' mean (goal within 20%).
"""

from __future__ import annotations

import math
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor
from statistics import NormalDist

import numpy as np

from dxi.scoring import sequential
from dxi.scoring.decision_index import WEIGHTS
from dxi.scoring.planner import (
    Profile,
    Usage,
    order_statistic,
    plan,
    profile_of,
    random_order,
    simulate,
    synthetic,
)
from dxi.scoring.sequential import Until, standings
from dxi.scoring.sums import WILDGUARD_F1, build_cubes, eval_metrics

from . import Result

POPULATIONS = {
    "aa_omniscience_decision": 500,
    "hle_multichoice": 513,
    "when2call": 300,
    "wildguardtest": 880,
}
VALID_SKILLS = (0.15, 0.30, 0.40, 0.55)  # validity: four models, index about 25, 36, 43, 54
SETS_PER_SKILL = 50  # fresh simulated whole sets per model
ORDERS_PER_SET = 5  # random orders of each (the guarantee is over the order, given the set)
VALID_RUNS = len(VALID_SKILLS) * SETS_PER_SKILL * ORDERS_PER_SET  # 1,000
PAIR_RUNS = 100  # --until separated on a pair about 2 points apart: its error rate
EPOCH_SETS = 40  # fresh whole sets of a typical model with 2 epochs (validity of every metric)
LEADER_RUNS = 1
ORACLE_SETS = 30  # whole sets of the leaderboard for its fixed-sample reference
PRECISION_RUNS = 20
GAP_RUNS = 10
PLAN_RUNS = 10
PLAN_CHECK_RUNS = 40  # fresh runs checking dxi plan --separate's 80% power
SEED = 35
NAME = "adaptive"
WORKERS = max(1, min(4, os.cpu_count() or 1))  # the validity runs in parallel processes


def skill(s: float, label: str) -> Profile:
    """A model of skill ``s`` (0-1): ``s`` correct on each choice evaluation, a third of its
    wrong Omniscience answers "I don't know", WildGuardTest sensitivity and specificity
    0.45 + 0.5·s (index about 14 + 73·s: 15 at 0.01, 40 at 0.36, 60 at 0.63)."""
    return Profile(
        label,
        {"aa_omniscience_decision": s, "hle_multichoice": s, "when2call": s},
        (1 - s) / 3,
        {q: 0.45 + 0.5 * s for q in WILDGUARD_F1},
        {q: 0.45 + 0.5 * s for q in WILDGUARD_F1},
        f"skill {s:.3f}",
    )


# 20 models spread as in a leaderboard, the example: indices from about 15 to 60, three
# pairs within a point of each other (skill = (index − 14)/73)
LEADER_INDICES = (
    15,
    18,
    21,
    23.5,
    24,
    27,
    30,
    32,
    34,
    34.7,
    37,
    40,
    42,
    44,
    46,
    46.8,
    50,
    53,
    56,
    60,
)
SPREAD_INDICES = (15, 20, 25, 30, 35, 40, 45, 50, 55, 60)  # 10 models 5 points apart
TYPICAL = 0.40


def _true_index(answers) -> dict[str, float]:
    """Each model's whole-set index: the exhausted standing's exact value."""
    order = {e: [f"{e}/{k}" for k in range(n)] for e, n in POPULATIONS.items()}
    st = standings(answers, POPULATIONS, Until("precision", 100.0), order=order)
    return {m: s.index.point for m, s in st.items()}


def _wilson(share: float, runs: int) -> tuple[float, float]:
    """The one-sided 95% Wilson lower and upper bounds of a share over ``runs`` runs (Wilson
    1927): the lower one for a coverage, the upper one for an error rate."""
    z = 1.645
    centre = (share + z * z / (2 * runs)) / (1 + z * z / runs)
    spread = (
        z * (share * (1 - share) / runs + z * z / (4 * runs * runs)) ** 0.5 / (1 + z * z / runs)
    )
    return centre - spread, centre + spread


def _mc(share: float, runs: int) -> str:
    """The Monte-Carlo error of a share over ``runs`` runs: its standard error and the one-sided
    95% Wilson bounds (``_wilson``)."""
    se = (share * (1 - share) / runs) ** 0.5
    lo, hi = _wilson(share, runs)
    return f"MC s.e. {se:.3f}; 95% one-sided bounds [{lo:.3f}, {hi:.3f}]"


def _validity_set(s: float, seed: np.random.SeedSequence) -> list[tuple[bool, bool]]:
    """One fresh whole set of a model of skill ``s`` asked in ``ORDERS_PER_SET`` random orders
    under ``--until precision=5``: per order, (the whole-set index inside the interval at
    stopping, inside at every look)."""
    rng = np.random.default_rng(seed)
    ans = synthetic([skill(s, "m")], POPULATIONS, rng)
    truth = _true_index(ans)["m"]
    out = []
    for _ in range(ORDERS_PER_SET):
        trace: list = []
        sim = simulate(
            ans,
            POPULATIONS,
            Until("precision", 5.0),
            random_order(POPULATIONS, rng, ans),
            trace=trace,
        )
        est = sim.standing["m"].index
        out.append(
            (
                est.low - 1e-9 <= truth <= est.high + 1e-9,
                all(t["m"].index.low - 1e-9 <= truth <= t["m"].index.high + 1e-9 for t in trace),
            )
        )
    return out


def _epochs_set(seed: np.random.SeedSequence) -> list[tuple[bool, bool]]:
    """One fresh whole set of a typical model with 2 epochs asked in ``ORDERS_PER_SET`` random
    orders under ``--until precision=5``: per order, (its index inside the interval at stopping,
    every metric inside too). The truth is the scorer's (``sums.eval_metrics`` over the whole
    set: per epoch, then the mean), computed apart from ``scoring.sequential``."""
    rng = np.random.default_rng(seed)
    ans = synthetic([skill(TYPICAL, "m")], POPULATIONS, rng, epochs=2)
    truth = {
        f"{name}.{metric}": float(v[0])
        for name, cube in build_cubes(ans).items()
        for metric, v in eval_metrics(cube).point.items()
    }
    index = sum(w * truth[f"{e}.{m}"] for (e, m), w in WEIGHTS.items())
    out = []
    for _ in range(ORDERS_PER_SET):
        st = simulate(
            ans, POPULATIONS, Until("precision", 5.0), random_order(POPULATIONS, rng, ans)
        ).standing["m"]
        inside = st.index.low - 1e-9 <= index <= st.index.high + 1e-9
        every = all(e.low - 1e-9 <= truth[k] <= e.high + 1e-9 for k, e in st.metrics.items())
        out.append((inside, inside and every))
    return out


def _pair_run(seed: np.random.SeedSequence) -> tuple[bool, bool]:
    """One run of ``--until separated`` on two models about 2 index points apart (skills 0.40
    and 0.37), each on a fresh whole set: (settled before the data ran out, ordered wrongly)."""
    rng = np.random.default_rng(seed)
    ans = synthetic([skill(TYPICAL, "a"), skill(TYPICAL - 0.03, "b")], POPULATIONS, rng)
    truth = _true_index(ans)
    sim = simulate(ans, POPULATIONS, Until("separated", 1.0), random_order(POPULATIONS, rng, ans))
    ia, ib = sim.standing["a"].index, sim.standing["b"].index
    if sim.standing["a"].rule == "exhausted":  # asked everything: no claim was made early
        return False, False
    return True, (ia.point > ib.point) != (truth["a"] > truth["b"])


def validity(rng: np.random.Generator) -> list[Result]:
    """Coverage at stopping and at every look (``precision=5``, ``VALID_RUNS`` runs: models of
    four skills, ``SETS_PER_SKILL`` fresh whole sets each, ``ORDERS_PER_SET`` orders of each),
    and how often ``separated`` orders a pair about 2 points apart wrongly (``PAIR_RUNS`` runs),
    in ``WORKERS`` processes (seeds spawned from ``rng``: the figures do not depend on them)."""
    seeds = np.random.SeedSequence(int(rng.integers(2**63))).spawn(
        len(VALID_SKILLS) * SETS_PER_SKILL + PAIR_RUNS
    )
    # a stream of their own: the figures after these (drawn from ``rng``) stay as they were
    epoch_seeds = np.random.SeedSequence([SEED, 2]).spawn(EPOCH_SETS)
    jobs = [
        (s, seeds[k * len(VALID_SKILLS) + j])
        for k in range(SETS_PER_SKILL)
        for j, s in enumerate(VALID_SKILLS)
    ]
    # spawned, not forked: a fork of a process whose Polars thread pool has run can hang
    with ProcessPoolExecutor(WORKERS, mp_context=multiprocessing.get_context("spawn")) as pool:
        sets = list(pool.map(_validity_set, *zip(*jobs, strict=True), chunksize=4))
        pairs = list(pool.map(_pair_run, seeds[len(jobs) :], chunksize=4))
        epochs = [r for rs in pool.map(_epochs_set, epoch_seeds, chunksize=4) for r in rs]
    out = []
    pooled = 0
    for s in VALID_SKILLS:
        runs = [r for (skill_, _), rs in zip(jobs, sets, strict=True) if skill_ == s for r in rs]
        inside = sum(r[0] for r in runs) / len(runs)
        always = sum(r[1] for r in runs) / len(runs)
        pooled += sum(r[0] for r in runs)
        out.append(
            Result(
                NAME,
                f"validity: index inside its interval at stopping, skill {s:.2f}",
                inside,
                "share of runs",
                "≥ 0.95 (its 95% lower bound)",
                _wilson(inside, len(runs))[0] >= 0.95,
                f"{len(runs)} runs of --until precision=5 ({SETS_PER_SKILL} whole sets × "
                f"{ORDERS_PER_SET} orders); {_mc(inside, len(runs))}",
            )
        )
        out.append(
            Result(
                NAME,
                f"validity: inside at every look, skill {s:.2f}",
                always,
                "share of runs",
                "≥ 0.95 (its 95% lower bound)",
                _wilson(always, len(runs))[0] >= 0.95,
                "the anytime statement: every round of the run at once; " + _mc(always, len(runs)),
            )
        )
    out.append(
        Result(
            NAME,
            "validity: index inside its interval at stopping, the four models pooled",
            pooled / VALID_RUNS,
            "share of runs",
            "≥ 0.95 (its 95% lower bound)",
            _wilson(pooled / VALID_RUNS, VALID_RUNS)[0] >= 0.95,
            f"{VALID_RUNS} runs; {_mc(pooled / VALID_RUNS, VALID_RUNS)}",
        )
    )
    for k, what in enumerate(("the index", "the index and every metric")):
        inside = sum(r[k] for r in epochs) / len(epochs)
        out.append(
            Result(
                NAME,
                f"validity with 2 epochs: {what} inside at stopping",
                inside,
                "share of runs",
                "≥ 0.95 (its 95% lower bound)",
                _wilson(inside, len(epochs))[0] >= 0.95,
                f"{len(epochs)} runs of --until precision=5 ({EPOCH_SETS} whole sets × "
                f"{ORDERS_PER_SET} orders) of a model of index about 40; the truth is the "
                f"scorer's mean over the epochs; {_mc(inside, len(epochs))}",
            )
        )
    decided = sum(d for d, _ in pairs)
    wrong = sum(w for _, w in pairs) / PAIR_RUNS
    out.append(
        Result(
            NAME,
            "validity: separated orders the pair wrongly",
            wrong,
            "share of runs",
            "≤ 0.05 (its 95% upper bound)",
            _wilson(wrong, PAIR_RUNS)[1] <= 0.05,
            f"{PAIR_RUNS} runs of two models about 2 points apart, each on a fresh whole set; "
            f"{decided} settled before the data ran out; {_mc(wrong, PAIR_RUNS)}",
        )
    )
    return out


def _whole_indices(answers) -> dict[str, float]:
    """Each model's index (0-100) over whole sets of ``answers``: its metrics' weighted sum,
    without intervals (``_true_index`` computes the same with them)."""
    out = {}
    for label, by_eval in sequential._parts(answers, None).items():
        points = {e: sequential._points(p, e) for e, p in by_eval.items()}
        out[label] = 100 * sum(w * points[e][m] for (e, m), w in WEIGHTS.items())
    return out


def fixed_sample_reference(profiles, rng: np.random.Generator, delta: float = 1.0) -> float:
    """What ``--until separated=Δ`` could at best save on these models, for comparison: the share
    of the whole index an oracle needs that knows every pair's true expected difference ``g``
    and the superpopulation standard deviation ``S`` of its paired whole-set difference
    (``ORACLE_SETS`` simulated whole sets), and asks each model one fixed share ``f`` of the
    set, the smallest at which a normal interval of the difference, simultaneous over the P
    pairs (Bonferroni: ``z = Φ⁻¹(1 − 0.05/(2P))``), half-width ``z·S·√((1 − f)/f)`` (finite
    population), would order every pair the model is in (half-width < |g|) or show it within
    ±Δ (|g| + half-width ≤ Δ). A model's share is its worst pair's; the figure is their mean.
    Anytime validity costs more, so no valid rule can be expected to do better."""
    labels = [p.label for p in profiles]
    values = np.array(
        [
            [v[m] for m in labels]
            for v in (
                _whole_indices(synthetic(profiles, POPULATIONS, rng)) for _ in range(ORACLE_SETS)
            )
        ]
    )
    pairs = [(a, b) for a in range(len(labels)) for b in range(a + 1, len(labels))]
    z = NormalDist().inv_cdf(1 - 0.05 / (2 * len(pairs)))
    need = np.zeros(len(labels))
    for a, b in pairs:
        d = values[:, a] - values[:, b]
        g, sd = abs(float(d.mean())), float(d.std(ddof=1))
        room = max(g, delta - g)  # the half-width that decides the pair (order, or a tie)
        # z·sd·√((1 − f)/f) ≤ room  ⇔  f ≥ 1/(1 + (room/(z·sd))²)
        f = 1.0 if room <= 0 else 1 / (1 + (room / (z * max(sd, 1e-9))) ** 2)
        need[a], need[b] = max(need[a], f), max(need[b], f)
    return float(need.mean())


def leaderboard(indices: tuple[float, ...], rng: np.random.Generator) -> list[Result]:
    """``--until separated`` on models of about these ``indices`` (``LEADER_RUNS`` runs, each on
    fresh whole sets): the requests it sends against the whole index, beside
    ``fixed_sample_reference``'s share for the same models."""
    whole = sum(POPULATIONS.values())
    profiles = [skill((i - 14) / 73, f"m{k:02d}") for k, i in enumerate(indices)]
    shares = []
    for _ in range(LEADER_RUNS):
        ans = synthetic(profiles, POPULATIONS, rng)
        sim = simulate(
            ans, POPULATIONS, Until("separated", 1.0), random_order(POPULATIONS, rng, ans)
        )
        shares.append(sum(sum(a.values()) for a in sim.asked.values()) / (whole * len(profiles)))
    spread = sorted(_whole_indices(ans).values())
    closest = sorted(b - a for a, b in zip(spread, spread[1:], strict=False))
    oracle = fixed_sample_reference(profiles, rng)
    share = float(np.mean(shares))
    n = len(profiles)
    return [
        Result(
            NAME,
            f"saving: requests of --until separated / whole index, {n} models",
            share,
            "share",
            "≤ 0.40",
            share <= 0.40,
            f"{LEADER_RUNS} run; indices {spread[0]:.0f} to {spread[-1]:.0f} (the last run's whole "
            f"sets), neighbours {closest[0]:.1f} and {closest[1]:.1f} points apart at the "
            f"closest; the fixed-sample reference needs {oracle:.2f}",
        ),
        Result(
            NAME,
            f"reference: the share a fixed-sample oracle needs to separate the {n} models",
            oracle,
            "share",
            "",
            None,
            f"knows each pair's true difference and spread, z simultaneous over the "
            f"{n * (n - 1) // 2} pairs (fixed_sample_reference): a floor for any valid rule",
        ),
    ]


def saving(rng: np.random.Generator) -> tuple[list[Result], float]:
    whole = sum(POPULATIONS.values())
    gaps: list[Result] = []
    for gap in (0.2, 0.1, 0.05):  # one pair: how the saving grows with their difference
        pair = []
        for _ in range(GAP_RUNS):
            ans = synthetic([skill(TYPICAL, "a"), skill(TYPICAL - gap, "b")], POPULATIONS, rng)
            sim = simulate(
                ans, POPULATIONS, Until("separated", 1.0), random_order(POPULATIONS, rng, ans)
            )
            pair.append(sum(sim.asked["a"].values()) / whole)
        gaps.append(
            Result(
                NAME,
                f"saving: requests of --until separated / whole index, two "
                f"models {100 * gap:.0f} skill points apart",
                float(np.mean(pair)),
                "share",
                "",
                None,
                f"{GAP_RUNS} runs",
            )
        )
    out = [
        *leaderboard(LEADER_INDICES, rng),
        *leaderboard(SPREAD_INDICES, rng),
        *gaps,
    ]
    # precision: one typical model per whole set; each P is its own run (its rounds are aimed
    # at the share predicted to settle it, ``sequential.aim``), on the same set and order
    typical = skill(TYPICAL, "t")
    needed: dict[int, list[int]] = {p: [] for p in range(1, 11)}
    widths: dict[float, list[float]] = {0.25: [], 0.5: [], 0.75: []}
    for _ in range(PRECISION_RUNS):
        ans = synthetic([typical], POPULATIONS, rng)
        order = random_order(POPULATIONS, rng, ans)
        for p in needed:
            sim = simulate(ans, POPULATIONS, Until("precision", float(p)), order)
            needed[p].append(sum(sim.asked["t"].values()))
        parts = sequential._parts(ans, order)["t"]
        for f in widths:  # the index's half-width after exactly a share f of every evaluation
            head = {e: p.head(math.ceil(f * POPULATIONS[e])) for e, p in parts.items()}
            look = sequential._standings({"t": head}, POPULATIONS, Until("precision", 0.01), 0.05)
            widths[f].append(look["t"].index.half_width)
    spent = needed[5]
    share5 = float(np.mean(spent)) / whole
    out.append(
        Result(
            NAME,
            "saving: requests of --until precision=5 / whole index, typical model",
            share5,
            "share",
            "≤ 0.40",
            share5 <= 0.40,
            f"{PRECISION_RUNS} runs of a model of index about 40",
        )
    )
    for f, hw in widths.items():
        out.append(
            Result(
                NAME,
                f"half-width of the index's interval at {100 * f:.0f}% of the set, typical model",
                float(np.mean(hw)),
                "points",
                "",
                None,
                f"{PRECISION_RUNS} runs; anytime-valid 95%",
            )
        )
    # the superpopulation spread of the whole-set index, for the fixed-sample ideal
    order = {e: [f"{e}/{k}" for k in range(n)] for e, n in POPULATIONS.items()}
    values = [
        standings(
            synthetic([typical], POPULATIONS, rng),
            POPULATIONS,
            Until("precision", 100.0),
            order=order,
        )["t"].index.point
        for _ in range(60)
    ]
    sd = float(np.std(values, ddof=1))
    out.append(
        Result(
            NAME,
            "superpopulation half-width of the whole-set index (1.96·S)",
            1.96 * sd,
            "points",
            "",
            None,
            "60 whole sets of the typical model",
        )
    )
    for p, firsts in needed.items():
        # fixed sample: 1.96·S·sqrt((1 − f)/f) ≤ p  ⇔  f ≥ 1/(1 + (p/(1.96·S))²)
        ideal = 1 / (1 + (p / (1.96 * sd)) ** 2)
        # anytime-valid at best: a linear boundary tuned to the very share it stops at, the
        # variance known, the whole α on the index, no ratio metric (Howard et al. 2021 §3):
        # sqrt(2 log(2/α))·S·sqrt((1 − f)/f) ≤ p
        anytime = 1 / (1 + (p / (math.sqrt(2 * math.log(2 / 0.05)) * sd)) ** 2)
        out.append(
            Result(
                NAME,
                f"curve: share of requests for ±{p}",
                float(np.mean(firsts)) / whole,
                "share",
                "",
                None,
                f"fixed-sample ideal {ideal:.3f}; anytime-valid ideal {anytime:.3f}",
            )
        )
    return out, float(np.mean(spent))


def planner(rng: np.random.Generator, actual_precision5: float) -> list[Result]:
    typical = skill(TYPICAL, "t")
    measured = profile_of(synthetic([typical], POPULATIONS, rng), "t")
    usage = {"t": Usage({e: (800.0, 40.0) for e in POPULATIONS}, (1.0, 4.0))}
    doc = plan([measured], POPULATIONS, Until("precision", 5.0), usage, runs=PLAN_RUNS, seed=SEED)
    predicted = doc["models"][0]["adaptive"]["requests"]
    error = predicted / actual_precision5 - 1
    out = [
        Result(
            NAME,
            "planner: predicted / spent requests, precision=5",
            1 + error,
            "ratio",
            "within 1 ± 0.20",
            abs(error) <= 0.20,
            f"plan {predicted:.0f} requests "
            f"(${doc['models'][0]['adaptive']['cost_usd']:.2f}) vs "
            f"{actual_precision5:.0f} spent; the cost follows the requests",
        )
    ]
    # separation: dxi plan --separate A B --difference 7 (80% power) against fresh runs of the two
    first = skill(TYPICAL, "t")
    second = first.shifted(7.0, "u")
    usage |= {"u": usage["t"]}
    until = Until("separated", 1.0)
    doc = plan([first, second], POPULATIONS, until, usage, runs=PLAN_RUNS, seed=SEED, quantile=0.8)
    predicted = doc["models"][0]["adaptive"]["requests"]
    seeds = np.random.SeedSequence(int(rng.integers(2**63))).spawn(PLAN_CHECK_RUNS)
    with ProcessPoolExecutor(WORKERS, mp_context=multiprocessing.get_context("spawn")) as pool:
        spent = list(pool.map(_separation_run, [(first, second)] * len(seeds), seeds))
    within = sum(x <= predicted for x in spent) / len(spent)
    expected = doc["models"][0]["expected"]["requests"]
    error = expected / float(np.mean(spent)) - 1
    out += [
        Result(
            NAME,
            "planner: fresh runs settled within the planned requests, separate at 7 points",
            within,
            "share of runs",
            f"≥ 0.80 over plans ({doc['holds']:.2f}: k/(runs + 1))",
            None,
            f"plan {predicted:.0f} requests per model (run {order_statistic(0.8, PLAN_RUNS)} of "
            f"{PLAN_RUNS} simulated runs sorted, dxi plan's default; one plan's share varies "
            f"around k/(runs + 1) as a Beta(k, runs + 1 − k), sd 0.11 here); {PLAN_CHECK_RUNS} "
            f"fresh runs spent {np.mean(spent):.0f} on average; {_mc(within, PLAN_CHECK_RUNS)}",
        ),
        Result(
            NAME,
            "planner: expected / spent requests, separate at 7 points",
            1 + error,
            "ratio",
            "within 1 ± 0.20",
            abs(error) <= 0.20,
            f"the plan's expected {expected:.0f} requests per model (the mean of its "
            f"{PLAN_RUNS} simulated runs) vs the {PLAN_CHECK_RUNS} fresh runs' mean "
            f"{np.mean(spent):.0f} (their s.e. {np.std(spent, ddof=1) / len(spent) ** 0.5:.0f})",
        ),
    ]
    return out


def _separation_run(profiles: tuple[Profile, Profile], seed: np.random.SeedSequence) -> int:
    """The requests the first of two models is sent by one ``--until separated`` run on a fresh
    whole set (``planner``'s check of ``dxi plan --separate``)."""
    rng = np.random.default_rng(seed)
    ans = synthetic(list(profiles), POPULATIONS, rng)
    sim = simulate(ans, POPULATIONS, Until("separated", 1.0), random_order(POPULATIONS, rng, ans))
    return sum(sim.asked[profiles[0].label].values())


def run() -> list[Result]:
    rng = np.random.default_rng(SEED)
    started = time.perf_counter()
    results = validity(rng)
    saved, spent5 = saving(rng)
    results += saved
    results += planner(rng, spent5)
    results.append(
        Result(
            NAME,
            "wall time",
            time.perf_counter() - started,
            "s",
            "",
            None,
            f"on the shared machine; the validity runs in {WORKERS} spawned processes",
        )
    )
    return results
