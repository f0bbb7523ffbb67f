"""Paired comparisons of the models scored together, and their ranks with sets that hold jointly.

Every model of a scoring is scored on the same tasks, and every model's bootstrap intervals come
from the same resamples of those tasks (``scoring.bootstrap``): so a difference between two models
can be resampled *paired*, each resample's difference computed on the same tasks for both. (An
adaptive run's models are scored over the parts they were asked, ``scoring.adaptive.asked_part``:
a question with no row of a model was never asked it; each resample's figure of a model is over
its part, and two models asked different parts get no McNemar test, ``discordant``.)

For every pair (a, b) of models (a before b in ``labels``' order), and for the Decision Index and
each evaluation metric (``sums.METRICS``) that both have (not null):

* ``difference`` = metric(a) − metric(b), in points of the 0-100 scale;
* ``low``/``high``: its 95% interval (``scoring.simultaneous``): for accuracy between two models of
  one epoch each, the hull of Newcombe's paired interval (1998, method 10) and Bonett & Price's
  (2012) adjusted Wald interval, from the 2×2 table of right and wrong answers
  (``simultaneous.newcombe``) where both models' answers are complete (with failed or missing
  answers the table counts them not right while the difference is over the answered questions, so
  such a pair takes the bootstrap interval below, around its difference); for two models that
  answered alike on every task behind a metric (a difference of 0 no resample moves), 0 ± the
  bound of the share of tasks on which they could differ (``simultaneous.identical_bound``:
  Wilson's upper bound for none of the tasks both replied to; never of zero width), hulled with
  MOVER as below where the metric has score-type intervals of its own, and for the Decision Index
  its terms' intervals weighed, added within an evaluation and square-and-added over the
  evaluations (``_terms_bound``); ``interval`` says "identical answers: ..."; otherwise
  the symmetric bootstrap interval over the resamples, for a metric with a
  score-type interval of its own (``Figure.low``: non-hallucination, the F1s, mean F1, accuracy of
  several epochs) its hull with the MOVER interval of the difference
  (``simultaneous.mover_difference``, Zou & Donner 2008; the bootstrap interval alone covered an F1
  difference 0.925 of the time at 60 questions); ``interval`` names which. The Decision Index's is
  the symmetric bootstrap interval alone, the inversion of its own test (its hull with MOVER was
  far too wide: ``benchmarks/stats_compare.py`` gives the figures); where the pair answered alike
  on some evaluations, their bounds (``_terms_bound``) are square-added to its half-width;
* ``se``: the standard deviation of the resampled difference;
* ``p_value``, the pair's own two-sided test, ``test`` names which: for accuracy between two models
  of one epoch each, the exact McNemar test (McNemar 1947) on the discordant answers ``a_only`` (a
  right, b wrong) and ``b_only``: p = min(1, 2·P(X ≤ min(a_only, b_only))), X ~ Binomial(a_only +
  b_only, ½) (``mcnemar_p``, as ``scipy.stats.binomtest`` computes it); otherwise the paired
  bootstrap test (1 + #{|Δ*_b − Δ| ≥ |Δ|}) / (B + 1) over the B resamples (never 0: at least
  1 / (B + 1)); where no resample moves a nonzero difference (every task favours one model
  alike), at least the sign test's 2 · ½ⁿ over the n tasks, as is ``p_adjusted``, and its
  interval runs from d · (n − z²)/(n + z²) to d;
* ``p_adjusted``, valid for every pair of one figure (metric) at once — the family is the pairs of
  models that both have the figure: the max-T step-down of Westfall & Young (1993) and Romano & Wolf
  (2005) on the paired differences over the same resamples (``simultaneous.max_t``: unstudentised,
  as measured studentised statistics over one set of resamples inflate the family-wise error), whose
  smallest value is 1 / (B + 1) whatever the number of pairs; for accuracy with McNemar's test, the
  larger of that and the exact McNemar p (a pair is then separated only when both separate it, so
  the family-wise error rate is at most the step-down's, and no pair is separated on fewer
  discordant answers than the exact test allows); ``adjustment`` names it;
* ``significant``: ``p_adjusted`` < 1 − confidence *and* the interval (``low``, ``high``) leaves
  0 out. The index's interval is its test's own inversion, so the two agree there (ties aside);
  a metric's MOVER hull is wider than its test's inversion (the hull is there because the
  bootstrap alone covered an F1 difference only 0.925 of the time at 60 questions: the same
  bootstrap's test rejects too often there), and accuracy's Newcombe interval is not McNemar's
  inversion; where they disagree the pair is not separated, so no claim stands beside an interval
  holding 0, and the family-wise error rate stays at most the step-down's. Every significance claim
  (the tied groups, the rank sets, the report's and ``dxi view``'s marks, the terminal's ranking
  line) reads this one boolean; a filter can AND another condition into it before ``ranks`` is
  computed again.

Ranks (by the Decision Index, among the models that have one; ``ranks``): ``rank`` = 1 + the number
of models placed higher, each model placed by its index, a provisional one by its lowest bound (the
worst outcome of its failed and missing answers, ``scoring.bounds``: a partial result never ranks
above what it could turn out to be; the order of every table follows, ``Summary.order``);
``rank_low``/``rank_high``: its marginal 95% rank set (Mogstad et al. 2024, §3.1: the max-T
step-down over that model's pairs alone, ``marginal_rank_sets``; docs/outputs.md gives its
coverage); ``rank_set_low``/``rank_set_high``: the simultaneous rank set of Mogstad, Romano, Shaikh
& Wilhelm (2024) from the index's ``significant`` pairs: every model's true rank lies in its set at
once with 95% confidence; ``group``: statistically tied models, consecutive in rank order, a
boundary only where every model above it is significantly above every model below it: the groups'
order holds for every pair across them, with the comparisons' simultaneous confidence (A > B > C
with only A above C claimed is one group, not {A, B} above {C}); so groups and rank sets agree.

A comparison that involves a provisional figure (``scoring.provisional``: answers failed or
missing) has ``complete`` false; for accuracy its exact McNemar p is the largest any outcome of the
open answers could give (``worst_mcnemar``): the claim holds whatever they would have been.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np
import polars as pl

from .bootstrap import Bootstrap
from .decision_index import WEIGHTS, index_values
from .intervals import SCORE_METRICS
from .simultaneous import (
    correlation,
    identical_bound,
    marginal_rank_sets,
    max_t,
    mcnemar_p,
    mover_difference,
    newcombe,
    rank_sets,
    symmetric_interval,
    worst_mcnemar,
)
from .sums import COUNTS, FLAGS, METRICS, Cube, EvalMetrics

ACCURACY = "accuracy"  # the metric of accuracy type: McNemar's test applies
INDEX = "decision_index"
MCNEMAR = "McNemar exact"
BOOTSTRAP_T = "paired bootstrap"
MAX_T = "max-T step-down"
MAX_T_MCNEMAR = "max-T step-down and McNemar exact"
NEWCOMBE = "Newcombe (method 10) and Bonett-Price hull"
SYMMETRIC = "symmetric bootstrap"
SYMMETRIC_MOVER = "symmetric bootstrap and MOVER hull"
IDENTICAL = "identical answers: Wilson bound of the tasks that could differ"
IDENTICAL_INDEX = "identical answers: its terms' intervals, square-and-add over the evaluations"
IDENTICAL_MOVER = IDENTICAL + " and MOVER hull"
CONSTANT = "every task favours one model: Wilson bound"
SYMMETRIC_ALIKE = (
    "symmetric bootstrap, square-and-added with the bounds of the terms answered alike"
)
METHOD = {
    "adjustment": (
        "max-T step-down (Westfall & Young 1993; Romano & Wolf 2005, JASA 100:94-108) on the "
        "paired differences over the bootstrap resamples (max-|Δ| form), smallest p_adjusted "
        "1/(B + 1) whatever the number of pairs; for accuracy with McNemar's test, p_adjusted is "
        "the larger of the step-down's and the exact McNemar p"
    ),
    "family": (
        "per figure (the index, each evaluation metric): every pair of models that both have it"
    ),
    "significant": "p_adjusted < 1 − confidence and ci leaving 0 out (a pair is separated only "
    "where its test and its interval agree)",
    "p_value": {
        "accuracy (one epoch each)": "exact McNemar test (two-sided binomial, p = ½)",
        "otherwise": "bootstrap test, (1 + #{|Δ* − Δ| ≥ |Δ|}) / (B + 1)",
    },
    "ci": {
        "accuracy (one epoch each, both models' answers complete)": (
            "the hull of Newcombe's paired interval (Statistics in Medicine 1998, method "
            "10) and Bonett & Price's adjusted Wald interval (2012)"
        ),
        "otherwise": "symmetric bootstrap interval d ± q, q the 95% quantile of |Δ* − Δ|; for "
        "non-hallucination, the F1s and mean F1 (and accuracy of several epochs) its hull with "
        "the MOVER interval of the difference from the two models' own intervals and the "
        "correlation of their resampled figures (Zou & Donner 2008, Statistics in Medicine "
        "27:1693-1702)",
        "identical answers (no resample moves a difference of 0)": "0 ± 100·z²/(m + z²), "
        "Wilson's upper bound of the share of tasks on which the two would differ when none of "
        "the m tasks both replied to does (never zero width), hulled with MOVER as above where "
        "the metric has its own intervals; the index: its terms' half-widths weighed, added "
        "within an evaluation and square-and-added over the evaluations; for a pair alike on "
        "some evaluations only, those evaluations' share is square-added to the bootstrap's",
    },
    "rank_set": (
        "simultaneous rank sets (Mogstad, Romano, Shaikh & Wilhelm 2024, Review of Economic "
        "Studies): "
        "[1 + models significantly above, N − models significantly below], by the index's "
        "significant pairs; every model's rank lies in its set at once with 95% confidence"
    ),
}
"""summary.json's ``comparison_method``: the procedures, in words, with their sources."""
COMPARISON_SCHEMA = {
    "a": pl.String,
    "b": pl.String,
    "eval": pl.String,
    "metric": pl.String,
    "difference": pl.Float64,
    "low": pl.Float64,
    "high": pl.Float64,
    "interval": pl.String,
    "se": pl.Float64,
    "p_value": pl.Float64,
    "test": pl.String,
    "p_adjusted": pl.Float64,
    "adjustment": pl.String,
    "significant": pl.Boolean,
    "a_only": pl.Int64,
    "b_only": pl.Int64,
    "mcnemar_p": pl.Float64,
    "complete": pl.Boolean,
}
RANK_SCHEMA = {
    "label": pl.String,
    "rank": pl.Int64,
    "rank_low": pl.Int64,
    "rank_high": pl.Int64,
    "rank_set_low": pl.Int64,
    "rank_set_high": pl.Int64,
    "group": pl.Int64,
}
TASKS_AT_ONCE = 65_536  # tasks whose right/wrong matrix is held at a time (``discordant``)


def discordant(cube: Cube) -> np.ndarray | None:
    """For an accuracy (choice) evaluation: ``d[i, j]`` = the answers label ``i`` got right and
    label ``j`` wrong, paired by question, and on the diagonal ``d[i, i]`` the answers label ``i``
    got right (labels × labels, int64; a failed, missing or invalid answer is not right); −1 where
    either label has several epochs (the answers of one task are then not independent pairs), and
    where the two were not asked the same questions (an adaptive run stopped one before the other,
    ``scoring.adaptive.asked_part``: a question with no row of a label was never asked it, and
    each figure is over its own part, so the difference is not one of paired answers). None for
    yes/no evaluations."""
    if cube.kind != "choice":
        return None
    n_labels = len(cube.labels)
    right = ((cube.flags >> FLAGS.index("correct")) & 1).astype(bool)
    first = cube.s == 0
    out = np.zeros((n_labels, n_labels), np.int64)
    common = np.zeros((n_labels, n_labels), np.int64)  # the questions both were asked
    total = np.zeros(n_labels, np.int64)
    for start in range(
        0, cube.n_tasks, TASKS_AT_ONCE
    ):  # a task is one question in a choice evaluation
        stop = min(start + TASKS_AT_ONCE, cube.n_tasks)
        mine = first & (cube.t >= start) & (cube.t < stop)
        r = np.zeros((n_labels, stop - start), np.float32)
        asked = np.zeros_like(r)
        r[cube.l[mine], cube.t[mine] - start] = right[mine]
        asked[cube.l[mine], cube.t[mine] - start] = 1
        # exact: integer sums far below 2**24 per block
        out += np.rint(r @ (asked - r).T).astype(np.int64)
        common += np.rint(asked @ asked.T).astype(np.int64)
        total += np.rint(r.sum(1)).astype(np.int64)
    out[np.diag_indices(n_labels)] = total
    several = (~cube.absent).sum(1) > 1 if cube.n_epochs > 1 else np.zeros(n_labels, bool)
    out[several, :] = -1
    out[:, several] = -1
    size = np.diag(common)
    out[(common != size[:, None]) | (common != size[None, :])] = -1
    return out


def open_pairs(cube: Cube) -> np.ndarray | None:
    """For an accuracy (choice) evaluation where some label's answer failed or is missing (no
    reply, whatever it would have been), what those answers could make of each pair's discordant
    counts: shape (3, labels, labels) int64, ``[0][i, j]`` the answers surely i-right-j-wrong (both
    replies), ``[1][i, j]`` those that could still be (i's open and j's a wrong reply, or i's right
    and j's open), ``[2][i, j]`` the questions both left open (either way, or concordant). A
    question with no row of a label was never asked it (``discordant``): it is none of these. None
    when every answer is a reply (``discordant`` is then exact) or for yes/no evaluations. One epoch
    (the first), as ``discordant``; ``worst_mcnemar`` reads it."""
    if cube.kind != "choice":
        return None
    first = cube.s == 0
    reply = first & (cube.stat("n") > 0)
    if reply.sum() == first.sum():
        return None
    n_labels = len(cube.labels)
    right = ((cube.flags >> FLAGS.index("correct")) & 1).astype(bool) & reply
    out = np.zeros((3, n_labels, n_labels), np.int64)
    for start in range(0, cube.n_tasks, TASKS_AT_ONCE):
        stop = min(start + TASKS_AT_ONCE, cube.n_tasks)
        mine = (cube.t >= start) & (cube.t < stop)
        r = np.zeros((n_labels, stop - start), np.float32)
        q = np.zeros_like(r)
        m = np.zeros_like(r)
        r[cube.l[mine & right], cube.t[mine & right] - start] = 1
        wrong = mine & reply & ~right
        q[cube.l[wrong], cube.t[wrong] - start] = 1
        open_ = mine & first & ~reply  # asked, no reply: failed or missing
        m[cube.l[open_], cube.t[open_] - start] = 1
        out += open_counts(r, q, m)
    return out


def open_counts(right: np.ndarray, wrong: np.ndarray, open_: np.ndarray) -> np.ndarray:
    """``open_pairs``' counts of the answers of labels × questions (0/1 or bool, one row a label):
    ``right`` and ``wrong`` replies and ``open_`` ones (asked, no reply: failed or missing; a
    question a label was not asked is none of the three); shape (3, labels, labels) int64, as
    ``open_pairs`` describes. Exact for up to 2**24 questions (float32 sums)."""
    r, q, m = (np.asarray(x, np.float32) for x in (right, wrong, open_))
    return np.rint(np.stack([r @ q.T, m @ q.T + r @ m.T, m @ m.T])).astype(np.int64)


@dataclass(frozen=True, slots=True)
class Figure:
    """One metric of every model: ``point`` (labels,), ``replicates`` (resamples, labels),
    ``complete`` (labels,): no failed or missing answer behind the figure; ``floor`` (labels,
    labels): the half-width, in points, of the interval of a difference between two models that
    answered alike on every task (``simultaneous.identical_bound``; the index: None, ``compare``
    takes it from its terms'); ``tasks``: its number of
    tasks (the index: the fewest of its
    evaluations'); ``low``/``high`` (labels,): each model's own score-type interval of the figure
    (``scoring.intervals``), None for a figure without one and for the index (the differences'
    interval is then the symmetric bootstrap's alone: the module docstring)."""

    eval: str | None
    metric: str
    point: np.ndarray
    replicates: np.ndarray
    complete: np.ndarray
    floor: np.ndarray | None
    tasks: int
    low: np.ndarray | None = None
    high: np.ndarray | None = None


def figures(estimates: dict[str, EvalMetrics], labels: list[str], boot: Bootstrap) -> list[Figure]:
    """The Decision Index and every evaluation metric of ``estimates`` (over ``labels``, with
    replicates from ``boot``), in summary order; a null metric is NaN."""
    complete = {
        name: (est.counts[:, COUNTS.index("failed")] + est.counts[:, COUNTS.index("missing")]) == 0
        for name, est in estimates.items()
    }
    index = index_values(estimates, labels, boot)
    unavailable = np.array([bool(u) for u in index.unavailable], dtype=bool)
    index_point = np.where(unavailable, np.nan, index.point)
    out = [
        Figure(
            None,
            INDEX,
            index_point,
            index.replicates,
            np.logical_and.reduce([complete[n] for n in complete], initial=True),
            None,
            min((est.n for est in estimates.values()), default=0),
        )
    ]
    for name, metrics in METRICS.items():
        est = estimates.get(name)
        if est is None:
            continue
        for metric in metrics:
            point = np.where(est.unscored() | ~est.answered, np.nan, est.point[metric])
            out.append(
                Figure(
                    name,
                    metric,
                    point,
                    est.replicates[metric],
                    complete[name],
                    identical_bound(_replied(est), boot.confidence),
                    est.n,
                    est.low.get(metric) if metric in SCORE_METRICS else None,
                    est.high.get(metric) if metric in SCORE_METRICS else None,
                )
            )
    return out


def _replied(est: EvalMetrics) -> np.ndarray:
    """The tasks each label replied to (the *n* of its figures), every task without that count."""
    return est.replied if est.replied is not None else np.full(len(est.answered), est.n)


def compare(
    estimates: dict[str, EvalMetrics],
    labels: list[str],
    boot: Bootstrap,
    discordants: dict[str, np.ndarray | None] | None = None,
    claim: Callable[[pl.DataFrame], pl.DataFrame] | None = None,
    opens: dict[str, np.ndarray | None] | None = None,
    place: np.ndarray | None = None,
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Every pair's comparisons (``COMPARISON_SCHEMA``) and every model's rank (``RANK_SCHEMA``),
    as the module docstring defines them. ``estimates`` maps evaluation -> ``sums.EvalMetrics``
    over ``labels`` with replicates from ``boot``; ``discordants`` maps an accuracy evaluation ->
    ``discordant`` of its cube (None or absent: no McNemar test, no Newcombe interval);
    ``claim``, given, turns the comparisons into those that may be claimed (it may add columns
    and only ever clears ``significant``: ``scoring.scored``'s rule for provisional figures)
    before the ranks, tied groups and rank sets are read from them; ``opens`` maps an accuracy
    evaluation with failed or missing answers -> ``open_pairs`` of its cube: the exact McNemar p
    of such a pair (``mcnemar_p`` and what enters ``p_adjusted``) is then the worst any outcome
    of the open answers could give (``worst_mcnemar``), while ``a_only``/``b_only`` stay the
    counts with the open answers as not right. ``place`` (labels,) is what each model is placed by
    in ``ranks`` (default: its index)."""
    discordants, opens = discordants or {}, opens or {}
    rows: list[pl.DataFrame] = []
    n = len(labels)
    first, second = np.triu_indices(n, 1)
    alpha = 1 - boot.confidence
    found = figures(estimates, labels, boot) if n else []
    halves: dict[tuple[str | None, str], np.ndarray] = {}  # each metric's half-widths, per pair
    for fig in found[1:] + found[:1]:  # the index last: its identical pairs read its terms'
        both = ~np.isnan(fig.point[first]) & ~np.isnan(fig.point[second])
        i, j = first[both], second[both]
        per_model = np.ascontiguousarray(
            fig.replicates.T
        )  # (labels, resamples): a pair's rows are gathered
        d = fig.point[i] - fig.point[j]

        def pair_replicates(
            rows: np.ndarray,
            i: np.ndarray = i,
            j: np.ndarray = j,
            per_model: np.ndarray = per_model,
        ) -> np.ndarray:
            return per_model[i[rows]] - per_model[j[rows]]

        se, p_boot, p_step = max_t(d, pair_replicates, len(i), per_model.shape[1])
        table = discordants.get(fig.eval) if fig.metric == ACCURACY else None
        if table is not None:
            a_only, b_only = table[i, j], table[j, i]
            paired = a_only >= 0  # -1: several epochs, no test
        else:
            a_only = b_only = np.full(len(i), -1, np.int64)
            paired = np.zeros(len(i), bool)
        mcnemar = np.where(paired, mcnemar_p(np.maximum(a_only, 0), np.maximum(b_only, 0)), np.nan)
        open_ = opens.get(fig.eval) if table is not None else None
        if open_ is not None:  # the worst outcome of the open answers (complete pairs: the same p)
            worst = worst_mcnemar(
                open_[0][i, j], open_[0][j, i], open_[1][i, j], open_[1][j, i], open_[2][i, j]
            )
            mcnemar = np.where(paired, np.fmax(mcnemar, worst), np.nan)
        low, high = np.empty(len(i)), np.empty(len(i))
        floor = _terms_bound(halves, i, j) if fig.floor is None else fig.floor[i, j]
        for start in range(0, len(i), 4096):
            rows_ = np.arange(start, min(start + 4096, len(i)))
            low[rows_], high[rows_] = symmetric_interval(
                d[rows_], pair_replicates(rows_), boot.confidence, floor[rows_]
            )
            if fig.low is not None:  # the hull with the MOVER interval of the models' own
                a, b = i[rows_], j[rows_]
                r = correlation(per_model[a], per_model[b])
                m_low, m_high = mover_difference(
                    (fig.point[a], fig.low[a], fig.high[a]),
                    (fig.point[b], fig.low[b], fig.high[b]),
                    r,
                )
                low[rows_] = np.fmin(low[rows_], m_low)
                high[rows_] = np.fmax(high[rows_], m_high)
        alike = np.zeros(len(i), bool)  # the index: terms answered alike add their bounds
        if fig.eval is None:
            extra = _terms_bound(halves, i, j)
            alike = (se > 0) & (extra > 0)
            low = np.where(alike, np.maximum(d - np.hypot(d - low, extra), -100), low)
            high = np.where(alike, np.minimum(d + np.hypot(high - d, extra), 100), high)
        # Newcombe's interval is of the 2×2 table's difference: where a model of the pair has
        # failed or missing answers, that table counts them not right while ``d`` is over the
        # answered questions, so such a pair keeps the bootstrap interval around ``d``
        tabled = paired & fig.complete[i] & fig.complete[j]
        if tabled.any():  # over the questions both were asked (the same: ``discordant``)
            est = estimates[fig.eval]
            tasks = est.n if est.asked is None else est.asked[i]
            right_a = table[i, i]
            both_right = right_a - a_only
            both_wrong = tasks - right_a - b_only
            n_low, n_high = newcombe(a_only, b_only, both_right, both_wrong, boot.confidence)
            low, high = np.where(tabled, n_low, low), np.where(tabled, n_high, high)
        # a difference no resample moves (every task favours the same model alike): the bootstrap
        # cannot judge it, the sign test over the tasks can: at least 2 · ½**tasks
        constant = (se == 0) & (d != 0) & ~paired
        sign_test = min(1.0, 2.0 * 0.5**fig.tasks) if fig.tasks > 0 else 1.0
        p_boot = np.where(constant, np.fmax(p_boot, sign_test), p_boot)
        # and its interval: from d · (n − z²)/(n + z²) (Wilson's lower bound of the share of tasks
        # favouring that model, when all n do, as a difference) to d
        z2 = NormalDist().inv_cdf(1 - alpha / 2) ** 2
        near = d * (fig.tasks - z2) / (fig.tasks + z2) if fig.tasks > 0 else np.full(len(d), np.nan)
        low = np.where(constant, np.fmin(near, d), low)
        high = np.where(constant, np.fmax(near, d), high)
        p_step = np.where(constant, np.fmax(p_step, sign_test), p_step)
        p_value = np.where(paired, mcnemar, p_boot)
        identical = (d == 0) & (se == 0)  # alike on every task: ``floor`` (MOVER's hull kept)
        identical_label = (
            IDENTICAL_INDEX
            if fig.eval is None
            else IDENTICAL_MOVER
            if fig.low is not None
            else IDENTICAL
        )
        p_adjusted = np.where(paired, np.fmax(p_step, mcnemar), p_step)
        halves[(fig.eval, fig.metric)] = np.full((n, n), np.nan)
        halves[(fig.eval, fig.metric)][i, j] = np.where(
            identical, np.fmax(np.abs(low), np.abs(high)), 0.0
        )
        rows.append(
            pl.DataFrame(
                {
                    "a": [labels[x] for x in i],
                    "b": [labels[x] for x in j],
                    "eval": pl.Series([fig.eval] * len(i), dtype=pl.String),
                    "metric": [fig.metric] * len(i),
                    "difference": d,
                    "low": low,
                    "high": high,
                    "interval": np.select(
                        [tabled, identical, constant, alike],
                        [NEWCOMBE, identical_label, CONSTANT, SYMMETRIC_ALIKE],
                        SYMMETRIC if fig.low is None else SYMMETRIC_MOVER,
                    ).tolist()
                    if len(i)
                    else [],
                    "se": se,
                    "p_value": p_value,
                    "test": np.where(paired, MCNEMAR, BOOTSTRAP_T).tolist() if len(i) else [],
                    "p_adjusted": p_adjusted,
                    "adjustment": np.where(paired, MAX_T_MCNEMAR, MAX_T).tolist() if len(i) else [],
                    # separated only where the interval printed beside it agrees (the MOVER
                    # hull of a metric is wider than the test's own inversion: the module docs)
                    "significant": (np.nan_to_num(p_adjusted, nan=1.0) < alpha)
                    & ((low > 0) | (high < 0)),
                    "a_only": _where(paired, a_only),
                    "b_only": _where(paired, b_only),
                    "mcnemar_p": mcnemar,
                    "complete": fig.complete[i] & fig.complete[j],
                },
                schema=COMPARISON_SCHEMA,
            ).fill_nan(None)
        )
    comparisons = (
        pl.concat(rows[-1:] + rows[:-1]) if rows else pl.DataFrame(schema=COMPARISON_SCHEMA)
    )
    if claim is not None:
        comparisons = claim(comparisons)
    return comparisons, (
        ranks(found[0], labels, comparisons, boot.confidence, place)
        if found
        else pl.DataFrame(schema=RANK_SCHEMA)
    )


def _terms_bound(
    halves: dict[tuple[str | None, str], np.ndarray], i: np.ndarray, j: np.ndarray
) -> np.ndarray:
    """The Decision Index's half-width for pairs (``i``, ``j``) that answered alike on every task:
    its terms' half-widths (``halves``, per metric (labels, labels); 0 where no resample moves the
    pair's difference there) weighed, added within an evaluation (the same tasks) and
    square-and-added over the evaluations (independent samples of tasks: MOVER's combination, Zou &
    Donner 2008). Over the evaluations a pair answered alike (every term of it unmoved: for a
    choice evaluation its accuracy then has no discordant answer) and only those, so it is 0 for a
    pair alike nowhere; ``compare`` square-adds it to the bootstrap's half-width, which sees no
    spread there (``tests/test_compare.py``: two models differing on 1% of 100 tasks of every
    evaluation, the index difference's interval covered 0.90 without, 0.965 with)."""
    parts: dict[str, np.ndarray] = {}
    alike: dict[str, np.ndarray] = {}
    for (name, metric), weight in WEIGHTS.items():
        half = halves.get((name, metric))
        term = weight * (half[i, j] if half is not None else np.full(len(i), np.nan))
        parts[name] = parts.get(name, 0.0) + term
        alike[name] = alike.get(name, True) & ~(term == 0)
    return np.sqrt(sum(np.where(alike[name], part, 0.0) ** 2 for name, part in parts.items()))


def _where(keep: np.ndarray, counts: np.ndarray) -> pl.Series:
    """``counts`` as an Int64 column, null where not ``keep``."""
    out = pl.Series(counts, dtype=pl.Int64)
    return out.scatter(np.flatnonzero(~keep), None) if (~keep).any() else out


def tied_groups(point: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Each model's tied group (1, 2, ...: the module docstring's ``group``) from ``point``
    (models,) and the pairs claimed (``a[k]``, ``b[k]``: positions in ``point``), every pair across
    two groups a claim. ``ranks`` reads ``significant``; an adaptive run's groups, the claims in
    force after stopping (``scoring.adaptive.headline``). O(models²)."""
    order = np.argsort(-point, kind="stable")
    p = point[order]
    separated = np.zeros((len(point), len(point)), bool)
    separated[a, b] = separated[b, a] = True
    above = separated[np.ix_(order, order)] & (p[:, None] > p[None, :])  # [i, j]: i claimed above j
    unclaimed = ~above & np.triu(np.ones_like(above), 1)
    at = np.arange(len(p))  # the lowest position each model is not claimed above (or its own):
    boundary = np.maximum.accumulate(np.where(unclaimed, at, at[:, None]).max(1, initial=0)) == at
    group = np.empty(len(point), np.int64)  # a boundary after position k: every pair across claimed
    group[order] = 1 + np.cumsum(boundary) - boundary
    return group


def ranks(
    index: Figure,
    labels: list[str],
    comparisons: pl.DataFrame,
    confidence: float,
    place: np.ndarray | None = None,
) -> pl.DataFrame:
    """``RANK_SCHEMA`` rows for the models with an index (in ``labels`` order), from its point
    values, replicates and the ``significant`` column of the index's rows of ``comparisons``
    (``compare``'s table, or that table after a filter has ANDed a condition into
    ``significant``). ``rank`` and the tied groups' order place each model by ``place`` (labels,):
    its index, a provisional one's lowest bound (``scoring.scored``; default: the index); the rank
    sets read the point values' directions of the pairs claimed."""
    ranked = np.flatnonzero(~np.isnan(index.point))
    if len(ranked) == 0:
        return pl.DataFrame(schema=RANK_SCHEMA)
    point = index.point[ranked]
    placed = point if place is None else np.asarray(place, np.float64)[ranked]
    rank = 1 + (placed[None, :] > placed[:, None]).sum(1)
    sign_test = min(1.0, 2.0 * 0.5**index.tasks) if index.tasks > 0 else 1.0
    low, high = marginal_rank_sets(point, index.replicates[:, ranked], confidence, sign_test)
    place = {labels[x]: k for k, x in enumerate(ranked)}  # label -> position among the ranked
    pairs = comparisons.filter(pl.col("metric") == INDEX).select("a", "b", "significant")
    a = np.array([place.get(x, -1) for x in pairs["a"].to_list()], np.int64)
    b = np.array([place.get(x, -1) for x in pairs["b"].to_list()], np.int64)
    sig = pairs["significant"].fill_null(False).to_numpy().astype(bool) & (a >= 0) & (b >= 0)
    set_low, set_high = rank_sets(point, a, b, sig)
    group = tied_groups(placed, a[sig], b[sig])
    return pl.DataFrame(
        {
            "label": [labels[x] for x in ranked],
            "rank": rank,
            "rank_low": low,
            "rank_high": high,
            "rank_set_low": set_low,
            "rank_set_high": set_high,
            "group": group,
        },
        schema=RANK_SCHEMA,
    )
