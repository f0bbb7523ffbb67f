"""Paired comparisons and ranks (``scoring.compare``): what they add to ``dxi score`` for 50 models
on the whole index (1,225 pairs), synthetic answers written through the real cache schema
(``tests.helpers.synthetic``).

Figures (the best of ``REPEATS``, as the machine is shared):

* added to scoring: the scoring's tables with comparisons minus without
  (``Scorer.result(comparisons=...)``: every pair's interval, p-values, the max-T step-down and
  McNemar's test for the index and the 7 metrics, the ranks and tied groups), plus the discordant
  counts each evaluation's cube gives (``compare.discordant``, computed while the evaluations are
  added), plus summary.json's ``comparisons`` and ``ranking`` (``build_summary`` with and without
  them) — goal ≤ 1 s;
* for information: the whole scoring with 1,000-resample intervals, beside it, and summary.json's
  size.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from dxi import scoring
from dxi.cache import Cache
from dxi.evals import PROMPT_VERSION, gold_frames
from dxi.scoring import records
from dxi.scoring.compare import discordant
from dxi.scoring.sums import build_cubes
from tests.helpers.synthetic import suite, write_cache

from . import Result
from .bench_scoring import _best

SIZES = {
    "aa_omniscience_decision": 500,
    "hle_multichoice": 513,
    "when2call": 3423,
    "wildguardtest": 835,
}
MODELS = 50
REPEATS = 3
GOAL_S = 1.0


def run() -> list[Result]:
    tasks = suite(SIZES)
    gold, categories = gold_frames(tasks)
    with tempfile.TemporaryDirectory(prefix="dxi-bench-compare-") as tmp:
        write_cache(Path(tmp), tasks, MODELS)
        with Cache(Path(tmp)) as cache:
            models = scoring.models_in_cache(cache.scan(), PROMPT_VERSION)
            answers = scoring.answers(cache.scan(), models, gold, categories)
    boot = scoring.Bootstrap()
    scorer = scoring.Scorer(boot)
    scorer.add(answers)
    labels = scorer.labels
    data = {name: {"files": []} for name in SIZES}
    cubes = build_cubes(answers)
    counted, counted_cpu, _ = _best(lambda: [discordant(c) for c in cubes.values()], REPEATS)
    plain, plain_cpu, without = _best(lambda: scorer.result(comparisons=False), REPEATS)
    compared, compared_cpu, with_ = _best(lambda: scorer.result(comparisons=True), REPEATS)
    summary_plain, summary_plain_cpu, _ = _best(
        lambda: scoring.build_summary(
            without.metrics, labels, data, PROMPT_VERSION, 1, {}, without
        ),
        REPEATS,
    )
    summary_with, summary_with_cpu, summary = _best(
        lambda: scoring.build_summary(with_.metrics, labels, data, PROMPT_VERSION, 1, {}, with_),
        REPEATS,
    )
    written, written_cpu, text = _best(lambda: records.to_json(summary), REPEATS)
    whole, whole_cpu, _ = _best(
        lambda: scoring.score(answers, boot, with_breakdowns=False, with_comparisons=True), 1
    )
    added = (compared - plain) + counted + (summary_with - summary_plain) + written
    added_cpu = (
        (compared_cpu - plain_cpu)
        + counted_cpu
        + (summary_with_cpu - summary_plain_cpu)
        + written_cpu
    )
    pairs = MODELS * (MODELS - 1) // 2
    shape = (
        f"{MODELS} models, {len(tasks):,} tasks ({answers.height:,} answers), {pairs:,} pairs × "
        f"{with_.comparisons.select('eval', 'metric').n_unique()} figures = {with_.comparisons.height:,} comparisons"
    )
    return [
        Result(
            "compare",
            "paired comparisons and ranks added to dxi score",
            added,
            "s",
            f"≤ {GOAL_S} s",
            added <= GOAL_S,
            f"{shape}; 1,000 resamples; tables {compared - plain:.3f} s, discordant counts {counted:.3f} s, "
            f"summary.json entries {summary_with - summary_plain + written:.3f} s; best of {REPEATS}; "
            f"CPU {added_cpu:.2f} s",
        ),
        Result(
            "compare",
            "… the whole scoring with intervals and comparisons",
            whole,
            "s",
            "",
            None,
            "scoring.score with 1,000-resample intervals, without the report's breakdowns (dxi score's work "
            f"after reading the cache); CPU {whole_cpu:.2f} s",
        ),
        Result(
            "compare",
            "… summary.json with every comparison",
            len(text) / 1e6,
            "MB",
            "",
            None,
            f"{len(summary.comparisons):,} entries in comparisons",
        ),
    ]
