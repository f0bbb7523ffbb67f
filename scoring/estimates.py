"""What marks an adaptive run's figures as estimates of the whole set where no ``≈`` can
(``dxi run --until``; docs/adaptive.md, "What an adaptive run records"): the tables
(``OUT/tables/index`` and ``metrics``: ``columns``) and the exports (``runner.export``: ``of``,
``method``). A model's figures are estimates by the one test the terminal, the report and ``dxi
view`` mark ``≈`` by, ``scoring.adaptive.estimated`` (a model asked everything, or marked
``exact``, is not one). Each interval is named by what produced it (``method``): an estimate's
headline intervals are the anytime-valid ones (``scoring.adaptive.headline``;
``scoring.intervals.ANYTIME_INDEX`` and ``ANYTIME_METRIC``), the fixed-sample ones over the asked
part kept beside them (its block's ``fixed_sample_ci``); every other figure's are the ones
summary.json's ``intervals.methods`` names, which in an adaptive run's summary names the
anytime-valid ones too (``name_anytime``). Pure: reads a ``Summary`` and a ``Scored``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import msgspec
import polars as pl

from .adaptive import estimated, is_adaptive, run_of
from .intervals import ANYTIME_INDEX, ANYTIME_METHODS, ANYTIME_METRIC
from .records import UNSET, ModelEntry, Summary, unset
from .scored import Scored
from .stopped_pairs import ANYTIME, FIXED_SAMPLE
from .sums import ALL_METRICS

INDEX = "decision_index"
# the metrics table's column naming its index terms' interval method (``columns``)
TERMS_INTERVAL = "index_terms_interval"


@dataclass(frozen=True)
class Estimate:
    """A model whose figures are estimates of the whole set (``of``): ``asked`` and ``whole``
    (evaluation -> the tasks it was asked, and the whole set's), the run's ``until`` and ``seed``,
    the ``rule`` that stopped it (None: the run ended before it was met) and the ``round`` after
    which, and ``fixed`` (its block's ``fixed_sample_ci``: "index" and "<evaluation>.<metric>" ->
    the fixed-sample [low, high] over the asked part, not valid after stopping)."""

    asked: dict[str, int]
    whole: dict[str, int]
    until: str | None
    seed: int
    rule: str | None
    round: int | None
    fixed: dict[str, list | None]

    def counts(self, name: str | None = None) -> tuple[int, int]:
        """(asked, whole set) of evaluation ``name``; None: summed over its evaluations (the
        index's)."""
        names = list(self.asked) if name is None else [name]
        return sum(self.asked.get(n, 0) for n in names), sum(self.whole.get(n, 0) for n in names)

    def stopped(self) -> str:
        """What stopped it: "stopped by precision=5 after round 4", or "not settled when the run
        ended"."""
        if self.rule is None:
            return "not settled when the run ended"
        return f"stopped by {self.rule}" + (
            "" if self.round is None else f" after round {self.round}"
        )

    def sentence(self, name: str | None = None) -> str:
        """The note of an export's record: "an estimate of the whole set: an adaptive run (--until
        precision=5, order seed 0) asked this model 31 of the 40 tasks (a seeded random part) and
        stopped by precision=5 after round 8; ..." (``name``: an evaluation; None: the index, its
        counts summed over its evaluations)."""
        asked, whole = self.counts(name)
        over = "" if name is not None else " of its evaluations"
        return (
            f"an estimate of the whole set: an adaptive run (--until {self.until}, order seed "
            f"{self.seed}) asked this model {asked:,} of the {whole:,} tasks{over} (a seeded random "
            f"part), {self.stopped()}; the scores are over the tasks asked and estimate the whole "
            "set's, their intervals the anytime-valid ones, which hold although the run chose when "
            "to stop (the fixed-sample ones over the tasks asked, not valid after stopping, are in "
            "score_details.details); a run without --until asks the others"
        )


def of(summary: Summary, entry: ModelEntry) -> Estimate | None:
    """``entry``'s ``Estimate`` when its figures are estimates of the whole set
    (``scoring.adaptive.estimated``), else None."""
    if not estimated(summary, entry):
        return None
    block, run = entry.adaptive, run_of(summary, entry.model)
    populations = summary.adaptive.get("populations", {})
    return Estimate(
        asked=dict(block.get("asked", {})),
        whole={name: populations.get(name, 0) for name in block.get("asked", {})},
        until=run.get("until"),
        seed=run.get("seed") or 0,
        rule=block.get("rule"),
        round=block.get("round"),
        fixed=dict(block.get("fixed_sample_ci") or {}),
    )


def fixed_method(summary: Summary, metric: str) -> str:
    """The fixed-sample interval method of ``metric`` (summary.json's ``intervals.methods``)."""
    intervals = unset(summary.intervals) or {}
    return str(
        (intervals.get("methods") or {}).get(metric)
        or intervals.get("method", "percentile bootstrap")
    )


def method(summary: Summary, entry: ModelEntry, metric: str) -> str:
    """The method of ``entry``'s headline interval of ``metric`` (``decision_index`` for the
    index): the anytime-valid one for an estimate of the index or of one of its terms, else
    ``fixed_method``."""
    if metric in (INDEX, *ALL_METRICS) and estimated(summary, entry):
        return ANYTIME_INDEX if metric == INDEX else ANYTIME_METRIC
    return fixed_method(summary, metric)


def name_anytime(summary: Summary) -> Summary:
    """``summary`` with, in an adaptive run's (``scoring.adaptive.is_adaptive``), its
    ``intervals.methods`` naming the anytime-valid intervals it publishes too, with their sources
    (``scoring.intervals.ANYTIME_METHODS``: ``anytime_index``, ``anytime_metric``); unchanged
    otherwise: a run without ``--until`` names the fixed-sample methods only."""
    intervals = unset(summary.intervals)
    if not is_adaptive(summary) or not intervals:
        return summary
    methods = {**(intervals.get("methods") or {}), **ANYTIME_METHODS}
    return msgspec.structs.replace(summary, intervals={**intervals, "methods": methods})


def columns(summary: Summary, scored: Scored) -> Scored:
    """``scored`` with, in an adaptive run's summary (``scoring.adaptive.is_adaptive``), the
    columns that say which figures are estimates appended to the index and metrics tables:
    ``estimate`` (``scoring.adaptive.estimated``), ``asked`` and ``whole_set`` (the tasks the model
    was asked and the whole set's: the index's summed over its evaluations; null for a model no
    adaptive run asked), ``stopped_by`` (the rule; null while it ran), which interval
    ``_low``/``_high`` are ("anytime-valid" for an estimate, else "fixed sample": the index table's
    ``interval``; the metrics table's ``TERMS_INTERVAL``, as only the index terms' are: Brier, ECE
    and log loss keep their fixed-sample ones) and the fixed-sample interval over the asked part of
    an estimate (null otherwise): the index's ``fixed_sample_low``/``_high``, each term's
    ``<metric>_fixed_sample_low``/``_high``. Unchanged for another summary."""
    if not is_adaptive(summary):
        return scored
    populations = summary.adaptive.get("populations", {})
    present = [m for m in ALL_METRICS if f"{m}_low" in scored.metrics.columns]
    rows: dict[str, dict] = {}  # label -> the index table's new cells
    cells: dict[str, dict] = {}  # label \x00 evaluation -> the metrics table's
    for m in summary.models:
        block = m.adaptive if m.adaptive is not UNSET and m.adaptive else {}
        estimate, asked = estimated(summary, m), block.get("asked", {})
        fixed = (block.get("fixed_sample_ci") or {}) if estimate else {}
        rule = {"stopped_by": block.get("rule"), "interval": ANYTIME if estimate else FIXED_SAMPLE}
        iv = fixed.get("index") or [None, None]
        rows[m.model] = {
            "estimate": estimate,
            "asked": sum(asked.values()) if asked else None,
            "whole_set": sum(populations.get(n, 0) for n in asked) if asked else None,
            **rule,
            "fixed_sample_low": iv[0],
            "fixed_sample_high": iv[1],
        }
        for name in m.evals:
            cell = {
                "estimate": estimate,
                "asked": asked.get(name),
                "whole_set": populations.get(name) if name in asked else None,
                "stopped_by": rule["stopped_by"],
                # the index terms' only: brier, ece and log_loss keep fixed-sample intervals
                TERMS_INTERVAL: rule["interval"],
            }
            for metric in present:
                iv = fixed.get(f"{name}.{metric}") or [None, None]
                cell[f"{metric}_fixed_sample_low"], cell[f"{metric}_fixed_sample_high"] = iv
            cells[f"{m.model}\x00{name}"] = cell
    label = pl.col("label").cast(pl.String)
    index, metrics = scored.index, scored.metrics
    if rows and "label" in index.columns:
        index = _append(index, label, rows)
    if cells and {"label", "eval"} <= set(metrics.columns):
        pair = pl.concat_str([label, pl.col("eval").cast(pl.String)], separator="\x00")
        metrics = _append(metrics, pair, cells)
    return replace(scored, index=index, metrics=metrics)


_TYPES = {
    "estimate": pl.Boolean,
    "stopped_by": pl.String,
    "interval": pl.String,
    TERMS_INTERVAL: pl.String,
}


def _append(table: pl.DataFrame, key: pl.Expr, rows: dict[str, dict]) -> pl.DataFrame:
    """``table`` with the columns of ``rows`` (its key's value -> column -> cell) appended, in the
    order of the first row's cells (a key not in ``rows``: null)."""
    names = list(next(iter(rows.values()), {}))
    return table.with_columns(
        key.replace_strict(
            {k: cells[name] for k, cells in rows.items()},
            default=None,
            return_dtype=_TYPES.get(
                name, pl.Int64 if name in ("asked", "whole_set") else pl.Float64
            ),
        ).alias(name)
        for name in names
    )
