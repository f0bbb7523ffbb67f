"""Every table of a scoring: the entry point used by ``dxi score``, ``dxi report`` and the
benchmarks.

``score(answers, bootstrap)`` computes, from one answers frame (``scoring.pipeline.answers``) and in
one vectorised pass over all models, the tables below. ``Scored.tables()`` names each for export
(CSV and Parquet files, the HTML report). ``Scorer`` computes the same tables from several answers
frames, each holding whole evaluations, given one after another and not kept (``dxi view`` scores
one evaluation at a time to hold one evaluation's answers only); ``score`` is a Scorer given one
frame.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import polars as pl

from . import breakdowns, calibration
from .bootstrap import Bootstrap
from .bounds import figure_bounds, settle, settle_ranks
from .compare import COMPARISON_SCHEMA, compare, discordant, open_pairs
from .decision_index import index_table, index_values
from .records import Summary
from .summary import invalid_counts
from .sums import (
    Cube,
    breakdown_table,
    build_cubes,
    calibration_table,
    eval_metrics_all,
    metric_table,
    reliability_table,
)


@dataclass
class Scored:
    """The results of scoring.

    * ``answers``: one row per (model, question, epoch) (``scoring.pipeline.ANSWER_COLUMNS``).
    * ``metrics``: per (label, eval): n, answer counts, every metric with ``_sd``, ``_low``,
      ``_high``.
    * ``index``: per label: the Decision Index with its spread over epochs and interval.
    * ``calibration``: per (label, eval, question): Brier, ECE, log loss (+ intervals), and
      ``auroc`` (+ DeLong interval) for WildGuardTest's yes/no questions.
    * ``reliability``: reliability-diagram bins per (label, eval).
    * ``breakdowns``: the metrics per (label, eval, dimension, group).
    * ``confusion``: When2Call gold reply type × predicted reply type (or status) per label.
    * ``statuses``: answer counts per status, per (label, eval); ``errors``: the most frequent
      errors.
    * ``invalid``: the invalid answers' reasons counted per (label, shape)
      (``summary.invalid_counts``).
    * ``comparisons``: every pair of models, the difference of the index and of each metric with its
      paired-bootstrap interval and p-values (``scoring.compare``; empty unless asked for, and
      without a bootstrap), and ``settled`` (``scoring.bounds.settle``: false where the failed and
      missing answers could overturn the difference, which is then not claimed). The index table
      then also has each model's ``rank``, ``rank_low``, ``rank_high`` and ``tied_group``
      (``scoring.bounds.settle_ranks`` applied).
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
    invalid: pl.DataFrame
    comparisons: pl.DataFrame = field(
        default_factory=lambda: pl.DataFrame(schema=COMPARISON_SCHEMA)
    )

    def tables(self) -> dict[str, pl.DataFrame]:
        """Every table except the answers, by file name (labels in a column named ``model``;
        ``comparisons`` only when computed)."""
        tables = {
            "index": self.index,
            "metrics": self.metrics,
            "calibration": self.calibration,
            "reliability": self.reliability,
            "breakdowns": self.breakdowns,
            "when2call_confusion": self.confusion,
            "answer_statuses": self.statuses,
            "errors": self.errors,
        }
        if not self.comparisons.is_empty():
            tables["comparisons"] = self.comparisons
        return {
            name: t.rename({"label": "model"}) if "label" in t.columns else t
            for name, t in tables.items()
        }


def score(
    answers: pl.DataFrame,
    bootstrap: Bootstrap | None = None,
    with_breakdowns: bool = True,
    with_comparisons: bool = False,
) -> Scored:
    """Score an answers frame: every table of ``Scored``. ``bootstrap`` None skips the intervals;
    ``with_breakdowns`` False skips the tables only the report shows (breakdowns, confusion,
    statuses, errors: left empty); summary.json needs none of them. ``with_comparisons`` (with a
    bootstrap) adds the paired comparisons and ranks (``scoring.compare``)."""
    scorer = Scorer(bootstrap)
    cubes = scorer.add(answers)
    if not with_breakdowns:
        return scorer.result(answers, comparisons=with_comparisons)
    return scorer.result(
        answers,
        comparisons=with_comparisons,
        breakdowns=breakdown_table(cubes, bootstrap),
        confusion=breakdowns.confusion(answers),
        statuses=breakdowns.statuses(answers),
        errors=breakdowns.errors(answers),
    )


@dataclass
class Part:
    """One answers frame's share of a scoring (``Scorer.part``): its ``cubes`` by evaluation,
    ``auroc`` (``calibration.auroc``) and ``invalid`` (``summary.invalid_counts``)."""

    cubes: dict[str, Cube]
    auroc: pl.DataFrame
    invalid: pl.DataFrame


class Scorer:
    """The tables of ``score`` from answers frames given one after another (``add``), each holding
    every row of the evaluations in it (``scoring.pipeline.answers`` over one evaluation's gold: all
    its models, questions and epochs) and no evaluation given twice. Every table but the index is
    per evaluation: each frame's rows are computed as ``score`` computes them and the parts
    concatenated and sorted as ``score`` sorts them; the index combines each evaluation's estimates
    (its point values and, with a bootstrap, its replicates: an evaluation's resamples depend on its
    name and task count alone, ``Bootstrap``). So ``result()`` equals ``score`` over all the frames
    at once, without the breakdown tables and without holding any frame: a frame's memory is freed
    once ``add`` returns and its caller drops it."""

    def __init__(self, bootstrap: Bootstrap | None = None):
        self.bootstrap = bootstrap
        self.estimates: dict = {}
        self.labels: list[str] = []
        self._metrics: list[pl.DataFrame] = []
        self._calibration: list[pl.DataFrame] = []
        self._reliability: list[pl.DataFrame] = []
        self._invalid: list[pl.DataFrame] = []
        self.discordants: dict[
            str, np.ndarray | None
        ] = {}  # per accuracy evaluation (``compare.discordant``)
        # the same with the open (failed, missing) answers apart (``compare.open_pairs``)
        self.opens: dict[str, np.ndarray | None] = {}

    def add(self, answers: pl.DataFrame) -> dict[str, Cube]:
        """Score the evaluations in ``answers``; returns their cubes (``scoring.sums.Cube`` by
        evaluation). Raises ValueError for an evaluation already added. ``add_part(part(answers))``
        in two steps."""
        return self.add_part(self.part(answers))

    def part(self, answers: pl.DataFrame) -> Part:
        """What ``add_part`` needs of ``answers``: their cubes, AUROCs and invalid reasons. The
        caller can then drop the answers before the intervals are computed (their resampled sums are
        the scoring's peak memory)."""
        with ThreadPoolExecutor(
            1, thread_name_prefix="dxi-auroc"
        ) as beside:  # on a second core, when there is one
            ranked = beside.submit(
                calibration.auroc, answers, self.bootstrap.confidence if self.bootstrap else 0.95
            )
            cubes = build_cubes(answers)
            invalid = invalid_counts(answers)
            return Part(cubes, ranked.result(), invalid)

    def add_part(self, part: Part) -> dict[str, Cube]:
        """Score the evaluations of ``part`` (``Scorer.part``); returns their cubes. Raises
        ValueError for an evaluation already added."""
        cubes, boot = part.cubes, self.bootstrap
        again = sorted(set(cubes) & set(self.estimates))
        if again:
            raise ValueError(
                f"evaluation scored twice: {', '.join(again)} (each answers frame must hold whole "
                "evaluations, each in one frame)"
            )
        estimates = eval_metrics_all(cubes, boot)
        if cubes and not self.labels:
            self.labels = next(iter(cubes.values())).labels
        self.estimates.update(estimates)
        self._metrics.append(metric_table(cubes, estimates))
        calib = calibration_table(cubes, estimates, boot)
        if not calib.is_empty():
            calib = calib.join(
                part.auroc.rename({"question_id": "question"}),
                on=["label", "eval", "question"],
                how="left",
            )
        self._calibration.append(calib)
        self._reliability.append(reliability_table(cubes))
        self._invalid.append(part.invalid)
        for name, cube in cubes.items():
            self.discordants[name] = discordant(cube)
            self.opens[name] = open_pairs(cube)
        return cubes

    def _claim(
        self,
    ) -> tuple[
        Callable[[pl.DataFrame], pl.DataFrame], Callable[[pl.DataFrame], pl.DataFrame], np.ndarray
    ]:
        """The rule for provisional figures (SPEC §6, ``scoring.bounds``) as three parts: on
        ``compare``'s comparisons, ``settled`` added and a difference the failed and missing
        answers could overturn made not significant (so the tied groups and rank sets never
        claim it); on its ranks, the rank intervals widened to every rank the bounds allow; and
        what each model is placed by in the ranks (``compare.ranks``): its index's lowest bound,
        a complete index's being its value, so a partial result never ranks above what it could
        turn out to be."""
        index = index_values(self.estimates, self.labels)
        point = np.where([bool(u) for u in index.unavailable], np.nan, index.point)
        figures = figure_bounds(self.estimates, (point, index.lowest, index.highest))

        def comparisons(pairs: pl.DataFrame) -> pl.DataFrame:
            pairs = settle(pairs, self.labels, figures)
            return pairs.with_columns(pl.col("significant") & pl.col("settled").fill_null(True))

        def ranks(table: pl.DataFrame) -> pl.DataFrame:
            return settle_ranks(table, self.labels, figures[(None, "decision_index")])

        return comparisons, ranks, figures[(None, "decision_index")][0]

    def result(
        self, answers: pl.DataFrame | None = None, comparisons: bool = False, **tables: pl.DataFrame
    ) -> Scored:
        """The tables of everything added, as ``Scored`` (``answers`` the frame to keep in it, or an
        empty one; ``tables`` the breakdown tables, ``breakdowns``, ``confusion``, ``statuses``,
        ``errors``, to keep in it, or empty ones). With ``comparisons`` (and a bootstrap), the
        paired comparisons of every pair of models and, in the index table, each model's rank with
        its interval and tied group."""
        empty = pl.DataFrame()
        index = index_table(self.estimates, self.labels, self.bootstrap)
        pairs = pl.DataFrame(schema=COMPARISON_SCHEMA)
        if comparisons and self.bootstrap is not None:
            claim, widen, place = self._claim()
            pairs, ranks = compare(
                self.estimates,
                self.labels,
                self.bootstrap,
                self.discordants,
                claim,
                self.opens,
                place,
            )
            ranks = widen(ranks)
            index = index.with_columns(pl.col("label").cast(pl.String)).join(
                ranks.rename({"group": "tied_group"}), on="label", how="left", maintain_order="left"
            )
        return Scored(
            answers=empty if answers is None else answers,
            metrics=_joined(self._metrics, ["label", "eval"]),
            index=index,
            comparisons=pairs,
            calibration=_joined(self._calibration, ["label", "eval", "question"]),
            reliability=_joined(self._reliability, ["label", "eval", "bin"]),
            breakdowns=tables.get("breakdowns", empty),
            confusion=tables.get("confusion", empty),
            statuses=tables.get("statuses", empty),
            errors=tables.get("errors", empty),
            bootstrap=self.bootstrap,
            invalid=pl.concat(self._invalid)
            if self._invalid
            else invalid_counts(
                pl.DataFrame(schema={"label": pl.String, "status": pl.String, "error": pl.String})
            ),
        )


def _joined(parts: list[pl.DataFrame], keys: list[str]) -> pl.DataFrame:
    """Per-evaluation tables as one, sorted by ``keys`` (unique per row) as each part is: one part
    as it is."""
    if len(parts) == 1:
        return parts[0]
    filled = [p for p in parts if not p.is_empty()] or parts[
        :1
    ]  # an empty part's schema may be a stub
    return filled[0] if len(filled) == 1 else pl.concat(filled, how="diagonal_relaxed").sort(keys)


class ScoredRun(NamedTuple):
    """A scored run as scoring hands it on (``runner.outputs.files.summarize``, ``score_all``;
    ``dxi view``'s ``Summarize``): the ``summary`` (summary.json) and the ``scored`` tables
    (``Scored``). A tuple: ``summary, scored = ...`` reads it."""

    summary: Summary
    scored: Scored
