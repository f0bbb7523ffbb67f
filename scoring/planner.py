"""The planner of an adaptive run (``dxi plan``; issue 35): how many questions, epochs, requests,
tokens and dollars it takes to know a model's whole-set index to ±P points, or to tell two models
apart at a given true difference, and what ``--until`` saves against the whole index.

**How.** By simulation of the run itself: a model's *profile* (its share of correct answers per
evaluation, of "I don't know" on AA-Omniscience-Decision, and its sensitivity and specificity on
each WildGuardTest question) makes whole sets of answers of the run's sizes (``synthetic``), and
the adaptive loop (``simulate``) asks them down a random order in the rounds of
``sequential.round_sizes``, stopping each model where ``sequential.standings`` settles it: the
same functions ``dxi run --until`` calls, so the plan is what the run would do with answers like
the model's. The profile is measured from the model's answers in the cache (``profile_of``), or,
for a model never run, the prior ``PRIOR`` (a model of index about 46: the middle of a leaderboard
of decision models; say so to the user). Tasks differ in difficulty alike for every model (a
shared latent per task, correlation ``RHO``), which is what makes paired differences precise.

Requests are questions × epochs (one request per task and epoch, SPEC §6); tokens are the
model's mean per request of each evaluation (``dxi estimate``'s figures, ``runner.estimate``);
dollars are ``cost.cost_usd`` at the model's price, synchronous and at ``cost.batch_price``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from statistics import NormalDist

import numpy as np
import polars as pl

from . import sequential
from .cost import batch_price, cost_usd
from .sequential import Standing, Until, round_sizes
from .sums import OMNISCIENCE, WILDGUARD, WILDGUARD_F1

RHO = 0.5  # the share of a task's latent that every model shares (tasks are hard for all alike)
POSITIVES = {"prompt_harmful": 0.418, "response_refusal": 0.285, "response_harmful": 0.163}
"""WildGuardTest's share of gold "yes" per question, measured on the 880 agreed rows of
../shared/data (the suite's own gold is used where the command has it)."""
CHOICE_EVALS = ("aa_omniscience_decision", "hle_multichoice", "when2call")


@dataclass(frozen=True)
class Profile:
    """What one model's answers look like: ``accuracy`` per choice evaluation (share correct,
    0-1), ``idk`` its share of "I don't know" on AA-Omniscience-Decision (0-1), and per
    WildGuardTest question its ``sensitivity`` (P(yes | gold yes)) and ``specificity``
    (P(no | gold no)); ``source`` says where it comes from (the cache, or the prior)."""

    label: str
    accuracy: dict[str, float]
    idk: float
    sensitivity: dict[str, float]
    specificity: dict[str, float]
    source: str = "prior"

    def whose(self) -> str:
        """``source`` naming this model, for another model's profile made of its answers
        (``shifted``): "<label>'s answers in the cache", "the prior for <label> (...)"."""
        if self.source == CACHED:
            return f"{self.label}'s answers in the cache"
        if self.source == PRIOR.source:
            return f"the prior for {self.label} ({PRIOR_SHARES})"
        return f"{self.label}'s profile ({self.source})"

    def shifted(self, points: float, label: str) -> Profile:
        """The same model ``points`` index points lower (every share moved by points/100, kept in
        [0.01, 0.99]), named ``label``: the second model of a separation plan. Its ``source``
        names this model (``whose``): the answers are this model's, not ``label``'s own."""
        d = points / 100

        def move(v: float) -> float:
            return float(min(0.99, max(0.01, v - d)))

        return replace(
            self,
            label=label,
            accuracy={k: move(v) for k, v in self.accuracy.items()},
            sensitivity={k: move(v) for k, v in self.sensitivity.items()},
            specificity={k: move(v) for k, v in self.specificity.items()},
            source=f"{self.whose()}, {points:g} point{'' if points == 1 else 's'} lower",
        )


CACHED = "its answers in the cache"  # a profile's source: measured by ``profile_of``
PRIOR_SHARES = (
    "40% correct on each choice evaluation, 20% 'I don't know', WildGuardTest sensitivity 0.70 "
    "and specificity 0.85; index about 46"
)
PRIOR = Profile(
    "prior",
    {e: 0.4 for e in CHOICE_EVALS},
    0.2,
    {q: 0.7 for q in WILDGUARD_F1},
    {q: 0.85 for q in WILDGUARD_F1},
    f"prior: {PRIOR_SHARES}",
)


def profile_of(answers: pl.DataFrame, label: str) -> Profile:
    """The profile measured from one model's answers (``scoring.pipeline.answers``; its replies
    only, failed and missing answers left out). Raises ValueError when the model has no reply of
    some evaluation of the index."""
    ans = answers.filter(
        (pl.col("label").cast(pl.String) == label)
        & ~pl.col("status").cast(pl.String).is_in(["failed", "missing"])
    )
    pred, gold = pl.col("predicted").cast(pl.String), pl.col("gold").cast(pl.String)
    acc, sens, spec = {}, {}, {}
    idk = 0.0
    for e in CHOICE_EVALS:
        part = ans.filter(pl.col("eval").cast(pl.String) == e)
        if part.is_empty():
            raise ValueError(f"{label}: no reply of {e} in the cache")
        acc[e] = float(part.select(pred.eq_missing(gold).mean()).item())
        if e == OMNISCIENCE:
            idk = float(part.select((pred == "E").fill_null(False).mean()).item())
    part = ans.filter(pl.col("eval").cast(pl.String) == WILDGUARD)
    if part.is_empty():
        raise ValueError(f"{label}: no reply of {WILDGUARD} in the cache")
    for q in WILDGUARD_F1:
        qa = part.filter(pl.col("question_id").cast(pl.String) == q)
        yes, no = qa.filter(gold == "yes"), qa.filter(gold == "no")
        sens[q] = float(yes.select((pred == "yes").fill_null(False).mean()).item() or 0.0)
        spec[q] = float(no.select((pred == "no").fill_null(False).mean()).item() or 0.0)
    return Profile(label, acc, idk, sens, spec, CACHED)


# ---------------------------------------------------------------------------------------------
# whole sets of answers, and the adaptive loop


def synthetic(
    profiles: Sequence[Profile],
    populations: Mapping[str, int],
    rng: np.random.Generator,
    *,
    positives: Mapping[str, float] = POSITIVES,
    epochs: int = 1,
    rho: float = RHO,
) -> pl.DataFrame:
    """Whole sets of answers, one row per (model, question, epoch) in the shape of
    ``scoring.pipeline.answers`` (label, eval, task_id, question_id, sample, status "ok",
    predicted, gold): each model's correct answers drawn with its profile's shares through a
    latent ``sqrt(rho)·d_task + sqrt(1 − rho)·e_model`` (``d`` shared by every model: hard tasks
    are hard for all). Task ids are ``<eval>/<k>``."""
    inv = NormalDist().inv_cdf
    frames = []
    for e, n in populations.items():
        questions = list(WILDGUARD_F1) if e == WILDGUARD else ["answer"]
        for q in questions:
            d = rng.standard_normal(n)
            gold_yes = rng.random(n) < positives.get(q, 0.5) if e == WILDGUARD else None
            for p in profiles:
                for s in range(epochs):
                    z = np.sqrt(rho) * d + np.sqrt(1 - rho) * rng.standard_normal(n)
                    if e == WILDGUARD:
                        cut = [
                            inv(min(max(v, 1e-6), 1 - 1e-6))
                            for v in (p.sensitivity[q], p.specificity[q])
                        ]
                        right = z < np.where(gold_yes, cut[0], cut[1])
                        gold = np.where(gold_yes, "yes", "no")
                        pred = np.where(right, gold, np.where(gold_yes, "no", "yes"))
                    else:
                        acc = p.accuracy.get(e, 0.4)
                        right = z < inv(min(max(acc, 1e-6), 1 - 1e-6))
                        gold = np.full(n, "A")
                        wrong = "B"
                        if e == OMNISCIENCE:  # among the wrong, "I don't know" at its share
                            share = min(1.0, p.idk / max(1e-9, 1 - acc))
                            wrong = np.where(rng.random(n) < share, "E", "B")
                        pred = np.where(right, "A", wrong)
                    frames.append(
                        {
                            "label": [p.label] * n,
                            "eval": [e] * n,
                            "task_id": [f"{e}/{k}" for k in range(n)],
                            "question_id": [q] * n,
                            "sample": np.full(n, s, np.int32),
                            "status": ["ok"] * n,
                            "predicted": pred,
                            "gold": gold,
                        }
                    )  # columns, concatenated once: a frame per column block costs ~2 ms each
    return pl.DataFrame(
        {c: np.concatenate([np.asarray(f[c]) for f in frames]) for c in frames[0]}
    ).with_columns(pl.col("sample").cast(pl.Int32))


def random_order(
    populations: Mapping[str, int], rng: np.random.Generator, answers: pl.DataFrame | None = None
) -> dict[str, list[str]]:
    """A random asking order of each evaluation's tasks (``<eval>/<k>``): uniform, except
    WildGuardTest, stratified by its prompt-harm label (from ``answers``' gold) so that its
    label mix progresses at the same rate, as the run's order is."""
    order = {}
    for e, n in populations.items():
        perm = rng.permutation(n)
        if e == WILDGUARD and answers is not None:
            gold = (
                answers.filter((pl.col("eval") == e) & (pl.col("question_id") == "prompt_harmful"))
                .unique("task_id")
                .sort("task_id")
            )
            yes = {
                int(t.split("/")[1])
                for t, g in gold.select("task_id", "gold").iter_rows()
                if g == "yes"
            }
            a = [k for k in perm if k in yes]
            b = [k for k in perm if k not in yes]
            # interleave by the share of each label so far
            merged, i, j = [], 0, 0
            while i < len(a) or j < len(b):
                if j >= len(b) or (i < len(a) and i * len(b) <= j * len(a)):
                    merged.append(a[i])
                    i += 1
                else:
                    merged.append(b[j])
                    j += 1
            perm = np.array(merged)
        order[e] = [f"{e}/{k}" for k in perm]
    return order


@dataclass
class Simulated:
    """One simulated adaptive run: per model its ``asked`` tasks per evaluation, the ``rounds``
    it took part in and its final ``standing``."""

    asked: dict[str, dict[str, int]] = field(default_factory=dict)
    rounds: dict[str, int] = field(default_factory=dict)
    standing: dict[str, Standing] = field(default_factory=dict)


def simulate(
    answers: pl.DataFrame,
    populations: Mapping[str, int],
    until: Until,
    order: Mapping[str, Sequence[str]],
    *,
    alpha: float = 0.05,
    max_rounds: int = 200,
    trace: list | None = None,
) -> Simulated:
    """The adaptive loop of ``dxi run --until`` over whole sets of ``answers`` (every task): each
    round asks every running model ``sequential.round_sizes`` more tasks down ``order``, then
    ``sequential.standings`` over what each model was asked settles some (a round stops where
    ``sequential.aim`` predicts the next model settles, as the run's do); the loop ends when every
    model is settled. ``trace``, when given, receives each look's standings. The answers are split
    into per-task components once (``sequential._parts``); each look takes every model's first asked
    tasks of them (``_Part.head``), what ``standings`` over the asked rows computes."""
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha}")
    parts = sequential._parts(answers, order)
    labels = sorted(parts)
    rank = {e: {t: k for k, t in enumerate(ts)} for e, ts in order.items()}
    # per model and evaluation: the asking position of each of its tasks (tasks not in the order
    # are never asked)
    positions = {
        m: {
            e: np.array([rank.get(e, {}).get(t, len(p.tasks) + 10**9) for t in p.tasks])
            for e, p in by_eval.items()
        }
        for m, by_eval in parts.items()
    }
    asked = {m: {e: 0 for e in populations} for m in labels}
    out = Simulated()
    running = set(labels)
    result: dict[str, Standing] = {}
    for k in range(max_rounds):
        aimed = sequential.aim(result[m] for m in running if m in result)
        for m in running:
            sizes = round_sizes(asked[m], populations, aim=aimed)
            asked[m] = {e: asked[m][e] + sizes[e] for e in populations}
            out.rounds[m] = k + 1
        view = {
            m: {
                e: p.head(int(np.searchsorted(positions[m][e], asked[m].get(e, 0))))
                for e, p in by_eval.items()
                if int(np.searchsorted(positions[m][e], asked[m].get(e, 0)))
            }
            for m, by_eval in parts.items()
        }
        result = sequential._standings(view, populations, until, alpha)
        if trace is not None:
            trace.append(result)
        for m, st in result.items():
            if m in running and st.settled:
                running.discard(m)
                out.standing[m] = st
        if not running:
            break
    for m in labels:
        out.asked[m] = asked[m]
        out.standing.setdefault(m, result[m])
    return out


# ---------------------------------------------------------------------------------------------
# the plan


@dataclass(frozen=True)
class Usage:
    """A model's mean tokens per request of each evaluation (input, output) and its price
    (``cost.cost_usd``'s tuple, USD per million tokens; None: unknown) with its batch price.
    ``cached``: per evaluation, the requests the cache already holds among the first k tasks of
    the run's order, k = 0..N (cumulative, N + 1 entries; none: nothing cached); ``new_tokens``:
    per evaluation, the mean tokens of a request it does not hold (default ``tokens``). Cached
    requests are not sent again: they cost nothing, the new ones are priced."""

    tokens: dict[str, tuple[float, float]]
    price: tuple[float | None, ...] | None
    batch: tuple[float | None, ...] | None = None
    cached: dict[str, Sequence[int]] = field(default_factory=dict)
    new_tokens: dict[str, tuple[float, float]] | None = None

    def cached_in(self, asked: Mapping[str, float]) -> dict[str, int]:
        """The cached requests among the first ``asked[e]`` tasks of each evaluation's order."""
        out = {}
        for e, k in asked.items():
            cum = self.cached.get(e)
            out[e] = 0 if not cum else int(cum[min(int(k), len(cum) - 1)])
        return out


def spend(
    questions: Mapping[str, float],
    epochs: int,
    usage: Usage,
    cached: Mapping[str, float] | None = None,
) -> dict:
    """Requests, tokens and dollars (synchronous and batch) of asking ``questions`` tasks per
    evaluation for ``epochs`` epochs: requests = tasks × epochs, of which ``cached`` (per
    evaluation; default none) the cache holds and ``new_requests`` the rest; tokens of every
    request at ``usage``'s means; dollars those of the new requests only (``new_input_tokens``,
    ``new_output_tokens``, at ``usage.new_tokens``' means): what the run spends; None without a
    price."""
    cached = cached or {}
    requests = sum(questions.values()) * epochs
    tin = sum(q * epochs * usage.tokens.get(e, (0.0, 0.0))[0] for e, q in questions.items())
    tout = sum(q * epochs * usage.tokens.get(e, (0.0, 0.0))[1] for e, q in questions.items())
    new = {e: max(0.0, q * epochs - cached.get(e, 0)) for e, q in questions.items()}
    per = usage.tokens if usage.new_tokens is None else usage.new_tokens
    nin = sum(n * per.get(e, (0.0, 0.0))[0] for e, n in new.items())
    nout = sum(n * per.get(e, (0.0, 0.0))[1] for e, n in new.items())
    price = usage.price
    batch = usage.batch if usage.batch is not None else batch_price(price)
    return {
        "requests": requests,
        "cached_requests": requests - sum(new.values()),
        "new_requests": sum(new.values()),
        "input_tokens": tin,
        "output_tokens": tout,
        "new_input_tokens": nin,
        "new_output_tokens": nout,
        "cost_usd": None if price is None else cost_usd(nin, nout, *price),
        "batch_cost_usd": None if batch is None else cost_usd(nin, nout, *batch),
    }


def order_statistic(quantile: float, runs: int) -> int:
    """Which of ``runs`` simulated runs, counted from the smallest (1-based), a plan for
    ``quantile`` q takes: k = ⌈q·(runs + 1)⌉, at most ``runs``. The runs and a fresh run are
    exchangeable, so a fresh run falls at or below the k-th smallest with probability
    k/(runs + 1) ≥ q when k ≤ runs (the conformal quantile: Vovk, Gammerman & Shafer 2005,
    "Algorithmic learning in a random world"; Lei et al. 2018, JASA 113:1094-1111, §2.1). The
    in-sample q-quantile (the ⌈q·runs⌉-th) holds with probability ⌈q·runs⌉/(runs + 1) only:
    8/11 = 0.73 for the 80th percentile of 10 runs, as the benchmark measured."""
    return max(1, min(runs, math.ceil(quantile * (runs + 1) - 1e-9)))


def runs_for(quantile: float) -> int | None:
    """The fewest simulated runs whose ``order_statistic`` holds a fresh run with probability at
    least ``quantile`` (runs/(runs + 1) ≥ q: ⌈q/(1 − q)⌉); None for q = 1, which no number
    reaches."""
    return None if quantile >= 1 else math.ceil(quantile / (1 - quantile) - 1e-9)


def plan(
    profiles: Sequence[Profile],
    populations: Mapping[str, int],
    until: Until,
    usage: Mapping[str, Usage],
    *,
    epochs: int = 1,
    runs: int = 10,
    seed: int = 0,
    quantile: float | None = None,
    positives: Mapping[str, float] = POSITIVES,
    alpha: float = 0.05,
) -> dict:
    """The plan for ``profiles`` under ``until``: ``runs`` simulated adaptive runs (seeded), and
    per model the questions per evaluation it takes (their mean over the runs, or with
    ``quantile`` q the run whose total is the ``order_statistic`` of the runs: 0.8 for "with 80%
    power"), with ``spend``'s requests, tokens and dollars (``adaptive``), the same for the whole
    index, the saving (1 − adaptive/whole requests) and ``expected``: ``spend`` of the mean
    questions over the runs, what a run costs on average (with no quantile, ``adaptive``
    itself). With a quantile the plan also gives ``holds``: the probability that a fresh run
    needs no more than the plan (k/(runs + 1)). Raises ValueError for no profile, ``runs`` < 1
    or a quantile outside (0, 1]."""
    if not profiles:
        raise ValueError("no model to plan for")
    if runs < 1:
        raise ValueError(f"runs must be at least 1, got {runs}")
    if quantile is not None and not 0 < quantile <= 1:
        raise ValueError(f"quantile must lie in (0, 1], got {quantile}")
    rng = np.random.default_rng(seed)
    per_run: dict[str, list[dict[str, int]]] = {p.label: [] for p in profiles}
    settled_by: dict[str, list[str | None]] = {p.label: [] for p in profiles}
    for _ in range(runs):
        ans = synthetic(profiles, populations, rng, positives=positives, epochs=epochs)
        sim = simulate(ans, populations, until, random_order(populations, rng, ans), alpha=alpha)
        for p in profiles:
            per_run[p.label].append(sim.asked[p.label])
            settled_by[p.label].append(sim.standing[p.label].rule)
    models = []
    for p in profiles:
        u = usage.get(p.label, Usage({}, None))
        totals = np.array([sum(a.values()) for a in per_run[p.label]], float)
        mean = {e: float(np.mean([a[e] for a in per_run[p.label]])) for e in populations}
        # the cached requests each run would ask (the first tasks of the run's order), their mean
        hits = [u.cached_in(a) for a in per_run[p.label]]
        cached = mean_cached = {e: float(np.mean([h[e] for h in hits])) for e in populations}
        questions = mean
        if quantile is not None:  # the run at that quantile of the totals asked
            at = order_statistic(quantile, len(totals)) - 1
            k = int(np.argsort(totals, kind="stable")[at])
            questions = {e: float(per_run[p.label][k][e]) for e in populations}
            cached = {e: float(v) for e, v in hits[k].items()}
        adaptive = spend(questions, epochs, u, cached)
        whole = spend(populations, epochs, u, u.cached_in(populations))
        exhausted = sum(r == "exhausted" for r in settled_by[p.label]) / runs
        models.append(
            {
                "model": p.label,
                "profile": p.source,
                "epochs": epochs,
                "questions": {e: round(v, 1) for e, v in questions.items()},
                "adaptive": adaptive,
                "expected": adaptive if quantile is None else spend(mean, epochs, u, mean_cached),
                "whole": whole,
                "saving": 1 - adaptive["requests"] / whole["requests"],
                "exhausted_share": exhausted,
            }
        )
    return {
        "until": str(until),
        "runs": runs,
        "seed": seed,
        "alpha": alpha,
        "quantile": quantile,
        "holds": None if quantile is None else order_statistic(quantile, runs) / (runs + 1),
        "populations": dict(populations),
        "models": models,
    }
