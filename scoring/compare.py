"""Paired comparisons of the models scored together, and their ranks with intervals.

Every model of a scoring is scored on the same tasks, and every model's bootstrap intervals come from the
same resamples of those tasks (``scoring.bootstrap``): so a difference between two models can be
resampled *paired*, each resample's difference computed on the same tasks for both.

For every pair (a, b) of models, in the summary's order (a before b), and for the Decision Index and each
evaluation metric (``sums.METRICS``) that both have (not null):

* ``difference`` = metric(a) − metric(b), in points of the 0-100 scale;
* ``low``/``high``: the percentile interval of the difference over the resamples (the intervals'
  resamples: ``Bootstrap.counts``; a resample where either value is undefined, an F1 without positives,
  is left out);
* ``p_value``: two-sided, from the same resamples: p = min(1, 2·min(1 + #{Δ* ≤ 0}, 1 + #{Δ* ≥ 0}) / (B + 1))
  over the B defined resamples, the percentile interval inverted (the interval at level 1 − α excludes 0
  about when p < α) with the (1 + #)/(B + 1) of Davison & Hinkley 1997, "Bootstrap Methods and their
  Application", §4.4.1, so no p-value is 0 (the smallest is 2 / (B + 1));
* ``p_holm``: Holm's step-down adjustment (Holm 1979, "A simple sequentially rejective multiple test
  procedure") of the p-values of one metric across every pair of the run;
* for the accuracy metrics, between two models of one epoch each: the exact McNemar test (McNemar 1947) on the discordant
  answers: ``a_only`` (a right, b wrong) and ``b_only``; under the null each discordant answer is either
  with probability ½, so p = min(1, 2·P(X ≤ min(a_only, b_only))) with X ~ Binomial(a_only + b_only, ½)
  (the two-sided exact binomial test, as ``scipy.stats.binomtest`` computes it for p = ½), evaluated
  exactly in log space (``mcnemar_p``). With several epochs the answers of one task are not independent
  pairs, and the test is left out.

Ranks (by the Decision Index, among the models that have one): ``rank`` = 1 + the number of models with
a higher index; ``rank_low``/``rank_high``: the 95% interval of the rank over the same resamples (each
resample's competition rank; the percentile bounds rounded outward to whole ranks); ``group``: models
that are statistically tied, consecutive in rank order: a model joins the group of the model ranked above
it unless its index is significantly lower (Holm-adjusted p < 1 − confidence) than that group's first
model's, when it starts the next group.

A comparison that involves a provisional figure (``scoring.provisional``: answers failed or missing) has
``complete`` false.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from .bootstrap import Bootstrap, nan_quantiles, ordered_quantiles
from .decision_index import index_values
from .sums import COUNTS, FLAGS, METRICS, Cube, EvalMetrics

ACCURACY = "accuracy"  # the metric of accuracy type: McNemar's test applies
INDEX = "decision_index"
COMPARISON_SCHEMA = {"a": pl.String, "b": pl.String, "eval": pl.String, "metric": pl.String, "difference": pl.Float64,
                     "low": pl.Float64, "high": pl.Float64, "p_value": pl.Float64, "p_holm": pl.Float64,
                     "a_only": pl.Int64, "b_only": pl.Int64, "mcnemar_p": pl.Float64, "complete": pl.Boolean}
RANK_SCHEMA = {"label": pl.String, "rank": pl.Int64, "rank_low": pl.Int64, "rank_high": pl.Int64, "group": pl.Int64}
PAIRS_AT_ONCE = 4096  # pairs whose resampled differences are held at a time (resamples × pairs float64)
TASKS_AT_ONCE = 65_536  # tasks whose right/wrong matrix is held at a time (``discordant``)


def discordant(cube: Cube) -> np.ndarray | None:
    """For an accuracy (choice) evaluation: ``d[i, j]`` = the answers label ``i`` got right and label
    ``j`` wrong, paired by question (labels × labels, int64; a failed, missing or invalid answer is not
    right); −1 where either label has several epochs (the answers of one task are then not independent
    pairs). None for yes/no evaluations."""
    if cube.kind != "choice":
        return None
    n_labels = len(cube.labels)
    right = ((cube.flags >> FLAGS.index("correct")) & 1).astype(bool)
    first = cube.s == 0
    out = np.zeros((n_labels, n_labels), np.int64)
    for start in range(0, cube.n_tasks, TASKS_AT_ONCE):  # a task is one question in a choice evaluation
        stop = min(start + TASKS_AT_ONCE, cube.n_tasks)
        mine = first & (cube.t >= start) & (cube.t < stop)
        r = np.zeros((n_labels, stop - start), np.float32)
        r[cube.l[mine], cube.t[mine] - start] = right[mine]
        out += np.rint(r @ (1 - r).T).astype(np.int64)  # exact: integer sums far below 2**24 per block
    several = (~cube.absent).sum(1) > 1 if cube.n_epochs > 1 else np.zeros(n_labels, bool)
    out[several, :] = -1
    out[:, several] = -1
    return out


def mcnemar_p(a_only: np.ndarray, b_only: np.ndarray) -> np.ndarray:
    """The exact two-sided McNemar p-values for arrays of discordant counts (non-negative integers):
    min(1, 2·P(X ≤ min(a, b))), X ~ Binomial(a + b, ½); 1 where there is no discordant answer. Summed in
    log space from log-factorials (relative error ~1e-12; tested against ``scipy.stats.binomtest``)."""
    a_only, b_only = np.asarray(a_only, np.int64), np.asarray(b_only, np.int64)
    n, k = a_only + b_only, np.minimum(a_only, b_only)
    out = np.ones(n.shape)
    todo = np.flatnonzero(n > 0)
    if len(todo) == 0:
        return out
    top = int(n[todo].max())
    log_fact = np.concatenate([[0.0], np.cumsum(np.log(np.arange(1, top + 1, dtype=np.float64)))])
    nn, kk = n[todo], k[todo]
    sizes = kk + 1
    test = np.repeat(np.arange(len(todo)), sizes)
    j = np.arange(sizes.sum()) - np.repeat(np.cumsum(sizes) - sizes, sizes)  # 0..k of each test
    terms = log_fact[nn[test]] - log_fact[j] - log_fact[nn[test] - j] - nn[test] * np.log(2.0)
    peak = terms[np.cumsum(sizes) - 1]  # the pmf rises up to n/2, so the term j = k is each test's largest
    sums = np.add.reduceat(np.exp(terms - peak[test]), np.cumsum(sizes) - sizes)
    out[todo] = np.minimum(1.0, 2.0 * np.exp(peak + np.log(sums)))
    return out


def holm(p: np.ndarray) -> np.ndarray:
    """Holm's step-down adjusted p-values of one family (NaN entries left out of it and kept NaN)."""
    p = np.asarray(p, np.float64)
    out = np.full(p.shape, np.nan)
    ok = np.flatnonzero(~np.isnan(p))
    if len(ok) == 0:
        return out
    order = ok[np.argsort(p[ok], kind="stable")]
    m = len(order)
    adjusted = np.minimum(1.0, np.maximum.accumulate((m - np.arange(m)) * p[order]))
    out[order] = adjusted
    return out


def paired_bootstrap(a: np.ndarray, b: np.ndarray, boot: Bootstrap) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The paired bootstrap of ``a − b``: ``a``, ``b`` are (pairs, resamples) replicates of the two models
    of each pair on the same resamples (NaN: undefined there), one pair per row. Returns (low, high,
    p_value) per pair, as the module docstring defines them; NaN where no resample is defined."""
    d = a - b  # (pairs, resamples)
    count = (~np.isnan(d)).sum(1)
    below, above = (d <= 0).sum(1), (d >= 0).sum(1)
    d.sort(axis=1)  # NaN last; a whole sort of these rows measured faster than numpy's partition at 4 places
    alpha = (1 - boot.confidence) / 2
    low, high = ordered_quantiles(d, count, (alpha, 1 - alpha))  # as ``Bootstrap.interval``'s percentiles
    with np.errstate(invalid="ignore", divide="ignore"):
        p = np.minimum(1.0, 2.0 * (1.0 + np.minimum(below, above)) / (count + 1.0))
    return low, high, np.where(count > 0, p, np.nan)


@dataclass(frozen=True, slots=True)
class Figure:
    """One metric of every model: ``point`` (labels,), ``replicates`` (resamples, labels), ``complete``
    (labels,): no failed or missing answer behind the figure."""

    eval: str | None
    metric: str
    point: np.ndarray
    replicates: np.ndarray
    complete: np.ndarray


def figures(estimates: dict[str, EvalMetrics], labels: list[str], boot: Bootstrap) -> list[Figure]:
    """The Decision Index and every evaluation metric of ``estimates`` (over ``labels``, with replicates
    from ``boot``), in summary order; a null metric is NaN."""
    complete = {name: (est.counts[:, COUNTS.index("failed")] + est.counts[:, COUNTS.index("missing")]) == 0
                for name, est in estimates.items()}
    index = index_values(estimates, labels, boot)
    unavailable = np.array([bool(u) for u in index.unavailable], dtype=bool)
    out = [Figure(None, INDEX, np.where(unavailable, np.nan, index.point), index.replicates,
                  np.logical_and.reduce([complete[n] for n in complete], initial=True))]
    for name, metrics in METRICS.items():
        est = estimates.get(name)
        if est is None:
            continue
        for metric in metrics:
            point = np.where(est.unscored() | ~est.answered, np.nan, est.point[metric])
            out.append(Figure(name, metric, point, est.replicates[metric], complete[name]))
    return out


def compare(estimates: dict[str, EvalMetrics], labels: list[str], boot: Bootstrap,
            discordants: dict[str, np.ndarray | None] | None = None) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Every pair's comparisons (``COMPARISON_SCHEMA``) and every model's rank (``RANK_SCHEMA``), as the
    module docstring defines them. ``estimates`` maps evaluation -> ``sums.EvalMetrics`` over ``labels``
    with replicates from ``boot``; ``discordants`` maps an accuracy evaluation -> ``discordant`` of its
    cube (None or absent: no McNemar test)."""
    discordants = discordants or {}
    rows: list[pl.DataFrame] = []
    n = len(labels)
    first, second = np.triu_indices(n, 1)
    alpha = 1 - boot.confidence
    found = figures(estimates, labels, boot) if n else []
    index_holm = np.full(len(first), np.nan)
    for fig in found:
        both = ~np.isnan(fig.point[first]) & ~np.isnan(fig.point[second])
        i, j = first[both], second[both]
        low, high, p = np.empty(len(i)), np.empty(len(i)), np.empty(len(i))
        per_model = np.ascontiguousarray(fig.replicates.T)  # (labels, resamples): a pair's rows are gathered
        for start in range(0, len(i), PAIRS_AT_ONCE):
            part = slice(start, start + PAIRS_AT_ONCE)
            low[part], high[part], p[part] = paired_bootstrap(per_model[i[part]], per_model[j[part]], boot)
        adjusted = holm(p)
        if fig.metric == INDEX:
            index_holm[both] = adjusted
        table = discordants.get(fig.eval) if fig.metric == ACCURACY else None
        a_only = table[i, j] if table is not None else None
        b_only = table[j, i] if table is not None else None
        paired = a_only >= 0 if a_only is not None else np.zeros(len(i), bool)  # -1: several epochs, no test
        rows.append(pl.DataFrame({
            "a": [labels[x] for x in i], "b": [labels[x] for x in j], "eval": pl.Series([fig.eval] * len(i), dtype=pl.String),
            "metric": [fig.metric] * len(i), "difference": fig.point[i] - fig.point[j], "low": low, "high": high,
            "p_value": p, "p_holm": adjusted,
            "a_only": _where(paired, a_only), "b_only": _where(paired, b_only),
            "mcnemar_p": np.where(paired, mcnemar_p(np.maximum(a_only, 0), np.maximum(b_only, 0)), np.nan)
            if a_only is not None else np.full(len(i), np.nan),
            "complete": fig.complete[i] & fig.complete[j],
        }, schema=COMPARISON_SCHEMA).fill_nan(None))
    comparisons = pl.concat(rows) if rows else pl.DataFrame(schema=COMPARISON_SCHEMA)
    ranks = _ranks(found[0], labels, first, second, index_holm, alpha) if found else pl.DataFrame(schema=RANK_SCHEMA)
    return comparisons, ranks


def _where(keep: np.ndarray, counts: np.ndarray | None) -> pl.Series:
    """``counts`` as an Int64 column, null where not ``keep`` (or everywhere without counts)."""
    if counts is None:
        return pl.Series([None] * len(keep), dtype=pl.Int64)
    return pl.Series(counts, dtype=pl.Int64).scatter(np.flatnonzero(~keep), None) if (~keep).any() else \
        pl.Series(counts, dtype=pl.Int64)


def _ranks(index: Figure, labels: list[str], first: np.ndarray, second: np.ndarray, p_holm: np.ndarray,
           alpha: float) -> pl.DataFrame:
    """``RANK_SCHEMA`` rows for the models with an index (in ``labels`` order), from its point values,
    replicates and the Holm-adjusted p-values of its pairs (``p_holm[k]`` of pair ``(first[k], second[k])``)."""
    ranked = np.flatnonzero(~np.isnan(index.point))
    if len(ranked) == 0:
        return pl.DataFrame(schema=RANK_SCHEMA)
    point = index.point[ranked]
    rank = 1 + (point[None, :] > point[:, None]).sum(1)
    reps = index.replicates[:, ranked]
    per_resample = np.empty(reps.shape)
    for start in range(0, reps.shape[0], 64):  # (64, models, models) comparisons at a time
        r = reps[start:start + 64]
        per_resample[start:start + 64] = 1 + (r[:, None, :] > r[:, :, None]).sum(2)
    per_resample[np.isnan(reps)] = np.nan
    low, high = nan_quantiles(per_resample, (alpha / 2, 1 - alpha / 2))
    low = np.where(np.isnan(low), rank, np.floor(low)).astype(np.int64)
    high = np.where(np.isnan(high), rank, np.ceil(high)).astype(np.int64)
    holm_of = np.full((len(labels), len(labels)), np.nan)
    holm_of[first, second] = holm_of[second, first] = p_holm
    group = np.zeros(len(ranked), np.int64)
    leader, current = None, 0
    for k in np.argsort(-point, kind="stable"):
        model = ranked[k]
        if leader is None or holm_of[leader, model] < alpha:  # significantly below the group's first: a new group
            leader, current = model, current + 1
        group[k] = current
    return pl.DataFrame({"label": [labels[x] for x in ranked], "rank": rank, "rank_low": low, "rank_high": high,
                         "group": group}, schema=RANK_SCHEMA)
