"""Scoring one evaluation at a time (``summarize(each=...)``, ``scoring.Scorer``,
``Cache.read_parts``): what ``dxi view``'s start-up child does to hold one evaluation's answers
only. The summary and every table must be the same, bit for bit, as scoring all the answers at
once."""

from __future__ import annotations

import shutil
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest

from dxi import scoring
from dxi.cache import Cache
from dxi.cache.layout import NESTED
from dxi.evals import PROMPT_VERSION
from dxi.runner.outputs.files import summarize
from dxi.scoring import records
from tests.helpers.synthetic import SyntheticSuite, model_name, suite, write_cache

SIZES = {"aa_omniscience_decision": 30, "hle_multichoice": 25, "when2call": 20, "wildguardtest": 12}
KEYS = ["model", "eval", "task_id", "question_id", "sample"]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """4 models' shards (invalid and failed answers among them); one model's shard in the nested
    layout; and one model's HLE rows again, newer, in a second shard (the newest row wins across
    shards)."""
    root = tmp_path_factory.mktemp("by-eval")
    write_cache(root, suite(SIZES), 4, invalid_rate=0.1, failed_rate=0.05)
    old = tmp_path_factory.mktemp("nested")
    write_cache(old, suite(SIZES), 5, seed=3, invalid_rate=0.1, failed_rate=0.05, layout=NESTED)
    (old / "shards" / f"synthetic-{4:03d}.parquet").rename(
        root / "shards" / "synthetic-004.parquet"
    )
    newer = tmp_path_factory.mktemp("newer")
    write_cache(newer, [t for t in suite(SIZES) if t.eval == "hle_multichoice"], 2, seed=5)
    table = pq.read_table(newer / "shards" / "synthetic-001.parquet")
    table = table.set_column(
        table.schema.get_field_index("created_at"),
        "created_at",
        pl.Series([2e9] * table.num_rows).to_arrow(),
    )
    pq.write_table(
        table.replace_schema_metadata(table.schema.metadata),
        root / "shards" / "synthetic-zz.parquet",
    )
    return root


def _models(cache: Cache) -> pl.DataFrame:
    return cache.read(lambda rows: scoring.models_in_cache(rows, PROMPT_VERSION))


def test_one_evaluation_at_a_time_gives_the_same_summary_and_tables(cache_dir: Path):
    with Cache(cache_dir, read_only=True) as cache:
        models = _models(cache)
        assert models.height == 5
        prices = {models["label"][0]: (1.0, 2.0)}
        whole, scored = summarize(cache, SyntheticSuite(SIZES), models, None, prices=prices)
        seen: list[pl.DataFrame] = []
        apart, parts = summarize(
            cache, SyntheticSuite(SIZES), models, None, prices=prices, each=seen.append
        )
    assert records.to_json(apart) == records.to_json(
        whole
    )  # the same keys in the same order: summary.json's bytes
    assert apart.labels == whole.labels
    assert any(m.invalid_reasons for m in whole.models)
    for table in ("metrics", "index", "calibration", "reliability", "invalid"):
        mine, theirs = getattr(parts, table), getattr(scored, table)
        if table == "invalid":  # counted per evaluation: the same once added up
            mine = mine.group_by("label", "shape").agg(pl.col("count").sum(), pl.col("error").min())
            theirs = theirs.group_by("label", "shape").agg(
                pl.col("count").sum(), pl.col("error").min()
            )
            mine, theirs = mine.sort("label", "shape"), theirs.sort("label", "shape")
        assert mine.equals(theirs), table
    # ``each`` got each evaluation once, in name order, with exactly its answers
    assert [f["eval"].cast(pl.String).unique().to_list() for f in seen] == [
        [name] for name in sorted(SIZES)
    ]
    exported = pl.concat([scoring.export(f) for f in seen]).sort(KEYS)
    assert exported.equals(scoring.export(scored.answers).sort(KEYS))
    assert parts.answers.is_empty()


def test_breakdowns_need_every_answer_at_once(cache_dir: Path):
    with Cache(cache_dir, read_only=True) as cache, pytest.raises(ValueError, match="breakdown"):
        summarize(
            cache,
            SyntheticSuite(SIZES),
            _models(cache),
            None,
            breakdowns=True,
            each=lambda ans: None,
        )


def test_an_evaluation_given_twice_is_refused(cache_dir: Path):
    gold, categories = SyntheticSuite(SIZES).gold_frames()
    hle = gold.filter(pl.col("eval") == "hle_multichoice")
    with Cache(cache_dir, read_only=True) as cache:
        answers = cache.read_parts(
            lambda parts: scoring.answers(parts, _models(cache), hle, categories)
        )
    scorer = scoring.Scorer()
    scorer.add(answers)
    with pytest.raises(ValueError, match="hle_multichoice"):
        scorer.add(answers)


def test_the_answers_read_shard_by_shard_are_those_of_the_whole_scan(cache_dir: Path):
    gold, categories = SyntheticSuite(SIZES).gold_frames()
    with Cache(cache_dir, read_only=True) as cache:
        models = _models(cache)
        whole = cache.scan().collect()
        # shards of 87 rows (the nested one among them) and one of 25 newer rows: up to 200 rows
        # together
        for rows, n_parts in ((200, 3), (1, 6), (10**9, 1)):
            parts = cache.scan_parts(rows)
            assert len(parts) == n_parts
            assert pl.concat([p.collect() for p in parts], how="vertical_relaxed").equals(whole)
        for name in SIZES:
            mine = gold.filter(pl.col("eval") == name)
            apart = cache.read_parts(
                lambda rows, mine=mine: scoring.answers(rows, models, mine, categories)
            )
            whole = cache.read(
                lambda rows, mine=mine: scoring.answers(rows, models, mine, categories)
            )
            assert apart.height == whole.height == models.height * mine.height
            assert apart.equals(whole), name
            used = cache.read_parts(lambda rows, mine=mine: scoring.usage(rows, models, mine))
            assert used.equals(
                cache.read(lambda rows, mine=mine: scoring.usage(rows, models, mine))
            ), name
            if (
                name == "hle_multichoice"
            ):  # model 1's rows twice; the newer shard's (seed 5) are scored
                newer = pl.read_parquet(cache_dir / "shards" / "synthetic-zz.parquet")
                label = f"synthetic:{model_name(1)}"
                picks = apart.filter(pl.col("label") == label).select(
                    pl.col("task_id").cast(pl.String), "predicted"
                )
                expected = newer.select(
                    "task_id", pl.col("answer_predicted").list.first().alias("newer")
                )
                joined = picks.join(expected, on="task_id")
                assert (
                    joined.height == SIZES[name]
                    and joined["predicted"].eq_missing(joined["newer"]).sum() > 20
                )


def test_a_filter_on_the_cache_is_pushed_down_to_the_parquet_reader(cache_dir: Path):
    """The flat layout's derived ``answers`` column (a Python function) must not stop a filter at
    it: the reader then decoded every row of every shard for a filter that keeps a few."""
    with Cache(cache_dir, read_only=True) as cache:
        for part in [cache.scan(), *cache.scan_parts()]:
            plan = (
                part.filter(pl.col("task_id") == "hle_multichoice/h3")
                .select("task_id", "answers")
                .explain()
            )
            assert "FILTER" not in plan and "SELECTION" in plan, plan
        wanted = pl.col("task_id") == "hle_multichoice/h3"
        rows = cache.scan().filter(wanted).select("model", "answers").collect()
        everything = cache.scan().select("model", "task_id", "answers").collect()
    assert rows.height == 5 + 1  # every model's row, and model 1's newer one
    # the answers derived row by row: the same for the rows kept as for the same rows of the whole
    # scan
    assert rows.equals(everything.filter(wanted).drop("task_id"))


def test_a_damaged_shard_is_set_aside_by_a_read_in_parts_and_its_answers_are_missing(
    cache_dir: Path, tmp_path: Path
):
    copy = tmp_path / "cache"
    shutil.copytree(cache_dir, copy)
    shard = copy / "shards" / "synthetic-002.parquet"
    shard.write_bytes(shard.read_bytes()[:-100])  # the footer cut off
    gold, categories = SyntheticSuite(SIZES).gold_frames()
    hle = gold.filter(pl.col("eval") == "hle_multichoice")
    with Cache(cache_dir, read_only=True) as cache:
        models = _models(cache)  # model 2 still chosen: its answers are then missing, not left out
    with Cache(copy, read_only=True) as cache:  # read-only (dxi view): skipped, left in place
        skipped = cache.read_parts(lambda rows: scoring.answers(rows, models, hle, categories))
        assert any("synthetic-002.parquet" in w and "left in place" in w for w in cache.warnings)
    assert shard.exists()
    with Cache(copy) as cache:
        apart = cache.read_parts(lambda rows: scoring.answers(rows, models, hle, categories))
        assert any("synthetic-002.parquet" in w and "quarantine" in w for w in cache.warnings)
    assert not shard.exists() and len(list((copy / "quarantine").iterdir())) == 1
    with Cache(copy, read_only=True) as cache:
        assert apart.equals(cache.read(lambda rows: scoring.answers(rows, models, hle, categories)))
    assert skipped.equals(apart)
    mine = apart.filter(pl.col("label") == f"synthetic:{model_name(2)}")
    assert mine.height == hle.height and mine["status"].cast(pl.String).unique().to_list() == [
        "missing"
    ]
