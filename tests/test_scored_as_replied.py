"""An answer read from the cache is scored ``ok`` only if the adapters would have accepted it from a
provider (``scoring.pipeline._as_replied``): its answer one of its question's allowed answers, its
probabilities in [0, 1]. Trial 9: rows an older version stored in a shard with ``predicted: "ZZZ"``,
a null answer or ``p_predicted: NaN`` were written to answers.parquet as ``ok``. The cache is the
committed old shard of tests/test_layout.py, three of its answers edited as damage would."""

from __future__ import annotations

import math
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from dxi import scoring
from dxi.cache import SCHEMA, Cache
from dxi.evals import PROMPT_VERSION, gold_frames
from tests.helpers.synthetic import suite

FIXTURE = Path(__file__).parent / "fixtures" / "cache-layout1"
TASKS = suite(
    dict.fromkeys(("aa_omniscience_decision", "hle_multichoice", "when2call", "wildguardtest"), 4)
)
KEY = ["model", "eval", "task_id", "question_id", "sample"]


def exported(root: Path) -> pl.DataFrame:
    gold, categories = gold_frames(TASKS)
    with Cache(root) as cache:
        models = scoring.models_in_cache(cache.scan(), PROMPT_VERSION)
        answers = cache.read(lambda rows: scoring.answers(rows, models, gold, categories))
    return scoring.export(answers).with_columns(pl.col(c).cast(pl.String) for c in KEY[:4])


def test_answers_no_adapter_would_accept_are_invalid_and_the_rest_unchanged(tmp_path: Path):
    before = exported(FIXTURE)
    rows = pq.read_table(FIXTURE / "shards" / "nested.parquet").to_pylist()
    assert (rows[5]["task_id"], rows[5]["answers"][0]["predicted"]) == ("hle_multichoice/h1", "D")
    rows[5]["answers"][0]["predicted"] = "ZZZ"
    assert rows[9]["task_id"] == "when2call/u1"
    rows[9]["answers"][0]["p_predicted"] = math.nan
    assert rows[15]["task_id"] == "wildguardtest/3"
    rows[15]["answers"][0]["probabilities"][0]["p"] = 7.0
    root = tmp_path / "cache"
    (root / "shards").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), root / "shards" / "nested.parquet")
    after = exported(root)
    changed = after.join(before, on=KEY, suffix="_before").filter(
        pl.col("status") != pl.col("status_before")
    )
    assert changed.select(*KEY[1:3], "status", "error", "status_before").rows() == [
        (
            "hle_multichoice",
            "hle_multichoice/h1",
            "invalid",
            "read from the cache as ZZZ, which is not one of the allowed answers "
            f"({', '.join(TASKS[5].questions[0].answer_ids)}): damaged",
            "ok",
        ),
        (
            "when2call",
            "when2call/u1",
            "invalid",
            "read from the cache with a probability not in [0, 1]: damaged",
            "ok",
        ),
        (
            "wildguardtest",
            "wildguardtest/3",
            "invalid",
            "read from the cache with a probability not in [0, 1]: damaged",
            "ok",
        ),
    ]
    assert changed.select("predicted", "p_predicted").rows() == [(None, None)] * 3
    same = after.join(changed.select(KEY), on=KEY, how="anti")
    assert same.height == before.height - 3
    assert same.sort(KEY).equals(before.join(changed.select(KEY), on=KEY, how="anti").sort(KEY))
