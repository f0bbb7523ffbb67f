"""Anytime-valid estimates of the whole-set index from the part of it asked so far, and the
stopping rules of an adaptive run (``dxi run --until``; issue 35).

**What is estimated.** The Decision Index is defined on the whole of each evaluation (its
*population*: the N tasks of this run). An adaptive run asks the tasks of each evaluation in a
uniformly random order (the order of ``runner``'s adaptive module), so after ``t`` tasks it holds a
sample drawn *without replacement*, and every figure here is an interval for the value the figure
would take over the whole set, not over a superpopulation: it shrinks to the exact value as the
asked part reaches the whole set.

**One mean: a betting confidence sequence for sampling without replacement** (Waudby-Smith &
Ramdas 2020, "Confidence sequences for sampling without replacement", NeurIPS 33, §3; the capital
process and predictable plug-in bets of Waudby-Smith & Ramdas 2023, "Estimating means of bounded
random variables by betting", JRSS B 86:1-27, §3-4). For values ``x_1..x_N`` in [0, 1] with mean
``μ`` drawn in a random order ``X_1, X_2, ...``, the mean of the tasks not yet drawn is
``m_i(μ) = (N·μ − S_{i−1}) / (N − i + 1)`` (``S`` the running sum) and ``E[X_i | past] = m_i``.
For a candidate ``μ``, the two bettors' capitals

    K⁺_t = Π_{i≤t} (1 + λ⁺_i (X_i − m_i(μ))),   K⁻_t = Π_{i≤t} (1 − λ⁻_i (X_i − m_i(μ))),

with predictable bets ``λ⁺_i = min(λ_i, BET_CAP/m_i)`` and ``λ⁻_i = min(λ_i, BET_CAP/(1 − m_i))``
(each factor ≥ 1 − BET_CAP > 0), are nonnegative martingales at the true ``μ``; by Ville's
inequality at α/2 each, with probability ≥ 1 − α neither ever reaches 2/α (``capital``). The
interval at ``t`` is every ``μ`` neither has reached 2/α for by then (found on a grid,
``invert``), intersected with the bounds that hold with certainty, ``[S_t/N, (S_t + N − t)/N]``
(the tasks not asked at their extremes: the exact value when ``t = N``); a candidate once rejected
stays rejected, so the intervals never widen (beyond the search's outward rounding, at most two
steps of its ~1/576 grid). Bets: ``λ_i = min(BET_MAX, N/(N − i + 1) ·
sqrt(2 log(2/α) / (σ̂²_{i−1} · i · log(1 + i))))`` with ``σ̂²`` the regularised running variance
of Waudby-Smith & Ramdas 2023 (eq. 15-16); the factor N/(N − i + 1), how much draw i tells about
``μ``, bets more as the draws left tell more about the whole. The capital is exact where the
empirical-Bernstein bound below is a lower bound of it: measured 11-16% narrower at α = 0.002 and
0.03 on accuracies of 513 and 880 tasks, and the index's interval 0.5 points narrower at a third
of the set. Because the sequence holds at every ``t``, it holds at the rounds of a run whatever
rule chose them, and at the round a model is stopped.

**The empirical-Bernstein form** (Howard, Ramdas, McAuliffe & Sekhon 2021, "Time-uniform,
nonparametric, nonasymptotic confidence sequences", Annals of Statistics 49:1055-1080): with
predictable bets ``λ_i ∈ [0, 1)`` and predictable centres ``μ̂_{i−1} ∈ [0, 1]``,

    M_t = Π_{i≤t} exp(λ_i (X_i − m_i) − ψ(λ_i) (X_i − μ̂_{i−1})²),  ψ(λ) = −log(1 − λ) − λ,

is a nonnegative supermartingale (Fan, Grama & Liu 2015's inequality
``exp(λξ − ψ(λ)ξ²) ≤ 1 + λξ`` for ξ ≥ −1, as in Howard et al. 2021 §A.8), and so is its mirror on
``1 − X``. Its logarithm is *linear* in the unknown means (``m_i`` is linear in ``μ``), so Ville's
inequality on both at α/2 each can be solved in closed form:

    μ ∈ [(A_t − Ψ_t − log(2/α)) / B_t,  (A_t + Ψ_t + log(2/α)) / B_t],
    A_t = Σ λ_i (X_i + S_{i−1}/(N − i + 1)),  B_t = Σ λ_i N/(N − i + 1),
    Ψ_t = Σ ψ(λ_i) (X_i − μ̂_{i−1})².

The index's sequence (below) needs that closed form (a log-capital quadratic in several
hypothesised ratios at once); each single metric uses the tighter capital above.

**Metrics.** Each figure is a function of whole-set means of per-task quantities (a task's value
is its mean over epochs; the population unit is the task): accuracy is the mean of C (correct); a
ratio — non-hallucination 1 − H/W (H hallucinated: a reply not correct and not "I don't know"; W
not correct), each WildGuardTest F1 = 2TP/(2TP + E) (E = FP + FN of that yes/no question) — by
inverting a test: "F1 ≥ r" is "the whole-set mean of 2(1 − r)·tp − r·e is ≥ 0", one bounded
per-task mean (rescaled to [0, 1]), so the interval is every r whose sequence holds its target
(``invert``; one test, at the true r, has to hold: nothing is spent on the grid). Every
such sequence of a model runs at α'/K (K sequences: Bonferroni), so its metrics hold at once
(mean F1 is the mean of its three F1s' ends). **Epochs**: the scorer's figure is the mean over
the epochs of each epoch's figure. An accuracy is linear, so its sequence runs on the tasks'
epoch means; a ratio is not, so each epoch's ratio gets its own sequence (the metric's interval
is the mean of its epochs') and enters the index as its own term at weight/E (``_parts`` keeps
a ratio's components per epoch).

**The index** gets one sequence across the four evaluations (a weighted sum of per-evaluation
intervals would add their widths). Each term is a ratio R = N/D of whole-set per-task means (D = 1
for an accuracy; non-hallucination enters as −w·H/W, each F1 as 2TP/(2TP + E)), and the sequence
tests *hypotheses about the ratios*: for a vector r of them, each term's per-task value
``u = num − r·den`` has whole-set mean 0 exactly when R = r, so under that hypothesis the mean of
the tasks not yet drawn is known, ``−Σ_{past} u / (N − i)``, and ``m_i(r) = Σ_k a_k·(u_k +
Σ_{past} u_k/(N − i))`` is a martingale difference, whatever the coefficients ``a`` (predictable).
No denominator is estimated: ``den`` enters only through the draws. The empirical-Bernstein form
above on ``X_i = (m_i − its lowest possible value)/s_i`` in [0, 1] (``s_i = Σ|a_k|·`` the length
of each term's range) with the running mean for ``μ̂`` gives, per evaluation, a log-capital
``Σ g_i·m_i(r) − Σ ψ(g_i·s_i)(X_i(r) − μ̂_i(r))² = P − K·r − Ψ(r)``, linear in r but for Ψ, a
convex quadratic in the ratios of the ratio terms; the evaluations are independent random
orders, so the four log-capitals add (one supermartingale, ``product_interval``). The true r is
rejected at ``PRODUCT_SHARE``·α with probability at most that (Ville), so the index lies, with
the metrics' box (the ratios' own sequences at the rest of α) holding too, between the least and
the greatest ``Σ w_k·r_k`` over the r of the box the sequence has not rejected. Ψ is bounded by
its largest value over the box (a corner), and what is left is a linear programme with one
constraint (``_least``). The coefficients: an accuracy's is its weight; a ratio's is w/D̂ (D̂ its
denominator's mean from the draws before), *steered* every 1/``BLOCK`` of the evaluation so that
its ``K/w`` follows an accuracy's (``_coefficients``): then ``K ∝ w`` nearly, the sequence tests
the index itself, and the box only bounds what a block's fluctuation leaves (the remainder the
earlier form bounded by the product of the ratio's and the denominator's intervals: 1.2-1.6
points at a third of the set, now about 0.2). The bet is one constant per evaluation, the same
multiple of 1/N in each: the bet that is best for a sequence read at the share ``TARGET`` of the
set (λ = sqrt(2 log(2/α) / (σ²·t)) at t = ``TARGET``·N, σ² a prior variance of the contribution:
a linear boundary tuned to one time, Howard et al. 2021 §3; Waudby-Smith & Ramdas 2023 §3.2's
decaying bets ∝ 1/sqrt(t log(1 + t)) spread the sequence's power over every time instead, and
measured 8%, 18% and 26% wider at 25%, 50% and 75% of the set; any predictable bet keeps
validity), capped at λ ≤ ``CAP``. The index's interval is the intersection of this one and the
weighted sum of the metrics' intervals, and its point the weighted sum of the metrics' points.

**Failed and missing answers** inside the asked part (``scoring.bounds``): a component's sequence is
computed twice, every open answer at its lowest (not correct, not hallucinated, not a TP, not an
error) and at its highest, and the interval is the union (the lower end of the first, the upper end
of the second).

**Separation** (``Until("separated", Δ)``): for each pair of models, the difference of their
whole-set indices over the tasks both were asked, by the index's construction applied to both
models' terms at once (the second's weights negated): the per-task contribution is then a paired
difference, so the tasks' shared difficulty cancels; its bets are tuned to ``PAIR_TARGET`` of
the set (the close pairs that decide a run's length are decided late). α is split once for all
pairs:
``PRODUCT_SHARE``·α over the P pairs' sequences (α·share/P each) and the rest over the M models'
boxes (each model's K sequences at α·(1 − share)/(M·K), from all that model was asked: the boxes
bound whole-set metrics, so they serve every pair the model is in; measured 12% narrower than
boxes per pair at α/P, for 10 models at half the set). Every pair's interval then holds at once,
at every look, with probability ≥ 1 − α. A pair is *decided* when its interval excludes 0 (their
order is known) or lies within [−Δ, Δ] (their difference does not matter), or when both models
have been asked everything; a model is settled when every pair it is in is decided, and its
reason says the relation that decided each of its pairs: "above a; below 2 (b, c); within ±1
point of none" (the models it is known to be above, below, and within ±Δ of).

**Order caveat.** The guarantee is for a uniformly random order within each evaluation. An order
stratified by WildGuardTest's label mix is a proportionally stratified sample, which is no less
precise; its coverage is measured by simulation in ``benchmarks/stats_adaptive.py``.

Why one module over 600 lines: the sequences, the metrics' and the index's intervals built from
them, the stopping rules and the round schedule are one statistical method, checked together
(tests/test_sequential.py, benchmarks/stats_adaptive.py); the planner (``scoring.planner``) is
apart.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations, product

import numpy as np
import polars as pl

from .decision_index import WEIGHTS
from .metrics import IDK, NOT_ANSWERS
from .sums import METRICS, OMNISCIENCE, WILDGUARD, WILDGUARD_F1, epoch_mean

CAP = 0.5  # the index's largest bet λ (Waudby-Smith & Ramdas 2023 use 1/2 or 3/4)
BET_MAX = 0.9  # a metric's largest bet per draw (``capital``), before the cap below
BET_CAP = 0.75  # ... and at most this share of what the capital can lose on the draw
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
        Until. Raises ValueError quoting the text, with the accepted forms, on anything else; any
        ``precision=P`` whose P is not a number above 0 and at most 100, and any ``separated=Δ``
        whose Δ is not a number from 0 to 100 (negative, above 100, nan, inf, not a number), gets
        the message giving the range: the ranges of ``dxi plan --precision`` and ``--tolerance``
        (``runner.planning.numbers.POINTS`` and ``TOLERANCE``)."""
        precision = re.fullmatch(r"\s*precision\s*=\s*([^:\s]+)\s*(:all)?\s*", str(text))
        if precision is not None:  # any P: out of range, nan, inf or not a number -> the range
            points = _number(precision[1])
            if not 0 < points <= 100:  # nan fails too
                raise ValueError(
                    f"{text!r}: the precision P must be a number above 0 and at most 100 "
                    f"(index points); accepted forms: {UNTIL_FORMS}"
                )
            return cls("precision", points, bool(precision[2]))
        m = re.fullmatch(r"\s*separated\s*(?:=\s*([^:\s]+)\s*)?", str(text))
        if m is None:
            raise ValueError(f"{text!r}: expected one of {UNTIL_FORMS}")
        if m[1] is None:
            return cls("separated", 1.0)
        tolerance = _number(m[1])
        if not 0 <= tolerance <= 100:  # nan fails too
            raise ValueError(
                f"{text!r}: the tolerance Δ must be a number from 0 to 100 (index "
                f"points); accepted forms: {UNTIL_FORMS}"
            )
        return cls("separated", tolerance)

    def __str__(self) -> str:
        return f"{self.rule}={self.points:g}" + (":all" if self.every_metric else "")


def _number(text: str) -> float:
    """``text`` as a float; nan when it is not a number (``Until.parse`` then gives the range)."""
    try:
        return float(text)
    except ValueError:
        return math.nan


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
    "exhausted"; None while running), a one-line ``reason`` ("index ±4.62 ≤ ±5 points"; under
    ``:all`` "every figure within ±5 points (widest: when2call.accuracy ±4.85; index ±1.79)",
    while running the widest figure above P, "when2call.accuracy ±7.10 > ±5 points"; under
    ``separated`` "above a; below 2 (b, c); within ±1 point of none", while running "not yet told
    apart from 2: b, c"; "every task of the whole set was asked") and, while it runs,
    ``settles_at``: the share of the whole set (0-1) at which it is predicted to be settled
    (``_predicted``; None when settled or not predictable yet), what ``aim`` reads."""

    model: str
    asked: dict[str, int]
    population: dict[str, int]
    index: Estimate
    metrics: dict[str, Estimate]
    settled: bool
    rule: str | None
    reason: str
    settles_at: float | None = None


# ---------------------------------------------------------------------------------------------
# the confidence sequence of one bounded mean, sampled without replacement


def capital(
    x: np.ndarray, target: np.ndarray, population: int, alpha: float, *, graded: bool = False
) -> np.ndarray:
    """The betting test of "the whole-set mean of row r is ``target[r]``" (module docstring,
    "One mean"): for values ``x`` (R, t) in [0, 1] in the order they were drawn from a population
    of ``population``, the largest log-capital either one-sided bettor reached at any draw so far,
    per row (R,); ``inf`` where the draws contradict the target with certainty (the tasks not yet
    drawn cannot make it; with ``graded``, ``1e12`` plus by how much the mean of the tasks not yet
    drawn would leave [0, 1] instead, which orders the impossible targets by their distance). The
    target is rejected at level ``alpha`` (at every time at once) where it is ≥ log(2/α). Raises
    ValueError when a value lies outside [0, 1] or there are more draws than the population."""
    x = np.asarray(x, dtype=np.float64)
    rows, t = x.shape
    if t > population:
        raise ValueError(f"{t} draws from a population of {population}")
    if t == 0:
        return np.zeros(rows)
    if x.min() < 0 or x.max() > 1:
        raise ValueError("values must lie in [0, 1]")
    i = np.arange(1, t + 1, dtype=np.float64)
    s = np.cumsum(x, -1)
    s_prev = s - x
    remaining = population - i + 1
    # under the target, the mean of the tasks not yet drawn
    m = (population * np.asarray(target, np.float64)[:, None] - s_prev) / remaining
    beyond = np.maximum(-m, m - 1).max(-1)  # > 0: the target is impossible
    impossible = beyond > 1e-9
    m = np.clip(m, 1e-12, 1 - 1e-12)
    dev = x - (0.5 + s) / (i + 1)  # X_i − μ̂_i
    dev *= dev
    var_prev = (0.25 + np.cumsum(dev, -1) - dev) / i  # σ̂²_{i−1}
    slope = population / remaining  # how much draw i tells about the whole-set mean
    bet = np.minimum(
        BET_MAX, slope * np.sqrt(2 * math.log(2 / alpha) / (var_prev * i * np.log1p(i)))
    )
    gain = x - m
    up = np.cumsum(np.log1p(np.minimum(bet, BET_CAP / m) * gain), -1)
    down = np.cumsum(np.log1p(-np.minimum(bet, BET_CAP / (1 - m)) * gain), -1)
    best = np.maximum(up, down).max(-1)
    best[impossible] = (1e12 + beyond[impossible]) if graded else np.inf
    return best


def interval(
    x_low: np.ndarray, x_high: np.ndarray, population: int, alpha: float
) -> tuple[float, float]:
    """The (1 − ``alpha``) interval for a whole-set mean (0-1) after the draws so far, with open
    answers: ``x_low`` / ``x_high`` (t,) the draws with every open answer at its lowest / highest
    value; the union of the two sequences' intervals (``scoring.bounds``'s rule), each the
    targets ``capital`` does not reject (``invert``). With no draw, [0, 1]; with every task
    drawn, the exact value."""
    t = len(x_low)
    if t == 0:
        return 0.0, 1.0
    if t == population:
        return float(np.mean(x_low)), float(np.mean(x_high))
    fills = {False: np.asarray(x_low, np.float64), True: np.asarray(x_high, np.float64)}

    def make_x(mu: np.ndarray, high: bool) -> tuple[np.ndarray, np.ndarray]:
        return np.broadcast_to(fills[high], (len(mu), t)), mu

    lo, hi = invert(make_x, population, alpha, None)
    # what holds with certainty: the tasks not drawn at their extremes
    lo = max(lo, float(fills[False].sum()) / population)
    hi = min(hi, float(fills[True].sum() + population - t) / population)
    return lo, max(lo, hi)


# ---------------------------------------------------------------------------------------------
# per-task components


@dataclass
class _Part:
    """One model's components on one evaluation, in asking order: name -> (low fill, high fill),
    each (tasks,) in [0, 1]; and the replies' counts per task (name -> (tasks,)) whose sums give
    the point estimate. A component a ratio metric is made of is kept per epoch (``name@e``,
    ``_parts``); ``epochs`` the model's epochs."""

    tasks: list[str]
    comps: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    counts: dict[str, np.ndarray] = field(default_factory=dict)
    epochs: int = 1

    @property
    def sums(self) -> dict[str, float]:
        """The replies' counts over the asked part (name -> float)."""
        return {k: float(v.sum()) for k, v in self.counts.items()}

    def head(self, n: int) -> _Part:
        """The part made of the first ``n`` tasks (what ``_parts`` gives after ``n`` asked)."""
        return _Part(
            self.tasks[:n],
            {k: (lo[:n], hi[:n]) for k, (lo, hi) in self.comps.items()},
            {k: v[:n] for k, v in self.counts.items()},
            self.epochs,
        )


FILLS = tuple(f"{c}_{end}" for c in ("c", "h", "tp", "err") for end in ("lo", "hi"))
"""Per-task components with the open answers at their lowest and highest (``_components``)."""
COUNTS = ("n", "c", "h", "tp", "err")
"""Per-task counts over the replies (``_components``)."""


def _components(ans: pl.DataFrame) -> pl.DataFrame:
    """Per answer (label, eval, task_id, question_id, sample): each component with the open
    answer low (``*_lo``) and high (``*_hi``), and as a reply's count (``n`` 1 for a reply, ``c``,
    ``h``, ``tp``, ``err``: 0 unless a reply)."""
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
    return (
        ans.lazy()
        .select(
            pl.col("label").cast(pl.String),
            pl.col("eval").cast(pl.String),
            pl.col("task_id").cast(pl.String),
            pl.col("question_id").cast(pl.String),
            pl.col("sample").cast(pl.Int64),
            right.cast(f).alias("c_lo"),
            (right | opened).cast(f).alias("c_hi"),
            hall.cast(f).alias("h_lo"),
            (hall | opened).cast(f).alias("h_hi"),
            tp.cast(f).alias("tp_lo"),
            (tp | (opened & gold_pos.fill_null(False))).cast(f).alias("tp_hi"),
            err.cast(f).alias("err_lo"),
            (err | opened).cast(f).alias("err_hi"),
            replied.cast(f).alias("n"),
        )
        .with_columns(
            (pl.col("c_lo") * pl.col("n")).alias("c"),
            (pl.col("h_lo") * pl.col("n")).alias("h"),
            (pl.col("tp_lo") * pl.col("n")).alias("tp"),
            (pl.col("err_lo") * pl.col("n")).alias("err"),
        )
        .collect()
    )


def _parts(
    ans: pl.DataFrame,
    order: Mapping[str, Sequence[str]] | None,
) -> dict[str, dict[str, _Part]]:
    """label -> eval -> its ``_Part`` (tasks in ``order``; tasks not in it after, by id).

    A task's accuracy component is its mean over the epochs (``c``: accuracy is linear, so the
    mean of per-epoch accuracies is the accuracy of the epoch means). A ratio metric's are kept
    per epoch e (``c@e``, ``h@e``, ``tp:q@e``, ``err:q@e``), as are the counts (``c@e``, ``n@e``,
    ...): the scorer's figure is the mean of the per-epoch ratios (SPEC §6, epochs), which is not
    the ratio of the epoch means."""
    table = _components(ans)
    out: dict[str, dict[str, _Part]] = {}
    for (label, name), g in table.group_by("label", "eval", maintain_order=False):
        rank = {t: k for k, t in enumerate((order or {}).get(name, ()))}
        tasks = sorted(set(g["task_id"].to_list()), key=lambda t: (rank.get(t, len(rank)), t))
        at = {t: k for k, t in enumerate(tasks)}
        pos = np.array([at[t] for t in g["task_id"].to_list()], np.int64)
        sample = g["sample"].to_numpy()
        part = _Part(tasks, epochs=int(sample.max()) + 1 if len(sample) else 1)

        def put(
            name_: str,
            lo: np.ndarray,
            hi: np.ndarray,
            rows: np.ndarray,
            part: _Part = part,
            pos: np.ndarray = pos,
        ) -> None:  # the mean over the rows of each task (its epochs)
            size = len(part.tasks)
            a, b, k = np.zeros(size), np.zeros(size), np.zeros(size)
            np.add.at(a, pos[rows], lo[rows])
            np.add.at(b, pos[rows], hi[rows])
            np.add.at(k, pos[rows], 1.0)
            k = np.maximum(k, 1.0)
            part.comps[name_] = (a / k, b / k)

        def count(
            name_: str, values: np.ndarray, rows: np.ndarray, part: _Part = part, pos=pos
        ) -> None:
            a = np.zeros(len(part.tasks))
            np.add.at(a, pos[rows], values[rows])
            part.counts[name_] = a

        col = {c: g[c].to_numpy() for c in (*FILLS, *COUNTS)}
        qs = g["question_id"].to_numpy()
        for e in range(part.epochs):
            epoch = sample == e
            if name == WILDGUARD:
                for q in WILDGUARD_F1:
                    rows = epoch & (qs == q)
                    put(f"tp:{q}@{e}", col["tp_lo"], col["tp_hi"], rows)
                    put(f"err:{q}@{e}", col["err_lo"], col["err_hi"], rows)
                    for c in ("tp", "err", "n"):
                        count(f"{c}:{q}@{e}", col[c], rows)
                continue
            for c in ("c", "n"):
                count(f"{c}@{e}", col[c], epoch)
            if name == OMNISCIENCE:
                put(f"c@{e}", col["c_lo"], col["c_hi"], epoch)
                put(f"h@{e}", col["h_lo"], col["h_hi"], epoch)
                count(f"h@{e}", col["h"], epoch)
        if name != WILDGUARD:
            put("c", col["c_lo"], col["c_hi"], np.ones(g.height, bool))
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


GRID = 25  # points of each stage of the search for an interval (two stages: ~1e-3 apart)
ZOOMS = 12  # at most this many finer grids around the least rejected candidate (a narrow interval)


def invert(
    make_x, population: int, alpha: float, exact: tuple[float, float] | None
) -> tuple[float, float]:
    """The (1 − ``alpha``) interval (0-1) of a whole-set value ``v*`` (a mean, or a ratio), by
    inverting a test of each candidate ``v``: ``make_x(v, high)`` gives, for candidates ``v``
    (R,), per-task values (R, t) in [0, 1] whose whole-set mean equals ``target`` (R,) exactly
    when ``v = v*`` (returned as ``(x, target)``), with the open answers at the value's lowest
    (``high`` False) or highest completion. The interval is every ``v`` that ``capital`` does not
    reject: one test, at the true ``v*``, has to hold, so no multiplicity over ``v`` is spent.
    Each end is found on a grid of ``GRID`` points over [0, 1]; when no point of it is accepted (an
    interval narrower than the grid, as when nearly the whole set is asked), on finer grids
    around the least rejected point (up to ``ZOOMS`` times); then in two finer stages around the
    end (~1e-3 of the first grid's spacing apart), rounded outwards. ``exact``: the value's
    (lowest, highest) when every task is asked (returned as it is)."""
    if exact is not None:
        return exact
    log_bar = math.log(2 / alpha)

    def scores(grid: np.ndarray, high: bool) -> np.ndarray:
        x, target = make_x(grid, high)
        return capital(x, target, population, alpha, graded=True)

    ends = []
    for side in (0, 1):
        grid = np.linspace(0.0, 1.0, GRID)
        score = scores(grid, bool(side))
        for _ in range(ZOOMS):
            if (score < log_bar).any():
                break
            k = int(np.argmin(score))
            grid = np.linspace(grid[max(0, k - 1)], grid[min(GRID - 1, k + 1)], GRID)
            score = scores(grid, bool(side))
        accepted = score < log_bar
        if not accepted.any():  # every candidate rejected (probability ≤ α): the closest
            ends.append(float(grid[int(np.argmin(score))]))
            continue
        for stage in range(3):
            k = int(np.flatnonzero(accepted)[-1 if side else 0])
            outer = min(GRID - 1, k + 1) if side else max(0, k - 1)  # the first rejected, outwards
            if stage == 2 or outer == k:
                ends.append(float(grid[outer]))
                break
            grid = np.linspace(*sorted((grid[k], grid[outer])), GRID)
            score = scores(grid, bool(side))
            accepted = score < log_bar
    return ends[0], max(ends[0], ends[1])


def _nh_interval(
    part: _Part, n: int, population: int, alpha: float, epoch: int = 0
) -> tuple[float, float]:
    """Non-hallucination NH = 1 − H/W (0-1; W = 1 − C the not-correct share) of one ``epoch``:
    NH ≥ r exactly when the whole-set mean of ``(1 − r)·w − h + r`` (in [0, 1], as h ≤ w) is at
    least r. Open answers: a wrong pick (w = h = 1) at the lowest, "I don't know" (w = 1,
    h = 0) at the highest."""
    c_lo = part.comps[f"c@{epoch}"][0][:n]
    h_lo, h_hi = part.comps[f"h@{epoch}"][0][:n], part.comps[f"h@{epoch}"][1][:n]
    w = 1 - c_lo

    def make_x(r: np.ndarray, high: bool) -> tuple[np.ndarray, np.ndarray]:
        h = h_lo if high else h_hi
        return np.clip((1 - r[:, None]) * w[None] - h[None] + r[:, None], 0, 1), r

    exact = None
    if n == population:
        exact = (_nh(h_hi.mean(), c_lo.mean()), _nh(h_lo.mean(), c_lo.mean()))
    return invert(make_x, population, alpha, exact)


def _f1_interval(
    part: _Part, q: str, n: int, population: int, alpha: float, epoch: int = 0
) -> tuple[float, float]:
    """One F1 = 2TP/(2TP + E) (0-1) of one ``epoch``: F1 ≥ r exactly when the whole-set mean of
    ``(2(1 − r)·tp − r·e + r)/(2 − r)`` (in [0, 1]) is at least r/(2 − r). Open answers: a
    false negative or a false positive at the lowest, a true positive or a true negative at
    the highest."""
    tp_lo, tp_hi = part.comps[f"tp:{q}@{epoch}"][0][:n], part.comps[f"tp:{q}@{epoch}"][1][:n]
    e_lo, e_hi = part.comps[f"err:{q}@{epoch}"][0][:n], part.comps[f"err:{q}@{epoch}"][1][:n]

    def make_x(r: np.ndarray, high: bool) -> tuple[np.ndarray, np.ndarray]:
        tp, e = (tp_hi, e_lo) if high else (tp_lo, e_hi)
        rr = r[:, None]
        x = (2 * (1 - rr) * tp[None] - rr * e[None] + rr) / (2 - rr)
        return np.clip(x, 0, 1), r / (2 - r)

    exact = None
    if n == population:
        exact = (_f1(tp_lo.mean(), e_hi.mean(), 0.0), _f1(tp_hi.mean(), e_lo.mean(), 1.0))
    return invert(make_x, population, alpha, exact)


def _mean_box(boxes: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """The box of the mean of values each within its (low, high)."""
    return (sum(b[0] for b in boxes) / len(boxes), sum(b[1] for b in boxes) / len(boxes))


def _terms(
    part: _Part, name: str, n: int, population: int, alpha: float
) -> dict[str, tuple[float, float]]:
    """Each metric of evaluation ``name`` (0-1) as (low, high) from its first ``n`` tasks, each
    primary sequence (accuracy; non-hallucination and each F1 in each epoch e, also given as
    ``metric@e``) at ``alpha``; a ratio metric the box of the mean of its epochs' (the scorer's
    figure is the mean of the per-epoch ratios), mean F1 the box of the three F1s."""
    out: dict[str, tuple[float, float]] = {}
    epochs = range(part.epochs)
    if name == WILDGUARD:
        for q, metric in WILDGUARD_F1.items():
            for e in epochs:
                out[f"{metric}@{e}"] = _f1_interval(part, q, n, population, alpha, e)
            out[metric] = _mean_box([out[f"{metric}@{e}"] for e in epochs])
        f1s = [out[m] for m in WILDGUARD_F1.values()]
        out["mean_f1"] = (float(np.mean([f[0] for f in f1s])), float(np.mean([f[1] for f in f1s])))
        return out
    out["accuracy"] = interval(part.comps["c"][0][:n], part.comps["c"][1][:n], population, alpha)
    if name == OMNISCIENCE:
        for e in epochs:
            out[f"non_hallucination_rate@{e}"] = _nh_interval(part, n, population, alpha, e)
        out["non_hallucination_rate"] = _mean_box(
            [out[f"non_hallucination_rate@{e}"] for e in epochs]
        )
    return out


def _primaries(name: str, epochs: int = 1) -> int:
    """How many sequences the metrics of evaluation ``name`` get over ``epochs`` epochs (a ratio
    metric one per epoch; mean F1 is from its F1s)."""
    return len(WILDGUARD_F1) * epochs if name == WILDGUARD else 1 + epochs * (name == OMNISCIENCE)


def _epoch_mean(values: Sequence[float | None]) -> float | None:
    """The scorer's mean over epochs (``sums.epoch_mean``: an undefined epoch, None or NaN here,
    is skipped) of one figure's per-epoch ``values``; None when none is defined."""
    v = float(epoch_mean(np.array([np.nan if x is None else x for x in values], np.float64)))
    return None if math.isnan(v) else v


def _points(part: _Part, name: str) -> dict[str, float | None]:
    """Each metric (0-1) over the replies of the asked part (None without a reply): per epoch,
    then the mean over the epochs, as the scorer computes it."""
    s = part.sums
    epochs = range(part.epochs)
    out: dict[str, float | None] = {}
    if name == WILDGUARD:
        f1 = {}  # (question, epoch) -> F1, None where undefined
        for q, metric in WILDGUARD_F1.items():
            for e in epochs:
                value = float("nan")
                if s[f"n:{q}@{e}"]:
                    value = _f1(s[f"tp:{q}@{e}"], s[f"err:{q}@{e}"], float("nan"))
                f1[q, e] = None if math.isnan(value) else value
            out[metric] = _epoch_mean([f1[q, e] for e in epochs])
        out["mean_f1"] = _epoch_mean(
            [_epoch_mean([f1[q, e] for q in WILDGUARD_F1]) for e in epochs]
        )
        return out
    accuracy, nh = [], []
    for e in epochs:
        n, c = s[f"n@{e}"], s[f"c@{e}"]
        accuracy.append(c / n if n else None)
        if name == OMNISCIENCE:
            wrong = n - c
            nh.append((1 - s[f"h@{e}"] / wrong if wrong else 1.0) if n else None)
    out["accuracy"] = _epoch_mean(accuracy)
    if name == OMNISCIENCE:
        out["non_hallucination_rate"] = _epoch_mean(nh)
    return out


def _pct(v: float | None) -> float | None:
    return None if v is None else round(100 * v, 10)


def _estimate(point: float | None, low: float, high: float) -> Estimate:
    """An Estimate in points with the point held inside its interval."""
    if point is not None:
        point = min(max(point, low), high)
    return Estimate(_pct(point), _pct(low), _pct(high))


# ---------------------------------------------------------------------------------------------
# the index: one confidence sequence across the evaluations (a product of supermartingales)

PRODUCT_SHARE = 0.8  # the share of α the index's own sequence spends (the rest: the box)
# ... under ``precision=P:all``, where the widest metric decides: the box's sequences get the
# most (a typical model's widest metric ±17.3 -> ±15.6 points at a third of the set, its index
# ±5.2 -> ±6.1; mean of 3 seeds)
EVERY_METRIC_SHARE = 0.2
BLOCK = 50  # the coefficients are steered every 1/BLOCK of an evaluation (predictably)
TARGET = 0.5  # the share of each evaluation the index's bets are tuned to (most stops: 0.3-0.7)
# ... a pair's: the pairs that decide a run's length are the close ones, decided late (far ones
# are decided in the first rounds whatever the bet). Measured on 10 models 5 points apart (3
# seeded runs of --until separated, requests / whole index): 0.5 -> 0.717, 0.65 -> 0.680,
# 0.75 -> 0.678, 1.0 -> 0.686
PAIR_TARGET = 0.75
D_FLOOR = 0.1  # the smallest reference denominator (bounds the per-task contribution)
STEER = (0.2, 5.0)  # a block's coefficient stays within these multiples of w/D̂
RANGE = {"lin": 1.0, "hall": 1.0, "f1": 2.0}  # the length of a term's per-task value's range


@dataclass
class _Term:
    """One term of the index in one evaluation, as a per-task ratio num/den (den = 1 for an
    accuracy): ``weight`` its signed weight in the index (non-hallucination enters as
    −w·H/W), per-task ``num``/``den`` at the index's lowest (False) and highest (True)
    completion, its form (``kind``: "lin", "hall", "f1"), the prior of den's mean, and
    ``ratio_box``: the ratio's whole-set (low, high) from the metrics' sequences."""

    kind: str
    weight: float
    num: dict[bool, np.ndarray]
    den: dict[bool, np.ndarray]
    prior_d: float
    ratio_box: tuple[float, float]
    metric: str = ""  # the metric it is an epoch of (a ratio's terms: one per epoch)


def _variance(terms: Sequence[_Term]) -> float:
    """A prior variance of one evaluation's per-task index contribution (each metric's
    num − r·den taken at variance 1/4; a metric's epochs as one, fully correlated; the two
    models of a pair apart, by their weights' signs)."""
    by_metric: dict[tuple[str, bool], float] = {}
    for k, t in enumerate(terms):
        key = (t.metric or str(k), t.weight > 0)
        by_metric[key] = by_metric.get(key, 0.0) + t.weight / t.prior_d
    return float(sum(v**2 * 0.25 for v in by_metric.values()))


def _psi(lam: np.ndarray) -> np.ndarray:
    """ψ_E(λ) = −log(1 − λ) − λ (Howard et al. 2021's empirical-Bernstein ψ)."""
    return -np.log1p(-lam) - lam


def _coefficients(
    terms: Sequence[_Term], dprime: np.ndarray, n: int, population: int, high: bool
) -> np.ndarray:
    """Each term's coefficient per draw (T, n): an accuracy's is its weight; a ratio's is
    w/D̂ (D̂ den's mean from the draws before the block: predictable), *steered* block by block
    so that its cumulative ``Σ a·den'`` per unit of weight follows an accuracy's ``Σ N/(N − i)``:
    the index's terms then enter the sequence's linear form in proportion to their weights, and
    what the remainder leaves to the box shrinks to a block's fluctuation. Every coefficient
    depends only on the draws before its block, never on ``n``."""
    w = np.array([t.weight for t in terms])
    a = np.repeat(w[:, None], n, 1).astype(np.float64)
    ratio = [k for k, t in enumerate(terms) if t.kind != "lin"]
    if not ratio:
        return a
    size = max(1, math.ceil(population / BLOCK))
    slope = population / (population - np.arange(population, dtype=np.float64))
    path = np.r_[0.0, np.cumsum(slope)]
    so_far = np.zeros(len(ratio))  # Σ (a/w)·den' over the blocks before
    prior = np.array([terms[k].prior_d for k in ratio])
    seen = np.c_[
        np.zeros(len(ratio)), np.cumsum(np.stack([terms[k].den[high][:n] for k in ratio]), 1)
    ]
    for start in range(0, n, size):
        stop, full = min(n, start + size), min(population, start + size)
        d_hat = np.maximum((prior + seen[:, start]) / (1 + start), D_FLOOR)
        block = path[full] - path[start]
        rel = np.clip((path[full] - so_far) / (d_hat * block), STEER[0] / d_hat, STEER[1] / d_hat)
        a[ratio, start:stop] = w[ratio, None] * rel[:, None]
        so_far += rel * dprime[ratio, start:stop].sum(1)
    return a


def _sums(
    terms: Sequence[_Term], n: int, population: int, high: bool, bet: float
) -> tuple[float, np.ndarray, float, np.ndarray, np.ndarray]:
    """One evaluation's part of the index's log-capital as a function of the hypothesised
    ratios r (T,) of its terms, over its first ``n`` draws with the open answers at the index's
    lowest (``high`` False) or highest completion: ``(P, K, A, b, C)`` with
    ``Σ_i g_i·m_i(r) = P − K·r`` and ``Σ_i ψ(λ_i)(X_i(r) − μ̂_i(r))² = A + 2b·r + r·C·r``
    (module docstring, "The index")."""
    size = len(terms)
    if n == 0:
        return 0.0, np.zeros(size), 0.0, np.zeros(size), np.zeros((size, size))
    i = np.arange(n, dtype=np.float64)
    remaining = population - i
    num = np.stack([t.num[high][:n] for t in terms])
    den = np.stack([t.den[high][:n] for t in terms])
    nprime = num + (np.cumsum(num, 1) - num) / remaining  # u_i − E[u_i | past] = m + r·(...)
    dprime = den + (np.cumsum(den, 1) - den) / remaining
    a = _coefficients(terms, dprime, n, population, high)
    top = np.array([RANGE[t.kind] for t in terms])
    s = (np.abs(a) * top[:, None]).sum(0)  # the length of m_i's range
    g = np.minimum(bet, CAP / s)  # the bet on m_i; λ_i = g_i·s_i ≤ CAP
    p = float((g * (a * nprime).sum(0)).sum())
    k = (g[None] * a * dprime).sum(1)
    # X_i(r) = (m_i − its lowest possible value)/s_i in [0, 1], affine in r: x0 + Σ r·x1
    up = a >= 0
    x0 = (np.where(up, num, num - top[:, None]) * a / s).sum(0)
    x1 = np.where(up, 1 - den, top[:, None] - den) * a / s
    e0 = x0 - (0.5 + np.cumsum(x0) - x0) / (1 + i)  # X_i − μ̂_i, μ̂ the running mean
    e1 = x1 - (np.cumsum(x1, 1) - x1) / (1 + i)
    psi = _psi(g * s)
    return (
        p,
        k,
        float((psi * e0 * e0).sum()),
        (psi * e1 * e0).sum(1),
        np.einsum("i,ti,ui->tu", psi, e1, e1),
    )


CORNERS = 12  # ``_largest`` tries every corner of a box of at most this many dimensions


def _largest(a: float, b: np.ndarray, c: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> float:
    """The largest of the convex ``a + 2b·r + r·C·r`` over the box [lo, hi]: at one of its
    corners (only the coordinates it depends on vary). Past ``CORNERS`` of them (several
    epochs' F1s in a pair), an upper bound instead: around the centre m with half-widths h,
    ``Ψ(m) + 2|b + C·m|·h + h·|C|·h``."""
    moving = np.flatnonzero(np.abs(c).sum(1) + np.abs(b) > 0)
    if len(moving) == 0:
        return a
    if len(moving) > CORNERS:
        m, h = (lo + hi) / 2, (hi - lo) / 2
        return float(a + 2 * b @ m + m @ c @ m + 2 * np.abs(b + c @ m) @ h + h @ np.abs(c) @ h)
    corners = np.array(list(product(*[(lo[k], hi[k]) for k in moving])))
    r = corners
    bb, cc = b[moving], c[np.ix_(moving, moving)]
    return float(np.max(a + 2 * r @ bb + np.einsum("ct,tu,cu->c", r, cc, r)))


def _least(w: np.ndarray, k: np.ndarray, h: float, lo: np.ndarray, hi: np.ndarray) -> float:
    """min w·r over lo ≤ r ≤ hi with k·r ≥ h (each k_t of w_t's sign, or 0): a linear
    programme with one constraint, solved greedily (the fractional knapsack): from the corner
    that makes w·r least, move the coordinates that buy k·r for the least w·r first. When no r
    of the box meets the constraint (probability ≤ α), its largest corner."""
    r = np.where(w > 0, lo, hi)
    short = h - float(k @ r)
    if short <= 0:
        return float(w @ r)
    price = np.where(np.abs(k) > 1e-300, np.abs(w) / np.maximum(np.abs(k), 1e-300), np.inf)
    for t in np.argsort(price, kind="stable"):
        if short <= 0 or not np.isfinite(price[t]):
            break
        take = min(abs(k[t]) * (hi[t] - lo[t]), short)
        r[t] += np.sign(w[t]) * take / abs(k[t])
        short -= take
    return float(w @ r)


def product_interval(
    strata: Mapping[str, tuple[Sequence[_Term], int, int]],
    alpha: float,
    offset: float,
    target: float = TARGET,
) -> tuple[float, float]:
    """The (1 − ``alpha``) interval (0-1) of ``offset + Σ weight·ratio`` over every term of
    ``strata`` (evaluation -> (terms, draws, population)), from one supermartingale across the
    evaluations for each hypothesis of the terms' ratios (module docstring, "The index"): its
    ends are the least and greatest index of the ratios in the terms' boxes that it has not
    rejected."""
    log_term = math.log(2 / alpha)
    var = sum(_variance(ts) / population for ts, _, population in strata.values())
    scale = math.sqrt(2 * log_term / max(var, 1e-12))
    terms = [t for ts, _, _ in strata.values() for t in ts]
    w = np.array([t.weight for t in terms])
    lo = np.array([t.ratio_box[0] for t in terms])
    hi = np.array([t.ratio_box[1] for t in terms])
    ends = []
    for high in (False, True):
        p, psi, ks, at = 0.0, 0.0, [], 0
        for ts, n, population in strata.values():
            pe, ke, a, b, c = _sums(ts, n, population, high, scale / math.sqrt(target) / population)
            box = slice(at, at + len(ts))
            at += len(ts)
            p += pe
            ks.append(ke)
            psi += _largest(a, b, c, lo[box], hi[box])
        k = np.concatenate(ks)
        if high:  # the bettor on the index being lower: not rejected where k·r ≤ p + Ψ + log
            ends.append(offset - _least(-w, -k, -(p + psi + log_term), lo, hi))
        else:  # on it being higher: not rejected where k·r ≥ p − Ψ − log
            ends.append(offset + _least(w, k, p - psi - log_term, lo, hi))
    return ends[0], ends[1]


def _box(
    part: _Part, name: str, n: int, population: int, alpha: float
) -> dict[str, tuple[float, float]]:
    """Every metric of evaluation ``name`` (0-1, ``_terms``) from the first ``n`` tasks, each
    primary one at ``alpha``: the index's sequence takes its terms' ratios within them."""
    return _terms(part, name, n, population, alpha)


def _boxed(part: _Part, name: str) -> int:
    """How many sequences ``_box`` spends α on for evaluation ``name``."""
    return _primaries(name, part.epochs)


def _index_terms(
    part: _Part, name: str, box: Mapping[str, tuple[float, float]], sign: float
) -> list[_Term]:
    """The index's terms of evaluation ``name`` for one model, with ``sign`` (−1: the second model
    of a difference): per term the per-task arrays at the lowest (False) and highest (True)
    completion of ``sign``·index, and its box. The index's constant (0.125 of
    non-hallucination's 1 −) is added by the caller."""

    def by_sign(weight: float, lowest: np.ndarray, highest: np.ndarray) -> dict[bool, np.ndarray]:
        return {False: lowest, True: highest} if weight > 0 else {False: highest, True: lowest}

    weights = {metric: w for (e, metric), w in WEIGHTS.items() if e == name}
    ones = np.ones(len(part.tasks))
    epochs = range(part.epochs)
    terms = []
    if name == WILDGUARD:  # mean F1: the mean of each F1's per-epoch values
        w = sign * weights["mean_f1"] / len(WILDGUARD_F1) / part.epochs
        for q, metric in WILDGUARD_F1.items():
            for e in epochs:
                (tl, th), (el, eh) = part.comps[f"tp:{q}@{e}"], part.comps[f"err:{q}@{e}"]
                terms.append(
                    _Term(
                        "f1",
                        w,
                        by_sign(w, 2 * tl, 2 * th),
                        by_sign(w, 2 * tl + eh, 2 * th + el),
                        0.6,
                        box[f"{metric}@{e}"],
                        metric,
                    )
                )
        return terms
    cl, ch = part.comps["c"]
    w = sign * weights["accuracy"]
    terms.append(
        _Term(
            "lin",
            w,
            by_sign(w, cl, ch),
            {False: ones, True: ones},
            1.0,
            box["accuracy"],
        )
    )
    if name == OMNISCIENCE:  # −w·H/W, the mean of the per-epoch ratios
        w = -sign * weights["non_hallucination_rate"] / part.epochs
        for e in epochs:
            hl, hh = part.comps[f"h@{e}"]
            wrong = 1 - part.comps[f"c@{e}"][0]
            nh = box[f"non_hallucination_rate@{e}"]
            terms.append(
                _Term(
                    "hall",
                    w,
                    by_sign(w, hl, hh),
                    {False: wrong, True: wrong},
                    0.6,
                    (1 - nh[1], 1 - nh[0]),
                    "non_hallucination_rate",
                )
            )
    return terms


def _offset(sign: float) -> float:
    """The index's constant: the 1 of non-hallucination's 1 − H/W, at its weight."""
    return sign * WEIGHTS[(OMNISCIENCE, "non_hallucination_rate")]


def _model_figures(
    parts: Mapping[str, _Part],
    populations: Mapping[str, int],
    alpha: float,
    share: float = PRODUCT_SHARE,
) -> tuple[Estimate, dict[str, Estimate]]:
    """One model's index and metrics, simultaneous (1 − ``alpha``): the metrics' box (each
    sequence at (1 − ``share``)·α/K, Bonferroni over the K sequences) and the index's own
    sequence at ``share``·α; the index's interval is the intersection of that sequence's
    and the box's weighted sum."""
    k = sum(_boxed(part, name) for name, part in parts.items())
    a = (1 - share) * alpha / max(k, 1)
    metrics: dict[str, Estimate] = {}
    index_ok = all(e in parts and e in populations for e, _ in WEIGHTS)
    boxes = {}
    for name, part in parts.items():
        boxes[name] = _box(part, name, len(part.tasks), populations[name], a)
        points = _points(part, name)
        for metric in METRICS.get(name, ()):
            lo, hi = boxes[name][metric]
            metrics[f"{name}.{metric}"] = _estimate(points.get(metric), lo, hi)
    low = high = point = 0.0
    for (name, metric), w in WEIGHTS.items():
        est = metrics.get(f"{name}.{metric}")
        if est is None or est.point is None:
            index_ok = False
            continue
        point += w * est.point
        low += w * est.low
        high += w * est.high
    if not index_ok:
        return Estimate(None, None, None), metrics
    strata = {
        name: (
            _index_terms(parts[name], name, boxes[name], 1.0),
            len(parts[name].tasks),
            populations[name],
        )
        for name in {e for e, _ in WEIGHTS}
    }
    plo, phi = product_interval(strata, share * alpha, _offset(1.0))
    low, high = max(low, 100 * plo), min(high, 100 * phi)
    high = max(high, low)
    return _estimate(point / 100, low / 100, high / 100), metrics


# ---------------------------------------------------------------------------------------------
# pairs


def _pair_interval(
    pa: Mapping[str, _Part],
    pb: Mapping[str, _Part],
    populations: Mapping[str, int],
    alpha: float,
    boxes: tuple[Mapping[str, Mapping[str, tuple[float, float]]], ...],
) -> tuple[float, float] | None:
    """The interval of index(a) − index(b) (points) over the whole set: one sequence across the
    evaluations of the paired per-task differences of the index's terms over the tasks both were
    asked (the common prefix of the one order), at ``alpha`` (pairing removes the tasks' shared
    difficulty); its remainder bounded by ``boxes`` (a's and b's: evaluation -> ``_box``, bounds
    of their whole-set metrics that hold together with the sequence: ``_standings`` computes them
    once per model, from all it was asked), intersected with the difference of the boxes'
    indices. None when the index of either is not computable."""
    names = sorted({e for e, _ in WEIGHTS})
    if not all(e in pa and e in pb and e in populations for e in names):
        return None
    box_a, box_b = boxes
    strata = {}
    low = high = 0.0
    for name in names:
        A, B = pa[name], pb[name]
        n = min(len(A.tasks), len(B.tasks))
        if A.tasks[:n] != B.tasks[:n]:
            raise ValueError(f"{name}: the two models were not asked in the same order")
        ba, bb = box_a[name], box_b[name]
        strata[name] = (
            _index_terms(A, name, ba, 1.0) + _index_terms(B, name, bb, -1.0),
            n,
            populations[name],
        )
        for (ename, metric), w in WEIGHTS.items():
            if ename == name:
                low += w * (ba[metric][0] - bb[metric][1])
                high += w * (ba[metric][1] - bb[metric][0])
    plo, phi = product_interval(strata, alpha, 0.0, PAIR_TARGET)
    low, high = 100 * max(low, plo), 100 * min(high, phi)
    return low, max(low, high)


def _pair_intervals(
    parts: Mapping[str, Mapping[str, _Part]],
    populations: Mapping[str, int],
    alpha: float,
    wanted: Callable[[str, str], bool] = lambda a, b: True,
) -> dict[tuple[str, str], tuple[float, float] | None]:
    """(a, b) -> the anytime-valid interval of index(a) − index(b) (points; ``_pair_interval``;
    None: not computable) of every pair of ``parts``' models (a before b, by label) that
    ``wanted`` keeps, all at once at 1 − ``alpha``: PRODUCT_SHARE of α over the pairs' sequences
    (Bonferroni over every pair, kept or not), the rest over every model's boxes (Bonferroni over
    the models and their sequences); the boxes bound whole-set metrics, so each model's come from
    all it was asked. What ``--until separated`` decides on, and what an adaptive run's paired
    comparisons claim (``scoring.adaptive.claim``)."""
    labels = sorted(parts)
    pairs = list(combinations(labels, 2))
    boxes = {
        m: {
            e: _box(
                p,
                e,
                len(p.tasks),
                populations[e],
                (1 - PRODUCT_SHARE)
                * alpha
                / len(labels)
                / sum(_boxed(q, name) for name, q in parts[m].items()),
            )
            for e, p in parts[m].items()
        }
        for m in labels
    }
    return {
        (a, b): _pair_interval(
            parts[a],
            parts[b],
            populations,
            PRODUCT_SHARE * alpha / len(pairs),
            (boxes[a], boxes[b]),
        )
        for a, b in pairs
        if wanted(a, b)
    }


def pair_intervals(
    parts: Mapping[str, Mapping[str, _Part]],
    populations: Mapping[str, int],
    of: Collection[str],
    alpha: float = 0.05,
) -> dict[tuple[str, str], tuple[float, float] | None]:
    """``_pair_intervals`` of the pairs with a model in ``of`` (``parts``: ``pair_parts``'), as
    ``--until separated`` computes them, valid after stopping: a confidence sequence holds at
    every round at once, so also at the last."""
    return _pair_intervals(parts, populations, alpha, lambda a, b: a in of or b in of)


def pair_parts(
    answers: pl.DataFrame, order: Mapping[str, Sequence[str]]
) -> dict[str, dict[str, _Part]]:
    """label -> evaluation -> what ``pair_intervals`` reads of ``answers`` (``standings``' frame;
    ``order``: evaluation -> the task ids in the order the run asks them). The parts of frames of
    different evaluations are merged with ``merge_parts``."""
    return _parts(answers, order)


def merge_parts(
    into: dict[str, dict[str, _Part]], parts: Mapping[str, Mapping[str, _Part]]
) -> dict[str, dict[str, _Part]]:
    """``into`` with the evaluations of ``parts`` (other evaluations' ``pair_parts``) added."""
    for label, by_eval in parts.items():
        into.setdefault(label, {}).update(by_eval)
    return into


# ---------------------------------------------------------------------------------------------
# the public API


def standings(
    answers: pl.DataFrame,
    populations: Mapping[str, int],
    until: Until,
    *,
    alpha: float = 0.05,
    order: Mapping[str, Sequence[str]] | None = None,
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
    return _standings(_parts(answers, order), populations, until, alpha)


def _standings(
    parts: Mapping[str, Mapping[str, _Part]],
    populations: Mapping[str, int],
    until: Until,
    alpha: float,
) -> dict[str, Standing]:
    """``standings`` from each model's parts (label -> evaluation -> ``_Part``, as ``_parts``
    makes them; ``scoring.planner.simulate`` slices one whole set's with ``_Part.head``)."""
    for label, by_eval in parts.items():
        for name, part in by_eval.items():
            if name not in populations:
                raise ValueError(f"{label}: evaluation {name!r} has no population")
            if len(part.tasks) > populations[name]:
                raise ValueError(
                    f"{label}: {len(part.tasks)} tasks of {name} asked, more than its "
                    f"population of {populations[name]}"
                )
    labels = sorted(parts)
    out: dict[str, Standing] = {}
    every = until.rule == "precision" and until.every_metric
    product = EVERY_METRIC_SHARE if every else PRODUCT_SHARE
    figures = {m: _model_figures(parts[m], populations, alpha, product) for m in labels}
    exhausted = {
        m: all(len(parts[m].get(e, _Part([])).tasks) >= n for e, n in populations.items())
        for m in labels
    }
    undecided: dict[str, list[str]] = {m: [] for m in labels}  # models not yet told from m
    # the relation that decided each pair, as seen from m: above, below or within ±Δ of whom
    relations: dict[str, dict[str, list[str]]] = {
        m: {"above": [], "below": [], "within": []} for m in labels
    }
    share = {  # the share of the whole set each model was asked
        m: sum(len(p.tasks) for p in parts[m].values()) / max(1, sum(populations.values()))
        for m in labels
    }
    settles_at: dict[str, float | None] = dict.fromkeys(labels)
    if until.rule == "separated":
        intervals = _pair_intervals(
            parts, populations, alpha, lambda a, b: not (exhausted[a] and exhausted[b])
        )
        for (a, b), iv in intervals.items():
            if iv is not None and iv[0] > 0:  # a − b > 0: a above b
                relations[a]["above"].append(b)
                relations[b]["below"].append(a)
                continue
            if iv is not None and iv[1] < 0:
                relations[a]["below"].append(b)
                relations[b]["above"].append(a)
                continue
            if iv is not None and iv[0] >= -until.points and iv[1] <= until.points:
                relations[a]["within"].append(b)
                relations[b]["within"].append(a)
                continue
            undecided[a].append(b)
            undecided[b].append(a)
            # decided once the half-width is below |centre| (ordered) or Δ − |centre| (within Δ)
            at = 1.0
            if iv is not None:
                centre, half = abs(iv[0] + iv[1]) / 200, (iv[1] - iv[0]) / 200
                at = _predicted(
                    half, max(centre, until.points / 100 - centre), min(share[a], share[b])
                )
            for m in (a, b):
                settles_at[m] = max(settles_at[m] or 0.0, at)
    for m in labels:
        index, metrics = figures[m]
        asked = {e: len(parts[m][e].tasks) if e in parts[m] else 0 for e in populations}
        settled, rule, reason = False, None, ""
        if exhausted[m]:
            settled, rule, reason = True, "exhausted", "every task of the whole set was asked"
        elif until.rule == "precision":
            # every figure the rule reads, the index first: name -> its half-width
            widths = {"index": index.half_width}
            if until.every_metric:
                widths |= {k: metrics[k].half_width for k in sorted(metrics)}
            known = {k: w for k, w in widths.items() if w is not None}
            p = _unit(until.points)
            if len(known) == len(widths):
                widest = max(known, key=known.__getitem__)  # the first of the widest
                if known[widest] <= until.points:
                    settled, rule = True, str(until)
                    reason = f"index ±{known['index']:.2f} ≤ ±{p}"
                    if until.every_metric:
                        also = "" if widest == "index" else f"; index ±{known['index']:.2f}"
                        reason = (
                            f"every figure within ±{p} (widest: {widest} ±{known[widest]:.2f}"
                            f"{also})"
                        )
                else:
                    settles_at[m] = _predicted(known[widest], until.points, share[m])
                    reason = f"{widest} ±{known[widest]:.2f} > ±{p}"
            else:
                unknown = next(k for k in widths if k not in known)
                reason = f"{unknown} not computable yet"
        else:
            if not undecided[m]:
                settled, rule = True, str(until)
                here = index.point

                def distance(other: str, here: float | None = here) -> tuple[float, str]:
                    there = figures[other][0].point
                    near = math.inf if here is None or there is None else abs(there - here)
                    return near, other

                # the nearest models first (by index estimate), then by label
                r = {k: sorted(v, key=distance) for k, v in relations[m].items()}
                reason = (
                    f"above {_named(r['above'])}; below {_named(r['below'])}; "
                    f"within ±{_unit(until.points)} of {_named(r['within'])}"
                )
            else:
                reason = (
                    f"not yet told apart from {len(undecided[m])}: {', '.join(undecided[m][:3])}"
                )
        out[m] = Standing(
            m,
            asked,
            dict(populations),
            index,
            metrics,
            settled,
            rule,
            reason,
            None if settled else settles_at[m],
        )
    return out


def _unit(points: float) -> str:
    """``points`` index points as a reason says them: "5 points", "0.5 points", "1 point"."""
    return f"{points:g} point" + ("" if points == 1 else "s")


NAMED = 3  # a reason names at most this many models per relation


def _named(models: Sequence[str]) -> str:
    """Models as a settled ``separated`` reason names them: "none", "a" (one), "2 (a, b)", and
    past ``NAMED`` of them "5 (a, b, c, +2 more)"."""
    if not models:
        return "none"
    if len(models) == 1:
        return models[0]
    more = f", +{len(models) - NAMED} more" if len(models) > NAMED else ""
    return f"{len(models)} ({', '.join(models[:NAMED])}{more})"


def _predicted(half: float, needed: float, share: float) -> float:
    """The share of the whole set (0-1) at which a half-width ``half`` at ``share`` is predicted
    to be at most ``needed`` (same units): the half-width of a sample drawn without replacement
    shrinks as ``sqrt((1 − f)/f)`` (the sequence's a little faster, so the prediction errs late),
    times ``AIM_MARGIN``; 1 when ``needed`` is not above 0 or nothing was asked."""
    if needed <= 0 or not 0 < share < 1:
        return 1.0
    if half <= needed:
        return share
    return min(1.0, AIM_MARGIN / (1 + (needed / half) ** 2 * (1 - share) / share))


def schedule(round_index: int, *, first: float = FIRST_ROUND, growth: float = GROWTH) -> float:
    """The share of every evaluation asked after round ``round_index`` (0-based): round k asks
    ``first·growth^k`` of each; the shares add up (capped at 1)."""
    if round_index < 0:
        raise ValueError(f"round_index must be ≥ 0, got {round_index}")
    return min(1.0, first * (growth ** (round_index + 1) - 1) / (growth - 1))


AIM_MARGIN = 1.02  # an aimed round asks this much more than the share predicted to settle
MIN_STEP = 0.01  # ... and at least this share of the set more than was asked


def aim(standings: Iterable[Standing]) -> float | None:
    """The share of the whole set (0-1) the next round should stop at so that no running model is
    asked past the share predicted to settle it: the least ``settles_at`` of the models not
    settled (``_standings``: under ``precision=P`` from the widest half-width the rule needs,
    under ``separated`` from the latest-decided of its pairs, each carried as
    ``sqrt((1 − f)/f)``). None when no model has a prediction: the rounds then follow the
    schedule alone (``round_sizes``)."""
    ats = [st.settles_at for st in standings if not st.settled and st.settles_at is not None]
    return min(ats) if ats else None


def round_sizes(
    asked: Mapping[str, int],
    populations: Mapping[str, int],
    *,
    round_index: int = 0,
    aim: float | None = None,
) -> dict[str, int]:
    """How many MORE tasks of each evaluation the next round asks a running model: every
    evaluation is brought to the same share of its population, the first share of the schedule
    (``schedule``: 4% of the set first, each round 1.25× the one before) from round
    ``round_index`` on that is above what it was already asked (a resumed run still progresses),
    never past the population. ``aim`` (``aim``: the share predicted to settle a running model)
    stops the round short of that share when it is less, and at least ``MIN_STEP`` of the set
    above the largest share asked of an evaluation. All zero only when every evaluation is
    exhausted."""
    for name, n in populations.items():
        if not 0 <= asked.get(name, 0) <= n:
            raise ValueError(f"{name}: {asked.get(name, 0)} asked of a population of {n}")
    k = round_index
    done = max((asked.get(e, 0) / n for e, n in populations.items() if n), default=1.0)

    def sizes(share: float) -> dict[str, int]:
        return {
            e: max(0, min(n, math.ceil(share * n - 1e-9)) - asked.get(e, 0))
            for e, n in populations.items()
        }

    while True:
        share = schedule(k)
        planned = sizes(share)
        if any(planned.values()) or share >= 1.0:
            if aim is not None and aim < share:  # short of the schedule, if it asks anything
                aimed = sizes(min(share, max(aim, done + MIN_STEP)))
                if any(aimed.values()):
                    return aimed
            return planned
        k += 1
