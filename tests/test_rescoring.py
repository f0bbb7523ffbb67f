"""Cache-only rescoring of a synthetic cache: the vectorised scorer agrees with a plain row-by-row
one, the newest row of a request wins, rows of other prompt versions or changed tasks are ignored,
the order of rows changes nothing, and each answer's error comes from where it should."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from benchmarks.bench_scoring import plain_index
from dxi import scoring
from dxi.cache import Cache
from dxi.cache.layout import read_nested
from dxi.cache.schema import SCHEMA
from dxi.evals import PROMPT_VERSION, gold_frames
from dxi.scoring.pipeline import NO_ANSWER
from tests.helpers.synthetic import model_name, suite, write_cache

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
    assert write_cache(tmp_path, tasks, 4, invalid_rate=0.05, failed_rate=0.05) == 4 * (
        30 + 25 + 20 + 3 * 12
    )
    shards = sorted(tmp_path.glob("shards/*.parquet"))
    plain = plain_index(shards, tasks, [model_name(m) for m in range(4)])
    vectorised = index_of(rescore(tmp_path, tasks))
    assert vectorised.keys() == plain.keys() and all(
        vectorised[k] == pytest.approx(plain[k], abs=1e-9) for k in plain
    )


@pytest.mark.slow
def test_with_answers_missing_the_vectorised_and_plain_scorers_agree(tmp_path: Path):
    # every 7th task never cached (a stopped run): left out, provisional
    tasks = suite(SIZES)
    written = [t for i, t in enumerate(tasks) if i % 7]
    write_cache(tmp_path, written, 3, invalid_rate=0.05, failed_rate=0.1)
    plain = plain_index(
        sorted(tmp_path.glob("shards/*.parquet")), tasks, [model_name(m) for m in range(3)]
    )
    vectorised = index_of(rescore(tmp_path, tasks))
    assert vectorised.keys() == plain.keys() and all(v is not None for v in plain.values())
    assert all(vectorised[k] == pytest.approx(plain[k], abs=1e-9) for k in plain)
    # the figures are over the answered questions: scoring only the tasks written gives the same
    answered = index_of(rescore(tmp_path, written))
    assert all(vectorised[k] == pytest.approx(answered[k], abs=1e-9) for k in plain)


@pytest.mark.slow
def test_the_newest_final_row_wins_and_stale_rows_are_ignored(tmp_path: Path):
    tasks = suite(SIZES)
    # every row final (no transient failure written): model 1's rows given to model 0 replace all of
    # its own
    write_cache(tmp_path, tasks, 2, failed_rate=0.0)
    before = index_of(rescore(tmp_path, tasks))
    first, second = f"synthetic:{model_name(0)}", f"synthetic:{model_name(1)}"
    shard = pl.from_arrow(
        read_nested(tmp_path / "shards" / "synthetic-000.parquet", SCHEMA.names)
    )  # flat on disk
    failed = shard.with_columns(
        pl.lit("failed").alias("status"),
        pl.lit("HTTP 500").alias("error"),
        pl.lit("transient").alias("error_kind"),
        pl.col("answers").list.head(0),
    )
    # model 1's replies, as model 0's rows: the same requests (configuration, task content, epoch),
    # other answers
    replies = pl.from_arrow(
        read_nested(tmp_path / "shards" / "synthetic-001.parquet", SCHEMA.names)
    ).with_columns(pl.lit(model_name(0)).alias("model"))

    def add(name: str, frame: pl.DataFrame) -> None:
        pq.write_table(frame.to_arrow().cast(SCHEMA), tmp_path / "shards" / f"{name}.parquet")

    add("older", replies.with_columns(pl.col("created_at") - 100))  # older: ignored
    add(
        "old-prompt",
        replies.with_columns(
            pl.lit("dxi-prompt-0").alias("prompt_version"), pl.col("created_at") + 100
        ),
    )  # other prompt version
    add(
        "changed-task",
        replies.with_columns(pl.lit("0" * 64).alias("task_digest"), pl.col("created_at") + 100),
    )  # task content changed
    assert index_of(rescore(tmp_path, tasks)) == before
    # a transient failure never replaces a final row, however far ahead its clock was (issue 32)
    add("transient-a-day-ahead", failed.with_columns(pl.col("created_at") + 86_400))
    assert index_of(rescore(tmp_path, tasks)) == before
    add("newer", replies.with_columns(pl.col("created_at") + 100))  # newer final rows: win
    after = index_of(rescore(tmp_path, tasks))
    assert after[first] == before[second] != before[first] and after[second] == before[second]
    plain = plain_index(
        sorted(tmp_path.glob("shards/*.parquet")), tasks, [model_name(0), model_name(1)]
    )
    assert plain == after


def test_the_order_of_rows_in_the_cache_does_not_change_a_single_bit(tmp_path: Path):
    """Two runs on one cache interleave their rows differently; sums of probabilities must not
    depend on it."""
    tasks = suite(SIZES)
    write_cache(tmp_path / "a", tasks, 3, invalid_rate=0.05, failed_rate=0.05)
    rows = pl.concat(
        [
            pl.from_arrow(read_nested(p, SCHEMA.names))
            for p in sorted((tmp_path / "a").glob("shards/*.parquet"))
        ]
    )
    (tmp_path / "b" / "shards").mkdir(parents=True)
    pq.write_table(
        rows.sample(fraction=1.0, shuffle=True, seed=5).to_arrow().cast(SCHEMA),
        tmp_path / "b" / "shards" / "shuffled.parquet",
    )
    gold, categories = gold_frames(tasks)
    scored = []
    for name in ("a", "b"):
        with Cache(tmp_path / name) as cache:
            models = scoring.models_in_cache(cache.scan(), PROMPT_VERSION)
            scored.append(
                scoring.score(
                    scoring.answers(cache.scan(), models, gold, categories),
                    scoring.Bootstrap(resamples=50),
                )
            )
    ordered, shuffled = scored
    for name, table in ordered.tables().items():
        assert table.equals(shuffled.tables()[name]), name
    assert not ordered.calibration.is_empty() and not ordered.reliability.is_empty()


def test_each_answer_gets_its_own_error_else_its_rows_else_no_answer_and_an_ok_answer_none(
    tmp_path: Path,
):
    tasks = suite({"hle_multichoice": 4, "wildguardtest": 1})
    by_id = {t.id: t for t in tasks}

    def answer(
        question: str, status: str | None, predicted: str | None = None, error: str | None = None
    ) -> dict:
        return {
            "question_id": question,
            "status": status,
            "predicted": predicted,
            "p_predicted": None,
            "p_yes": None,
            "probabilities": None,
            "error": error,
            "warning": None,
        }

    def cache_row(task_id: str, status: str, error: str | None, answers: list[dict]) -> dict:
        task = by_id[task_id]
        return {
            "key": task_id,
            "provider": "synthetic",
            "model": "m",
            "endpoint": "synthetic",
            "params": "{}",
            "sample": 0,
            "prompt_version": PROMPT_VERSION,
            "eval": task.eval,
            "task_id": task_id,
            "task_digest": task.digest,
            "status": status,
            "error": error,
            "created_at": 1.0,
            "answers": answers,
        }

    h = [t.id for t in tasks if t.eval == "hle_multichoice"]
    wild = next(t.id for t in tasks if t.eval == "wildguardtest")
    rows = [
        cache_row(h[0], "ok", None, [answer("answer", "ok", by_id[h[0]].gold["answer"])]),
        cache_row(
            h[1], "invalid", "reply was prose", [answer("answer", "invalid")]
        ),  # the row's error
        cache_row(h[2], "invalid", None, [answer("answer", None)]),  # no status, no error
        cache_row(h[3], "failed", "HTTP 500", []),
        # the row's error is its invalid answers' (adapters.base.Reply.error): never an ok sibling's
        cache_row(
            wild,
            "invalid",
            "response_refusal: not yes or no",
            [
                answer("prompt_harmful", "ok", "yes"),
                answer("response_refusal", "invalid", error="not yes or no"),
            ],
        ),
    ]
    (tmp_path / "shards").mkdir()
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), tmp_path / "shards" / "hand.parquet")
    gold, categories = gold_frames(tasks)
    with Cache(tmp_path) as cache:
        models = scoring.models_in_cache(cache.scan(), PROMPT_VERSION)
        got = scoring.export(scoring.answers(cache.scan(), models, gold, categories))
    assert got.select("task_id", "question_id", "status", "error").rows() == [
        (h[0], "answer", "ok", None),
        (h[1], "answer", "invalid", "reply was prose"),
        (h[2], "answer", "invalid", NO_ANSWER),
        (h[3], "answer", "failed", "HTTP 500"),
        (wild, "prompt_harmful", "ok", None),
        (
            wild,
            "response_harmful",
            "invalid",
            "response_refusal: not yes or no",
        ),  # not in the reply: the row's
        (wild, "response_refusal", "invalid", "not yes or no"),
    ]
