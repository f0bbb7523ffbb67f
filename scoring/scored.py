"""Every table of a scoring: the entry point used by ``dxi score``, ``dxi report`` and the benchmarks.

``score(answers, bootstrap)`` computes, from one answers frame (``scoring.score.answers``) and in one
vectorised pass over all models, the tables below. ``Scored.tables()`` names each for export (CSV and
Parquet files, the HTML report).
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import polars as pl

from . import breakdowns, calibration
from .bootstrap import Bootstrap
from .index import index_table
from .sums import breakdown_table, build_cubes, calibration_table, estimate_all, metric_table, reliability_table


@dataclass
class Scored:
    """The results of scoring.

    * ``answers``: one row per (model, question, epoch) (``scoring.score.ANSWER_COLUMNS``).
    * ``metrics``: per (label, eval): n, answer counts, every metric with ``_sd``, ``_low``, ``_high``.
    * ``index``: per label: the Decision Index with its spread over epochs and interval.
    * ``calibration``: per (label, eval, question): Brier, ECE, log loss (+ intervals), and ``auroc``
      (+ DeLong interval) for WildGuardTest's yes/no questions.
    * ``reliability``: reliability-diagram bins per (label, eval).
    * ``breakdowns``: the metrics per (label, eval, dimension, group).
    * ``confusion``: When2Call gold reply type × predicted reply type (or status) per label.
    * ``statuses``: answer counts per status, per (label, eval); ``errors``: the most frequent errors.
    """

    answers: pl.DataFrame
    metrics: pl.DataFrame
    index: pl.DataFrame
    calibration: pl.DataFrame
    reliability: pl.DataFrame
    breakdowns: pl.DataFrame
    confusion: pl.DataFrame
    statuses: pl.DataFrame
    errors: pl.DataFrame
    bootstrap: Bootstrap | None

    def tables(self) -> dict[str, pl.DataFrame]:
        """Every table except the answers, by file name (labels in a column named ``model``)."""
        tables = {"index": self.index, "metrics": self.metrics, "calibration": self.calibration,
                  "reliability": self.reliability, "breakdowns": self.breakdowns,
                  "when2call_confusion": self.confusion, "answer_statuses": self.statuses, "errors": self.errors}
        return {name: t.rename({"label": "model"}) if "label" in t.columns else t for name, t in tables.items()}


def score(answers: pl.DataFrame, bootstrap: Bootstrap | None = None, with_breakdowns: bool = True) -> Scored:
    """Score an answers frame: every table of ``Scored``. ``bootstrap`` None skips the intervals;
    ``with_breakdowns`` False skips the tables only the report shows (breakdowns, confusion, statuses,
    errors: left empty); summary.json needs none of them."""
    with ThreadPoolExecutor(1, thread_name_prefix="dxi-auroc") as beside:  # on a second core, when there is one
        ranked = beside.submit(calibration.auroc, answers, bootstrap.confidence if bootstrap else 0.95)
        cubes = build_cubes(answers)
        estimates = estimate_all(cubes, bootstrap)
        auroc = ranked.result()
    labels = next(iter(cubes.values())).labels if cubes else []
    table = metric_table(cubes, estimates)
    calib = calibration_table(cubes, estimates, bootstrap)
    if not calib.is_empty():
        calib = calib.join(auroc.rename({"question_id": "question"}), on=["label", "eval", "question"], how="left")
    empty = pl.DataFrame()
    return Scored(
        answers=answers, metrics=table, index=index_table(estimates, labels, bootstrap), calibration=calib,
        reliability=reliability_table(cubes),
        breakdowns=breakdown_table(cubes, bootstrap) if with_breakdowns else empty,
        confusion=breakdowns.confusion(answers) if with_breakdowns else empty,
        statuses=breakdowns.statuses(answers) if with_breakdowns else empty,
        errors=breakdowns.errors(answers) if with_breakdowns else empty,
        bootstrap=bootstrap)
