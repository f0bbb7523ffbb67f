"""Anytime-valid estimates of the whole-set index from the part of it asked so far, and the
stopping rules of an adaptive run (``dxi run --until``; issue 35).

**What is estimated.** The Decision Index is defined on the whole of each evaluation (its
*population*: the N tasks of this run). An adaptive run asks the tasks of each evaluation in a
uniformly random order (the order of ``runner``'s adaptive module), so after ``t`` tasks it holds a
sample drawn *without replacement*, and every figure here is an interval for the value the figure
would take over the whole set, not over a superpopulation: it shrinks to the exact value as the
asked part reaches the whole set.

**Confidence sequences for sampling without replacement** (Waudby-Smith & Ramdas 2020,
"Confidence sequences for sampling without replacement", NeurIPS 33, §3; the empirical-Bernstein
supermartingale of Howard, Ramdas, McAuliffe & Sekhon 2021, "Time-uniform, nonparametric,
nonasymptotic confidence sequences", Annals of Statistics 49:1055-1080, with the predictable
plug-in bets of Waudby-Smith & Ramdas 2023, "Estimating means of bounded random variables by
betting", JRSS B 86:1-27, §3.2). For values ``x_1..x_N`` in [0, 1] with mean ``μ`` drawn in a
random order ``X_1, X_2, ...``, the mean of the tasks not yet drawn is
``m_i = (N·μ − S_{i−1}) / (N − i + 1)`` (``S`` the running sum) and ``E[X_i | past] = m_i``. With
predictable bets ``λ_i ∈ [0, 1)`` and predictable centres ``μ̂_{i−1} ∈ [0, 1]``,

    M_t = Π_{i≤t} exp(λ_i (X_i − m_i) − ψ(λ_i) (X_i − μ̂_{i−1})²),  ψ(λ) = −log(1 − λ) − λ,

is a nonnegative supermartingale (Fan, Grama & Liu 2015's inequality
``exp(λξ − ψ(λ)ξ²) ≤ 1 + λξ`` for ξ ≥ −1, as in Howard et al. 2021 §A.8), and so is its mirror on
``1 − X``. Ville's inequality on both at α/2 each, solved for ``μ`` (``m_i`` is linear in it),
gives at every ``t`` at once with probability ≥ 1 − α:

    μ ∈ [(A_t − Ψ_t − log(2/α)) / B_t,  (A_t + Ψ_t + log(2/α)) / B_t],
    A_t = Σ λ_i (X_i + S_{i−1}/(N − i + 1)),  B_t = Σ λ_i N/(N − i + 1),
    Ψ_t = Σ ψ(λ_i) (X_i − μ̂_{i−1})²,

the closed-form WoR empirical-Bernstein confidence sequence. Each is intersected with the bounds
that hold with certainty, ``[S_t/N, (S_t + N − t)/N]`` (the tasks not asked at their extremes: the
interval is the exact value when ``t = N``), and with every earlier look's (the running
intersection of a confidence sequence is one). Bets: ``λ_i = min(CAP, N/(N − i + 1) ·
sqrt(2 log(2/α) / (σ̂²_{i−1} · i · log(1 + i))))`` with ``σ̂²`` and ``μ̂`` the regularised running
variance and mean of Waudby-Smith & Ramdas 2023 (eq. 15-16); the factor N/(N − i + 1), the weight
of draw i in ``B_t``, bets more as the draws left tell more about the whole (measured: 5-10%
narrower late in the run than the with-replacement bets, coverage unchanged). Because the sequence holds at every ``t``, it holds at
the rounds of a run whatever rule chose them, and at the round a model is stopped.

**Metrics from their components.** Each figure is a function of the whole-set means of per-task
quantities (its *components*; a task's value is its mean over epochs, the population unit is the
task): accuracy = C (correct); non-hallucination = 1 − H/(1 − C) (H hallucinated: a reply not
correct and not "I don't know"); each WildGuardTest F1 = 2·TP/(2·TP + E) (E = FP + FN: the wrong
replies of that yes/no question); mean F1 their mean; the index the weighted sum of
``decision_index.WEIGHTS``. Every component of a model gets its confidence sequence at α/K (K
components: Bonferroni), so all hold at once with probability ≥ 1 − α, and each figure's interval
is its lowest and highest value over that box (each figure is monotone in each component: F1 rises
with TP and falls with E, non-hallucination falls with H and rises with 1 − C). Every figure and the
index are then simultaneous (1 − α) statements. With several epochs the ratio figures are the
ratios of the epoch-averaged counts (the scorer's are means of per-epoch ratios; equal for one
epoch).

**Failed and missing answers** inside the asked part (``scoring.bounds``): a component's sequence is
computed twice, every open answer at its lowest (not correct, not hallucinated, not a TP, not an
error) and at its highest, and the interval is the union (the lower end of the first, the upper end
of the second).

**Separation** (``Until("separated", Δ)``): for each pair of models, the difference of their
whole-set indices over the tasks both were asked: the accuracy terms from the paired per-task
differences ``(x_a − x_b + 1)/2`` (one sequence each: pairing removes the tasks' shared
difficulty), the ratio terms from each model's components; each at α/(K·P) for P pairs
(Bonferroni over the pairs and components), so every pair's interval holds at once, at every look,
with probability ≥ 1 − α. A pair is *decided* when its interval excludes 0 (their order is known)
or lies within [−Δ, Δ] (their difference does not matter), or when both models have been asked
everything; a model is settled when every pair it is in is decided.

**Order caveat.** The guarantee is for a uniformly random order within each evaluation. An order
stratified by WildGuardTest's label mix is a proportionally stratified sample, which is no less
precise; its coverage is measured by simulation in ``benchmarks/adaptive.py``.
"""
from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations

import numpy as np
import polars as pl

from .decision_index import WEIGHTS
from .metrics import IDK, NOT_ANSWERS
from .sums import METRICS, OMNISCIENCE, WILDGUARD, WILDGUARD_F1

CAP = 0.5  # the largest bet λ (Waudby-Smith & Ramdas 2023 use 1/2 or 3/4)
FIRST_ROUND = 0.04  # the share of each evaluation the first round asks
GROWTH = 1.25  # each round asks this many times what the one before asked
UNTIL_FORMS = "precision=P (e.g. precision=5), precision=P:all, separated, separated=Δ"


@dataclass(frozen=True)
class Until:
    """A stopping rule for an adaptive run (``dxi run --until``, run-file key ``until``).

    ``rule``: "precision" (stop a model once its whole-set index is known to ±``points``, and with
    ``every_metric`` every metric too) or "separated" (stop once every other model's order is known
    or their difference is within ``points``, Δ, default 1). ``points`` are index points (0-100)."""

    rule: str
    points: float
    every_metric: bool = False

    @classmethod
    def parse(cls, text: str) -> Until:
        """``"precision=5"``, ``"precision=2.5:all"``, ``"separated"``, ``"separated=0.5"`` ->
        Until. Raises ValueError naming ``--until`` and the accepted forms on anything else (a
        precision must be above 0 and at most 100; Δ at least 0)."""
        m = re.fullmatch(r"\s*(precision|separated)\s*(?:=\s*([0-9]*\.?[0-9]+)\s*)?(:all)?\s*",
                         str(text))
        if m is None or (m[1] == "precision" and m[2] is None) or (m[1] == "separated" and m[3]):
            raise ValueError(f"--until {text!r}: expected one of {UNTIL_FORMS}")
        points = float(m[2]) if m[2] is not None else 1.0
        if m[1] == "precision" and not 0 < points <= 100:
            raise ValueError(f"--until {text!r}: the precision P must be above 0 and at most 100 "
                             f"(index points); accepted forms: {UNTIL_FORMS}")
        return cls(m[1], points, bool(m[3]))

    def __str__(self) -> str:
        return f"{self.rule}={self.points:g}" + (":all" if self.every_metric else "")


@dataclass(frozen=True)
class Estimate:
    """A whole-set figure (0-100): ``point`` from the asked part (over its replies), ``low`` /
    ``high`` its anytime-valid (1 − α) interval for the value over the whole set; None where the
    figure cannot be computed (an evaluation with no data or no reply)."""

    point: float | None
    low: float | None
    high: float | None

    @property
    def half_width(self) -> float | None:
        """(high − low) / 2 in points; None when unknown."""
        return None if self.low is None or self.high is None else (self.high - self.low) / 2


@dataclass(frozen=True)
class Standing:
    """One model after a round: the tasks ``asked`` per evaluation (answered or failed) out of its
    ``population``, the index and every metric (``"<evaluation>.<metric>"``) as ``Estimate``s,
    whether it is ``settled``, the ``rule`` that settled it ("precision=5", "separated=1",
    "exhausted"; None while running) and a one-line ``reason``."""

    model: str
    asked: dict[str, int]
    population: dict[str, int]
    index: Estimate
    metrics: dict[str, Estimate]
    settled: bool
    rule: str | None
    reason: str


# ---------------------------------------------------------------------------------------------
# the confidence sequence of one bounded mean, sampled without replacement

def cs_path(x: np.ndarray, population: int, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """The WoR empirical-Bernstein confidence sequence (module docstring) of the mean of a
    population of ``population`` values in [0, 1], from the values ``x`` (t,) in the order they
    were drawn: ``(low, high)``, each (t,), the (1 − ``alpha``) interval after each draw,
    intersected with the certain bounds and with every earlier interval. Raises ValueError when
    a value lies outside [0, 1] or there are more draws than the population."""
    x = np.asarray(x, dtype=np.float64)
    t = len(x)
    if t > population:
        raise ValueError(f"{t} draws from a population of {population}")
    if t == 0:
        return np.empty(0), np.empty(0)
    if np.nanmin(x) < 0 or np.nanmax(x) > 1:
        raise ValueError("values must lie in [0, 1]")
    i = np.arange(1, t + 1, dtype=np.float64)
    s = np.cumsum(x)
    s_prev = s - x
    mu_hat = (0.5 + s) / (i + 1)  # μ̂_i after draw i
    mu_prev = np.r_[0.5, mu_hat[:-1]]
    var = (0.25 + np.cumsum((x - mu_hat) ** 2)) / (i + 1)
    var_prev = np.r_[0.25, var[:-1]]
    log_term = math.log(2 / alpha)
    remaining = population - i + 1
    slope = population / remaining  # how much draw i tells about μ (N/(N − i + 1))
    lam = np.minimum(CAP, slope * np.sqrt(2 * log_term / (var_prev * i * np.log1p(i))))
    a = np.cumsum(lam * (x + s_prev / remaining))
    b = np.cumsum(lam * population / remaining)
    psi = np.cumsum((-np.log1p(-lam) - lam) * (x - mu_prev) ** 2)
    low = (a - psi - log_term) / b
    high = (a + psi + log_term) / b
    low = np.maximum(low, s / population)
    high = np.minimum(high, (s + population - i) / population)
    low, high = np.maximum.accumulate(low), np.minimum.accumulate(high)
    high = np.maximum(high, low)  # a crossing (probability ≤ α) keeps a point, not an empty set
    return low, high


def interval(x_low: np.ndarray, x_high: np.ndarray, population: int, alpha: float
             ) -> tuple[float, float]:
    """The (1 − ``alpha``) interval for a whole-set mean (0-1) after the draws so far, with open
    answers: ``x_low`` / ``x_high`` (t,) the draws with every open answer at its lowest / highest
    value; the union of the two sequences' intervals (``scoring.bounds``'s rule). With no draw,
    [0, 1]."""
    if len(x_low) == 0:
        return 0.0, 1.0
    lo = cs_path(x_low, population, alpha)[0][-1]
    hi = cs_path(x_high, population, alpha)[1][-1]
    return float(lo), float(hi)


# ---------------------------------------------------------------------------------------------
# per-task components

@dataclass
class _Part:
    """One model's components on one evaluation, in asking order: name -> (low fill, high fill),
    each (tasks,) in [0, 1]; and the replies' sums for the point estimate."""

    tasks: list[str]
    comps: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    sums: dict[str, float] = field(default_factory=dict)


def _components(ans: pl.DataFrame) -> pl.DataFrame:
    """Per (label, eval, task_id, question_id): the epoch means of each component with open
    answers low (``*_lo``) and high (``*_hi``), and the replies' counts (``n``, ``c``, ``h``,
    ``tp``, ``err``)."""
    status = pl.col("status").cast(pl.String)
    replied = ~status.is_in(NOT_ANSWERS)
    opened = ~replied
    pred, gold = pl.col("predicted").cast(pl.String), pl.col("gold").cast(pl.String)
    right = pred.eq_missing(gold) & replied
    hall = replied & ~right & pred.ne_missing(pl.lit(IDK))
    gold_pos = gold == "yes"
    pred_pos = pl.when(pred.is_null()).then(~gold_pos).otherwise(pred == "yes")
    tp = replied & pred_pos & gold_pos
    err = replied & (pred_pos != gold_pos)
    f = pl.Float64
    return (ans.lazy().select(
        pl.col("label").cast(pl.String), pl.col("eval").cast(pl.String),
        pl.col("task_id").cast(pl.String), pl.col("question_id").cast(pl.String),
        right.cast(f).alias("c_lo"), (right | opened).cast(f).alias("c_hi"),
        hall.cast(f).alias("h_lo"), (hall | opened).cast(f).alias("h_hi"),
        tp.cast(f).alias("tp_lo"), (tp | (opened & gold_pos.fill_null(False))).cast(f).alias("tp_hi"),
        err.cast(f).alias("err_lo"), (err | opened).cast(f).alias("err_hi"),
        replied.cast(f).alias("n"))
        .group_by("label", "eval", "task_id", "question_id")
        .agg(pl.col("c_lo", "c_hi", "h_lo", "h_hi", "tp_lo", "tp_hi", "err_lo", "err_hi").mean(),
             (pl.col("c_lo") * pl.col("n")).sum().alias("c"),
             (pl.col("h_lo") * pl.col("n")).sum().alias("h"),
             (pl.col("tp_lo") * pl.col("n")).sum().alias("tp"),
             (pl.col("err_lo") * pl.col("n")).sum().alias("err"),
             pl.col("n").sum())
        .collect())


def _parts(ans: pl.DataFrame, order: Mapping[str, Sequence[str]] | None
           ) -> dict[str, dict[str, _Part]]:
    """label -> eval -> its ``_Part`` (tasks in ``order``; tasks not in it after, by id)."""
    table = _components(ans)
    out: dict[str, dict[str, _Part]] = {}
    for (label, name), g in table.group_by("label", "eval", maintain_order=False):
        rank = {t: k for k, t in enumerate((order or {}).get(name, ()))}
        tasks = sorted(set(g["task_id"].to_list()), key=lambda t: (rank.get(t, len(rank)), t))
        at = {t: k for k, t in enumerate(tasks)}
        pos = np.array([at[t] for t in g["task_id"].to_list()], np.int64)
        part = _Part(tasks)

        def put(name_: str, lo: np.ndarray, hi: np.ndarray, rows: np.ndarray) -> None:
            a, b = np.zeros(len(tasks)), np.zeros(len(tasks))
            a[pos[rows]], b[pos[rows]] = lo[rows], hi[rows]
            part.comps[name_] = (a, b)

        every = np.ones(g.height, bool)
        col = {c: g[c].to_numpy() for c in ("c_lo", "c_hi", "h_lo", "h_hi", "tp_lo", "tp_hi",
                                              "err_lo", "err_hi", "n", "c", "h", "tp", "err")}
        if name == WILDGUARD:
            qs = g["question_id"].to_numpy()
            for q in WILDGUARD_F1:
                rows = qs == q
                put(f"tp:{q}", col["tp_lo"], col["tp_hi"], rows)
                put(f"err:{q}", col["err_lo"], col["err_hi"], rows)
                part.sums[f"tp:{q}"] = float(col["tp"][rows].sum())
                part.sums[f"err:{q}"] = float(col["err"][rows].sum())
                part.sums[f"n:{q}"] = float(col["n"][rows].sum())
        else:
            put("c", col["c_lo"], col["c_hi"], every)
            part.sums["c"], part.sums["n"] = float(col["c"].sum()), float(col["n"].sum())
            if name == OMNISCIENCE:
                put("h", col["h_lo"], col["h_hi"], every)
                part.sums["h"] = float(col["h"].sum())
        out.setdefault(label, {})[name] = part
    return out


# ---------------------------------------------------------------------------------------------
# figures over a box of components

def _nh(h: float, c: float) -> float:
    """Non-hallucination (0-1) from whole-set means H and C: 1 − H/(1 − C); 1 when 1 − C ≤ 0."""
    wrong = 1 - c
    return 1.0 if wrong <= 1e-12 else float(min(1.0, max(0.0, 1 - h / wrong)))


def _f1(tp: float, err: float, undefined: float) -> float:
    """F1 (0-1) = 2TP/(2TP + E); ``undefined`` where 2TP + E is 0."""
    d = 2 * tp + err
    return undefined if d <= 1e-12 else 2 * tp / d


def _figures(box: Mapping[str, tuple[float, float]], name: str
             ) -> dict[str, tuple[float, float]]:
    """Each metric of evaluation ``name`` (0-1) as (lowest, highest) over the ``box`` of its
    components' whole-set means."""
    out: dict[str, tuple[float, float]] = {}
    if name == WILDGUARD:
        f1s = []
        for q, metric in WILDGUARD_F1.items():
            (tl, th), (el, eh) = box[f"tp:{q}"], box[f"err:{q}"]
            out[metric] = (_f1(tl, eh, 0.0), _f1(th, el, 1.0))
            f1s.append(out[metric])
        out["mean_f1"] = (float(np.mean([f[0] for f in f1s])), float(np.mean([f[1] for f in f1s])))
        return out
    out["accuracy"] = box["c"]
    if name == OMNISCIENCE:
        (cl, ch), (hl, hh) = box["c"], box["h"]
        out["non_hallucination_rate"] = (_nh(hh, ch), _nh(hl, cl))
    return out


def _points(part: _Part, name: str) -> dict[str, float | None]:
    """Each metric (0-1) over the replies of the asked part (None without a reply)."""
    s = part.sums
    out: dict[str, float | None] = {}
    if name == WILDGUARD:
        f1s = []
        for q, metric in WILDGUARD_F1.items():
            n = s[f"n:{q}"]
            value = _f1(s[f"tp:{q}"], s[f"err:{q}"], float("nan")) if n else float("nan")
            out[metric] = None if math.isnan(value) else value
            f1s.append(value)
        defined = [f for f in f1s if not math.isnan(f)]
        out["mean_f1"] = float(np.mean(defined)) if defined else None
        return out
    n = s["n"]
    out["accuracy"] = s["c"] / n if n else None
    if name == OMNISCIENCE:
        wrong = n - s["c"]
        out["non_hallucination_rate"] = (1 - s["h"] / wrong if wrong else 1.0) if n else None
    return out


def _pct(v: float | None) -> float | None:
    return None if v is None else round(100 * v, 10)


def _estimate(point: float | None, low: float, high: float) -> Estimate:
    """An Estimate in points with the point held inside its interval."""
    if point is not None:
        point = min(max(point, low), high)
    return Estimate(_pct(point), _pct(low), _pct(high))


def _model_figures(parts: Mapping[str, _Part], populations: Mapping[str, int], alpha: float
                   ) -> tuple[Estimate, dict[str, Estimate]]:
    """One model's index and metrics, simultaneous (1 − ``alpha``) over every component."""
    k = sum(len(p.comps) for p in parts.values())
    a = alpha / max(k, 1)
    metrics: dict[str, Estimate] = {}
    index_ok = all(e in parts for e, _ in WEIGHTS) and all(e in populations for e, _ in WEIGHTS)
    low = high = point = 0.0
    for name, part in parts.items():
        box = {c: interval(lo, hi, populations[name], a) for c, (lo, hi) in part.comps.items()}
        figures, points = _figures(box, name), _points(part, name)
        for metric in METRICS.get(name, ()):
            lo, hi = figures[metric]
            metrics[f"{name}.{metric}"] = _estimate(points.get(metric), lo, hi)
    for (name, metric), w in WEIGHTS.items():
        est = metrics.get(f"{name}.{metric}")
        if est is None or est.point is None:
            index_ok = False
            continue
        point += w * est.point
        low += w * est.low
        high += w * est.high
    index = Estimate(point, low, high) if index_ok else Estimate(None, None, None)
    return index, metrics


# ---------------------------------------------------------------------------------------------
# pairs

LINEAR = "c"  # the component whose paired difference is a mean (accuracy)


def _pair_interval(pa: Mapping[str, _Part], pb: Mapping[str, _Part],
                   populations: Mapping[str, int], alpha: float) -> tuple[float, float] | None:
    """The (1 − ``alpha``) interval of index(a) − index(b) (points) over the whole set, from the
    tasks both were asked (the common prefix of the one order); None when the index of either is
    not computable."""
    if not all(e in pa and e in pb and e in populations for e, _ in WEIGHTS):
        return None
    names = {e for e, _ in WEIGHTS}
    # the paired C, and each model's own other components (and C, for non-hallucination)
    k = sum(1 + 2 * (len(pa[e].comps) - 1) + 2 * (e == OMNISCIENCE) for e in names)
    a = alpha / k
    low = high = 0.0
    for name in sorted(names):
        A, B = pa[name], pb[name]
        n = min(len(A.tasks), len(B.tasks))
        if A.tasks[:n] != B.tasks[:n]:
            raise ValueError(f"{name}: the two models were not asked in the same order")
        N = populations[name]
        box_a: dict[str, tuple[float, float]] = {}
        box_b: dict[str, tuple[float, float]] = {}
        for comp in A.comps:
            if comp == LINEAR:
                continue
            box_a[comp] = interval(A.comps[comp][0][:n], A.comps[comp][1][:n], N, a)
            box_b[comp] = interval(B.comps[comp][0][:n], B.comps[comp][1][:n], N, a)
        if LINEAR in A.comps:  # paired: (x_a − x_b + 1)/2, lowest with a low and b high
            d_lo = (A.comps[LINEAR][0][:n] - B.comps[LINEAR][1][:n] + 1) / 2
            d_hi = (A.comps[LINEAR][1][:n] - B.comps[LINEAR][0][:n] + 1) / 2
            lo, hi = interval(d_lo, d_hi, N, a) if n else (0.0, 1.0)
            diff_c = (2 * lo - 1, 2 * hi - 1)
            if name == OMNISCIENCE:
                box_a["c"] = interval(A.comps[LINEAR][0][:n], A.comps[LINEAR][1][:n], N, a)
                box_b["c"] = interval(B.comps[LINEAR][0][:n], B.comps[LINEAR][1][:n], N, a)
        for (ename, metric), w in WEIGHTS.items():
            if ename != name:
                continue
            if metric == "accuracy":
                low += w * 100 * diff_c[0]
                high += w * 100 * diff_c[1]
            else:
                fa, fb = _figures(box_a, name)[metric], _figures(box_b, name)[metric]
                low += w * 100 * (fa[0] - fb[1])
                high += w * 100 * (fa[1] - fb[0])
    return low, high


# ---------------------------------------------------------------------------------------------
# the public API

def standings(answers: pl.DataFrame, populations: Mapping[str, int], until: Until, *,
              alpha: float = 0.05, order: Mapping[str, Sequence[str]] | None = None
              ) -> dict[str, Standing]:
    """Every model's ``Standing`` after a round.

    ``answers``: the per-answer frame of ``scoring.pipeline.answers`` (columns label, eval,
    task_id, question_id, sample, status, predicted, gold) for every model of the run, restricted
    to the tasks each model has been asked so far (failed and missing answers included: bounds).
    ``populations``: evaluation -> its whole-set task count. ``order``: evaluation -> its task
    ids in the order the run asks them (the sequence's validity needs the asking order; tasks not
    in it come after, by id). ``alpha``: 1 − the confidence (0.05: 95%).

    A model whose asked part is the whole set is settled with rule "exhausted" (its interval is
    its exact value). Under "precision=P" a model is settled when its index's half-width is at
    most P (and, with ``every_metric``, every metric's). Under "separated=Δ" when every pair it is
    in is decided (module docstring; Bonferroni over the pairs). Raises ValueError when a model
    was asked more tasks of an evaluation than its population, or an evaluation has no population.
    """
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha}")
    parts = _parts(answers, order)
    for label, by_eval in parts.items():
        for name, part in by_eval.items():
            if name not in populations:
                raise ValueError(f"{label}: evaluation {name!r} has no population")
            if len(part.tasks) > populations[name]:
                raise ValueError(f"{label}: {len(part.tasks)} tasks of {name} asked, more than its "
                                 f"population of {populations[name]}")
    labels = sorted(parts)
    out: dict[str, Standing] = {}
    figures = {m: _model_figures(parts[m], populations, alpha) for m in labels}
    exhausted = {m: all(len(parts[m].get(e, _Part([])).tasks) >= n for e, n in populations.items())
                 for m in labels}
    decided: dict[str, list[str]] = {m: [] for m in labels}  # models not yet decided against m
    if until.rule == "separated":
        pairs = list(combinations(labels, 2))
        for a, b in pairs:
            if exhausted[a] and exhausted[b]:
                continue
            iv = _pair_interval(parts[a], parts[b], populations, alpha / max(len(pairs), 1))
            if iv is not None and (iv[0] > 0 or iv[1] < 0
                                   or (iv[0] >= -until.points and iv[1] <= until.points)):
                continue
            decided[a].append(b)
            decided[b].append(a)
    for m in labels:
        index, metrics = figures[m]
        asked = {e: len(parts[m][e].tasks) if e in parts[m] else 0 for e in populations}
        settled, rule, reason = False, None, ""
        if exhausted[m]:
            settled, rule, reason = True, "exhausted", "every task of the whole set was asked"
        elif until.rule == "precision":
            widths = [index.half_width]
            if until.every_metric:
                widths += [e.half_width for e in metrics.values()]
            known = [w for w in widths if w is not None]
            if len(known) == len(widths) and max(known) <= until.points:
                settled, rule = True, str(until)
                reason = f"index ±{index.half_width:.2f} ≤ ±{until.points:g} points"
            else:
                reason = (f"index ±{index.half_width:.2f} > ±{until.points:g} points"
                          if index.half_width is not None else "index not computable yet")
        else:
            if not decided[m]:
                settled, rule = True, str(until)
                reason = f"every other model ordered or within {until.points:g} points"
            else:
                reason = f"not yet told apart from {len(decided[m])}: {', '.join(decided[m][:3])}"
        out[m] = Standing(m, asked, dict(populations), index, metrics, settled, rule, reason)
    return out


def schedule(round_index: int, *, first: float = FIRST_ROUND, growth: float = GROWTH) -> float:
    """The share of every evaluation asked after round ``round_index`` (0-based): round k asks
    ``first·growth^k`` of each; the shares add up (capped at 1)."""
    if round_index < 0:
        raise ValueError(f"round_index must be ≥ 0, got {round_index}")
    return min(1.0, first * (growth ** (round_index + 1) - 1) / (growth - 1))


def round_sizes(asked: Mapping[str, int], populations: Mapping[str, int], *, round_index: int
                ) -> dict[str, int]:
    """How many MORE tasks of each evaluation the next round asks a running model: every
    evaluation is brought to the same share of its population, ``schedule(round_index)`` (4% of
    the set first, each round 1.25× the one before), or the next share of the schedule above what
    it was already asked (a resumed run still progresses), never past the population. All zero
    only when every evaluation is exhausted."""
    for name, n in populations.items():
        if not 0 <= asked.get(name, 0) <= n:
            raise ValueError(f"{name}: {asked.get(name, 0)} asked of a population of {n}")
    k = round_index
    while True:
        share = schedule(k)
        sizes = {e: max(0, min(n, math.ceil(share * n - 1e-9)) - asked.get(e, 0))
                 for e, n in populations.items()}
        if any(sizes.values()) or share >= 1.0:
            return sizes
        k += 1
