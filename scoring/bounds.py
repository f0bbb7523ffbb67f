"""Bounds of provisional figures, and the differences they let a comparison claim (SPEC §6).

A failed or missing answer (an *open* answer) answered nothing. A figure with open answers is
computed over the answered questions only (``scoring.metrics``) and carries its **bounds**: the
lowest and the highest value the figure over *every* question could take, whatever the open answers
turn out to be, each one in turn right, wrong, or "I don't know" where that is an option
(AA-Omniscience-Decision's ``E``). The bounds are exact, over all completions of the open answers,
per epoch and per metric:

* **accuracy** (c correct of n replies, k open): [100·c/(n + k), 100·(c + k)/(n + k)] (every open
  answer wrong; every one right).
* **non-hallucination rate** (h hallucinated of w wrong replies): an open answer completed right
  leaves the rate alone, as "I don't know" it adds to the wrong answers only, as a wrong pick to
  both. The hallucination rate (h + j)/(w + j + i) (j wrong picks, i abstentions) grows with j (as h
  ≤ w) and falls with i: lowest non-hallucination 100·(1 − (h + k)/(w + k)), every open answer a
  wrong pick; highest 100·(1 − h/(w + k)), every one "I don't know". HLE-MultiChoice and When2Call
  have no abstention.
* **F1** of one yes/no question (TP, FP, FN of the replies; p open answers with gold yes, q with
  gold no): an open gold-yes answer is a TP or an FN, an open gold-no one an FP or a true negative.
  F1 = 2T/(2T + F + N) rises when an FN becomes a TP (the difference of the two values has the sign
  of T + F + N + 1 > 0) and falls when a true negative becomes an FP, so every answer moves it one
  way: lowest 2T/(2T + F + q + N + p), highest 2(T + p)/(2(T + p) + F + N). Where that highest is
  undefined (no positive gold label and no FP reply: 0/0), the completions give either an undefined
  F1 (every open answer "no") or 0.
* **mean F1** is the mean of the *defined* F1 scores, so a question whose F1 can be undefined can
  drop out of the mean or enter it as 0: the extremes are taken over every choice of which questions
  are defined (2³ cases), each question at its own extreme (the questions' open answers are distinct
  answers, so their extremes are reached together).
* **several epochs**: the figure is the mean over epochs of each epoch's figure, and each epoch's
  open answers are its own: the bounds are the mean of each epoch's bounds.
* **Decision Index**: the weighted sum of its terms (every weight is positive), so its bounds are
  the same sums of the terms' bounds (a complete term at its value). This is exact at the low end
  (every term's lowest is reached by the same completion: every open answer a wrong pick) and can be
  loose at the high end (Omniscience's accuracy is highest with every open answer right, its
  non-hallucination rate with every one "I don't know").

The figure over the answered questions lies within its bounds (each formula above has it between its
two completions), so a failure can never raise a figure. A complete figure has no bounds: null in
the tables, absent from summary.json.

**Comparisons** (``settle``): between two figures of which one at least is provisional, a difference
is claimed only when no outcome of the open answers could overturn it: ``a`` above ``b`` only when
the lowest ``a`` could be exceeds the highest ``b`` could be (a complete figure's bounds are its
value), besides the comparison's own significance. ``settled`` false marks the others: their
p-values stay as computed, but the report, ``dxi view`` and the ranking claim nothing for them. The
ranks' intervals widen to every rank the bounds allow, and a tied-group boundary whose leading
comparison is not settled is removed (``settle_ranks``).
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from .metrics import accuracy_from, f1_from, non_hallucination_from

if TYPE_CHECKING:
    from .sums import EvalMetrics

Bounds = tuple[np.ndarray, np.ndarray]  # (lowest, highest), 0-100, NaN where undefined
Array = np.ndarray


def accuracy_bounds(correct: Array, replies: Array, open_: Array) -> Bounds:
    """Accuracy's bounds (0-100) from the correct answers, the replies and the open (failed or
    missing) answers, arrays of one shape: every open answer wrong, every one right."""
    total = replies + open_
    return accuracy_from(correct, total), accuracy_from(correct + open_, total)


def non_hallucination_bounds(hallucinated: Array, wrong: Array, open_: Array) -> Bounds:
    """The non-hallucination rate's bounds (0-100) from the hallucinated and the wrong replies
    and the open answers: every open answer a wrong pick; every one "I don't know"."""
    return (
        non_hallucination_from(hallucinated + open_, wrong + open_),
        non_hallucination_from(hallucinated, wrong + open_),
    )


def f1_bounds(
    tp: Array, fp: Array, fn: Array, open_yes: Array, open_no: Array
) -> tuple[Array, Array, Array]:
    """One yes/no question's F1 bounds (0-100) from the replies' TP, FP, FN and the open answers
    with gold yes and gold no: ``(lowest, highest, can_be_undefined)``, the extremes over the
    completions whose F1 is defined (NaN where none is) and whether a completion leaves it
    undefined (0/0)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        low = f1_from(tp, fp + open_no, fn + open_yes)
        high = f1_from(tp + open_yes, fp, fn)
    high = np.where(np.isnan(high) & (open_no > 0), 0.0, high)  # undefined at best: else 0
    return low, high, (tp + fp + fn + open_yes) == 0


def mean_f1_bounds(low: Array, high: Array, undefined: Array) -> Bounds:
    """The bounds of the mean of the defined F1 scores from each question's ``f1_bounds``
    stacked on the last axis (..., questions): the extremes over every choice of the questions
    left undefined (each one only where it can be), NaN where every choice leaves them all
    undefined."""
    lowest, highest = np.full(low.shape[:-1], np.nan), np.full(low.shape[:-1], np.nan)
    defined = ~np.isnan(low)
    for choice in itertools.product((False, True), repeat=low.shape[-1]):
        kept = np.array(choice)
        if not kept.any():
            continue
        possible = np.where(kept, defined, undefined).all(-1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            lo, hi = low[..., kept].mean(-1), high[..., kept].mean(-1)
        lowest = np.fmin(lowest, np.where(possible, lo, np.nan))
        highest = np.fmax(highest, np.where(possible, hi, np.nan))
    return lowest, highest


def settled(low_a: Array, high_a: Array, low_b: Array, high_b: Array) -> Array:
    """Whether no outcome of the open answers could overturn a difference between figures
    ``a`` and ``b``: their bounds (a complete figure's are its value) do not overlap, ``a``
    wholly above or below ``b``. Equal complete figures are not settled (no difference)."""
    return (low_a > high_b) | (high_a < low_b)


def figure_bounds(
    estimates: dict[str, EvalMetrics], index: tuple[Array, Array, Array]
) -> dict[tuple[str | None, str], Bounds]:
    """Per figure compared, ``(eval, metric)`` (``(None, "decision_index")`` for the index),
    every label's bounds with a complete figure at its value: from each evaluation's
    ``EvalMetrics`` (point, ``lowest``, ``highest``) and the index's ``(point, lowest,
    highest)`` (labels,) arrays."""

    def filled(point: Array, low: Array, high: Array) -> Bounds:
        return np.where(np.isnan(low), point, low), np.where(np.isnan(high), point, high)

    out = {(None, "decision_index"): filled(*index)}
    for name, est in estimates.items():
        for metric, point in est.point.items():
            if metric in est.lowest:
                out[(name, metric)] = filled(point, est.lowest[metric], est.highest[metric])
    return out


def settle(
    comparisons: pl.DataFrame, labels: Sequence[str], bounds: dict[tuple[str | None, str], Bounds]
) -> pl.DataFrame:
    """``comparisons`` (``scoring.compare``'s table: ``a``, ``b``, ``eval``, ``metric``,
    ``complete``) with ``settled``: true where both figures are complete, else whether the open
    answers could not overturn the difference (``settled``; ``bounds`` from ``figure_bounds``
    over ``labels``)."""
    if comparisons.is_empty():
        return comparisons.with_columns(pl.lit(None, pl.Boolean).alias("settled"))
    at = {label: i for i, label in enumerate(labels)}
    a = np.array([at[x] for x in comparisons["a"].to_list()], np.int64)
    b = np.array([at[x] for x in comparisons["b"].to_list()], np.int64)
    out = comparisons["complete"].fill_null(False).to_numpy().copy()
    rows = comparisons.select("eval", "metric").with_row_index("row")
    for (name, metric), part in rows.group_by("eval", "metric"):
        if (name, metric) not in bounds:
            continue
        k = part["row"].to_numpy()
        todo = k[~out[k]]
        low, high = bounds[(name, metric)]
        out[todo] = settled(low[a[todo]], high[a[todo]], low[b[todo]], high[b[todo]])
    return comparisons.with_columns(pl.Series("settled", out, dtype=pl.Boolean))


def settle_ranks(ranks: pl.DataFrame, labels: Sequence[str], bounds: Bounds) -> pl.DataFrame:
    """The ranks (``scoring.compare.RANK_SCHEMA``) with their intervals widened so they claim
    nothing the open answers could overturn, from the index's ``bounds`` over ``labels`` (a
    complete index at its value); unchanged when every index ranked is complete. ``rank_low`` /
    ``rank_high`` and ``rank_set_low`` / ``rank_set_high`` cover every rank the bounds allow: as
    good as 1 + the models whose lowest exceeds this one's highest, as poor as 1 + the models
    whose highest exceeds its lowest. The tied groups need nothing here: they are read from the
    comparisons' ``significant``, which ``settle``'s rule has already cleared where a difference
    is not settled (``scoring.scored``)."""
    if ranks.is_empty():
        return ranks
    at = {label: i for i, label in enumerate(labels)}
    idx = np.array([at[x] for x in ranks["label"].to_list()], np.int64)
    low, high = bounds[0][idx], bounds[1][idx]
    if np.array_equal(low, high):  # every index ranked is complete: nothing to overturn
        return ranks
    best = 1 + (low[None, :] > high[:, None]).sum(1)
    worst = 1 + ((high[None, :] > low[:, None]) & ~np.eye(len(idx), dtype=bool)).sum(1)
    return ranks.with_columns(
        *(
            pl.Series(name, np.minimum(ranks[name].to_numpy(), best), dtype=pl.Int64)
            for name in ("rank_low", "rank_set_low")
        ),
        *(
            pl.Series(name, np.maximum(ranks[name].to_numpy(), worst), dtype=pl.Int64)
            for name in ("rank_high", "rank_set_high")
        ),
    )
