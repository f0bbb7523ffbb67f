"""Which interval each per-model figure gets, and how it is computed.

Every interval is over tasks as a sample of a superpopulation of tasks (the convention since
intervals were added): on the whole data set a figure is exact for that set, and its interval still
says how far another draw of as many tasks from the same source could move it. Each interval is
bounded so that ``low ≤ point ≤ high`` holds exactly (``contain``), and none has zero width: at 0%
or 100% a score interval keeps its width.

* **Accuracy** (AA-Omniscience-Decision, HLE-MultiChoice, When2Call, and every breakdown group) is a
  single proportion of the tasks: the **Wilson score interval with continuity correction**
  (``score_interval``; Newcombe 1998, "Two-sided confidence intervals for the single proportion:
  comparison of seven methods", Statistics in Medicine 17:857-872, method 4) with n = the number of
  tasks. Wilson's score interval (Wilson 1927, "Probable inference, the law of succession, and
  statistical inference", JASA 22:209-212) beats the Wald and percentile intervals (Brown, Cai &
  DasGupta 2001, "Interval Estimation for a Binomial Proportion", Statistical Science 16:101-133)
  but its coverage dips near the bounds: computed exactly, 90.5% at a true 99.5% over 20 tasks,
  92.5% at 95% over 20, 84% at its worst point. The continuity correction removes the dips: its
  exact coverage is at least 95.0% at every true value from 50% to 99.95% for n = 20, 35, 60, 100
  and 500 (Clopper and Pearson's exact interval does the same, at least as wide and without a closed
  form for the fractional counts of several epochs). With several epochs the per-task score is the
  mean of its epochs, a value in [0, 1] whose variance is at most p(1 − p): the same interval over
  the tasks is then conservative.
* **Non-hallucination rate** = the share of the answers not correct that are not hallucinations: a
  ratio whose denominator W (answers not correct) is random. Given W = w, the answers not
  hallucinated are Binomial(w, 1 − h) when tasks are independent draws, so the interval is the same
  continuity-corrected Wilson interval of that conditional proportion with n = w: its conditional
  coverage is the binomial interval's at every w, hence so is the unconditional one. W = 0 (every
  answer correct) says nothing about hallucinations: the interval is then [0, 100] around the
  conventional 100.
* **F1** (each WildGuardTest question): F1 = 2TP / (2TP + FP + FN) = 2θ / (1 + θ) with
  θ = TP / (TP + FP + FN). Given m = TP + FP + FN, TP is Binomial(m, θ) (the conditional view of
  Goutte & Gaussier 2005, "A Probabilistic Interpretation of Precision, Recall and F-Score, with
  Implication for Evaluation", ECIR, LNCS 3408:345-359, whose posterior of F is the same monotone
  map of a Beta on θ): the continuity-corrected Wilson interval of θ over m, mapped through
  2θ / (1 + θ).
* **Mean F1** and the **Decision Index** are weighted sums of figures with intervals of their own:
  the **MOVER** combination (method of variance estimates recovery; Zou & Donner 2008, "Construction
  of confidence limits about effect measures: A general approach", Statistics in Medicine
  27:1693-1702; with correlated terms Zou 2008, "On the estimation of additive interaction by use of
  the four-by-two table and beyond", American Journal of Epidemiology 168:212-224), ``mover``: each
  side of the sum's interval recovers the variances from the same side of the terms' intervals, so
  it inherits their behaviour near 0 and 100 (Newcombe's 1998 hybrid score interval for a difference
  is its special case). The three F1 scores of a WildGuardTest row share the row: mean F1 combines
  them as fully correlated (r = 1, the mean of their bounds), the conservative choice (a correlation
  estimated from the few errors of a model near 100 made the interval too short). The index's terms
  come from independent task sets, except accuracy and non-hallucination on the same Omniscience
  tasks, which are uncorrelated (the non-hallucination estimate's mean given W does not depend on
  W): r = 0.
* **Brier score** and **log loss** are means of per-answer losses bounded to [0, M] (M = 1 for
  Brier's ½Σ(p − y)², M = −ln 5e-5 = 9.90 nats for the log loss with its probability floor,
  ``calibration.LOG_LOSS_FLOOR``): ``bounded_mean_interval``, M times the continuity-corrected
  Wilson interval of the mean / M over the tasks. A [0, 1] variable of mean μ has variance at most
  μ(1 − μ) (Bhatia & Davis 2000, "A better bound on the variance", American Mathematical Monthly
  107:353-357), the binomial case, so the binomial score interval is conservative for it, keeps
  its width at 0 (every answer right at the same confidence gives a percentile bootstrap interval
  of zero width) and never leaves [0, M] (coverage in ``benchmarks/bench_stats_intervals.py``).
* **ECE** has no interval (null): the binned estimator is biased upwards at every finite size (its
  expectation exceeds the true calibration error, and a well-calibrated model's true ECE of 0 is
  never covered; Kumar, Liang & Ma 2019, "Verified Uncertainty Calibration", NeurIPS), so no
  interval around it covers honestly.
* **AUROC**: the hull of DeLong's interval (DeLong, DeLong & Clarke-Pearson 1988, Biometrics
  44:837-845; ``scoring.calibration``) and Newcombe's score-type interval (2006, "Confidence
  intervals for an effect size measure based on the Mann-Whitney statistic. Part 2: asymptotic
  methods and evaluation", Statistics in Medicine 25:559-573, method 5), which keeps its width at
  an AUROC of 0 or 1 where DeLong's variance is 0.
* Differences between two models (``scoring.compare``): the paired bootstrap over the same
  resamples, hulled with the MOVER interval of the difference for the metrics above
  (``simultaneous.mover_difference``).

The bootstrap resamples stay the same for every metric: the paired comparisons and ranks use the
resampled metrics, whatever interval a metric itself reports.
"""

from __future__ import annotations

from statistics import NormalDist

import numpy as np

WILSON = "Wilson score interval with continuity correction over tasks (Newcombe 1998)"
CONDITIONAL = (
    "Wilson score interval with continuity correction of the share not hallucinated among the "
    "answers not correct (conditional on their number)"
)
F1_SCORE = (
    "Wilson score interval with continuity correction of TP / (TP + FP + FN), mapped to "
    "F1 = 2θ / (1 + θ)"
)
MOVER = "MOVER combination of the terms' intervals (Zou & Donner 2008)"
RESAMPLING = (
    "bootstrap over tasks (resampled with replacement within each evaluation, the same resamples "
    "for every model), for the paired comparisons and the ranks' intervals; each metric's own "
    "interval is the one `methods` names"
)
"""summary.json's ``intervals.method``: what ``resamples`` and ``seed`` are of and what uses them
(before: "percentile bootstrap over tasks", when every metric had that interval; none has now)."""
BOUNDED = (
    "Wilson score interval with continuity correction of the mean loss / its bound over the "
    "tasks (conservative for a bounded mean: Bhatia & Davis 2000)"
)
METHODS = {
    "accuracy": WILSON,
    "non_hallucination_rate": CONDITIONAL,
    "f1_prompt_harm": F1_SCORE,
    "f1_response_refusal": F1_SCORE,
    "f1_response_harm": F1_SCORE,
    "mean_f1": MOVER + " of the three F1 scores, fully correlated (the mean of their bounds)",
    "decision_index": MOVER + " of its five weighted terms, independent",
    "brier": BOUNDED + ", bound 1",
    "ece": (
        "none (null): the binned ECE is biased upwards at every finite size (Kumar, Liang & Ma "
        "2019), so no interval around it covers the true calibration error honestly"
    ),
    "log_loss": BOUNDED + ", bound −ln 5e-5 = 9.90 nats (the probability floor)",
    "auroc": (
        "hull of DeLong's interval and Newcombe's (2006, method 5) score-type interval (never "
        "of zero width at 0 or 1)"
    ),
    "differences": (
        "accuracy of one epoch each: the hull of Newcombe's (1998, method 10) and "
        "Bonett & Price's (2012) paired intervals; otherwise the symmetric paired "
        "bootstrap interval, for a metric with a score-type interval its hull with "
        "the MOVER interval of the difference (Zou & Donner 2008; summary.json's "
        "comparison_method)"
    ),
}
"""summary.json's ``intervals.methods``: each metric's interval method, by metric name (the one
place summary.json names them)."""
# the interval of a figure an adaptive run estimated from the part of the set it asked
# (``scoring.adaptive.estimated``; ``scoring.adaptive.headline`` made it the headline one;
# docs/adaptive.md, "The method"): valid although the run chose when to stop, where the ones of
# ``METHODS`` over the asked part are not (``scoring.estimates.method`` names each)
ANYTIME_METRIC = (
    "anytime-valid confidence sequence of the whole-set value (sampling without replacement): "
    'the betting confidence sequence of Waudby-Smith & Ramdas (2020, "Confidence sequences for '
    'sampling without replacement", NeurIPS 33), a ratio by inverting a test, simultaneous over '
    "the model's metrics (Bonferroni), at the round the adaptive run stopped the model"
)
ANYTIME_INDEX = (
    "anytime-valid confidence sequence of the whole-set index (sampling without replacement): "
    "the empirical-Bernstein sequence across the four evaluations (Howard, Ramdas, McAuliffe & "
    "Sekhon 2021) intersected with the weighted sum of the metrics' betting confidence sequences "
    "(Waudby-Smith & Ramdas 2020, NeurIPS 33), at the round the adaptive run stopped the model"
)
ANYTIME_METHODS = {"anytime_index": ANYTIME_INDEX, "anytime_metric": ANYTIME_METRIC}
"""Added to summary.json's ``intervals.methods`` in an adaptive run's summary only
(``scoring.estimates.name_anytime``): the methods of the anytime-valid intervals it publishes, the
index's and each index metric's (the headline intervals of a model whose figures are estimates,
and those of every model's ``adaptive`` block)."""
SCORE_METRICS = frozenset(
    {
        "accuracy",
        "non_hallucination_rate",
        "f1_prompt_harm",
        "f1_response_refusal",
        "f1_response_harm",
        "mean_f1",
        "brier",
        "log_loss",
        "ece",
    }
)
"""The metrics whose interval is not the bootstrap's (``scoring.sums.score_intervals``; ECE's is
none)."""


def z_value(confidence: float) -> float:
    """The two-sided normal quantile for ``confidence`` in (0, 1): 1.959963984540054 for 0.95."""
    return NormalDist().inv_cdf(1 - (1 - confidence) / 2)


def wilson(
    percent: np.ndarray, n: int | np.ndarray, confidence: float
) -> tuple[np.ndarray, np.ndarray]:
    """The plain Wilson score interval (low, high), 0-100, of proportions given as ``percent``
    (0-100; NaN gives NaN) over ``n`` trials (0 gives NaN), at ``confidence`` (two-sided):
    (p̂ + z²/2n ± z·√(p̂(1 − p̂)/n + z²/4n²)) / (1 + z²/n), z the normal quantile of 1 − α/2;
    clipped to [0, 100]. Not bounded to contain p̂ (``contain`` does that): floating point can put a
    bound a hair inside the point (100 over 60 trials gives a high of 99.99999999999997)."""
    z = z_value(confidence)
    p = np.asarray(percent, np.float64) / 100
    n = np.asarray(n, np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        z2n = np.where(n > 0, z * z / n, np.nan)
        center = (p + z2n / 2) / (1 + z2n)
        half = z / (1 + z2n) * np.sqrt(np.maximum(p * (1 - p), 0) / n + z2n / (4 * n))
        low, high = np.clip(center - half, 0, 1), np.clip(center + half, 0, 1)
    return 100 * low, 100 * high


def score_interval(
    successes: np.ndarray, trials: np.ndarray, confidence: float
) -> tuple[np.ndarray, np.ndarray]:
    """The Wilson score interval with continuity correction (low, high) of a proportion, as
    fractions 0-1 (Newcombe 1998, "Two-sided confidence intervals for the single proportion:
    comparison of seven methods", Statistics in Medicine 17:857-872, method 4; the interval of
    ``prop.test(correct=TRUE)`` in R): the p with |x − np| − ½ = z√(np(1 − p)), i.e. with p̂ = x/n
    and z the normal quantile,

        low  = (2np̂ + z² − 1 − z√(z² − 2 − 1/n + 4p̂(n(1 − p̂) + 1))) / (2(n + z²)),   0 when x =
        0, high = (2np̂ + z² + 1 + z√(z² + 2 − 1/n + 4p̂(n(1 − p̂) − 1))) / (2(n + z²)),   1 when x
        = n,

    clipped to [0, 1]. ``successes`` x and ``trials`` n: arrays of any matching shape; counts may be
    fractional (means over epochs). n = 0 gives (0, 1): no trial, no information. Not yet bounded to
    contain x/n (``contain``)."""
    z = z_value(confidence)
    x, n = np.broadcast_arrays(np.asarray(successes, np.float64), np.asarray(trials, np.float64))
    with np.errstate(invalid="ignore", divide="ignore"):
        p = np.where(n > 0, x / n, np.nan)
        low = (
            2 * n * p
            + z * z
            - 1
            - z * np.sqrt(np.maximum(z * z - 2 - 1 / n + 4 * p * (n * (1 - p) + 1), 0))
        ) / (2 * (n + z * z))
        high = (
            2 * n * p
            + z * z
            + 1
            + z * np.sqrt(np.maximum(z * z + 2 - 1 / n + 4 * p * (n * (1 - p) - 1), 0))
        ) / (2 * (n + z * z))
        low = np.where(x <= 0, 0.0, low)
        high = np.where(x >= n, 1.0, high)
        empty = ~(n > 0)
        low, high = np.where(empty, 0.0, low), np.where(empty, 1.0, high)
    return np.clip(low, 0, 1), np.clip(high, 0, 1)


def bounded_mean_interval(
    mean: np.ndarray, n: np.ndarray, bound: float, confidence: float
) -> tuple[np.ndarray, np.ndarray]:
    """The interval (low, high), in the mean's units, of a mean of per-task values in [0,
    ``bound``] over ``n`` tasks (may be fractional: answers per epoch over units): ``bound`` times
    ``score_interval`` of (``mean`` / ``bound``) · n successes over n (the module docstring: a
    bounded variable's variance is at most the binomial's, Bhatia & Davis 2000). Never of zero
    width for n < ∞; NaN where ``mean`` is NaN or n = 0. Not yet bounded by ``contain``."""
    mean, n = np.broadcast_arrays(np.asarray(mean, np.float64), np.asarray(n, np.float64))
    share = np.clip(mean / bound, 0, 1)
    low, high = score_interval(np.nan_to_num(share) * n, n, confidence)
    bad = np.isnan(mean) | ~(n > 0)
    return np.where(bad, np.nan, bound * low), np.where(bad, np.nan, bound * high)


def auroc_score_interval(
    auroc: np.ndarray, positives: np.ndarray, negatives: np.ndarray, confidence: float
) -> tuple[np.ndarray, np.ndarray]:
    """Newcombe's score-type interval for an AUROC θ̂ (2006, Statistics in Medicine 25:559-573,
    method 5): the θ in [0, 1] with (θ̂ − θ)² ≤ z² V(θ), where V is Hanley & McNeil's (1982,
    Radiology 143:29-36) variance with its exponential-model terms Q₁ = θ/(2 − θ), Q₂ = 2θ²/(1 + θ)
    and both m − 1 and n − 1 replaced by N* − 1, N* = (m + n)/2:
    V(θ) = θ(1 − θ)[1 + (N* − 1)((1 − θ)/(2 − θ) + θ/(1 + θ))] / (m n), m positives, n
    negatives. Solved by bisection (60 steps, to ~1e-18) on each side of θ̂; arrays of one shape;
    NaN where either class is empty or θ̂ is NaN. Its width at θ̂ = 1 is that of V's root, never
    zero."""
    theta = np.asarray(auroc, np.float64)
    m, n = np.asarray(positives, np.float64), np.asarray(negatives, np.float64)
    z2 = z_value(confidence) ** 2
    star = (m + n) / 2 - 1

    def outside(t: np.ndarray) -> np.ndarray:  # True where t is rejected
        with np.errstate(invalid="ignore", divide="ignore"):
            v = t * (1 - t) * (1 + star * ((1 - t) / (2 - t) + t / (1 + t))) / (m * n)
            return (theta - t) ** 2 > z2 * v

    bounds = []
    for end in (0.0, 1.0):
        inner, outer = theta.copy(), np.full(theta.shape, end)  # inner accepted, outer maybe not
        for _ in range(60):
            mid = (inner + outer) / 2
            rejected = outside(mid)
            outer, inner = np.where(rejected, mid, outer), np.where(rejected, inner, mid)
        # the end itself is accepted when not rejected (V = 0 there: only when θ̂ is the end)
        bounds.append(np.where(outside(np.full(theta.shape, end)), outer, end))
    bad = np.isnan(theta) | ~(m > 0) | ~(n > 0)
    return np.where(bad, np.nan, bounds[0]), np.where(bad, np.nan, bounds[1])


def f1_interval(
    tp: np.ndarray, fp: np.ndarray, fn: np.ndarray, confidence: float
) -> tuple[np.ndarray, np.ndarray]:
    """The interval (low, high), 0-100, of F1 = 2TP / (2TP + FP + FN): ``score_interval`` of
    θ = TP / (TP + FP + FN) over m = TP + FP + FN trials, each bound mapped through 2θ / (1 + θ)
    (monotone, so the coverage is θ's). NaN where m = 0 (F1 undefined)."""
    tp, fp, fn = (np.asarray(a, np.float64) for a in (tp, fp, fn))
    m = tp + fp + fn
    low, high = score_interval(tp, m, confidence)
    undefined = ~(m > 0)
    return (
        np.where(undefined, np.nan, 200 * low / (1 + low)),
        np.where(undefined, np.nan, 200 * high / (1 + high)),
    )


def mover(
    point: np.ndarray,
    points: np.ndarray,
    lows: np.ndarray,
    highs: np.ndarray,
    weights: np.ndarray,
    correlation: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The MOVER interval of the weighted sum ``point`` = Σ w_k θ_k (Zou & Donner 2008): with
    d⁻_k = θ_k − l_k and d⁺_k = u_k − θ_k (each term's distances to its own bounds, ≥ 0),
    low = point − √(Σ_jk r_jk w_j w_k d⁻_j d⁻_k) and high = point + √(Σ_jk r_jk w_j w_k d⁺_j d⁺_k).
    Shapes: ``points``, ``lows``, ``highs`` (..., terms); ``weights`` (terms,) or (..., terms) ≥ 0
    (a term with weight 0 or NaN values is left out); ``correlation`` (..., terms, terms), the
    terms' correlations r_jk (None: independent terms, r = identity). ``point`` (...,). Returns
    (low, high); not yet bounded by ``contain``."""
    points, lows, highs = (np.asarray(a, np.float64) for a in (points, lows, highs))
    w = np.broadcast_to(np.asarray(weights, np.float64), points.shape)
    kept = (w > 0) & ~np.isnan(points) & ~np.isnan(lows) & ~np.isnan(highs)
    below = np.where(kept, w * np.maximum(points - lows, 0), 0.0)
    above = np.where(kept, w * np.maximum(highs - points, 0), 0.0)
    if correlation is None:
        var_low, var_high = (below**2).sum(-1), (above**2).sum(-1)
    else:
        r = np.asarray(correlation, np.float64)
        var_low = np.einsum("...j,...jk,...k->...", below, r, below)
        var_high = np.einsum("...j,...jk,...k->...", above, r, above)
    return point - np.sqrt(np.maximum(var_low, 0)), point + np.sqrt(np.maximum(var_high, 0))


def contain(point: np.ndarray, low: np.ndarray, high: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The bounds made to hold the point exactly: (min(low, point), max(high, point)), elementwise,
    NaN where the point is NaN (no figure, no interval) and where a bound is. So ``low ≤ point ≤
    high`` holds in floating point and after rounding (rounding is monotone), and a chart's error
    bar is never negative."""
    point, low, high = (np.asarray(a, np.float64) for a in (point, low, high))
    with np.errstate(invalid="ignore"):
        bad = np.isnan(point) | np.isnan(low) | np.isnan(high)
        return np.where(bad, np.nan, np.minimum(low, point)), np.where(
            bad, np.nan, np.maximum(high, point)
        )
