"""Ties: picks of a decision model decided by a tie of the highest probabilities.

A valid answer whose two (or more) most probable options are exactly equal (as the server returned
them; servers round to 4 decimals, so rounding shows up as exact ties) was not decided by the
model's probabilities: the returned choice was scored when it is one of them, else the first of them
in option order (SPEC §6, ``adapters.decision.pick``). A yes/no answer with P(yes) = 0.5 is a tie
too (scored yes). Values that differ, however little, are no tie: the higher one was scored. Ties
are scored as any answer, and counted here, per model and evaluation, for summary.json (``ties`` in
each evaluation block).

Rounded replies: a server that rounds each probability to k < 4 decimals (a gateway's two) is
accepted when the sum is within what that rounding explains (``adapters.decision``), with a warning
that starts ``rounded:``; such answers are counted here too (``rounded`` in an evaluation block that
has any)."""

from __future__ import annotations

import polars as pl

from .records import Summary

CHUNK = 65_536  # answers looked at a time (``tie_counts``): the per-option lists of a chunk only


def tie_counts(answers: pl.DataFrame) -> dict[tuple[str, str], int]:
    """``(label, eval) -> ties`` over an answers frame (``scoring.answers``: label, eval, status,
    probabilities), counting every epoch's answer; pairs without a tie are absent. ``CHUNK`` answers
    at a time: at once, the option lists built for a million answers were the view's start-up
    peak."""
    p = pl.col("probabilities").list.eval(pl.element().struct.field("p"))
    counts: dict[tuple[str, str], int] = {}
    for start in range(0, answers.height, CHUNK):
        found = (
            answers.slice(start, CHUNK)
            .lazy()
            .filter(
                (pl.col("status").cast(pl.String) == "ok")
                & (pl.col("probabilities").list.len() >= 2)
            )
            .select(
                pl.col("label").cast(pl.String),
                pl.col("eval").cast(pl.String),
                p.list.eval((pl.element() == pl.element().max()).cast(pl.Int32))
                .list.sum()
                .alias("top"),
            )
            .filter(pl.col("top") >= 2)
            .group_by("label", "eval")
            .agg(pl.len().alias("ties"))
            .collect()
        )
        for label, name, n in found.iter_rows():
            counts[(label, name)] = counts.get((label, name), 0) + n
    return counts


ROUNDED_PREFIX = "rounded:"  # ``adapters.decision.ROUNDED``'s warning, as answers carry it


def rounded_counts(answers: pl.DataFrame) -> dict[tuple[str, str], int]:
    """``(label, eval) -> answers`` accepted as rounded replies (their warning starts ``rounded:``),
    every epoch counted; pairs without one are absent."""
    found = (
        answers.lazy()
        .filter(pl.col("warning").str.starts_with(ROUNDED_PREFIX))
        .group_by(pl.col("label").cast(pl.String), pl.col("eval").cast(pl.String))
        .agg(pl.len())
        .collect()
    )
    return {(label, name): n for label, name, n in found.iter_rows()}


def add_ties(
    summary: Summary,
    counts: dict[tuple[str, str], int],
    rounded: dict[tuple[str, str], int] | None = None,
) -> Summary:
    """``summary`` with ``ties`` (``counts``, from ``tie_counts``; 0 when none) in every evaluation
    block of every model, and ``rounded`` (``rounded_counts``) in the blocks that have rounded
    replies."""
    for m in summary.models:
        for name, block in m.evals.items():
            block["ties"] = counts.get((m.model, name), 0)
            if (rounded or {}).get((m.model, name)):
                block["rounded"] = rounded[(m.model, name)]
    return summary
