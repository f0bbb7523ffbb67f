"""Data and cache integrity (issue 11): every task its own answer, and no damaged byte ever scored.

Datasets: a repeated task id, two tasks that send the same bytes, the raw cais/hle "Answer Choices:"
block, exclusion ids with ``:`` and ``#``, a malformed row found before the first request, an
evaluation whose every request failed. The cache: log lines that are JSON but not rows, bytes
flipped inside a shard's column chunks (footer intact), a panic in the reader, a cache that cannot
be written. Runs are in-process against the fake provider's System One responder (``InProcess``) or
its HTTP server."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import numpy as np
import orjson
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dxi import scoring
from dxi.adapters import Limits, ModelSpec
from dxi.cache import Cache, CacheWriteError, schema, verify
from dxi.evals import (
    PROMPT_VERSION,
    DatasetError,
    Exclusions,
    Suite,
    Task,
    discover,
    fetch,
    gold_frames,
    hle,
)
from dxi.runner.cli import main
from dxi.runner.outputs.files import score
from dxi.runner.sending.scheduler import run
from dxi.scoring import records
from dxi.scoring.sums import METRICS

from .conftest import FIXTURES, REAL_DATA
from .fakes.fake_provider import FakeProvider, InProcess
from .helpers.damage import column_chunks, damage
from .helpers.rows import read_only_files, row, sealed


class Counting(InProcess):
    """The in-process System One responder, counting the requests sent to it."""

    sent = 0

    async def send(self, request):
        Counting.sent += 1
        return await super().send(request)


def models_frame(adapter) -> pl.DataFrame:
    return pl.DataFrame(
        [adapter.identity.row(PROMPT_VERSION)], schema=scoring.MODELS_SCHEMA, orient="row"
    )


async def run_once(
    suite: Suite, cache_dir: Path, out: Path | None = None, adapter=None
) -> tuple[int, dict | None]:
    """Run ``suite`` on the counting responder; return the requests sent and, with ``out``, the
    summary."""
    adapter = adapter or Counting(
        ModelSpec("systemone", "m", "http://in-process"), Limits(max_in_flight=4)
    )
    await adapter.start()
    Counting.sent = 0
    with Cache(cache_dir) as cache:
        await run([adapter], suite, cache)
        summary = (
            records.to_builtins(score(cache, suite, models_frame(adapter), out, None))
            if out is not None
            else None
        )
    return Counting.sent, summary


def omniscience_rows(ids: list, distinct: bool = False) -> list[dict]:
    """The Omniscience fixture's 4 rows under ``ids`` (repeated in turn; ``distinct``: each question
    its own text)."""
    rows = [
        orjson.loads(line) for line in (FIXTURES / "omniscience.jsonl").read_bytes().splitlines()
    ]
    return [
        {**rows[i % len(rows)], "question_id": qid}
        | ({"question": f"{rows[i % len(rows)]['question']} ({i})"} if distinct else {})
        for i, qid in enumerate(ids)
    ]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return path


# ---- 1. repeated task ids ------------------------------------------------------------------------
def test_two_rows_with_one_task_id_are_an_error_naming_both_rows(tmp_path: Path):
    data = tmp_path / "data"
    write_jsonl(
        data / "omniscience" / "o.jsonl", omniscience_rows(["a", 1, "b", "1"])
    )  # 1 and "1": one id
    suite = Suite(discover(data))
    with pytest.raises(
        DatasetError,
        match=r"o\.jsonl, row 4, field 'question_id': task id "
        r"'aa_omniscience_decision/1' is also the id of row 2",
    ):
        suite.validate()
    (checked,) = [
        o for o in fetch.check(data) if o.eval == "aa_omniscience_decision"
    ]  # what `dxi data check` shows
    assert (
        checked.status == "failed"
        and "row 4" in checked.message
        and "also the id of row 2" in checked.message
    )
    assert main(["data", "check", "--data-dir", str(data)]) == 1


# ---- 2. tasks that send the same bytes -----------------------------------------------------------
async def test_renamed_ids_send_nothing_and_score_the_same(tmp_path: Path):
    """Omniscience and HLE requests do not carry the task id: renamed, every task maps to the row
    its request made. (When2Call's option order is drawn from the id, so renaming its ids changes
    its requests.)"""
    data = tmp_path / "data"
    write_jsonl(data / "omniscience" / "o.jsonl", omniscience_rows(["q1", "q2", "q3", "q4"]))
    (data / "hle").mkdir()
    shutil.copy(FIXTURES / "hle_split.json", data / "hle" / "hle.json")
    sent, first = await run_once(Suite(discover(data)), tmp_path / "cache", tmp_path / "out1")
    assert sent == 6
    write_jsonl(data / "omniscience" / "o.jsonl", omniscience_rows(["r1", "r2", "r3", "r4"]))
    hle_rows = orjson.loads((data / "hle" / "hle.json").read_bytes())
    (data / "hle" / "hle.json").write_bytes(
        orjson.dumps([{**r, "id": f"renamed-{r['id']}"} for r in hle_rows])
    )
    sent, again = await run_once(Suite(discover(data)), tmp_path / "cache", tmp_path / "out2")
    assert sent == 0
    for name in ("aa_omniscience_decision", "hle_multichoice"):
        assert again["models"][0]["evals"][name] == first["models"][0]["evals"][name]
        assert again["models"][0]["evals"][name]["missing"] == 0
    answers = pl.read_parquet(tmp_path / "out2" / "answers.parquet")
    assert (
        answers["task_id"].str.contains("/r|/renamed-").all() and (answers["status"] == "ok").all()
    )


async def test_two_questions_with_the_same_text_share_one_request_and_both_are_scored(
    tmp_path: Path,
):
    data = tmp_path / "data"
    rows = omniscience_rows(["q1", "q2", "q3", "q4"])
    rows.append(
        {**rows[0], "question_id": "q1-again", "correct_index": 3}
    )  # same text, its own gold
    write_jsonl(data / "omniscience" / "o.jsonl", rows)
    sent, summary = await run_once(Suite(discover(data)), tmp_path / "cache", tmp_path / "out")
    assert sent == 4  # the repeated question is one request
    block = summary["models"][0]["evals"]["aa_omniscience_decision"]
    assert (block["n"], block["missing"]) == (5, 0) and block["accuracy"] is not None
    answers = (
        pl.read_parquet(tmp_path / "out" / "answers.parquet")
        .filter(
            pl.col("task_id").is_in(
                ["aa_omniscience_decision/q1", "aa_omniscience_decision/q1-again"]
            )
        )
        .sort("task_id")
    )
    assert answers["predicted"][0] == answers["predicted"][1] and answers["gold"].to_list() == [
        "B",
        "D",
    ]
    assert answers["correct"].to_list() == [
        answers["predicted"][0] == "B",
        answers["predicted"][0] == "D",
    ]
    with Cache(tmp_path / "cache") as cache:
        usage = scoring.usage(
            cache.scan(),
            models_frame(Counting(ModelSpec("systemone", "m", "http://in-process"))),
            gold_frames(Suite(discover(data)).tasks())[0],
        )
    assert usage["requests"].to_list() == [4]  # the shared row is counted once


def test_rows_written_when_the_digest_covered_the_id_are_still_found(tmp_path: Path):
    task = next(
        iter(Suite(discover(None, {"hle_multichoice": FIXTURES / "hle_split.json"})).tasks())
    )
    answers = [
        {
            "question_id": "answer",
            "status": "ok",
            "predicted": "B",
            "p_predicted": None,
            "p_yes": None,
            "probabilities": None,
            "error": None,
            "warning": None,
        }
    ]
    old = row(
        "k-old",
        task_id=task.id,
        task_digest=task.id_digest,
        eval=task.eval,
        answers=answers,
        provider="systemone",
        model="m",
        endpoint="e",
        params="{}",
        prompt_version=PROMPT_VERSION,
    )
    with Cache(tmp_path) as cache:
        cache.append(old)
        models = pl.DataFrame(
            [("x", "systemone", "m", "e", "{}", PROMPT_VERSION)],
            schema=scoring.MODELS_SCHEMA,
            orient="row",
        )
        found = scoring.answers(cache.scan(), models, *gold_frames([task]))
    assert found.select("status", "predicted").rows() == [("ok", "B")]


# ---- 3. the raw cais/hle "Answer Choices:" block -------------------------------------------------
def raw_hle(rows: list[dict]) -> list[dict]:
    """Pre-split rows in the raw cais/hle form: body, then the block, one ``L. text`` line per
    choice."""
    return [
        {
            "id": r["id"],
            "question": r["question"]
            + "\n\nAnswer Choices:\n"
            + "\n".join(f"{letter}. {text}" for letter, text in r["choices"]),
            "answer": r["answer"],
            "answer_type": "multipleChoice",
            "image": "",
            "category": r.get("category"),
        }
        for r in rows
    ]


@pytest.mark.skipif(
    not (REAL_DATA / "hle" / "hle_mcqa.json").is_file(), reason="shared HLE data absent"
)
def test_every_real_hle_row_round_trips_through_the_raw_form(tmp_path: Path):
    split = REAL_DATA / "hle" / "hle_mcqa.json"
    raw = write_jsonl(tmp_path / "hle_raw.jsonl", raw_hle(orjson.loads(split.read_bytes())))
    expected, parsed = list(hle.load(split)), list(hle.load(raw))
    assert len(parsed) == len(expected) == 513
    for want, got in zip(expected, parsed, strict=True):
        assert (got.id, got.state, got.gold) == (want.id, want.state, want.gold)
        assert got.questions[0].options == want.questions[0].options, got.id
    tricky = next(t for t in parsed if t.id == "hle_multichoice/67219b2486e95ac1054387bc")
    assert (
        len(tricky.questions[0].options) == 18
    )  # "P: ...", "Q: ..." lines stay inside their choices


@pytest.mark.parametrize(
    ("block", "choices"),
    [
        (
            "A) one\nB) two\n\nstill two\nC) three",
            [("A", "one"), ("B", "two\n\nstill two"), ("C", "three")],
        ),
        ("A: x\nB: y", [("A", "x"), ("B", "y")]),
        (
            "\nA. P: a premise\nQ: another\n\nP ∧ Q\nB. no",
            [("A", "P: a premise\nQ: another\n\nP ∧ Q"), ("B", "no")],
        ),
    ],
)
def test_the_block_is_read_with_its_own_delimiter_and_texts_stay_whole(block: str, choices: list):
    body, found = hle.split_choices(Path("f.jsonl"), 3, f"Body?\n\nAnswer Choices:\n{block}")
    assert (body, found) == ("Body?", choices)


def test_only_hles_own_marker_opens_the_block_not_answer_choices_in_lowercase_inside_a_choice():
    """cais/hle writes the marker "Answer Choices:"; a choice's text that says "answer choices:" in
    lowercase (real choices say "None of the other answer choices are correct") is text, not a
    second marker."""
    block = "A. one\nB. none of these answer choices: all are wrong\nC. three"
    body, found = hle.split_choices(
        Path("f.jsonl"), 3, f"Which of the answer choices: is right?\n\nAnswer Choices:\n{block}"
    )
    assert body == "Which of the answer choices: is right?"
    assert found == [
        ("A", "one"),
        ("B", "none of these answer choices: all are wrong"),
        ("C", "three"),
    ]
    with pytest.raises(DatasetError, match="without an 'Answer Choices:' block"):
        hle.split_choices(Path("f.jsonl"), 3, "Body?\n\nanswer choices:\nA. x\nB. y")


@pytest.mark.parametrize(
    ("block", "problem"),
    [
        (
            "A. a\nB. b\nD. d\nE. e",
            "after choice 'B' a line reads as choice 'D'",
        ),  # a skipped letter
        (
            "A: a\nP: premise\nB: b",
            "after choice 'A' a line reads as choice 'P'",
        ),  # text that reads as a choice
        ("B. b\nC. c", "does not start with choice 'A'"),
    ],
)
def test_a_block_that_cannot_be_read_unambiguously_is_an_error_naming_the_row(
    block: str, problem: str
):
    with pytest.raises(DatasetError, match=rf"f\.jsonl, row 3, field 'question': .*{problem}"):
        hle.split_choices(Path("f.jsonl"), 3, f"Body?\n\nAnswer Choices:\n{block}")


# ---- 4. exclusion ids with ':' and '#' -----------------------------------------------------------
def test_ids_with_a_colon_or_a_hash_can_be_excluded(tmp_path: Path):
    data = tmp_path / "data"
    write_jsonl(data / "omniscience" / "o.jsonl", omniscience_rows(["q:1", "q#2", "q3", "q4"]))
    listing = tmp_path / "exclude.txt"
    listing.write_text(
        "# a comment line\naa_omniscience_decision/q:1\naa_omniscience_decision/q#2  # after a space\n"
        "q3:answer\t# one question of q3 (its only one)\nq4:nosuchquestion\n"
    )
    suite = Suite(discover(data), Exclusions.read(listing, "aa_omniscience_decision"))
    assert [t.id for t in suite.tasks()] == ["aa_omniscience_decision/q4"]
    assert suite.data_block()["aa_omniscience_decision"]["excluded"] == {"listed": 4, "matched": 3}


# ---- 5. validate before sending; in-flight requests finish ---------------------------------------
async def test_a_malformed_row_at_the_end_is_found_before_the_first_request(tmp_path: Path):
    data = tmp_path / "data"
    rows = omniscience_rows([f"q{i}" for i in range(40)])
    rows[-1]["correct_index"] = 7
    write_jsonl(data / "omniscience" / "o.jsonl", rows)
    with pytest.raises(DatasetError, match="row 40, field 'correct_index'"):
        await run_once(Suite(discover(data)), tmp_path / "cache")
    assert Counting.sent == 0


class Breaking(Suite):
    """A suite whose stream fails after ``after`` tasks (as if its file changed after it was
    checked)."""

    def __init__(self, data: dict, after: int):
        super().__init__(data)
        self.after = after

    def tasks(self, name: str | None = None):
        for i, task in enumerate(super().tasks(name)):
            if i == self.after:
                raise DatasetError("o.jsonl", i + 1, "question", "changed under the run")
            yield task


async def test_an_error_that_stops_a_run_lets_the_requests_in_flight_finish_and_be_stored(
    tmp_path: Path,
):
    data = tmp_path / "data"
    write_jsonl(
        data / "omniscience" / "o.jsonl",
        omniscience_rows([f"q{i}" for i in range(200)], distinct=True),
    )
    async with FakeProvider(
        model="fake", latency="uniform:0.01:0.3"
    ) as server:  # replies in flight at the error
        from dxi import adapters

        adapter = adapters.get(f"systemone:fake@{server.url}", Limits(max_in_flight=16))
        await adapter.start()
        try:
            with (
                Cache(tmp_path / "cache") as cache,
                pytest.raises(DatasetError, match="changed under the run"),
            ):
                await run([adapter], Breaking(discover(data), after=60), cache)
        finally:
            await adapter.close()
        stats = server.stats()
    stored = Cache(tmp_path / "cache").scan().collect()
    assert (
        stats["ok"] >= 16 and stored.height == stats["ok"] == stats["arrivals"]
    )  # every reply sent is kept


# ---- 6. an evaluation whose every request failed -------------------------------------------------
async def test_every_request_failed_gives_null_metrics_with_the_reason_and_no_index(
    tmp_path: Path, data_dir: Path
):
    # every reply a 500 with one attempt: each request stored as a failure (a 401 would stop the
    # provider instead, leaving the requests unsent: tests/test_provider_faults.py)
    async with FakeProvider(model="fake", default="500") as server:
        from dxi import adapters

        adapter = adapters.get(
            f"systemone:fake@{server.url}", Limits(max_in_flight=4, max_attempts=1)
        )
        await adapter.start()
        try:
            with Cache(tmp_path / "cache") as cache:
                suite = Suite(discover(data_dir))
                stats = await run([adapter], suite, cache)
                summary = records.to_builtins(
                    score(cache, suite, models_frame(adapter), tmp_path / "out", None)
                )
        finally:
            await adapter.close()
    assert stats[adapter.label].failed == stats[adapter.label].sent == 12
    model = summary["models"][0]
    assert model["decision_index"] is None and model["decision_index_ci"] is None
    for name, block in model["evals"].items():
        assert block["reason"].startswith("every request failed"), name
        assert all(block[m] is None for m in METRICS[name]) and block["failed"] > 0


# ---- 7. log lines that are JSON but not rows -----------------------------------------------------
def test_a_logged_line_that_is_json_but_not_a_row_is_dropped_and_the_log_kept(tmp_path: Path):
    (tmp_path / "wal").mkdir()
    good = [row(k) for k in ("a" * 64, "b" * 64, "c" * 64)]
    lines = [
        sealed(good[0]),
        b"{}",
        sealed(good[1]),
        sealed({**good[2], "key": None}),
        sealed({**good[2], "key": "d" * 64, "status": "bogus"}),
        sealed({**good[2], "key": " "}),
        sealed(good[2]),
    ]
    (tmp_path / "wal" / "1-1-dead.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    cache = Cache(tmp_path)
    assert any("line(s) 2, 4, 5, 6 hold no cache row" in w for w in cache.warnings)
    assert cache.has_many(["a" * 64, "b" * 64, "c" * 64, "d" * 64]) == [True, True, True, False]
    assert len(list(tmp_path.glob("quarantine/1-1-dead.jsonl.*"))) == 1
    assert cache.scan().collect()["key"].to_list() == ["a" * 64, "b" * 64, "c" * 64]
    assert cache._keys()._keys.dtype == np.uint64 and len(cache) == 3
    (tmp_path / "wal" / "2-2-dead.jsonl").write_bytes(
        b"[1, 2, 3]\n" + sealed({**row("f" * 64), "key": 5}) + b"\n" + sealed(row("e" * 64)) + b"\n"
    )
    again = Cache(tmp_path)
    for n in (1, 2):
        assert any(
            f"2-2-dead.jsonl line {n} is corrupt or holds no cache row" in w for w in again.warnings
        )
    assert again.has("e" * 64) and len(again) == 4


def test_a_row_without_a_key_in_an_old_shard_never_reaches_the_key_index(tmp_path: Path):
    (tmp_path / "shards").mkdir(parents=True)
    table = pl.DataFrame(
        [row("a" * 64), row("b" * 64)], schema=pl.from_arrow(schema.SCHEMA.empty_table()).schema
    )
    table = table.with_columns(
        pl.when(pl.col("key") == "a" * 64).then(None).otherwise(pl.col("key")).alias("key")
    )
    pq.write_table(table.to_arrow().cast(schema.SCHEMA), tmp_path / "shards" / "old.parquet")
    cache = Cache(tmp_path)
    assert cache.has("b" * 64) and len(cache) == 1 and cache._keys()._keys.dtype == np.uint64


# ---- 8. bytes flipped inside a shard, its footer intact ------------------------------------------
@pytest.mark.slow
async def test_a_flipped_byte_in_any_column_chunk_is_never_scored(tmp_path: Path, data_dir: Path):
    suite = Suite(discover(data_dir))
    adapter = Counting(ModelSpec("systemone", "m", "http://in-process"), Limits(max_in_flight=4))
    pristine = tmp_path / "pristine"
    sent, _ = await run_once(suite, pristine, adapter=adapter)
    (shard,) = pristine.glob("shards/*.parquet")
    n_rows = pq.ParquetFile(shard).metadata.num_rows
    gold, categories = gold_frames(suite.tasks())
    models = models_frame(adapter)

    def answers(cache: Cache) -> pl.DataFrame:
        return scoring.export(
            cache.read(lambda rows: scoring.answers(rows, models, gold, categories))
        )

    with Cache(pristine) as cache:
        baseline = answers(cache)
    assert (baseline["status"] == "ok").all() and sent == n_rows == 12
    rng = random.Random(11)
    outcomes = {"unchanged": 0, "quarantined": 0}
    for name, start, size in column_chunks(shard):
        for _ in range(2):
            trial = tmp_path / "trial"
            shutil.rmtree(trial, ignore_errors=True)
            shutil.copytree(pristine, trial)
            (damaged,) = trial.glob("shards/*.parquet")
            data = bytearray(damaged.read_bytes())
            at = start + rng.randrange(max(1, size - 4))
            for k in range(4):
                data[at + k] ^= 0xFF
            damaged.write_bytes(bytes(data))
            Counting.sent = 0
            with Cache(
                trial
            ) as cache:  # scored, then run on the same cache: its key index must agree
                scored = answers(cache)
                await run([adapter], suite, cache)
            resent = Counting.sent
            if not list(trial.glob("quarantine/*")):
                assert scored.equals(baseline) and resent == 0, (name, at)
                outcomes["unchanged"] += 1
                continue
            # set aside: never scored (its answers are missing, none changed), its requests sent
            # again
            changed = scored.filter(pl.col("status") != "missing")
            assert changed.equals(
                baseline.join(
                    changed.select("task_id", "question_id"),
                    on=["task_id", "question_id"],
                    how="semi",
                )
            ), (name, at)
            assert resent == n_rows, (name, at)
            with Cache(trial) as cache:
                assert answers(cache).equals(baseline), (name, at)
            outcomes["quarantined"] += 1
    assert outcomes["quarantined"] > len(
        column_chunks(shard)
    )  # most flips are caught by the page checksums


# ---- 9. a panic in the reader --------------------------------------------------------------------
def test_a_panic_while_reading_a_shard_sets_the_shard_aside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    with Cache(tmp_path) as cache:
        cache.append(row("a" * 64))
    with Cache(tmp_path) as cache:
        cache.append(row("b" * 64))
    poisoned = sorted(tmp_path.glob("shards/*.parquet"))[0]
    real_scan = verify.scan

    def scan(
        shards,
    ):  # Polars reads the shards; it surfaces a Rust panic as PanicException (a BaseException)
        if poisoned in shards:
            raise pl.exceptions.PanicException("called `Option::unwrap()` on a `None` value")
        return real_scan(shards)

    monkeypatch.setattr(verify, "scan", scan)
    cache = Cache(tmp_path)
    assert (cache.has("a" * 64), cache.has("b" * 64)) == (False, True)
    assert any("PanicException" in w and "quarantine" in w for w in cache.warnings)
    assert [p.name.split(".parquet")[0] for p in tmp_path.glob("quarantine/*")] == [poisoned.stem]
    calls = []

    def query(rows: pl.LazyFrame) -> int:
        calls.append(1)
        if len(calls) == 1:
            raise pl.exceptions.PanicException("index out of bounds")
        return rows.collect().height

    with pytest.raises(
        pl.exceptions.PanicException
    ):  # no shard is damaged: the panic is the query's own
        Cache(tmp_path).read(query)


def test_an_error_in_a_query_itself_propagates_unchanged_and_sets_nothing_aside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    for key in ("a" * 64, "b" * 64):
        with Cache(tmp_path) as cache:
            cache.append(row(key))
    shards = sorted(tmp_path.glob("shards/*.parquet"))
    checked = []
    real_check = verify.check
    monkeypatch.setattr(
        verify,
        "check",
        lambda shard, columns=None: checked.append(shard) or real_check(shard, columns),
    )
    cache = Cache(tmp_path)
    assert (
        cache.read(lambda rows: rows.collect().height) == 2 and checked == []
    )  # intact: read, never re-read

    def raising(error: BaseException):
        def query(rows: pl.LazyFrame):
            rows.collect()
            raise error

        return query

    bugs = [
        KeyError("label"),
        ZeroDivisionError("division by zero"),
        TypeError("unhashable type: 'list'"),
        pl.exceptions.ColumnNotFoundError("no_such_column"),
        pl.exceptions.SchemaError("bad cast"),
        PermissionError(13, "Permission denied"),
        MemoryError(),
    ]
    for bug in bugs:
        with pytest.raises(type(bug)) as raised:
            cache.read(raising(bug))
        assert raised.value is bug, bug  # the very error, not a copy or a wrapper
    with pytest.raises(
        pl.exceptions.ColumnNotFoundError, match="no_such_column"
    ):  # a real query with a bug
        cache.read(lambda rows: rows.select(pl.col("no_such_column")).collect())
    assert (
        checked == []
        and not list(tmp_path.glob("quarantine/*"))
        and sorted(tmp_path.glob("shards/*.parquet")) == shards
    )

    # a Polars error that damage also raises: every shard is read again, none is damaged, the error
    # is the query's
    bug = pl.exceptions.ComputeError("conversion from `str` to `i64` failed")
    with pytest.raises(pl.exceptions.ComputeError) as raised:
        cache.read(raising(bug))
    assert raised.value is bug and checked == shards and not list(tmp_path.glob("quarantine/*"))

    # reading a shard again fails with an error that is not damage (memory runs out): it propagates,
    # nothing is moved
    def no_memory(*args, **kwargs):
        raise MemoryError()

    monkeypatch.setattr(verify.pq, "read_table", no_memory)
    with pytest.raises(MemoryError):
        cache.read(raising(pl.exceptions.ComputeError("conversion failed")))
    assert (
        not list(tmp_path.glob("quarantine/*"))
        and sorted(tmp_path.glob("shards/*.parquet")) == shards
    )
    assert cache.warnings == [] and cache.has("a" * 64) and cache.has("b" * 64)


def test_what_damage_raises_is_told_from_what_it_does_not():
    damage = [
        verify._Damaged("crc"),
        OSError("Couldn't deserialize thrift: TProtocolException: Invalid data"),
        pa.ArrowInvalid("Parquet magic bytes not found in footer"),
        pl.exceptions.ComputeError("parquet: File out of specification: Invalid thrift: bad data"),
        pl.exceptions.InvalidOperationError(
            "unable to decode the encoded schema stored in ARROW:schema"
        ),
        pl.exceptions.PanicException("assertion failed: offset + length <= self.length"),
    ]
    others = [
        FileNotFoundError(2, "No such file or directory"),
        PermissionError(13, "Permission denied"),
        OSError(28, "No space left on device"),
        MemoryError(),
        KeyError("x"),
        ValueError("x"),
        pl.exceptions.ColumnNotFoundError("x"),
        pl.exceptions.SchemaError("x"),
        KeyboardInterrupt(),
    ]
    assert [verify.is_damage(e) for e in damage] == [True] * 6
    assert [verify.is_damage(e) for e in others] == [False] * 9


# ---- 10. a cache that cannot be written ----------------------------------------------------------
async def test_a_read_only_cache_is_found_before_the_first_request(
    tmp_path: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    sent, _ = await run_once(Suite(discover(data_dir), limit=1), tmp_path / "cache")
    assert sent == 4
    read_only_files(monkeypatch)
    assert (await run_once(Suite(discover(data_dir), limit=1), tmp_path / "cache"))[
        0
    ] == 0  # nothing to write
    with pytest.raises(
        CacheWriteError, match=f"cannot create a file in {tmp_path / 'cache' / 'wal'}"
    ):
        await run_once(Suite(discover(data_dir)), tmp_path / "cache")
    assert Counting.sent == 0


def test_tasks_are_frozen_records(
    data_dir: Path,
):  # the digest covers what a model is shown, not the id
    task = next(iter(Suite(discover(data_dir)).tasks("hle_multichoice")))
    renamed = Task(f"{task.id}-other", task.eval, task.state, task.questions, task.gold, task.meta)
    assert renamed.digest == task.digest and renamed.id_digest != task.id_digest


# ---- 10. what was set aside is told: never "interrupted" or "not in the cache" -------------------
def test_answers_of_a_shard_set_aside_are_told_as_such_with_exact_counts(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
):
    from .helpers.runs import run_plan

    cache = tmp_path / "cache"
    assert run_plan(data_dir, tmp_path, limit=2).exit_code == 0  # the first shard: 2 tasks each
    assert run_plan(data_dir, tmp_path, all_tasks=True).exit_code == 0  # the rest: a second shard
    first = sorted(cache.glob("shards/*.parquet"))[0]
    assert pq.ParquetFile(first).metadata.num_rows == 8
    damage(first)
    args = ["--data-dir", str(data_dir), "--cache-dir", str(cache), "--all-tasks"]
    assert main(["score", *args, "--out", str(tmp_path / "scored"), "-q"]) == 1  # provisional
    assert [p.name.split(".parquet")[0] for p in cache.glob("quarantine/*")] == [first.stem]
    summary = orjson.loads((tmp_path / "scored" / "summary.json").read_bytes())
    (entry,) = summary["models"]
    # 2 tasks of each evaluation were in the shard: 2 answers each, WildGuardTest 2 rows × 3
    expected = {
        "aa_omniscience_decision": 2,
        "hle_multichoice": 2,
        "when2call": 2,
        "wildguardtest": 6,
    }
    told = (
        "set aside as damaged (the cache found their rows unreadable and moved them to "
        f"{cache}/quarantine/): they are not scored, and `dxi run` with --all-tasks requests "
        "them again"
    )
    for eval_name, n in expected.items():
        block = entry["evals"][eval_name]
        assert (block["missing"], block["set_aside"], block["rerun"]) == (n, n, n), eval_name
        reason = block["reason"].split("; f1_")[0]  # an undefined F1's reason may follow
        tasks = ", of 2 task(s)," if eval_name == "wildguardtest" else ""  # its answers' tasks
        assert reason == f"{n} answer(s){tasks} not in the cache: {told}", eval_name
    out = capsys.readouterr().out
    assert (
        "12 missing answer(s) in AA-Omniscience-Decision, HLE-MultiChoice, When2Call, "
        "WildGuardTest, left out (12 of the missing set aside as damaged by the cache): its "
        "figures are over the answered questions"
    ) in out
    assert "(interrupted" not in out
    # the dry run says why they are new
    capsys.readouterr()
    assert main(["estimate", *args, "--model", "embedded", "--json"]) == 0
    (model,) = orjson.loads(capsys.readouterr().out)["models"]
    assert (model["new"], model["reasons"]) == (8, {"set aside as damaged": 8})
    # the next run sends them again: complete, nothing told
    assert run_plan(data_dir, tmp_path, all_tasks=True).exit_code == 0
    assert main(["score", *args, "--out", str(tmp_path / "again"), "-q"]) == 0
    (entry,) = orjson.loads((tmp_path / "again" / "summary.json").read_bytes())["models"]
    assert all("set_aside" not in b and b["complete"] for b in entry["evals"].values())


def test_missing_answers_beside_those_set_aside_keep_their_own_reason(
    data_dir: Path, tmp_path: Path
):
    from .helpers.runs import run_plan

    cache = tmp_path / "cache"
    assert run_plan(data_dir, tmp_path, limit=1).exit_code == 0
    assert run_plan(data_dir, tmp_path, limit=2).exit_code == 0
    first = sorted(cache.glob("shards/*.parquet"))[0]
    damage(first)
    # scored over 3 tasks: 1 set aside, 1 cached, 1 never sent (Omniscience)
    args = ["--data-dir", str(data_dir), "--cache-dir", str(cache), "--limit", "3"]
    assert main(["score", *args, "--out", str(tmp_path / "scored"), "-q"]) == 1
    (entry,) = orjson.loads((tmp_path / "scored" / "summary.json").read_bytes())["models"]
    block = entry["evals"]["aa_omniscience_decision"]
    assert (block["missing"], block["set_aside"]) == (2, 1)
    assert block["reason"] == (
        "2 answer(s) not in the cache: 1 set aside as damaged (the cache found their rows "
        f"unreadable and moved them to {cache}/quarantine/): they are not scored, and `dxi run` "
        "with --limit 3 requests them again; the other 1: this model's runs selected --limit 2 "
        "here, not --limit 3; score with --limit 2 to see what they answered, or `dxi run` with "
        "--limit 3 to send what is missing"
    )


def test_a_shard_set_aside_whose_requests_cannot_be_read_is_named_as_a_possible_cause(
    data_dir: Path, tmp_path: Path
):
    from .helpers.runs import run_plan

    cache = tmp_path / "cache"
    assert run_plan(data_dir, tmp_path, limit=2).exit_code == 0
    assert run_plan(data_dir, tmp_path, all_tasks=True).exit_code == 0
    first = sorted(cache.glob("shards/*.parquet"))[0]
    first.write_bytes(first.read_bytes()[:-100])  # its footer cut off: no column can be read
    args = ["--data-dir", str(data_dir), "--cache-dir", str(cache), "--all-tasks"]
    assert main(["score", *args, "--out", str(tmp_path / "scored"), "-q"]) == 1
    (entry,) = orjson.loads((tmp_path / "scored" / "summary.json").read_bytes())["models"]
    block = entry["evals"]["hle_multichoice"]
    assert (block["missing"], "set_aside" in block) == (2, False)
    # (not "or it ran other tasks": the runs recorded selected every task, what is scored)
    assert block["reason"] == (
        "2 answer(s) not in the cache: the run is incomplete (interrupted, or its rows were in one "
        "of 1 damaged shard(s) whose requests cannot be told: the cache moved them to "
        f"{cache}/quarantine/, or it ran fewer epochs than scored here); `dxi run` with "
        "--all-tasks sends what is missing"
    )
