"""Simultaneous inference over every pair of models: the max-T step-down, Newcombe's paired
interval, the symmetric bootstrap interval and the rank sets that hold jointly.

Everything here is plain numpy over arrays a caller has laid out (``scoring.compare`` does): per
pair, the point difference ``d`` (points of the 0-100 scale) and its bootstrap replicates ``D*``
(pairs, resamples; the same resamples of the tasks for both models of a pair,
``scoring.bootstrap``).

* **Max-T step-down** (Westfall & Young 1993, "Resampling-Based Multiple Testing", Algorithm 2.8;
  Romano & Wolf 2005, "Exact and approximate stepdown methods for multiple hypothesis testing", JASA
  100:94-108, Algorithm 4.1). Each pair's statistic is ``T = d / s``; the null distribution of every
  pair at once is that of the centred replicates ``Z*_b = |D*_b − d| / s`` (so the correlation
  between pairs, which share models and tasks, is used). Pairs are taken in decreasing ``|T|``; the
  k-th pair's adjusted p-value is
  ``(1 + #{b : max over pairs k, k+1, … of Z*_b ≥ |T_k|}) / (B + 1)``, made non-decreasing along
  that order. It controls the family-wise error rate (asymptotically) over all pairs of one figure
  at once, and its smallest value is 1 / (B + 1) whatever the number of pairs (Holm's adjustment
  of a resampling p-value is at least m / (B + 1) for m pairs). The scale ``s`` is 1 by default
  (the max-|Δ| form: measured, studentising by each pair's bootstrap standard error, fixed over the
  resamples, separates identical models too often; ``max_t``); ``studentise`` takes ``s`` = that
  standard error.
* **Paired proportions: Newcombe's interval and Bonett & Price's, their hull** (Newcombe 1998,
  "Improved confidence intervals for the difference between binomial proportions based on paired
  data", Statistics in Medicine 17:2635-2650, method 10: the Wilson score intervals of both
  proportions combined with the 2×2 table's correlation φ, continuity-corrected as the paper does
  (AD − BC less N/2 when above it, 0 between 0 and N/2); Bonett & Price 2012, "Adjusted Wald
  confidence interval for a difference of binomial proportions based on paired data", Journal of
  Educational and Behavioral Statistics 37:479-488: (b + 1)/(n + 2) − (c + 1)/(n + 2) ± z·se; both
  recommended by Fagerland, Lydersen & Laake 2014, Statistics in Medicine 33:2850-2875). Measured
  over 20, 60 and 500 questions, accuracies 50-99.5% and 50-95% of answers alike, method 10 alone
  (``hull`` False; with at most one discordant answer its width collapses as φ nears 1, and the
  hull is taken anyway) covers down to 0.932, Bonett & Price's down to 0.937; the hull covers at
  least as often as either (0.945 at the worst cell), and never has zero width
  (``benchmarks/stats_compare.py``).
* **Symmetric bootstrap interval** (Hall 1988, "Theoretical comparison of bootstrap
  confidence intervals", Annals of Statistics 16:927-953, the symmetric percentile-t; here with the
  resamples' standard error as the scale): ``d ± q`` with ``q`` the (1 − α) quantile of
  ``|D*_b − d|``; it is the inversion of the pair's studentised test and contains ``d``. Where no
  resample moves the difference, ``q`` is at least a floor (``floor_width``).
* **Identical answers** (``identical_bound``): two models that answered alike on every task behind
  a figure differ by 0 there, and no resample moves that; the interval is of the difference over
  the tasks the source could give, so it is not of zero width: the share of such tasks on which the
  two would answer differently is at most Wilson's upper bound 100 · z² / (m + z²) when none of the
  m tasks both replied to does, and an evaluation's metric is bounded by that (``scoring.compare``
  hulls it with MOVER for the metrics with intervals of their own, and takes the index's from its
  terms' intervals).
* **McNemar's exact test** (``mcnemar_p``) and its worst case over open answers
  (``worst_mcnemar``).
* **Rank sets** (Mogstad, Romano, Shaikh & Wilhelm 2024, "Inference for Ranks with Applications to
  Mobility across Neighbourhoods and Academic Achievement across Countries", Review of Economic
  Studies 91:476-518, §3 with the step-down of their §3.3): from the pairs the step-down separates,
  model j's rank lies in [1 + #{k significantly above j}, N − #{k significantly below j}]; every
  model's rank lies in its set at once with the procedure's confidence. The marginal set of one
  model (``marginal_rank_sets``, their §3.1) is the same with the family of that model's pairs
  alone.
"""

from __future__ import annotations

from statistics import NormalDist

import numpy as np

BLOCK = 4096  # pairs whose (pairs, resamples) replicates are held at a time


def studentised(d: np.ndarray, replicates: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per pair, the bootstrap standard error ``se`` of the difference (standard deviation of its
    replicates, ddof 1, undefined resamples (NaN) left out; NaN with fewer than two defined) and the
    studentised statistic ``T = d / se``: 0 where ``d`` is 0, ±inf where ``se`` is 0 and ``d`` is
    not (every resample gives the same nonzero difference), NaN where ``d`` or ``se`` is NaN.
    ``d`` (pairs,), ``replicates`` (pairs, resamples)."""
    nan = np.isnan(replicates)
    count = replicates.shape[1] - nan.sum(1)
    with np.errstate(invalid="ignore", divide="ignore"):
        if not nan.any():
            se = replicates.std(1, ddof=1) if replicates.shape[1] > 1 else np.full(len(d), np.nan)
        else:
            mean = np.nansum(replicates, 1) / count
            se = np.sqrt(np.nansum((replicates - mean[:, None]) ** 2, 1) / (count - 1))
        se = np.where(count >= 2, se, np.nan)
        se = np.where(se < 1e-9, 0.0, se)  # float noise of constant replicates is no spread
        t = np.where(d == 0, 0.0, np.where(se > 0, d / se, np.sign(d) * np.inf))
    return se, np.where(np.isnan(d) | np.isnan(se), np.nan, t)


def _z(d: np.ndarray, se: np.ndarray, replicates: np.ndarray) -> np.ndarray:
    """``|D* − d| / se`` per pair and resample (0 where ``se`` is 0 or the resample undefined)."""
    z = np.abs(replicates - d[:, None])
    if not (se == 1).all():
        with np.errstate(invalid="ignore", divide="ignore"):
            z /= se[:, None]
        z[~np.isfinite(z)] = 0.0
    elif np.isnan(z).any():
        z[np.isnan(z)] = 0.0
    return z


def max_t(
    d: np.ndarray, pair_replicates, n_pairs: int, resamples: int, studentise: bool = False
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The max-T step-down over one family of pairs (the module docstring): returns per pair
    (``se``, ``p_raw``, ``p_adjusted``), where ``p_raw = (1 + #{Z*_b ≥ |T|}) / (B + 1)`` is the
    pair's own studentised bootstrap test and ``p_adjusted`` the step-down's; NaN for a pair whose
    statistic is undefined (left out of the family). ``d`` (pairs,) the point differences;
    ``pair_replicates(rows)`` returns the (len(rows), resamples) replicates of the pairs ``rows``
    (an index array), so that only ``BLOCK`` pairs' replicates are held at a time. ``studentise``
    False (the default) takes every pair's scale as 1 (the max-|Δ| step-down: ``T = d``, ``Z*_b =
    |D*_b − d|``): measured, the studentised statistics over one set of resamples (each pair's
    ``se`` fixed, not re-estimated per resample) separate identical models too often (family-wise
    error 8.7–13% for 10 models on 60 tasks, 7.3% for 20 on 200; ``benchmarks/stats_compare.py``),
    the unstudentised ones about 5%."""
    if 0 < n_pairs <= BLOCK:  # one block: the replicates are made once, not once per pass
        held = pair_replicates(np.arange(n_pairs))
        pair_replicates = held.__getitem__
    se, t = np.empty(n_pairs), np.empty(n_pairs)
    for start in range(0, n_pairs, BLOCK):
        rows = np.arange(start, min(start + BLOCK, n_pairs))
        se[rows], t[rows] = studentised(d[rows], pair_replicates(rows))
    scale = se if studentise else np.where(np.isnan(se), np.nan, 1.0)
    if not studentise:
        t = np.where(np.isnan(t), np.nan, d)
    p_raw, p_adj = np.full(n_pairs, np.nan), np.full(n_pairs, np.nan)
    ok = np.flatnonzero(~np.isnan(t))
    if len(ok) == 0:
        return se, p_raw, p_adj
    size = np.abs(t[ok])
    order = ok[np.argsort(-size, kind="stable")]  # decreasing |T|
    exceed = np.empty(len(order))
    running = np.zeros(resamples)  # max of Z*_b over the pairs after the current block
    for stop in range(len(order), 0, -BLOCK):  # blocks from the last (smallest |T|) backwards
        rows = order[max(0, stop - BLOCK) : stop]
        z = _z(d[rows], scale[rows], pair_replicates(rows))
        p_raw[rows] = (1 + (z >= np.abs(t[rows])[:, None]).sum(1)) / (resamples + 1)
        suffix = np.maximum.accumulate(z[::-1], axis=0)[
            ::-1
        ]  # max over this pair and the later ones in the block
        suffix = np.maximum(suffix, running[None, :])
        exceed[max(0, stop - BLOCK) : stop] = (suffix >= np.abs(t[rows])[:, None]).sum(1)
        running = suffix[0]
    p_adj[order] = np.maximum.accumulate((1 + exceed) / (resamples + 1))
    return se, p_raw, p_adj


def newcombe(
    a_only: np.ndarray,
    b_only: np.ndarray,
    both_right: np.ndarray,
    both_wrong: np.ndarray,
    confidence: float,
    hull: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """Newcombe's interval (method 10; the module docstring) for the difference of two paired
    proportions, p(a right) − p(b right), in points (−100..100), from the 2×2 table's counts
    (non-negative integers, arrays of one shape): ``both_right``, ``a_only`` (a right, b wrong),
    ``b_only``, ``both_wrong``; its hull with Bonett & Price's interval (``hull`` False: only with
    at most one discordant answer, where method 10 collapses). NaN where the table is empty. The
    bounds contain the point (a_only − b_only)/n exactly (clipped against floating-point escape)
    and lie in [−100, 100]."""
    a, b, c, d = (np.asarray(x, np.float64) for x in (both_right, a_only, b_only, both_wrong))
    n = a + b + c + d
    z = NormalDist().inv_cdf(1 - (1 - confidence) / 2)
    with np.errstate(invalid="ignore", divide="ignore"):
        p1, p2 = (a + b) / n, (a + c) / n
        l1, u1 = _wilson(p1, n, z)
        l2, u2 = _wilson(p2, n, z)
        margins = (a + b) * (c + d) * (a + c) * (b + d)
        # φ with Newcombe's continuity correction (his eq. for method 10): AD − BC less N/2 when
        # it exceeds N/2, 0 from 0 to N/2, as it is below 0 (Fagerland et al. 2014, §4.2; as R's
        # contingencytables::Newcombe_square_and_add_CI_paired_2x2 and biostatUZH compute it)
        cross = a * d - b * c
        cross = np.where(cross > n / 2, cross - n / 2, np.where(cross < 0, cross, 0.0))
        phi = np.where(margins > 0, cross / np.sqrt(margins), 0.0)
        theta = p1 - p2
        delta = np.sqrt(
            np.maximum((p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2, 0)
        )
        eps = np.sqrt(
            np.maximum((u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2, 0)
        )
        low, high = theta - delta, theta + eps
        few = hull | (b + c <= 1)  # Bonett & Price's adjusted Wald interval, the hull with it
        first, second = (b + 1) / (n + 2), (c + 1) / (n + 2)
        centre = first - second
        half = z * np.sqrt((first + second - centre**2) / (n + 2))
        low = np.where(few, np.minimum(low, centre - half), low)
        high = np.where(few, np.maximum(high, centre + half), high)
        point = 100 * (b - c) / n
        low = np.clip(np.minimum(100 * low, point), -100, 100)
        high = np.clip(np.maximum(100 * high, point), -100, 100)
    empty = n == 0
    return np.where(empty, np.nan, low), np.where(empty, np.nan, high)


def _wilson(p: np.ndarray, n: np.ndarray, z: float) -> tuple[np.ndarray, np.ndarray]:
    """Wilson's score interval (0-1) of proportions ``p`` over ``n`` trials, clipped to contain
    ``p``."""
    z2n = z * z / n
    center = (p + z2n / 2) / (1 + z2n)
    half = z / (1 + z2n) * np.sqrt(np.maximum(p * (1 - p), 0) / n + z2n / (4 * n))
    return np.minimum(np.maximum(center - half, 0), p), np.maximum(np.minimum(center + half, 1), p)


def floor_width(n_tasks: float, confidence: float) -> float:
    """The floor of the symmetric interval's half-width, in points: 100 · z² / (n + z²) for
    ``n_tasks`` tasks (Wilson's upper bound of a rate when 0 of n tasks have it); inf for no
    task."""
    z = NormalDist().inv_cdf(1 - (1 - confidence) / 2)
    return 100 * z * z / (n_tasks + z * z) if n_tasks > 0 else float("inf")


def identical_bound(replied: np.ndarray, confidence: float) -> np.ndarray:
    """Per pair of models, (labels, labels), the half-width in points of the interval of an
    evaluation metric's difference between two models that answered alike on every task (the
    module docstring): ``floor_width`` of the fewer of the tasks the two replied to (``replied``,
    (labels,)). inf where one replied to none."""
    both = np.minimum.outer(replied, replied).astype(np.float64)
    return np.array([floor_width(m, confidence) for m in both.ravel()]).reshape(both.shape)


def symmetric_interval(
    d: np.ndarray, replicates: np.ndarray, confidence: float, floor: float
) -> tuple[np.ndarray, np.ndarray]:
    """The symmetric bootstrap interval ``d ± q`` (module docstring) per pair: ``d``
    (pairs,), ``replicates`` (pairs, resamples; NaN undefined), ``floor`` the half-width used where
    no resample moves the difference (``floor_width``); clipped to [−100, 100] (differences of
    0-100 figures), always containing ``d``. NaN where ``d`` is NaN or no resample is defined."""
    dev = np.abs(replicates - d[:, None])
    count = (~np.isnan(dev)).sum(1)
    k = np.maximum(count - 1, 0)
    pos = confidence * k
    lo = np.floor(pos).astype(np.int64)
    hi = np.minimum(lo + 1, k)
    full = count == dev.shape[1]
    if full.all() and len(
        d
    ):  # no undefined resample: only the two order statistics around the quantile
        dev = np.partition(dev, sorted({int(lo[0]), int(hi[0])}), axis=1)
    else:
        dev.sort(axis=1)  # NaN last
    rows = np.arange(len(d))
    with np.errstate(invalid="ignore"):
        q = dev[rows, lo] + (dev[rows, hi] - dev[rows, lo]) * (pos - lo) if len(d) else np.empty(0)
    q = np.where(q > 1e-9, q, floor)
    bad = np.isnan(d) | (count == 0)
    low, high = np.clip(d - q, -100, np.minimum(d, 100)), np.clip(d + q, np.maximum(d, -100), 100)
    return np.where(bad, np.nan, low), np.where(bad, np.nan, high)


def correlation(reps_a: np.ndarray, reps_b: np.ndarray) -> np.ndarray:
    """Per row, Pearson's correlation over the resamples of two models' replicates of a figure
    (``reps_a``, ``reps_b``: (pairs, resamples); a resample undefined (NaN) in either is left out):
    the correlation of the two estimates, which share the tasks. 0 where either does not vary (or
    fewer than two resamples are defined): no evidence of a correlation, the wider choice for
    ``mover_difference`` when the correlation is positive."""
    ok = ~(np.isnan(reps_a) | np.isnan(reps_b))
    count = ok.sum(1)
    with np.errstate(invalid="ignore", divide="ignore"):
        a, b = np.where(ok, reps_a, 0.0), np.where(ok, reps_b, 0.0)
        ma, mb = a.sum(1) / count, b.sum(1) / count
        a = np.where(ok, a - ma[:, None], 0.0)
        b = np.where(ok, b - mb[:, None], 0.0)
        va, vb = (a * a).sum(1), (b * b).sum(1)
        r = (a * b).sum(1) / np.sqrt(va * vb)
    return np.where((count >= 2) & (va > 1e-12) & (vb > 1e-12), np.clip(r, -1, 1), 0.0)


def mover_difference(
    a: tuple[np.ndarray, np.ndarray, np.ndarray],
    b: tuple[np.ndarray, np.ndarray, np.ndarray],
    r: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """The MOVER interval of a paired difference θ_a − θ_b from each model's own interval (Zou &
    Donner 2008, "Construction of confidence limits about effect measures: A general approach",
    Statistics in Medicine 27:1693-1702, eq. (7) with the correlation of the two estimates;
    Newcombe's 1998 method 10 for paired proportions is the case of Wilson intervals and φ):
    with ``a`` = (point, low, high) of model a and ``b`` the same of model b (0-100, arrays of one
    shape) and ``r`` their estimates' correlation,

        low  = d − √((θ_a − l_a)² + (u_b − θ_b)² − 2r(θ_a − l_a)(u_b − θ_b)),
        high = d + √((u_a − θ_a)² + (θ_b − l_b)² − 2r(u_a − θ_a)(θ_b − l_b)),

    d = θ_a − θ_b. Each side recovers the variances from the same side of the models' score-type
    intervals, so it keeps their behaviour near 0 and 100 where a bootstrap's spread collapses.
    Clipped to [−100, 100]; contains d; NaN where an input is."""
    (pa, la, ha), (pb, lb, hb) = a, b
    d = pa - pb
    below_a, above_a = np.maximum(pa - la, 0), np.maximum(ha - pa, 0)
    below_b, above_b = np.maximum(pb - lb, 0), np.maximum(hb - pb, 0)
    low = d - np.sqrt(np.maximum(below_a**2 + above_b**2 - 2 * r * below_a * above_b, 0))
    high = d + np.sqrt(np.maximum(above_a**2 + below_b**2 - 2 * r * above_a * below_b, 0))
    return np.clip(np.minimum(low, d), -100, 100), np.clip(np.maximum(high, d), -100, 100)


def rank_sets(
    point: np.ndarray, first: np.ndarray, second: np.ndarray, significant: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Mogstad et al.'s simultaneous rank sets (module docstring): ``point`` (models,) the figure
    (higher ranks first), pairs ``(first[k], second[k])`` with ``significant[k]`` (bool: the pair is
    separated by a procedure controlling the family-wise error rate, in the direction of its point
    difference). Returns (low, high) int64 per model: 1 + the models significantly above, N − the
    models significantly below."""
    n = len(point)
    above, below = np.zeros(n, np.int64), np.zeros(n, np.int64)
    sig = np.asarray(significant, bool)
    i, j = first[sig], second[sig]
    i_higher = point[i] > point[j]
    np.add.at(above, np.where(i_higher, j, i), 1)
    np.add.at(below, np.where(i_higher, i, j), 1)
    return 1 + above, n - below


def marginal_rank_sets(
    point: np.ndarray, replicates: np.ndarray, confidence: float, sign_test: float = 0.0
) -> tuple[np.ndarray, np.ndarray]:
    """Each model's marginal rank set (Mogstad, Romano, Shaikh & Wilhelm 2024, Review of Economic
    Studies 91:476-518, §3.1 with the step-down of §3.3, for one model at a time): for model j the
    family is its N − 1 differences θ_k − θ_j alone, tested by the max-T step-down (``max_t``, the
    same unstudentised form as every pair's), and j's rank lies in [1 + #{k separated above j}, N −
    #{k separated below j}] with probability at least ``confidence`` for each j. It replaces the
    percentile interval of each resample's rank, which is not valid where true values are tied or
    close (Hall & Miller 2009, "Using the bootstrap to quantify the authority of an empirical
    ranking", Annals of Statistics 37:3929-3959; Mogstad et al. §2): measured over 20 models and 100
    tasks an evaluation, the percentile interval held the true rank of models of one true index
    0.386 of the time (these sets 0.970, 500 datasets), of models half an accuracy point apart 0.74
    for the first and last (0.98), of five tied at the top 0.80 (0.98; 100 datasets each;
    ``tests/test_rank_sets.py`` asserts a seeded case). ``point`` (models,), ``replicates``
    (resamples, models; NaN undefined); ``sign_test``: the floor of the adjusted p of a difference
    no resample moves (``compare``'s sign test over the tasks). Returns (low, high) int64."""
    n, resamples = len(point), replicates.shape[0]
    low, high = np.ones(n, np.int64), np.full(n, n, np.int64)
    alpha = 1 - confidence
    per_model = np.ascontiguousarray(replicates.T)  # (models, resamples)
    for j in range(n):
        k = np.delete(np.arange(n), j)
        d = point[k] - point[j]
        reps = per_model[k] - per_model[j]
        se, _, adjusted = max_t(d, reps.__getitem__, len(k), resamples)
        adjusted = np.where((se == 0) & (d != 0), np.fmax(adjusted, sign_test), adjusted)
        separated = np.nan_to_num(adjusted, nan=1.0) < alpha
        low[j] += int((separated & (d > 0)).sum())
        high[j] -= int((separated & (d < 0)).sum())
    return low, high


def worst_mcnemar(
    sure_a: np.ndarray,
    sure_b: np.ndarray,
    could_a: np.ndarray,
    could_b: np.ndarray,
    both_open: np.ndarray,
) -> np.ndarray:
    """The largest exact McNemar p any outcome of the open answers could give (issue 31, item 5:
    a difference is claimed only where no outcome of the missing answers could overturn it): with
    ``sure_a``/``sure_b`` the discordant answers both replies make (a right b wrong, the other
    way), ``could_a``/``could_b`` the answers that could join each side and ``both_open`` those
    that could join either. Adding a discordant answer to the larger side lowers p, to the smaller
    side raises it (2·P(Bin(n + 1, ½) ≤ k + 1) ≥ 2·P(Bin(n, ½) ≤ k)), so the worst case adds every
    open answer it can to the smaller side: p = 1 where that reaches the larger side, else
    ``mcnemar_p(larger, smaller + could_smaller + both_open)``. Arrays of one shape, counts ≥ 0."""
    a, b = np.asarray(sure_a, np.int64), np.asarray(sure_b, np.int64)
    a_larger = a >= b
    larger = np.where(a_larger, a, b)
    smaller = np.where(a_larger, b, a) + np.where(a_larger, could_b, could_a) + both_open
    return np.where(smaller >= larger, 1.0, mcnemar_p(larger, np.minimum(smaller, larger)))


def mcnemar_p(a_only: np.ndarray, b_only: np.ndarray) -> np.ndarray:
    """The exact two-sided McNemar p-values for arrays of discordant counts (non-negative integers):
    min(1, 2·P(X ≤ min(a, b))), X ~ Binomial(a + b, ½); 1 where there is no discordant answer.
    Summed in log space from log-factorials (relative error ~1e-12; tested against
    ``scipy.stats.binomtest``)."""
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
    peak = terms[
        np.cumsum(sizes) - 1
    ]  # the pmf rises up to n/2, so the term j = k is each test's largest
    sums = np.add.reduceat(np.exp(terms - peak[test]), np.cumsum(sizes) - sizes)
    out[todo] = np.minimum(1.0, 2.0 * np.exp(peak + np.log(sums)))
    return out
