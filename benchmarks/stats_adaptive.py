"""Adaptive runs (issue 35, ``dxi run --until``): validity, saving and the planner's accuracy, by
seeded simulation over realistic models at this machine's populations (AA-Omniscience-Decision
stand-in 500, HLE-MultiChoice 513, When2Call 300 here (3,423 published), WildGuardTest 880 agreed
rows). Every simulated run calls ``scoring.sequential.standings`` and ``round_sizes`` through
``scoring.planner.simulate``, the loop ``dxi run --until`` follows.

Figures:

* **validity**: ``VALID_RUNS`` runs of ``--until precision=5``, models of four skills in turn
  (each simulated whole set asked in ``ORDERS_PER_SET`` random orders: the sequence's guarantee is
  over the order, given the set; the notes give each share's Monte-Carlo error):
  the share of runs whose whole-set index lies inside the interval at stopping (goal ≥ 0.95,
  each model), and inside at *every* look (the stronger anytime statement); ``PAIR_RUNS`` runs
  of two models about 2 index points apart under ``--until separated``: the share that ordered
  them wrongly (goal ≤ 0.05; a run that settles them orders them by their estimates).
* **saving**: ``GAP_RUNS`` runs of a pair of models 20, 10 and 5 skill points apart (about 15, 7
  and 4 index points) under ``--until separated``; ``LEADER_RUNS`` runs of 20 models with indices
  from about 17 to 54 (three pairs within half a point) under ``--until separated``: requests
  against the whole index (goal ≤ 0.40); ``--until precision=5`` for a typical model (goal ≤
  0.40); the requests each P from 1 to 10 needs beside the fixed-sample ideal (the share f of the
  set at which 1.96·S·sqrt((1 − f)/f) ≤ P, S the superpopulation standard deviation of the
  whole-set index, measured over many whole sets); the index's half-width after 25%, 50% and 75%
  of the set.
* **planner**: ``dxi plan``'s predicted requests (``scoring.planner.plan`` from a profile measured
  on one whole set) against the mean the simulated runs spent on fresh whole sets (goal within
  20%); the cost follows the requests (same tokens per request).
"""

from __future__ import annotations

import math
import time

import numpy as np

from dxi.scoring import sequential
from dxi.scoring.planner import Profile, Usage, plan, profile_of, random_order, simulate, synthetic
from dxi.scoring.sequential import Until, standings
from dxi.scoring.sums import WILDGUARD_F1

from . import Result

POPULATIONS = {
    "aa_omniscience_decision": 500,
    "hle_multichoice": 513,
    "when2call": 300,
    "wildguardtest": 880,
}
# run counts sized so that the whole benchmark takes about a minute and a half on a loaded 2-core
# machine; the Monte-Carlo error of each figure is in its note
VALID_RUNS = 240
ORDERS_PER_SET = 4  # validity: random orders of each simulated whole set (its true index once)
PAIR_RUNS = 40
LEADER_RUNS = 1
PRECISION_RUNS = 20
GAP_RUNS = 3
PLAN_RUNS = 10
SEED = 35
NAME = "adaptive"


def skill(s: float, label: str) -> Profile:
    """A model of skill ``s`` (0-1): ``s`` correct on each choice evaluation, a third of its
    wrong Omniscience answers "I don't know", WildGuardTest sensitivity and specificity
    0.45 + 0.5·s (index about 14 + 73·s: 17 at 0.08, 40 at 0.40, 54 at 0.58)."""
    return Profile(
        label,
        {"aa_omniscience_decision": s, "hle_multichoice": s, "when2call": s},
        (1 - s) / 3,
        {q: 0.45 + 0.5 * s for q in WILDGUARD_F1},
        {q: 0.45 + 0.5 * s for q in WILDGUARD_F1},
        f"skill {s:.3f}",
    )


# 20 models, indices spread as in a leaderboard (17 to 54), three pairs within half a point
LEADERBOARD = [
    0.08,
    0.12,
    0.17,
    0.21,
    0.24,
    0.245,
    0.28,
    0.31,
    0.33,
    0.335,
    0.36,
    0.39,
    0.41,
    0.43,
    0.44,
    0.445,
    0.48,
    0.51,
    0.54,
    0.58,
]
TYPICAL = 0.40


def _true_index(answers) -> dict[str, float]:
    """Each model's whole-set index: the exhausted standing's exact value."""
    order = {e: [f"{e}/{k}" for k in range(n)] for e, n in POPULATIONS.items()}
    st = standings(answers, POPULATIONS, Until("precision", 100.0), order=order)
    return {m: s.index.point for m, s in st.items()}


def _mc(share: float, runs: int) -> str:
    """The Monte-Carlo error of a share over ``runs`` runs: its standard error and the one-sided
    95% Wilson lower (for a coverage) and upper (for an error rate) bounds."""
    z = 1.645
    se = (share * (1 - share) / runs) ** 0.5
    centre = (share + z * z / (2 * runs)) / (1 + z * z / runs)
    spread = (
        z * (share * (1 - share) / runs + z * z / (4 * runs * runs)) ** 0.5 / (1 + z * z / runs)
    )
    return f"MC s.e. {se:.3f}; 95% one-sided bounds [{centre - spread:.3f}, {centre + spread:.3f}]"


def validity(rng: np.random.Generator) -> list[Result]:
    """Coverage at stopping and at every look (``precision=5``, models of four skills in turn),
    and how often ``separated`` orders a pair about 2 points apart wrongly."""
    skills = {f"skill {s:.2f}": s for s in (0.15, 0.30, TYPICAL, 0.55)}
    inside = dict.fromkeys(skills, 0)
    always = dict.fromkeys(skills, 0)
    runs = dict.fromkeys(skills, 0)
    sets: dict[str, tuple] = {}
    for k in range(VALID_RUNS):
        name = list(skills)[k % len(skills)]
        if k % (len(skills) * ORDERS_PER_SET) < len(skills):  # a fresh whole set
            ans = synthetic([skill(skills[name], "m")], POPULATIONS, rng)
            sets[name] = (ans, _true_index(ans)["m"])
        ans, truth = sets[name]
        trace: list = []
        sim = simulate(
            ans,
            POPULATIONS,
            Until("precision", 5.0),
            random_order(POPULATIONS, rng, ans),
            trace=trace,
        )
        est = sim.standing["m"].index
        runs[name] += 1
        inside[name] += est.low - 1e-9 <= truth <= est.high + 1e-9
        always[name] += all(
            t["m"].index.low - 1e-9 <= truth <= t["m"].index.high + 1e-9 for t in trace
        )
    out = []
    for name in skills:
        share = inside[name] / runs[name]
        out.append(
            Result(
                NAME,
                f"validity: index inside its interval at stopping, {name}",
                share,
                "share of runs",
                "≥ 0.95",
                share >= 0.95,
                f"{runs[name]} runs of --until precision=5 ({runs[name] // ORDERS_PER_SET} whole "
                f"sets × {ORDERS_PER_SET} orders); {_mc(share, runs[name])}",
            )
        )
        out.append(
            Result(
                NAME,
                f"validity: inside at every look, {name}",
                always[name] / runs[name],
                "share of runs",
                "≥ 0.95",
                always[name] / runs[name] >= 0.95,
                "the anytime statement: every round of the run at once; "
                + _mc(always[name] / runs[name], runs[name]),
            )
        )
    pooled = sum(inside.values()) / VALID_RUNS
    out.append(
        Result(
            NAME,
            "validity: index inside its interval at stopping, the four models pooled",
            pooled,
            "share of runs",
            "≥ 0.95",
            pooled >= 0.95,
            f"{VALID_RUNS} runs; {_mc(pooled, VALID_RUNS)}",
        )
    )
    a, b = skill(TYPICAL, "a"), skill(TYPICAL - 0.03, "b")
    wrong = decided = 0
    for _ in range(PAIR_RUNS):
        ans = synthetic([a, b], POPULATIONS, rng)
        truth = _true_index(ans)
        sim = simulate(
            ans, POPULATIONS, Until("separated", 1.0), random_order(POPULATIONS, rng, ans)
        )
        ia, ib = sim.standing["a"].index, sim.standing["b"].index
        if sim.standing["a"].rule != "exhausted":  # the run claimed their order (or a tie)
            decided += 1
            wrong += (ia.point > ib.point) != (truth["a"] > truth["b"])
    out.append(
        Result(
            NAME,
            "validity: separated orders the pair wrongly",
            wrong / PAIR_RUNS,
            "share of runs",
            "≤ 0.05",
            wrong / PAIR_RUNS <= 0.05,
            f"{PAIR_RUNS} runs of two models about 2 points apart; {decided} settled "
            f"before the data ran out; {_mc(wrong / PAIR_RUNS, PAIR_RUNS)}",
        )
    )
    return out


def saving(rng: np.random.Generator) -> tuple[list[Result], float]:
    whole = sum(POPULATIONS.values())
    profiles = [skill(s, f"m{k:02d}") for k, s in enumerate(LEADERBOARD)]
    shares: list[float] = []
    gaps: list[Result] = []
    for _ in range(LEADER_RUNS):
        ans = synthetic(profiles, POPULATIONS, rng)
        sim = simulate(
            ans, POPULATIONS, Until("separated", 1.0), random_order(POPULATIONS, rng, ans)
        )
        shares.append(sum(sum(a.values()) for a in sim.asked.values()) / (whole * len(profiles)))
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
        Result(
            NAME,
            "saving: requests of --until separated / whole index, 20 models",
            float(np.mean(shares)),
            "share",
            "≤ 0.40",
            float(np.mean(shares)) <= 0.40,
            f"{LEADER_RUNS} runs; indices 17 to 54, three pairs within half a point",
        ),
        *gaps,
    ]
    # precision: one typical model, traced to the end; each P's first settled look
    typical = skill(TYPICAL, "t")
    needed = {p: [] for p in range(1, 11)}
    widths: dict[float, list[float]] = {0.25: [], 0.5: [], 0.75: []}
    spent = []
    for _ in range(PRECISION_RUNS):
        # one run traced to the end: --until precision=P stops at the first look whose
        # half-width is at most P (the looks do not depend on P), so one trace gives every P
        ans = synthetic([typical], POPULATIONS, rng)
        trace: list = []
        order = random_order(POPULATIONS, rng, ans)
        simulate(ans, POPULATIONS, Until("precision", 0.01), order, trace=trace)
        parts = sequential._parts(ans, order)["t"]
        for f in widths:  # the index's half-width after exactly a share f of every evaluation
            head = {e: p.head(math.ceil(f * POPULATIONS[e])) for e, p in parts.items()}
            look = sequential._standings({"t": head}, POPULATIONS, Until("precision", 0.01), 0.05)
            widths[f].append(look["t"].index.half_width)
        spent.append(
            next((sum(t["t"].asked.values()) for t in trace if t["t"].index.half_width <= 5), whole)
        )
        for p in needed:
            first = next(
                (sum(t["t"].asked.values()) for t in trace if t["t"].index.half_width <= p), whole
            )
            needed[p].append(first)
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
        out.append(
            Result(
                NAME,
                f"curve: share of requests for ±{p}",
                float(np.mean(firsts)) / whole,
                "share",
                "",
                None,
                f"fixed-sample ideal {ideal:.3f}",
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
    return out


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
            "≤ 90",
            None,
            "on the shared machine",
        )
    )
    return results
