"""Calibration of models that return probabilities (decision models, logprob models).

Which answers count: those with status ``ok`` whose probabilities were returned. Invalid and failed
answers have no probability: they are left out of every calibration metric and counted
(``excluded``); accuracy and F1 count the invalid ones as wrong and leave the failed ones out (not
answers, SPEC §6). A model with no probabilities at all has no calibration.

Per answer, with ``p_k`` the probability of option ``k`` (yes/no questions: P(yes) and P(no)),
``p_gold`` that of the gold answer and ``confidence`` that of the answer given (``p_predicted``):

* Brier score = ½ Σ_k (p_k − y_k)² — in [0, 1]; for a yes/no question it is the usual (P(yes) − y)².
  Brier (1950), "Verification of forecasts expressed in terms of probability", Monthly Weather
  Review 78; the same value as ``sklearn.metrics.brier_score_loss(..., scale_by_half=True)``.
* Log loss = −ln p_gold (natural log, nats), with p_gold clipped to at least ``LOG_LOSS_FLOOR`` =
  5e-5: decision servers round probabilities to 4 decimals, so a reported 0 only says p < 5e-5.
* Expected calibration error (top-label; Guo et al. 2017, "On Calibration of Modern Neural
  Networks", ICML, eq. 3): the confidence of the answer given is binned into ``ECE_BINS`` = 10
  equal-width bins [0, 0.1), [0.1, 0.2), …, [0.9, 1.0] (the last includes 1); ECE = Σ_b (n_b / N)
  · |accuracy_b − mean confidence_b| = Σ_b |Σ_{i∈b} (correct_i − confidence_i)| / N. In [0, 1] (0 =
  perfectly calibrated). Reliability diagrams plot the same bins.
* AUROC for each yes/no question (WildGuardTest): the probability that a random positive (gold
  "yes") gets a higher P(yes) than a random negative, ties counting ½ (Mann–Whitney); null with one
  class only. Its 95% interval uses DeLong's variance (DeLong, DeLong & Clarke-Pearson 1988,
  Biometrics 44) in the midrank form of Sun & Xu (2014, IEEE Signal Processing Letters 21): AUROC ±
  z·SE, clipped to [0, 1], hulled with Newcombe's score-type interval (2006, method 5;
  ``intervals.auroc_score_interval``), which keeps a width where DeLong's variance is 0 (AUROC 0 or
  1).

Brier score, log loss and ECE are sums over answers (``answer_calibration``); Brier's and the log
loss's intervals are the bounded-mean score interval (``intervals.bounded_mean_interval``), ECE has
none (``intervals.METHODS`` says why); AUROC is a rank statistic and uses DeLong's and Newcombe's.
With several epochs each metric is computed per epoch and averaged.
"""

from __future__ import annotations

from statistics import NormalDist

import numpy as np
import polars as pl

from .columns import canonical_order, explode
from .intervals import auroc_score_interval, contain

ECE_BINS = 10
LOG_LOSS_FLOOR = 5e-5
GOLD_CHUNK = 65_536  # answers matched to their gold option at a time (``_gold_probability``)
CALIBRATION_METRICS = ("brier", "ece", "log_loss")


def describe() -> dict:
    """The ``calibration`` block of summary.json (how the calibration metrics are computed)."""
    bounded = (
        "; interval: Wilson score interval with continuity correction of the mean over its bound"
    )
    return {
        "answers": "status ok with probabilities; invalid and failed answers are excluded and counted as 'excluded'",
        "brier": (
            "1/2 * sum over options of (p - y)^2, in [0, 1] (binary Brier for yes/no "
            "questions)" + bounded
        ),
        "ece": (
            f"top-label, {ECE_BINS} equal-width confidence bins on [0, 1], in [0, 1]; no "
            "interval (null): the binned estimate is biased upwards at every size (Kumar, "
            "Liang & Ma 2019)"
        ),
        "log_loss": f"-ln p(gold) in nats, p clipped to at least {LOG_LOSS_FLOOR:g}"
        + bounded
        + f" ({-np.log(LOG_LOSS_FLOOR):.2f} nats)",
        "auroc": (
            "P(yes) against gold yes/no per WildGuardTest question, ties count 1/2; "
            "interval: hull of DeLong's and Newcombe's (2006, method 5) score-type "
            "interval"
        ),
        "epochs": "computed per epoch, then averaged",
    }


def answer_calibration(ans: pl.DataFrame) -> pl.DataFrame:
    """Per answer row of ``ans`` (same order): ``pn`` (1.0 when the answer counts for calibration),
    ``brier``, ``log_loss``, ``gap`` (correct − confidence) and ``bin`` (0..ECE_BINS−1; −1 when not
    counted). Needs ``status``, ``gold``, ``correct``, ``p_predicted`` and ``probabilities``; a
    frame without ``probabilities`` has no calibration (``pn`` all 0)."""
    terms = answer_terms(ans)
    return pl.DataFrame(
        {
            "pn": terms["pn"].astype(np.float64),
            **{c: terms[c] for c in ("brier", "log_loss", "gap", "bin")},
        }
    )


def answer_terms(ans: pl.DataFrame) -> dict[str, np.ndarray]:
    """``answer_calibration`` as NumPy arrays (``pn`` boolean), and ``p_gold``: the probability each
    answer gave its gold option (``gold_probability``: NaN where there is none)."""
    n = ans.height
    if "probabilities" not in ans.columns or n == 0:
        zero = np.zeros(n)
        return {
            "pn": np.zeros(n, bool),
            "brier": zero,
            "log_loss": zero,
            "gap": zero,
            "bin": np.full(n, -1, np.int64),
            "p_gold": np.full(n, np.nan),
        }
    p_gold, sum_sq = _gold_probability(ans["probabilities"], ans["gold"].cast(pl.String))
    confidence = ans["p_predicted"].fill_null(np.nan).to_numpy().astype(np.float64)
    counted = (
        (ans["status"].cast(pl.String) == "ok").to_numpy()
        & ~np.isnan(p_gold)
        & ~np.isnan(confidence)
    )
    correct = ans["correct"].to_numpy().astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        brier = 0.5 * (sum_sq - 2 * p_gold + 1)
        log_loss = -np.log(np.maximum(p_gold, LOG_LOSS_FLOOR))
    bins = np.minimum((np.nan_to_num(confidence) * ECE_BINS).astype(np.int64), ECE_BINS - 1)
    return {
        "pn": counted,
        "brier": np.where(counted, brier, 0.0),
        "log_loss": np.where(counted, log_loss, 0.0),
        "gap": np.where(counted, correct - np.nan_to_num(confidence), 0.0),
        "bin": np.where(counted, np.clip(bins, 0, ECE_BINS - 1), -1),
        "p_gold": p_gold,
    }


def gold_probability(probabilities: pl.Series, gold: pl.Series) -> np.ndarray:
    """Per answer, the probability its ``probabilities`` (``list<struct{option, p}>``) give its
    ``gold`` option (NaN where there is none: invalid, failed and missing answers), as calibration
    reads it."""
    return _gold_probability(probabilities, gold)[0]


def _gold_probability(probabilities: pl.Series, gold: pl.Series) -> tuple[np.ndarray, np.ndarray]:
    """Per answer: the probability given to its ``gold`` option (NaN if none) and the sum of the
    squared probabilities. Options are matched to their answer's gold by a 64-bit hash of the text,
    and every match is then confirmed by comparing the strings, so the result is exact (equal texts
    always hash alike; a collision of different texts is caught by the comparison). Hashing the
    several million option texts is about 10× faster than mapping them to categories. Done
    ``GOLD_CHUNK`` answers at a time (each answer's result depends on its own options only, summed
    in the same order), so that the exploded options, their hashes and positions are held for one
    chunk, not for every answer at once (for a million answers they were ~300 MB on top of the
    answers)."""
    n = len(probabilities)
    if n <= GOLD_CHUNK:
        return _gold_probability_part(probabilities, gold)
    parts = [
        _gold_probability_part(
            probabilities.slice(start, GOLD_CHUNK), gold.slice(start, GOLD_CHUNK)
        )
        for start in range(0, n, GOLD_CHUNK)
    ]
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def _gold_probability_part(
    probabilities: pl.Series, gold: pl.Series
) -> tuple[np.ndarray, np.ndarray]:
    """``_gold_probability`` over one chunk of answers."""
    n = len(probabilities)
    owner = np.repeat(np.arange(n), probabilities.list.len().fill_null(0).to_numpy())
    flat = explode(probabilities).struct.unnest()  # every (answer, option)
    options = flat["option"]
    maybe = np.flatnonzero(options.hash(seed=0).to_numpy() == gold.hash(seed=0).to_numpy()[owner])
    same = (options.gather(maybe) == gold.gather(owner[maybe])).fill_null(False).to_numpy()
    is_gold = maybe[same]
    p = flat["p"].to_numpy()
    p_gold = np.full(n, np.nan)
    p_gold[owner[is_gold]] = p[is_gold]
    return p_gold, np.bincount(owner, weights=p * p, minlength=n)


def brier_from(brier_sum, pn):
    """Mean Brier score from its sum over ``pn`` counted answers (NaN when none)."""
    return brier_sum / pn


def log_loss_from(log_loss_sum, pn):
    """Mean log loss from its sum (NaN when no answer is counted)."""
    return log_loss_sum / pn


def ece_from(gaps: np.ndarray, pn, axis: int):
    """ECE from per-bin sums of (correct − confidence), the bins on ``axis``, over ``pn``
    answers."""
    return np.abs(gaps).sum(axis=axis) / pn


def auroc(ans: pl.DataFrame, confidence: float = 0.95) -> pl.DataFrame:
    """AUROC of P(yes) per (label, eval, question_id) over the yes/no answers counted for
    calibration, averaged over epochs, with DeLong's interval: columns label, eval, question_id,
    ``auroc``, ``auroc_low``, ``auroc_high``, ``positives``, ``negatives`` (of the first epoch).
    Null with one class only. With several epochs the variance is the mean of the epochs' variances
    (an upper bound of the variance of their mean)."""
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    keys = ["label", "eval", "question_id", "sample"]
    taken = np.flatnonzero(
        _is(ans["kind"], "yes_no")
        & _is(ans["status"], "ok")
        & ans["p_yes"].is_not_null().to_numpy()
    )
    task = (
        ans["task_id"].to_physical()
        if isinstance(ans["task_id"].dtype, pl.Enum)
        else ans["task_id"].rank("dense")
    )
    taken = taken[
        canonical_order(task.gather(taken).fill_null(0).to_numpy().astype(np.int64))
    ]  # see build_cubes
    yes_no = ans.select(*keys, (pl.col("gold") == "yes").alias("pos"), "p_yes")[taken]
    ranked = yes_no.with_columns(**_ranks(yes_no, keys))
    # placement values: a positive's share of negatives below it; a negative's share of positives
    # above it
    placed = ranked.with_columns(
        pl.when(pl.col("pos"))
        .then((pl.col("r_all") - pl.col("r_class")) / pl.col("n_neg"))
        .otherwise(1 - (pl.col("r_all") - pl.col("r_class")) / pl.col("n_pos"))
        .alias("v")
    )
    per_epoch = placed.group_by(keys).agg(
        pl.col("v").filter(pl.col("pos")).mean().alias("auroc"),
        (
            pl.col("v").filter(pl.col("pos")).var() / pl.col("n_pos").first()
            + pl.col("v").filter(~pl.col("pos")).var() / pl.col("n_neg").first()
        ).alias("var"),
        pl.col("n_pos").first().alias("positives"),
        pl.col("n_neg").first().alias("negatives"),
    )
    defined = (pl.col("positives") > 0) & (pl.col("negatives") > 0)
    per_epoch = per_epoch.with_columns(
        pl.when(defined).then(pl.col("auroc")).alias("auroc"),
        pl.when(defined).then(pl.col("var").fill_null(0.0)).alias("var"),
    )
    out = per_epoch.group_by(keys[:-1]).agg(
        pl.col("auroc").mean(),
        pl.col("var").mean(),
        pl.col("positives").sort_by("sample").first(),
        pl.col("negatives").sort_by("sample").first(),
    )
    half = z * pl.col("var").sqrt()
    out = (
        out.select(
            *keys[:-1],
            "auroc",
            (pl.col("auroc") - half).clip(0, 1).alias("auroc_low"),
            (pl.col("auroc") + half).clip(0, 1).alias("auroc_high"),
            "positives",
            "negatives",
        )
        .with_columns(pl.col(pl.Enum).cast(pl.String))
        .sort(keys[:-1])
    )
    # the hull with Newcombe's score-type interval: never of zero width where DeLong's variance is 0
    point = out["auroc"].to_numpy().astype(np.float64)
    s_low, s_high = auroc_score_interval(
        point,
        out["positives"].to_numpy().astype(np.float64),
        out["negatives"].to_numpy().astype(np.float64),
        confidence,
    )
    low, high = contain(
        point,
        np.fmin(out["auroc_low"].to_numpy().astype(np.float64), s_low),
        np.fmax(out["auroc_high"].to_numpy().astype(np.float64), s_high),
    )
    return out.with_columns(
        pl.Series("auroc_low", low).fill_nan(None), pl.Series("auroc_high", high).fill_nan(None)
    )


def _is(column: pl.Series, value: str) -> np.ndarray:
    """``column == value`` as a NumPy bool array (null: False); an Enum is compared by its codes."""
    if isinstance(column.dtype, pl.Enum):
        categories = column.dtype.categories.to_list()
        if value not in categories:
            return np.zeros(len(column), bool)
        return (column.to_physical() == categories.index(value)).fill_null(False).to_numpy()
    return (column.cast(pl.String) == value).fill_null(False).to_numpy()


def _ranks(frame: pl.DataFrame, keys: list[str]) -> dict[str, pl.Series]:
    """Per row of ``frame`` (columns ``keys``, ``pos``, ``p_yes``): ``r_all``, the average rank
    (1-based, ties averaged) of ``p_yes`` among the rows with the same ``keys``; ``r_class``, the
    same among those rows of its class ``pos``; ``n_pos`` and ``n_neg``, the positives and negatives
    there. The values of ``rank("average").over(...)`` and ``sum().over(...)``, from one sort (NaN
    values tie and rank last)."""
    group = np.zeros(frame.height, np.int64)
    for k in keys:
        codes = (
            frame[k].to_physical()
            if isinstance(frame[k].dtype, pl.Enum)
            else frame[k].rank("dense")
        )
        codes = codes.fill_null(-1).to_numpy().astype(np.int64) + 1
        group = group * (int(codes.max(initial=0)) + 1) + codes
    present = np.bincount(group) > 0 if len(group) and group.max() < 1 << 24 else None
    group = (
        (np.cumsum(present) - 1)[group]
        if present is not None
        else np.unique(group, return_inverse=True)[1].ravel()
    )
    pos = frame["pos"].fill_null(False).to_numpy()
    p = frame["p_yes"].to_numpy()
    order = np.argsort(p)  # NaN last; the order within ties does not matter
    by_group = group[order]
    order = order[
        np.argsort(
            by_group.astype(np.uint16) if len(group) and group.max() < 1 << 16 else by_group,
            kind="stable",
        )
    ]
    g, v, c = group[order], p[order], pos[order]
    new_group = np.r_[True, g[1:] != g[:-1]]
    same = (v[1:] == v[:-1]) | (np.isnan(v[1:]) & np.isnan(v[:-1]))
    new_block = new_group | np.r_[True, ~same]
    starts = np.flatnonzero(new_block)  # tie blocks [start, end) within a group, in sorted order
    ends = np.r_[starts[1:], len(v)]
    block = np.cumsum(new_block) - 1
    group_start = np.flatnonzero(new_group)[np.cumsum(new_group) - 1]
    r_all = np.empty(len(v))
    r_all[order] = (starts[block] + ends[block] + 1) / 2 - group_start
    # within the class: the class members before the block in the group, plus the mean rank inside
    # it
    positives_before = np.r_[0, np.cumsum(c)]  # positives before each sorted position (and the end)

    def members_before(
        at: np.ndarray,
    ) -> np.ndarray:  # members of each row's class before position ``at``
        return np.where(c, positives_before[at], at - positives_before[at])

    a, b = starts[block], ends[block]
    r_class = np.empty(len(v))
    r_class[order] = (members_before(a) - members_before(group_start)) + (
        members_before(b) - members_before(a) + 1
    ) / 2
    n_pos = np.bincount(group, weights=pos)[group]
    n_neg = np.bincount(group, weights=~pos)[group]
    return {
        "r_all": pl.Series(r_all),
        "r_class": pl.Series(r_class),
        "n_pos": pl.Series(n_pos, dtype=pl.UInt32),
        "n_neg": pl.Series(n_neg, dtype=pl.UInt32),
    }
