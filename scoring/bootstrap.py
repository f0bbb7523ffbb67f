"""Bootstrap confidence intervals over tasks: the resampling weights and the percentile interval.

Method (Efron & Tibshirani 1993, "An Introduction to the Bootstrap", ch. 13, percentile interval):
within each evaluation the tasks are resampled with replacement ``resamples`` times; resample ``b``
is a row of counts ``W[b, t]`` (how often task ``t`` was drawn; each row sums to the number of
tasks; kept as small integers, ``Bootstrap.counts``). Every metric is a function of sums over tasks,
so the resampled sums of all models at once are one matrix product ``W @ X``
(``scoring.sums.Cube.resampled``), and the interval is the (α/2, 1 − α/2) percentile of the
resampled metric (linear interpolation between order statistics, as ``numpy.nanquantile``).

* The resamples depend only on the seed, the evaluation's name and its number of tasks (tasks in
  sorted id order), never on the models: every model is scored on the same resamples (a paired
  bootstrap), and scoring one model alone gives it the same interval as scoring it beside others.
* The evaluations are resampled independently; the Decision Index of resample ``b`` combines
  resample ``b`` of each evaluation.
* A task is the unit (a WildGuardTest row's three questions move together); several epochs of one
  task move together too, and the per-epoch metrics are averaged within each resample.
* A resample in which a metric is undefined (F1 with no positive label and no positive prediction)
  is left out of that metric's percentiles.
"""

from __future__ import annotations

import functools
import zlib
from dataclasses import dataclass

import numpy as np

from .intervals import METHODS, RESAMPLING

DEFAULT_SEED = 20250607


@dataclass(frozen=True, slots=True)
class Bootstrap:
    """How intervals are computed: ``resamples`` (≥ 1), ``confidence`` in (0, 1), ``seed``."""

    resamples: int = 1000
    confidence: float = 0.95
    seed: int = DEFAULT_SEED

    def __post_init__(self) -> None:
        if self.resamples < 1:
            raise ValueError(f"resamples must be at least 1, got {self.resamples}")
        if not 0 < self.confidence < 1:
            raise ValueError(f"confidence must be in (0, 1), got {self.confidence}")

    def counts(self, eval_name: str, n_tasks: int) -> np.ndarray:
        """Resample counts, shape (resamples, n_tasks), in the smallest unsigned integer type that
        holds them (uint8 unless a task is drawn more than 255 times in one resample); the same
        read-only array object for the same arguments (drawn once, kept: ``dxi run`` draws them
        during the run). A quarter of the float32 matrix's memory: 12.5 MB for 12,500 tasks. After
        ``prepare`` for the same arguments, the float32 matrix instead (the same values)."""
        prepared = _PREPARED.get((self, eval_name, n_tasks))
        return _counts(self, eval_name, n_tasks) if prepared is None else prepared

    def prepare(self, eval_name: str, n_tasks: int, block_bytes: int = 1 << 22) -> None:
        """Draw the counts and keep them as float32 too, so that the resampled sums' product
        (``scoring.sums.Cube.resampled``) has its matrix ready: ``dxi run`` calls it on a thread
        during the run. The float32 matrix is four times the counts' memory (400 MB for 100,000
        tasks) and fresh memory's first touch is slow (measured: 0.77 s for those 400 MB, against
        0.04 s for a conversion into touched memory), which this moves from the tail into the run;
        it is filled a block of ``block_bytes`` at a time, so the thread lets the event loop run
        between blocks. ``dxi score`` and ``dxi view`` do not call it and hold the counts only."""
        key = (self, eval_name, n_tasks)
        if key in _PREPARED:
            return
        counts = _counts(self, eval_name, n_tasks)
        out = np.empty(counts.shape, np.float32)
        rows = max(1, block_bytes // max(1, 4 * counts.shape[1]))
        for start in range(0, counts.shape[0], rows):
            out[start : start + rows] = counts[start : start + rows]
        out.flags.writeable = False
        _PREPARED[key] = out

    def weights(self, eval_name: str, n_tasks: int) -> np.ndarray:
        """``counts`` as float32 (exact for counts below 2**24), shape (resamples, n_tasks): what
        the resampled sums multiply (``scoring.sums.Cube.resampled``); a new array on each call."""
        return self.counts(eval_name, n_tasks).astype(np.float32)

    def _draw(self, eval_name: str, n_tasks: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, zlib.crc32(eval_name.encode())])
        b = self.resamples
        if n_tasks == 0:
            return np.zeros((b, 0), np.uint8)
        # Drawn a block of resamples at a time and counted row by row: the same draws as one
        # ``integers(0, n_tasks, size=(b, n_tasks))`` call (the generator's stream is consumed in
        # the same order; 32-bit draws are the ones the 64-bit call makes below 2**32), without
        # holding them all and without one bincount over b * n_tasks bins (~10x slower: it scatters
        # over a huge array).
        out = np.empty((b, n_tasks), np.uint8)
        dtype = np.uint32 if n_tasks <= 2**32 else np.int64
        block = max(1, min(b, (1 << 22) // n_tasks))
        for start in range(0, b, block):
            drawn = rng.integers(0, n_tasks, size=(min(block, b - start), n_tasks), dtype=dtype)
            for i, row in enumerate(drawn, start):
                counted = np.bincount(row, minlength=n_tasks)
                top = int(counted.max())
                if (
                    top > np.iinfo(out.dtype).max
                ):  # rare (a task drawn > 255 times): a wider type from here on
                    out = out.astype(np.min_scalar_type(max(top, n_tasks)))
                out[i] = counted
        return out

    def interval(self, replicates: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(low, high) percentiles over axis 0 of ``replicates`` (NaN = undefined, left out); NaN
        where no resample is defined."""
        alpha = (1 - self.confidence) / 2
        low, high = nan_quantiles(replicates, (alpha, 1 - alpha))
        return low, high

    def describe(self) -> dict:
        """The ``intervals`` block of summary.json: the bootstrap (``method``,
        ``scoring.intervals.RESAMPLING``: what its resamples are used for), and ``methods``, each
        metric's interval method by metric name (``scoring.intervals.METHODS``, the one place
        summary.json names them)."""
        return {
            "method": RESAMPLING,
            "confidence": self.confidence,
            "resamples": self.resamples,
            "seed": self.seed,
            "methods": dict(METHODS),
            "note": (
                "each metric's interval is over tasks as a sample of a superpopulation of"
                " tasks (on the whole data set too) and holds its point; `methods` names "
                "each one (scoring/intervals.py gives the sources): accuracy, the "
                "non-hallucination rate and each F1 a score interval (Wilson's with "
                "continuity correction), mean F1 and the Decision Index the MOVER "
                "combination of their terms' intervals, Brier and log loss the same score "
                "interval of a bounded mean, ECE none, AUROC the hull of DeLong's and "
                "Newcombe's; the paired comparisons use the bootstrap: tasks resampled "
                "with replacement within each evaluation, the same resamples for every "
                "model"
            ),
        }


_PREPARED: dict[tuple[Bootstrap, str, int], np.ndarray] = {}  # Bootstrap.prepare's float32 matrices


@functools.lru_cache(maxsize=16)
def _counts(boot: Bootstrap, eval_name: str, n_tasks: int) -> np.ndarray:
    w = boot._draw(eval_name, n_tasks)
    w.flags.writeable = False
    return w


def nan_quantiles(a: np.ndarray, qs: tuple[float, ...]) -> list[np.ndarray]:
    """The quantiles ``qs`` (0-1) over axis 0, ignoring NaN, with linear interpolation: the same
    values as ``numpy.nanquantile(a, q, axis=0)``, from one partial sort and without its per-column
    loop."""
    a = np.asarray(a, dtype=np.float64)
    shape = a.shape[1:]
    if a.shape[0] == 0:
        return [np.full(shape, np.nan) for _ in qs]
    rows = np.ascontiguousarray(a.reshape(a.shape[0], -1).T)  # one row per column of ``a``
    nan = np.isnan(rows)
    k = rows.shape[1] - nan.sum(axis=1)
    if nan.any():
        ordered = np.sort(rows, axis=1)  # NaN sort last
    else:  # every column complete: only the order statistics around each quantile are needed
        n = rows.shape[1]
        needed = sorted({min(int(np.floor(q * (n - 1))) + d, n - 1) for q in qs for d in (0, 1)})
        ordered = np.partition(rows, needed, axis=1)
    return [v.reshape(shape) for v in ordered_quantiles(ordered, k, qs)]


def ordered_quantiles(
    ordered: np.ndarray, k: np.ndarray, qs: tuple[float, ...]
) -> list[np.ndarray]:
    """The quantiles ``qs`` (0-1) of each row of ``ordered`` (rows, n), of its first ``k[row]``
    values, with linear interpolation (``numpy.quantile``'s default): each row sorted (NaN last), or
    partitioned at the order statistics the quantiles need; NaN for a row with ``k`` = 0. One array
    (rows,) per quantile."""
    top = np.maximum(k - 1, 0)
    out = []
    for q in qs:
        pos = q * top
        lo = np.floor(pos).astype(np.int64)
        hi = np.minimum(lo + 1, top)
        low = np.take_along_axis(ordered, lo[:, None], axis=1)[:, 0]
        high = np.take_along_axis(ordered, hi[:, None], axis=1)[:, 0]
        with np.errstate(invalid="ignore"):
            value = low + (high - low) * (pos - lo)
        out.append(np.where(k > 0, value, np.nan))
    return out
