"""Sums over answers: every metric, its spread over epochs and its bootstrap interval from the same
sums.

``build_cubes(answers)`` splits the answers frame by evaluation into ``Cube``s. Each answer carries
the statistics ``ALL_STATS``: ``metrics.STATS`` (n, correct, hallucinated, tp, fp, fn, open_yes),
its status counts (invalid, failed, missing) and its calibration terms
(``calibration.answer_calibration``: pn, brier, log_loss, and its confidence bin's ECE gap), and its
place: task ``t`` (sorted id order), model label ``l``, epoch ``s`` and metric unit ``u``
(WildGuardTest: the question, each with its own F1; other evaluations: one unit, "all").

* Point estimates: the statistics summed per (label, epoch, unit) — ``Cube.sums`` — then the metric
  formulas (``metrics.*_from``, ``calibration.*_from``), then the mean and spread over epochs.
* Intervals: the index metrics' from the same counts (``score_intervals``: score intervals and
  their MOVER combination, ``scoring.intervals``); the calibration metrics' from the same sums
  per task, weighted by bootstrap resample counts (``bootstrap.Bootstrap``): one matrix product
  ``W @ X`` for every model at once (``Cube.resampled``), then the same formulas (the paired
  comparisons use every metric's resampled values).
* Failed and missing answers are not answers: every metric is over the replies (``n`` counts them),
  the intervals too (their *n* is the answers replied), and a provisional figure gets its bounds
  from the same sums (``eval_bounds``, ``scoring.bounds``).
* Breakdowns (HLE category, Omniscience domain, When2Call reply type, WildGuardTest subcategory and
  adversarial flag) are sets of tasks: the same sums over a group's tasks only.

Why one module over 600 lines: every metric's sums, its epoch spread and its bootstrap interval are
computed from the same ``Cube``; kept together so a metric's point value and interval cannot
diverge.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import polars as pl

from . import bounds as bnd
from . import calibration as cal
from .bootstrap import Bootstrap
from .columns import canonical_order
from .intervals import (
    SCORE_METRICS,
    bounded_mean_interval,
    contain,
    f1_interval,
    mover,
    score_interval,
)
from .metrics import STATS, accuracy_from, answer_stats, f1_from, non_hallucination_from

OMNISCIENCE, WILDGUARD = "aa_omniscience_decision", "wildguardtest"
WILDGUARD_F1 = {
    "prompt_harmful": "f1_prompt_harm",
    "response_refusal": "f1_response_refusal",
    "response_harmful": "f1_response_harm",
}
METRICS: dict[str, tuple[str, ...]] = {
    "aa_omniscience_decision": ("accuracy", "non_hallucination_rate"),
    "hle_multichoice": ("accuracy",),
    "when2call": ("accuracy",),
    "wildguardtest": (*WILDGUARD_F1.values(), "mean_f1"),
}
ALL_METRICS = ("accuracy", "non_hallucination_rate", *WILDGUARD_F1.values(), "mean_f1")
COUNTS = (
    "invalid",
    "failed",
    "missing",
    "repaired",
    "rerun",
)  # answers by status; repaired = ok from a fenced
# reply; rerun = failed or missing answers whose request the next ``dxi run`` sends again
# (``scoring.pipeline``)
CALIBRATION = ("pn", "brier", "log_loss")
ECE_GAPS = tuple(f"gap{b}" for b in range(cal.ECE_BINS))
ALL_STATS = (*STATS, *COUNTS, *CALIBRATION, *ECE_GAPS)
# the 0/1 statistics of an answer, bit k = FLAGS[k] (``n``, 1 for a reply, is 1 − failed − missing)
FLAGS = (*STATS[1:], *COUNTS, "pn")
assert ALL_STATS[1 : 1 + len(FLAGS)] == FLAGS
RESAMPLED = {  # the statistics a resample needs, per kind of evaluation
    "choice": ("n", "correct", "hallucinated", *CALIBRATION, *ECE_GAPS),
    "yes_no": ("tp", "fp", "fn", *CALIBRATION, *ECE_GAPS),
}
# breakdown dimension -> answers column holding each task's group, per evaluation
BREAKDOWNS: dict[str, dict[str, str]] = {
    "aa_omniscience_decision": {"domain": "group"},
    "hle_multichoice": {"category": "group"},
    "when2call": {"reply_type": "gold_category"},
    "wildguardtest": {"subcategory": "group", "adversarial": "adversarial"},
}
TABLE_METRICS = (*ALL_METRICS, *cal.CALIBRATION_METRICS)
SUFFIXES = ("", "_sd", "_low", "_high")
BOUND_SUFFIXES = ("_lowest", "_highest")  # a provisional figure's bounds (``scoring.bounds``)
EVERY_FAILED = (
    "every request failed"  # the reason an evaluation's metrics are null when no reply came
)
NONE_CACHED = "no answer in the cache"  # ... when none of its requests is in the cache
NO_REPLY = (
    "no reply: every answer failed or is missing"  # ... when some failed and the rest are missing
)


class Sums:
    """Named statistics of an array of sums laid out (..., stats, labels, epochs, units):
    ``sums["correct"]`` -> (..., labels, epochs, units)."""

    def __init__(self, array: np.ndarray, names: Sequence[str]):
        self.array, self.index = array, {n: k for k, n in enumerate(names)}

    def __getitem__(self, name: str) -> np.ndarray:
        return self.array[..., self.index[name], :, :, :]

    def gaps(self) -> np.ndarray:
        """The per-bin ECE gaps: (..., bins, labels, epochs, units) (a view: the gaps are the last
        stats)."""
        first = self.index[ECE_GAPS[0]]
        return self.array[..., first : first + len(ECE_GAPS), :, :, :]


@dataclass
class Cube:
    """One evaluation's answers as integer places and statistics.

    ``t``, ``l``, ``s``, ``u``: each answer's task, label, epoch and unit; ``flags``: its 0/1
    statistics as bits (uint16, bit k = ``FLAGS[k]``); ``brier`` and ``log_loss`` (0 where not
    counted for calibration), ``bin``/``gap`` its ECE bin (−1: not counted) and gap; ``groups``:
    breakdown dimension -> (group names, each task's group code, −1 for none). ``stat(name)`` gives
    one statistic per answer."""

    eval: str
    labels: list[str]
    units: list[str]
    n_tasks: int
    n_epochs: int
    t: np.ndarray
    l: np.ndarray  # noqa: E741 (the label axis)
    s: np.ndarray
    u: np.ndarray
    flags: np.ndarray
    brier: np.ndarray
    log_loss: np.ndarray
    bin: np.ndarray
    gap: np.ndarray
    groups: dict[str, tuple[list[str], np.ndarray]] = field(default_factory=dict)
    _per_task: np.ndarray | None = None
    _sums: Sums | None = None
    _resampled: tuple[np.ndarray, Sums] | None = None

    @property
    def kind(self) -> str:
        return "yes_no" if self.eval == WILDGUARD else "choice"

    @cached_property
    def absent(self) -> np.ndarray:
        """(labels, epochs): True where a label has no answer in that epoch (it was run with
        fewer)."""
        present = np.zeros(self.shape[:2], bool)
        present[self.l, self.s] = True
        return ~present

    @property
    def shape(self) -> tuple[int, int, int]:
        return len(self.labels), self.n_epochs, len(self.units)

    @cached_property
    def _replied(self) -> np.ndarray:
        """(labels, tasks) bool: the label has a reply (not failed or missing) to the task in some
        epoch."""
        out = np.zeros((len(self.labels), self.n_tasks), bool)
        r = self.stat("n") > 0
        out[self.l[r], self.t[r]] = True
        return out

    def asked_tasks(self, tasks: np.ndarray | None = None) -> np.ndarray:
        """(labels,) the tasks (of ``tasks``, else all) each label has an answer row for, whatever
        its status: every task for a run over the whole set (its missing answers are rows), the
        part it was asked for a model an adaptive run stopped (``scoring.adaptive.asked_part``)."""
        out = np.zeros((len(self.labels), self.n_tasks), bool)
        out[self.l, self.t] = True
        return (out if tasks is None else out[:, tasks]).sum(1)

    def missing_tasks(self, tasks: np.ndarray | None = None) -> np.ndarray:
        """(labels,) the tasks (of ``tasks``, else all) with an answer of the label missing from the
        cache in some epoch: the unit the other counts of a task are in (a WildGuardTest task's one
        request holds up to three answers, all missing together)."""
        out = np.zeros((len(self.labels), self.n_tasks), bool)
        r = self.stat("missing") > 0
        out[self.l[r], self.t[r]] = True
        return (out if tasks is None else out[:, tasks]).sum(1)

    def replied_tasks(self, tasks: np.ndarray | None = None) -> np.ndarray:
        """(labels,) the tasks (of ``tasks``, else all) each label has a reply to: the *n* of an
        interval over the answered questions (a provisional figure's, SPEC §6)."""
        replied = self._replied if tasks is None else self._replied[:, tasks]
        return replied.sum(1)

    def stat(self, name: str) -> np.ndarray:
        """One statistic of ``ALL_STATS`` but the ECE gaps, per answer (float64)."""
        if name == "n":  # a reply: neither failed nor missing
            return 1.0 - self.stat("failed") - self.stat("missing")
        if name in ("brier", "log_loss"):
            return getattr(self, name)
        return ((self.flags >> FLAGS.index(name)) & 1).astype(np.float64)

    def sums(self, groups: np.ndarray | None = None, n_groups: int = 1) -> Sums:
        """Every statistic summed per (label, epoch, unit): shape (``ALL_STATS``, labels, epochs,
        units). With ``groups`` (each answer's group code, −1 for none), per group: shape (n_groups,
        ``ALL_STATS``, labels, epochs, units). The sums over all answers are computed once."""
        if groups is None and self._sums is not None:
            return self._sums
        n_l, n_e, n_u = self.shape
        cells = n_l * n_e * n_u
        key = (self.l * n_e + self.s) * n_u + self.u
        flags, brier, log_loss, bins, gap = (
            self.flags,
            self.brier,
            self.log_loss,
            self.bin,
            self.gap,
        )
        if groups is not None:
            kept = groups >= 0
            key = groups[kept] * cells + key[kept]
            flags, brier, log_loss, bins, gap = (
                flags[kept],
                brier[kept],
                log_loss[kept],
                bins[kept],
                gap[kept],
            )
        size = cells * n_groups
        out = np.empty((n_groups, len(ALL_STATS), cells))
        out[:, 0] = np.bincount(key, minlength=size).reshape(n_groups, cells)
        out[:, 1 : 1 + len(FLAGS)] = (
            _flag_sums(key, flags, size).reshape(len(FLAGS), n_groups, cells).swapaxes(0, 1)
        )
        # ``n``: the replies
        out[:, 0] -= out[:, ALL_STATS.index("failed")] + out[:, ALL_STATS.index("missing")]
        first = 1 + len(FLAGS)
        for k, values in enumerate((brier, log_loss)):
            out[:, first + k] = np.bincount(key, weights=values, minlength=size).reshape(
                n_groups, cells
            )
        counted = bins >= 0
        g, c = np.divmod(key[counted], cells)
        gaps = np.bincount(
            (g * cal.ECE_BINS + bins[counted]) * cells + c,
            weights=gap[counted],
            minlength=size * cal.ECE_BINS,
        )
        out[:, first + 2 :] = gaps.reshape(n_groups, cal.ECE_BINS, cells)
        shape = (len(ALL_STATS), n_l, n_e, n_u)
        if groups is not None:
            return Sums(out.reshape(n_groups, *shape), ALL_STATS)
        self._sums = Sums(out.reshape(shape), ALL_STATS)
        return self._sums

    def per_task(self) -> np.ndarray:
        """The resampled statistics per task, (tasks, stats·labels·epochs·units) float32 (built
        once)."""
        if self._per_task is None:
            names = RESAMPLED[self.kind]
            x = np.zeros((self.n_tasks, len(names), *self.shape), np.float32)
            base = [n for n in names if n not in ECE_GAPS]
            x[self.t, : len(base), self.l, self.s, self.u] = np.column_stack(
                [self.stat(n) for n in base]
            )
            c = self.bin >= 0
            x[self.t[c], len(base) + self.bin[c], self.l[c], self.s[c], self.u[c]] = self.gap[c]
            self._per_task = x.reshape(self.n_tasks, -1)
        return self._per_task

    def resampled(self, counts: np.ndarray, tasks: np.ndarray | None = None) -> Sums:
        """Sums per resample: the resample ``counts`` (resamples, tasks; ``Bootstrap.counts``, any
        numeric type) as float32 @ per-task statistics, optionally over ``tasks`` only; shape
        (resamples, ``RESAMPLED[kind]``, labels, epochs, units), float32 (counts exact; sums of
        probabilities to about 1e-6 relative). The float32 matrix exists only during the product
        (one evaluation's at a time); the sums over all tasks are kept for the same ``counts``
        object."""
        if tasks is None and self._resampled is not None and self._resampled[0] is counts:
            return self._resampled[1]
        x = self.per_task()
        if tasks is None:
            weights = counts.astype(np.float32, copy=False)
        else:
            x, weights = x[tasks], counts[:, tasks].astype(np.float32, copy=False)
        names = RESAMPLED[self.kind]
        sums = Sums((weights @ x).reshape(weights.shape[0], len(names), *self.shape), names)
        del weights
        if tasks is None:
            self._resampled = (counts, sums)
        return sums


def _codes(s: pl.Series) -> tuple[np.ndarray, list[str]]:
    """Integer codes of a column (its Enum codes, or the sorted distinct values') and the names."""
    if isinstance(s.dtype, pl.Enum):
        return s.to_physical().fill_null(-1).to_numpy().astype(
            np.int64
        ), s.dtype.categories.to_list()
    s = s.cast(pl.String)
    names = s.unique().drop_nulls().sort().to_list()
    return s.cast(pl.Enum(names)).to_physical().fill_null(-1).to_numpy().astype(np.int64), names


def _group_codes(column: pl.Series, rows: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """``_codes`` of ``column[rows]``, a Boolean column's values named "false" / "true"."""
    if isinstance(column.dtype, pl.Enum):
        return column.to_physical().gather(rows).fill_null(-1).to_numpy().astype(
            np.int64
        ), column.dtype.categories.to_list()
    values = column.gather(rows)
    if values.dtype == pl.Boolean:
        code = values.cast(pl.Int8).fill_null(-1).to_numpy()
        present = [v for v in (0, 1) if (code == v).any()]
        codes = np.full(len(code), -1, np.int64)
        for new, v in enumerate(present):
            codes[code == v] = new
        return codes, [("false", "true")[v] for v in present]
    return _codes(values)


def _flag_sums(key: np.ndarray, flags: np.ndarray, size: int) -> np.ndarray:
    """Per statistic of ``FLAGS``, how many answers in each cell ``key`` (0..size−1) have it: shape
    (``FLAGS``, size). One count per distinct combination of flags, then a sum over the
    combinations."""
    present = np.bincount(flags, minlength=1 << len(FLAGS)) > 0
    combos = np.flatnonzero(present)
    dense = np.cumsum(present) - 1
    counts = np.bincount(key * len(combos) + dense[flags], minlength=size * len(combos)).reshape(
        size, len(combos)
    )
    bits = (combos[:, None] >> np.arange(len(FLAGS))) & 1  # (combinations, FLAGS)
    return (counts @ bits).T


def _dense(codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Renumber codes 0..n−1 keeping their order; returns (new codes, the original code of each)."""
    if len(codes) == 0:
        return codes, codes
    low = codes.min()
    present = np.bincount(codes - low) > 0
    return (np.cumsum(present) - 1)[codes - low], np.flatnonzero(present) + low


def build_cubes(ans: pl.DataFrame) -> dict[str, Cube]:
    """One Cube per evaluation in ``ans``: an answers frame (label, eval, task_id, question_id,
    sample, status, predicted, gold; correct, kind, p_predicted, probabilities and the breakdown
    columns when present). A (label, task, question, epoch) must appear at most once."""
    if "correct" not in ans.columns:
        ans = ans.with_columns(pl.col("predicted").eq_missing(pl.col("gold")).alias("correct"))
    status = pl.col("status").cast(pl.String)
    repaired = pl.col("repaired").fill_null(False) if "repaired" in ans.columns else pl.lit(False)
    rerun = (
        pl.col("rerun").fill_null(False)
        if "rerun" in ans.columns
        else status.is_in(["failed", "missing"])
    )  # a frame made by hand: every failure counted transient
    indicators = ans.select(
        *answer_stats()[1:],
        *[(status == c).alias(c) for c in COUNTS[:3]],
        repaired.alias("repaired"),
        rerun.alias("rerun"),
    )  # FLAGS but pn, side by side
    calib = cal.answer_terms(ans)
    flags = calib["pn"].astype(np.uint16) << FLAGS.index("pn")
    for k, name in enumerate(FLAGS[:-1]):
        flags |= indicators[name].fill_null(False).cast(pl.UInt16).to_numpy() << k
    brier, log_loss, bins, gaps = calib["brier"], calib["log_loss"], calib["bin"], calib["gap"]
    label, labels = _codes(ans["label"])
    evals, eval_names = _codes(ans["eval"])
    task, _ = _codes(ans["task_id"])
    question, questions = _codes(ans["question_id"])
    sample = ans["sample"].to_numpy().astype(np.int64)
    n_epochs = int(sample.max()) + 1 if len(sample) else 1
    # each evaluation's answers in (task, question) order, whatever order the cache gave them in:
    # the sums of probabilities then add up in one order, so equal caches give bit-equal results
    by_task = canonical_order(task * (len(questions) + 1) + question + 1)
    order = by_task[np.argsort(evals[by_task], kind="stable")]
    bounds = np.searchsorted(evals[order], np.arange(len(eval_names) + 1))
    cubes = {}
    for e, name in enumerate(eval_names):
        rows = order[bounds[e] : bounds[e + 1]]
        if len(rows) == 0:
            continue
        tasks = task[rows]  # ascending (see above): numbered 0, 1, ... in order
        t = np.cumsum(np.r_[False, tasks[1:] != tasks[:-1]])
        if name == WILDGUARD:
            u, kept = _dense(question[rows])
            units = [questions[q] for q in kept]
        else:
            u, units = np.zeros(len(rows), np.int64), ["all"]
        cube = Cube(
            name,
            labels,
            units,
            int(t.max()) + 1,
            n_epochs,
            t,
            label[rows],
            sample[rows],
            u,
            flags[rows],
            brier[rows],
            log_loss[rows],
            bins[rows],
            gaps[rows],
        )
        for dimension, column in BREAKDOWNS.get(name, {}).items():
            if column in ans.columns:
                codes, names = _group_codes(ans[column], rows)
                per_task = np.full(cube.n_tasks, -1, np.int64)
                per_task[t] = codes
                if names:
                    cube.groups[dimension] = (names, per_task)
        cubes[name] = cube
    return cubes


def all_answers(sums: Sums) -> np.ndarray:
    """Every answer expected, whatever its status: the replies (``n``) plus the failed and missing
    ones."""
    return sums["n"] + sums["failed"] + sums["missing"]


def _pooled(a: np.ndarray) -> np.ndarray:
    """Sum over the last (units) axis, as float64."""
    return _f64(a[..., 0] if a.shape[-1] == 1 else a.sum(-1))


def _f64(a: np.ndarray) -> np.ndarray:
    """``a`` as float64. The resampled sums are float32 (``Cube.resampled``); their counts are exact
    integers there, so the metric formulas over them in float64 give the same values as over the
    point sums (100 × 162 / 500 is 32.4, where float32 arithmetic gave 32.400002)."""
    return a.astype(np.float64, copy=False)


def values(cube: Cube, sums: Sums) -> dict[str, np.ndarray]:
    """Every metric of ``cube``'s evaluation from ``sums`` of shape (..., labels, epochs, units,
    stats): the index metrics (0-100) and the pooled calibration metrics, each (..., labels,
    epochs); NaN where undefined, and in the epochs a label does not have (models run with fewer
    epochs than others)."""
    with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        out: dict[str, np.ndarray] = {}
        if cube.kind == "choice":
            n, right = _pooled(sums["n"]), _pooled(sums["correct"])
            out["accuracy"] = accuracy_from(right, n)
            if cube.eval == OMNISCIENCE:  # NaN, as accuracy, where no answer is a reply
                out["non_hallucination_rate"] = non_hallucination_from(
                    *hallucination_counts(lambda stat: _pooled(sums[stat])), n
                )
        else:
            f1 = f1_from(_f64(sums["tp"]), _f64(sums["fp"]), _f64(sums["fn"]))  # (..., units)
            for q, metric in WILDGUARD_F1.items():
                out[metric] = (
                    f1[..., cube.units.index(q)]
                    if q in cube.units
                    else np.full(f1.shape[:-1], np.nan)
                )
            out["mean_f1"] = np.nanmean(np.stack([out[m] for m in WILDGUARD_F1.values()], -1), -1)
        pn = _pooled(sums["pn"])
        out["brier"] = cal.brier_from(_pooled(sums["brier"]), pn)
        out["log_loss"] = cal.log_loss_from(_pooled(sums["log_loss"]), pn)
        out["ece"] = cal.ece_from(_pooled(sums.gaps()), pn, axis=-3)  # (..., bins, labels, epochs)
        if cube.absent.any():  # an epoch with no answers has no metric at all
            out = {m: np.where(cube.absent, np.nan, v) for m, v in out.items()}
        return out


def hallucination_counts(pooled: Callable[[str], np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The non-hallucination rate's counts, (hallucinated, not correct), from ``pooled(stat)``: a
    statistic's sum over the units (``values`` per epoch; ``score_intervals`` its mean over epochs).
    The one place they are defined, for the figure and its interval alike."""
    n, right = pooled("n"), pooled("correct")
    return pooled("hallucinated"), n - right


def eval_bounds(cube: Cube, sums: Sums) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The bounds of ``cube``'s index metrics from ``sums`` (``scoring.bounds``): ``(lowest,
    highest)``, each metric -> (labels,), the mean over epochs of each epoch's bounds; NaN for a
    label without failed or missing answers (a complete figure has no bounds) and where no
    completion is defined."""
    open_ = sums["failed"] + sums["missing"]  # (labels, epochs, units)
    with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        per_epoch: dict[str, bnd.Bounds] = {}
        if cube.kind == "choice":
            n, right, k = _pooled(sums["n"]), _pooled(sums["correct"]), _pooled(open_)
            per_epoch["accuracy"] = bnd.accuracy_bounds(right, n, k)
            if cube.eval == OMNISCIENCE:
                per_epoch["non_hallucination_rate"] = bnd.non_hallucination_bounds(
                    _pooled(sums["hallucinated"]), n - right, k
                )
        else:
            yes = _f64(sums["open_yes"])
            low, high, undefined = bnd.f1_bounds(
                _f64(sums["tp"]), _f64(sums["fp"]), _f64(sums["fn"]), yes, _f64(open_) - yes
            )
            stacked = []
            for q, metric in WILDGUARD_F1.items():
                if q in cube.units:
                    u = cube.units.index(q)
                    stacked.append((low[..., u], high[..., u], undefined[..., u]))
                else:  # a question never asked: its F1 is undefined whatever happens
                    never = np.full(low.shape[:-1], np.nan)
                    stacked.append((never, never, np.ones(low.shape[:-1], bool)))
                per_epoch[metric] = stacked[-1][:2]
            per_epoch["mean_f1"] = bnd.mean_f1_bounds(
                *(np.stack(v, -1) for v in zip(*stacked, strict=True))
            )
        provisional = open_.sum(axis=(1, 2)) > 0  # (labels,)
        lowest, highest = {}, {}
        for metric, (low, high) in per_epoch.items():
            if cube.absent.any():
                low, high = np.where(cube.absent, np.nan, low), np.where(cube.absent, np.nan, high)
            lowest[metric] = np.where(provisional, epoch_mean(low), np.nan)
            highest[metric] = np.where(provisional, epoch_mean(high), np.nan)
        return lowest, highest


def unit_calibration(sums: Sums) -> dict[str, np.ndarray]:
    """Calibration metrics per unit (WildGuardTest: per question), each (..., labels, epochs,
    units)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        pn = sums["pn"]
        return {
            "brier": cal.brier_from(sums["brier"], pn),
            "log_loss": cal.log_loss_from(sums["log_loss"], pn),
            "ece": cal.ece_from(sums.gaps(), pn, axis=-4),
        }


def replied_epochs(sums: Sums) -> np.ndarray:
    """(labels,) the epochs in which each label has a reply in ``sums`` (at least 1): what an
    interval's counts are averaged over. An epoch whose every answer failed or is missing has no
    figure (``values``), so it has no share of the interval's *n* either (counted, it halved n)."""
    return np.maximum((_pooled(sums["n"]) > 0).sum(-1), 1)


def epoch_mean(v: np.ndarray) -> np.ndarray:
    """Mean over the last (epochs) axis, ignoring epochs where the metric is undefined."""
    if v.shape[-1] == 1:
        return v[..., 0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(v, axis=-1)


def epoch_sd(v: np.ndarray) -> np.ndarray:
    """Sample standard deviation over the last (epochs) axis; NaN with one epoch."""
    if v.shape[-1] < 2:
        return np.full(v.shape[:-1], np.nan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanstd(v, axis=-1, ddof=1)


@dataclass
class EvalMetrics:
    """One evaluation's (or breakdown group's) metrics for every label: ``point``/``sd``/``low``/
    ``high`` map metric -> (labels,); ``per_epoch`` -> (labels, epochs); ``replicates`` ->
    (resamples, labels); ``counts`` (labels, ``COUNTS``); ``n`` tasks; ``answered`` labels with
    answers; ``answers`` (labels,) the answers expected of each (questions × epochs, whatever their
    status); ``no_reply`` labels none of whose answers is a reply (every one failed or missing: null
    metrics); ``replied`` (labels,) the tasks each label has a reply to; ``lowest``/``highest`` map
    metric -> (labels,), a provisional figure's bounds (``scoring.bounds``; NaN for a complete
    one); ``asked`` (labels,) the tasks each label has answer rows for (``Cube.asked_tasks``: its
    table's ``n``; below ``n`` for a model an adaptive run cut to the part it was asked);
    ``missing_tasks`` (labels,) the tasks with a missing answer (``Cube.missing_tasks``)."""

    point: dict[str, np.ndarray]
    sd: dict[str, np.ndarray]
    per_epoch: dict[str, np.ndarray]
    counts: np.ndarray
    n: int
    answered: np.ndarray
    low: dict[str, np.ndarray] = field(default_factory=dict)
    high: dict[str, np.ndarray] = field(default_factory=dict)
    replicates: dict[str, np.ndarray] = field(default_factory=dict)
    answers: np.ndarray | None = None
    no_reply: np.ndarray | None = None
    replied: np.ndarray | None = None
    asked: np.ndarray | None = None
    missing_tasks: np.ndarray | None = None
    lowest: dict[str, np.ndarray] = field(default_factory=dict)
    highest: dict[str, np.ndarray] = field(default_factory=dict)

    def unscored(self) -> np.ndarray:
        """Labels whose metrics are null: no answer of theirs is a reply (every one failed or is
        missing). A label with some replies is scored over them, its failed and missing answers left
        out (provisional, with bounds: ``eval_bounds``)."""
        return self.no_reply if self.no_reply is not None else np.zeros(len(self.answered), bool)

    def reason(self) -> list[str | None]:
        """Per label, why its metrics are null (``EVERY_FAILED``, ``NONE_CACHED``, ``NO_REPLY``),
        else None."""
        failed, missing = (
            self.counts[:, COUNTS.index("failed")],
            self.counts[:, COUNTS.index("missing")],
        )
        total = self.answers if self.answers is not None else failed + missing
        return [
            None if not none else EVERY_FAILED if f == n else NONE_CACHED if m == n else NO_REPLY
            for none, f, m, n in zip(self.unscored(), failed, missing, total, strict=True)
        ]


def eval_metrics(
    cube: Cube,
    boot: Bootstrap | None = None,
    weights: np.ndarray | None = None,
    tasks: np.ndarray | None = None,
    sums: Sums | None = None,
) -> EvalMetrics:
    """Every metric of ``cube`` over all its tasks (or over ``tasks``, whose ``sums`` are then
    given): point estimate (mean over epochs), spread over epochs and, with ``boot`` and resample
    ``weights`` (``Bootstrap.counts``), the interval: the score-type intervals of
    ``score_intervals`` for the index metrics (``scoring.intervals``), the percentile interval for
    the calibration metrics; every bound holds its point (``intervals.contain``). The replicates of
    every metric are kept (the paired comparisons and ranks use them)."""
    sums = cube.sums() if sums is None else sums
    per_epoch = values(cube, sums)
    counts = np.stack([sums[c].sum(axis=(1, 2)) for c in COUNTS], -1)  # (labels, COUNTS)
    total = all_answers(sums).sum(axis=(1, 2))
    answered = (total + counts.sum(-1)) > 0
    no_reply = answered & (
        counts[:, COUNTS.index("failed")] + counts[:, COUNTS.index("missing")] == total
    )
    est = EvalMetrics(
        {m: epoch_mean(v) for m, v in per_epoch.items()},
        {m: epoch_sd(v) for m, v in per_epoch.items()},
        per_epoch,
        counts,
        cube.n_tasks if tasks is None else len(tasks),
        answered,
        answers=total,
        no_reply=no_reply,
        replied=cube.replied_tasks(tasks),
        asked=cube.asked_tasks(tasks),
        missing_tasks=cube.missing_tasks(tasks),
    )
    est.lowest, est.highest = eval_bounds(cube, sums)
    if boot is not None and weights is not None:
        for m, v in values(cube, cube.resampled(weights, tasks)).items():
            reps = epoch_mean(v)  # (resamples, labels)
            est.replicates[m] = reps
            if m not in SCORE_METRICS:
                est.low[m], est.high[m] = contain(est.point[m], *boot.interval(reps))
        score_intervals(cube, est, sums, boot.confidence)
    return est


def score_intervals(cube: Cube, est: EvalMetrics, sums: Sums, confidence: float) -> None:
    """Set ``est.low``/``est.high`` (0-100, (labels,)) of the metrics of ``intervals.SCORE_METRICS``
    from the counts in ``sums`` (``Cube.sums``: of all ``cube``'s tasks or a group's), each count
    the mean over the epochs in which a label has a reply (``replied_epochs``; ``scoring.intervals``
    gives the methods and sources):
    accuracy and the non-hallucination rate the continuity-corrected Wilson interval of correct / n
    and of (not correct − hallucinated) / not correct, each F1 the same interval of TP / (TP + FP +
    FN) mapped to 2θ / (1 + θ), mean F1 the MOVER combination of the defined F1 scores taken as
    fully correlated (r = 1: the mean of their bounds; a row's three questions share the row, and a
    correlation estimated from a few errors near 100 made the interval too short: coverage 0.92 at a
    true 99.5 over 60 rows, ``benchmarks/bench_stats_intervals.py``). Every interval is bounded by
    ``intervals.contain`` to hold its point."""
    epochs = replied_epochs(sums)  # (labels,)

    def mean(stat: str) -> np.ndarray:  # (labels, units): the count per epoch
        return _f64(sums[stat]).sum(axis=1) / epochs[:, None]

    counted = mean("pn")  # (labels, units): answers counted for calibration, per epoch
    for m, (low, high) in calibration_intervals(
        {m: est.point[m] for m in ("brier", "log_loss")},
        counted.sum(-1) / counted.shape[-1],
        confidence,
    ).items():
        est.low[m], est.high[m] = low, high
    if cube.kind == "choice":
        n, right = mean("n").sum(-1), mean("correct").sum(-1)
        bounds = {"accuracy": score_interval(right, n, confidence)}
        if cube.eval == OMNISCIENCE:
            hallucinated, wrong = hallucination_counts(lambda stat: mean(stat).sum(-1))
            not_hallucinated = wrong - hallucinated
            bounds["non_hallucination_rate"] = score_interval(not_hallucinated, wrong, confidence)
        for m, (low, high) in bounds.items():
            est.low[m], est.high[m] = contain(est.point[m], 100 * low, 100 * high)
        return
    tp, fp, fn = mean("tp"), mean("fp"), mean("fn")  # (labels, units)
    low, high = f1_interval(tp, fp, fn, confidence)
    names = list(WILDGUARD_F1.values())
    points = np.full((len(cube.labels), len(names)), np.nan)
    lows, highs = points.copy(), points.copy()
    for k, (q, metric) in enumerate(WILDGUARD_F1.items()):
        if q in cube.units:
            u = cube.units.index(q)
            lows[:, k], highs[:, k] = contain(est.point[metric], low[:, u], high[:, u])
            points[:, k] = est.point[metric]
        est.low[metric], est.high[metric] = lows[:, k].copy(), highs[:, k].copy()
    defined = ~np.isnan(points)
    weights = np.where(defined, 1 / np.maximum(defined.sum(-1, keepdims=True), 1), 0.0)
    centre = np.where(defined, weights * np.nan_to_num(points), 0.0).sum(-1)
    r = np.ones((len(cube.labels), len(names), len(names)))  # the F1 scores fully correlated
    low, high = mover(
        centre, np.nan_to_num(points), np.nan_to_num(lows), np.nan_to_num(highs), weights, r
    )
    est.low["mean_f1"], est.high["mean_f1"] = contain(est.point["mean_f1"], low, high)


def calibration_intervals(
    point: dict[str, np.ndarray], tasks: np.ndarray, confidence: float
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The intervals (low, high) of the calibration metrics, each (labels,) like its ``point``
    (``point`` maps "brier" and "log_loss" -> (labels,)), over ``tasks`` (labels,): the tasks with
    counted answers (fractional: answers per epoch over the units a task has), every bound holding
    its point: Brier score and log loss ``intervals.bounded_mean_interval`` with bounds 1 and
    −ln ``calibration.LOG_LOSS_FLOOR``; ECE NaN (no interval: ``intervals.METHODS`` says why)."""
    bounds = {"brier": 1.0, "log_loss": -np.log(cal.LOG_LOSS_FLOOR)}
    out = {
        m: contain(point[m], *bounded_mean_interval(point[m], tasks, bound, confidence))
        for m, bound in bounds.items()
    }
    out["ece"] = (np.full(len(tasks), np.nan), np.full(len(tasks), np.nan))
    return out


def _frame(cube: Cube, est: EvalMetrics) -> pl.DataFrame:
    """Rows per label with answers: n tasks, ``answers`` expected (questions × epochs),
    ``replied`` tasks (with a reply in some epoch: ``Cube.replied_tasks``), counts,
    ``missing_tasks`` (the tasks with a missing answer: ``Cube.missing_tasks``),
    epochs, metrics (NaN -> null; all null when no answer is a reply, ``reason`` then saying why),
    their sd and interval."""
    unscored = est.unscored()
    n_labels = len(cube.labels)
    columns: dict[str, object] = {
        "label": cube.labels,
        "eval": [cube.eval] * n_labels,
        "n": (
            np.full(n_labels, est.n, np.int64) if est.asked is None else est.asked.astype(np.int64)
        ),
        "answers": est.answers.astype(np.int64),
        # the tasks with a reply: the n a provisional figure and its interval are over
        "replied": (
            np.full(n_labels, est.n, np.int64)
            if est.replied is None
            else est.replied.astype(np.int64)
        ),
    }
    for c, name in enumerate(COUNTS):
        columns[name] = est.counts[:, c].astype(np.int64)
    columns["missing_tasks"] = (
        est.counts[:, COUNTS.index("missing")] if est.missing_tasks is None else est.missing_tasks
    ).astype(np.int64)
    columns["epochs"] = (~cube.absent).sum(-1).astype(np.int64)
    for m in (*METRICS.get(cube.eval, ()), *cal.CALIBRATION_METRICS):
        for suffix, source in zip(SUFFIXES, (est.point, est.sd, est.low, est.high), strict=True):
            v = source.get(m)
            columns[m + suffix] = (
                np.full(n_labels, np.nan) if v is None else np.where(unscored, np.nan, v)
            )
    for m in METRICS.get(cube.eval, ()):
        for suffix, source in zip(BOUND_SUFFIXES, (est.lowest, est.highest), strict=True):
            v = source.get(m)
            columns[m + suffix] = (
                np.full(n_labels, np.nan) if v is None else np.where(unscored, np.nan, v)
            )
    columns["reason"] = pl.Series(est.reason(), dtype=pl.String)
    return pl.DataFrame(columns).fill_nan(None).filter(pl.Series(est.answered))


def _table(frames: list[pl.DataFrame], keys: list[str]) -> pl.DataFrame:
    columns = [
        *keys,
        "n",
        "answers",
        "replied",
        *COUNTS,
        "missing_tasks",
        "epochs",
        *[m + s for m in TABLE_METRICS for s in SUFFIXES],
        *[m + s for m in ALL_METRICS for s in BOUND_SUFFIXES],
        "reason",
    ]
    if not frames:
        return pl.DataFrame(
            schema={c: (pl.String if c in keys or c == "reason" else pl.Float64) for c in columns}
        )
    table = pl.concat(frames, how="diagonal_relaxed")
    table = table.with_columns(
        pl.lit(None, pl.Float64).alias(c) for c in columns if c not in table.columns
    )
    return table.select(columns).sort(keys)


def eval_metrics_all(
    cubes: dict[str, Cube], boot: Bootstrap | None = None
) -> dict[str, EvalMetrics]:
    """``eval_metrics`` of every evaluation over all its tasks."""
    return {
        name: eval_metrics(c, boot, boot.counts(name, c.n_tasks) if boot else None)
        for name, c in cubes.items()
    }


def metric_table(cubes: dict[str, Cube], estimates: dict[str, EvalMetrics]) -> pl.DataFrame:
    """Per (label, eval): ``n`` tasks, ``invalid``/``failed``/``missing`` answer counts, ``epochs``,
    and every metric (index metrics 0-100, calibration in its own units) with ``_sd`` over epochs
    and the interval ``_low``/``_high`` (null without a bootstrap); the index metrics of a
    provisional figure (failed or missing answers) with its bounds ``_lowest``/``_highest``
    (``scoring.bounds``; null when complete). Labels with no answers in an evaluation have no row
    for it."""
    return _table([_frame(cubes[name], est) for name, est in estimates.items()], ["label", "eval"])


def breakdown_table(cubes: dict[str, Cube], boot: Bootstrap | None = None) -> pl.DataFrame:
    """The columns of ``metric_table`` per (label, eval, dimension, group): each evaluation's
    breakdown groups (``BREAKDOWNS``), with intervals from the same resamples as the whole
    evaluation."""
    frames = []
    for name, cube in cubes.items():
        weights = boot.counts(name, cube.n_tasks) if boot else None
        for dimension, (names, per_task) in cube.groups.items():
            by_group = cube.sums(per_task[cube.t], len(names))
            for code, group in enumerate(names):
                tasks = np.flatnonzero(per_task == code)
                if len(tasks):
                    est = eval_metrics(
                        cube, boot, weights, tasks, Sums(by_group.array[code], ALL_STATS)
                    )
                    frames.append(
                        _frame(cube, est).with_columns(
                            pl.lit(dimension).alias("dimension"), pl.lit(group).alias("group")
                        )
                    )
    return _table(frames, ["label", "eval", "dimension", "group"])


def calibration_table(
    cubes: dict[str, Cube], estimates: dict[str, EvalMetrics], boot: Bootstrap | None = None
) -> pl.DataFrame:
    """Per (label, eval, question): ``answers`` counted for calibration (every epoch), ``excluded``
    (answers without probabilities: invalid, failed, missing), and Brier score, ECE and log loss
    with ``_sd`` over epochs and ``_low``/``_high``. ``question`` is "all" (the evaluation pooled;
    the same values as ``metric_table``) and, for WildGuardTest, each yes/no question. Labels whose
    answers carry no probabilities at all in an evaluation have no rows for it; with answers failed
    or missing, the rows are over the answers that are replies (provisional, as the evaluation's
    other figures)."""
    frames = []
    for name, cube in cubes.items():
        sums = cube.sums()
        counted, total = sums["pn"].sum(axis=1), all_answers(sums).sum(axis=1)  # (labels, units)
        est = estimates[name]
        rows = {
            "all": (
                {m: est.point[m] for m in cal.CALIBRATION_METRICS},
                {m: est.sd[m] for m in cal.CALIBRATION_METRICS},
                {m: est.low.get(m) for m in cal.CALIBRATION_METRICS},
                {m: est.high.get(m) for m in cal.CALIBRATION_METRICS},
                counted.sum(-1),
                total.sum(-1),
            )
        }
        if cube.kind == "yes_no":
            per_epoch = unit_calibration(sums)  # (labels, epochs, units)
            epochs = replied_epochs(sums)  # (labels,)
            for k, unit in enumerate(cube.units):
                point = {m: epoch_mean(v[..., k]) for m, v in per_epoch.items()}
                sd = {m: epoch_sd(v[..., k]) for m, v in per_epoch.items()}
                low, high = {}, {}
                if boot is not None:  # the pooled row's intervals, over this question's answers
                    for m, (lo, hi) in calibration_intervals(
                        point, counted[:, k] / epochs, boot.confidence
                    ).items():
                        low[m], high[m] = lo, hi
                rows[unit] = (point, sd, low, high, counted[:, k], total[:, k])
        for question, (point, sd, low, high, n_counted, n_total) in rows.items():
            columns: dict[str, object] = {
                "label": cube.labels,
                "eval": name,
                "question": question,
                "answers": n_counted.astype(np.int64),
                "excluded": (n_total - n_counted).astype(np.int64),
            }
            for m in cal.CALIBRATION_METRICS:
                for suffix, source in zip(SUFFIXES, (point, sd, low, high), strict=True):
                    v = source.get(m)
                    columns[m + suffix] = np.full(len(cube.labels), np.nan) if v is None else v
            frames.append(pl.DataFrame(columns).fill_nan(None).filter(pl.col("answers") > 0))
    keys = ["label", "eval", "question"]
    if not frames:
        return pl.DataFrame(
            schema={
                "label": pl.String,
                "eval": pl.String,
                "question": pl.String,
                "answers": pl.Int64,
            }
        )
    return pl.concat(frames, how="diagonal_relaxed").sort(keys)


def reliability_table(cubes: dict[str, Cube]) -> pl.DataFrame:
    """Reliability-diagram data per (label, eval), every epoch and question pooled: per confidence
    bin (``calibration.ECE_BINS`` equal-width bins, edges ``low``/``high``), ``n`` answers counted
    for calibration, their mean ``confidence`` and ``accuracy`` (0-1). Empty bins are left out."""
    frames = []
    for name, cube in cubes.items():
        c = cube.bin >= 0
        key = cube.l[c] * cal.ECE_BINS + cube.bin[c]
        size = len(cube.labels) * cal.ECE_BINS
        n = np.bincount(key, minlength=size)
        correct = cube.stat("correct")[c]
        right = np.bincount(key, weights=correct, minlength=size)
        confidence = np.bincount(key, weights=correct - cube.gap[c], minlength=size)
        label, b = np.divmod(np.arange(size), cal.ECE_BINS)
        with np.errstate(invalid="ignore", divide="ignore"):
            frames.append(
                pl.DataFrame(
                    {
                        "label": [cube.labels[i] for i in label],
                        "eval": name,
                        "bin": b,
                        "low": b / cal.ECE_BINS,
                        "high": (b + 1) / cal.ECE_BINS,
                        "n": n,
                        "confidence": confidence / n,
                        "accuracy": right / n,
                    }
                ).filter(pl.col("n") > 0)
            )
    if not frames:
        return pl.DataFrame(
            schema={
                "label": pl.String,
                "eval": pl.String,
                "bin": pl.Int64,
                "low": pl.Float64,
                "high": pl.Float64,
                "n": pl.Int64,
                "confidence": pl.Float64,
                "accuracy": pl.Float64,
            }
        )
    return pl.concat(frames).sort("label", "eval", "bin")
