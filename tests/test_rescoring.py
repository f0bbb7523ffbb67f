"""Cache-only rescoring of a synthetic cache: the vectorised scorer agrees with a plain row-by-row one,
the newest row of a request wins, rows of other prompt versions or changed tasks are ignored."""
from __future__ import annotations

from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest

import scoring
from benchmarks.bench_scoring import plain_index
from benchmarks.synthetic import model_name, suite, write_cache
from cache import Cache
from cache.schema import SCHEMA
from evals import PROMPT_VERSION, gold_frames

SIZES = {"aa_omniscience_decision": 30, "hle_multichoice": 25, "when2call": 20, "wildguardtest": 12}


def rescore(root: Path, tasks: list) -> pl.DataFrame:
    gold, categories = gold_frames(tasks)
    with Cache(root) as cache:
        models = scoring.models_in_cache(cache.scan(), PROMPT_VERSION)
        answers = scoring.answers(cache.scan(), models, gold, categories)
    return scoring.score(answers, scoring.Bootstrap(resamples=50)).index


def index_of(table: pl.DataFrame) -> dict[str, float | None]:
    return dict(table.select("label", "decision_index").iter_rows())


def test_vectorised_and_plain_scorers_agree(tmp_path: Path):
    tasks = suite(SIZES)
    assert write_cache(tmp_path, tasks, 4, invalid_rate=0.05, failed_rate=0.05) == 4 * (30 + 25 + 20 + 3 * 12)
    shards = sorted(tmp_path.glob("shards/*.parquet"))
    plain = plain_index(shards, tasks, [model_name(m) for m in range(4)])
    vectorised = index_of(rescore(tmp_path, tasks))
    assert vectorised.keys() == plain.keys() and all(vectorised[k] == pytest.approx(plain[k], abs=1e-9) for k in plain)


def test_the_newest_row_wins_and_stale_rows_are_ignored(tmp_path: Path):
    tasks = suite(SIZES)
    write_cache(tmp_path, tasks, 2)
    before = index_of(rescore(tmp_path, tasks))
    shard = pl.read_parquet(tmp_path / "shards" / "synthetic-000.parquet")
    failed = shard.with_columns(pl.lit("failed").alias("status"), pl.lit("HTTP 500").alias("error"),
                                pl.col("answers").list.head(0))

    def add(name: str, frame: pl.DataFrame) -> None:
        pq.write_table(frame.to_arrow().cast(SCHEMA), tmp_path / "shards" / f"{name}.parquet")

    add("older", failed.with_columns(pl.col("created_at") - 100))                       # older: ignored
    add("old-prompt", failed.with_columns(pl.lit("dxi-prompt-0").alias("prompt_version"),
                                          pl.col("created_at") + 100))                  # other prompt version
    add("changed-task", failed.with_columns(pl.lit("0" * 64).alias("task_digest"),
                                            pl.col("created_at") + 100))                # task content changed
    assert index_of(rescore(tmp_path, tasks)) == before
    add("newer", failed.with_columns(pl.col("created_at") + 100))                       # newer: wins
    after = index_of(rescore(tmp_path, tasks))
    first = f"synthetic:{model_name(0)}"
    # every request of model 0 failed: accuracies 0, non-hallucination 0, F1 0 (gold yes -> FN, no -> FP)
    assert after[first] == 0.0 and after[f"synthetic:{model_name(1)}"] == before[f"synthetic:{model_name(1)}"]
    plain = plain_index(sorted(tmp_path.glob("shards/*.parquet")), tasks, [model_name(0), model_name(1)])
    assert plain[first] == 0.0


def test_the_order_of_rows_in_the_cache_does_not_change_a_single_bit(tmp_path: Path):
    """Two runs on one cache interleave their rows differently; sums of probabilities must not depend on it."""
    tasks = suite(SIZES)
    write_cache(tmp_path / "a", tasks, 3, invalid_rate=0.05, failed_rate=0.05)
    rows = pl.concat([pl.read_parquet(p) for p in sorted((tmp_path / "a").glob("shards/*.parquet"))])
    (tmp_path / "b" / "shards").mkdir(parents=True)
    pq.write_table(rows.sample(fraction=1.0, shuffle=True, seed=5).to_arrow().cast(SCHEMA),
                   tmp_path / "b" / "shards" / "shuffled.parquet")
    gold, categories = gold_frames(tasks)
    scored = []
    for name in ("a", "b"):
        with Cache(tmp_path / name) as cache:
            models = scoring.models_in_cache(cache.scan(), PROMPT_VERSION)
            scored.append(scoring.score(scoring.answers(cache.scan(), models, gold, categories),
                                        scoring.Bootstrap(resamples=50)))
    ordered, shuffled = scored
    for name, table in ordered.tables().items():
        assert table.equals(shuffled.tables()[name]), name
    assert not ordered.calibration.is_empty() and not ordered.reliability.is_empty()
