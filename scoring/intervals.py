"""Which interval each metric gets, and the Wilson score interval of the single proportions.

* **Accuracy** (AA-Omniscience-Decision, HLE-MultiChoice, When2Call, and their breakdown groups) is a
  single proportion: correct answers among a fixed number of tasks. Its interval is the Wilson score
  interval (Wilson 1927, "Probable inference, the law of succession, and statistical inference", JASA
  22:209-212; recommended over the Wald and percentile intervals by Brown, Cai & DasGupta 2001,
  "Interval Estimation for a Binomial Proportion", Statistical Science 16:101-133), with n = the number
  of tasks. Unlike a percentile bootstrap it does not collapse at 0% or 100% (20 tasks all wrong give
  [0.0, 16.1], not [0.0, 0.0]). With several epochs the per-task score is the mean of its epochs, a
  value in [0, 1] whose variance is at most p(1 − p): the same interval over the tasks is then
  conservative.
* Everything else keeps the percentile bootstrap over tasks (``scoring.bootstrap``): the
  non-hallucination rate (its denominator, the answers not correct, is itself random), the F1 scores
  and their mean (not proportions of a fixed count), the Decision Index (a weighted sum over four
  evaluations), the calibration metrics (Brier score, ECE, log loss). At 0 or 100 such an interval can
  have zero width (every resample gives the same value); that is the data, not a bound: the docs say so.
* AUROC: DeLong's variance (``scoring.calibration``).
* Differences between two models (``scoring.compare``): the paired percentile bootstrap.

The bootstrap resamples stay the same for every metric: the index and the paired comparisons use the
resampled accuracies, whatever interval accuracy itself reports.
"""
from __future__ import annotations

from statistics import NormalDist

import numpy as np

WILSON = "Wilson score interval over tasks"
BOOTSTRAP = "percentile bootstrap over tasks"
METHODS = {
    "accuracy": WILSON,
    "non_hallucination_rate": BOOTSTRAP,
    "f1_prompt_harm": BOOTSTRAP, "f1_response_refusal": BOOTSTRAP, "f1_response_harm": BOOTSTRAP, "mean_f1": BOOTSTRAP,
    "decision_index": BOOTSTRAP,
    "brier": BOOTSTRAP, "ece": BOOTSTRAP, "log_loss": BOOTSTRAP,
    "auroc": "DeLong's variance, normal approximation",
    "differences": "paired percentile bootstrap over tasks (the same resamples for both models)",
}
"""summary.json's ``intervals.methods``: each metric's interval method, by metric name."""
WILSON_METRICS = frozenset(m for m, method in METHODS.items() if method == WILSON)


def wilson(percent: np.ndarray, n: int | np.ndarray, confidence: float) -> tuple[np.ndarray, np.ndarray]:
    """The Wilson score interval (low, high), 0-100, of proportions given as ``percent`` (0-100; NaN
    gives NaN) over ``n`` trials (tasks; 0 gives NaN), at ``confidence`` (two-sided):
    (p̂ + z²/2n ± z·√(p̂(1 − p̂)/n + z²/4n²)) / (1 + z²/n), z the normal quantile of 1 − α/2."""
    z = NormalDist().inv_cdf(1 - (1 - confidence) / 2)
    p = np.asarray(percent, np.float64) / 100
    n = np.asarray(n, np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        z2n = np.where(n > 0, z * z / n, np.nan)
        center = (p + z2n / 2) / (1 + z2n)
        half = z / (1 + z2n) * np.sqrt(np.maximum(p * (1 - p), 0) / n + z2n / (4 * n))
        low, high = np.clip(center - half, 0, 1), np.clip(center + half, 0, 1)
    return 100 * low, 100 * high
