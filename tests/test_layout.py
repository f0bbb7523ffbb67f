"""The shards' answer layouts (cache.layout): new shards are flat, old nested shards read without
migration and score exactly as their flat rewrite does, mixed freely in one cache, and
``dxi cache compact --cache-dir`` rewrites the old ones and merges small ones (idempotent, beside a
running writer).

The old shard is a committed fixture (tests/fixtures/cache-layout1/shards/nested.parquet, 32 rows of
two models over 16 synthetic tasks, written by the cache of b30692d:
tests/fixtures/make_cache_layout1.py), beside the answers b30692d's scoring made of it
(cache-layout1-answers.parquet)."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from benchmarks.bench_scoring import plain_index
from dxi import scoring
from dxi.cache import SCHEMA, Cache, layout
from dxi.cache.remote import Manifest, Remote
from dxi.evals import PROMPT_VERSION, gold_frames
from dxi.runner.cli import main
from tests.helpers.synthetic import model_name, suite

FIXTURE = Path(__file__).parent / "fixtures" / "cache-layout1"
BEFORE = (
    FIXTURE.parent / "cache-layout1-answers.parquet"
)  # b30692d's scoring.export of the fixture's answers
SIZES = {
    "aa_omniscience_decision": 4,
    "hle_multichoice": 4,
    "when2call": 4,
    "wildguardtest": 4,
}  # the fixture's
TASKS = suite(SIZES)


def old_cache(where: Path) -> Path:
    shutil.copytree(FIXTURE, where)
    return where


def scored(root: Path):
    """(the answers frame as exported, every table of the score with 50-resample intervals)."""
    gold, categories = gold_frames(TASKS)
    with Cache(root) as cache:
        models = scoring.models_in_cache(cache.scan(), PROMPT_VERSION)
        answers = cache.read(lambda rows: scoring.answers(rows, models, gold, categories))
    return scoring.export(answers), scoring.score(answers, scoring.Bootstrap(resamples=50)).tables()


def assert_same(a, b) -> None:
    assert a[0].equals(b[0])
    assert a[1].keys() == b[1].keys()
    for name, table in a[1].items():
        assert table.equals(b[1][name]), name


def test_the_fixture_is_an_old_nested_shard_and_scores_as_the_plain_scorer_does(tmp_path: Path):
    root = old_cache(tmp_path / "old")
    (shard,) = root.glob("shards/*.parquet")
    assert layout.layout_of(shard) == layout.NESTED and "answers" in pq.read_schema(shard).names
    exported, tables = scored(root)
    # 2 models x (12 one-question tasks + 4 WildGuardTest tasks x 3 questions), as b30692d scored
    # them
    assert exported.height == 48
    assert dict(exported.group_by("status").len().iter_rows()) == {
        "ok": 29,
        "invalid": 5,
        "failed": 14,
    }
    assert exported.equals(pl.read_parquet(BEFORE))
    # b30692d scored them 9.375 and 36.806: their failed Omniscience answers counted as
    # hallucinations; then 17.708 and 43.056: as not correct, never hallucinations. Now failed
    # answers are left out (SPEC §6: the figures are over the answered questions, with bounds); the
    # plain scorer below agrees with the new figure
    assert tables["index"]["decision_index"].to_list() == [12.5, 50.00000000000001]
    plain = plain_index([shard], TASKS, [model_name(0), model_name(1)])
    index = dict(tables["index"].select("model", "decision_index").iter_rows())
    assert index.keys() == plain.keys()
    assert all(
        index[k] == pytest.approx(plain[k], abs=1e-9) if plain[k] is not None else index[k] is None
        for k in plain
    )


def test_old_new_and_mixed_caches_give_identical_answers_and_scores(tmp_path: Path):
    old = old_cache(tmp_path / "old")
    rows = pq.read_table(old / "shards" / "nested.parquet")
    new = tmp_path / "new"
    (new / "shards").mkdir(parents=True)
    layout.write_shard(rows, new / "shards" / "nested.parquet")
    mixed = tmp_path / "mixed"  # half the rows in each layout, under the same name order
    (mixed / "shards").mkdir(parents=True)
    pq.write_table(rows.slice(0, 16), mixed / "shards" / "a.parquet")
    layout.write_shard(rows.slice(16), mixed / "shards" / "b.parquet")
    assert [layout.layout_of(p) for p in sorted(mixed.glob("shards/*"))] == [
        layout.NESTED,
        layout.FLAT_LAYOUT,
    ]
    logged = (
        tmp_path / "logged"
    )  # every row appended through the cache: a log, then a shard of the flat layout
    with Cache(logged) as cache:
        for row in rows.to_pylist():
            cache.append(row)
    reference = scored(old)
    for other in (new, mixed, logged):
        assert_same(reference, scored(other))
    # the logical shape is the same whatever the layout: the nested answers and the flat columns
    with Cache(old) as a, Cache(mixed) as b:
        assert a.scan().collect().equals(b.scan().collect())


def test_flat_and_nested_answers_convert_both_ways_exactly():
    def answer(q, status="ok", probabilities=None, **more):
        return {
            "question_id": q,
            "status": status,
            "predicted": more.get("predicted"),
            "p_predicted": more.get("p"),
            "p_yes": None,
            "probabilities": probabilities,
            "error": more.get("error"),
            "warning": None,
        }

    lists = [
        None,  # a failed request: no answers
        [],  # a reply without answers
        [
            answer(
                "answer",
                predicted="B",
                p=0.75,
                probabilities=[{"option": "A", "p": 0.25}, {"option": "B", "p": 0.75}],
            )
        ],
        [
            answer("prompt_harmful", probabilities=[]),
            answer("response_refusal", "invalid", error="not yes or no"),
            None,
        ],  # empty, null probabilities; a null answer
    ]
    column = pa.array(lists, type=SCHEMA.field("answers").type)
    flat = layout.flat_answers(column)
    assert list(flat) == list(layout.FLAT_COLUMNS)
    assert flat["answer_question_id"].to_pylist() == [
        None,
        [],
        ["answer"],
        ["prompt_harmful", "response_refusal", None],
    ]
    assert flat["answer_probabilities"].to_pylist()[2:] == [
        [[{"option": "A", "p": 0.25}, {"option": "B", "p": 0.75}]],
        [[], None, None],
    ]
    back = layout.nested_answers(flat).to_pylist()
    assert back[:3] == lists[:3] and back[3][:2] == lists[3][:2]
    assert back[3][2] == answer(None, None)  # a null answer comes back as an answer of nulls
    sliced = layout.flat_answers(
        column.slice(2, 2)
    )  # an array that does not start at its buffers' start
    assert sliced["answer_question_id"].to_pylist() == [
        ["answer"],
        ["prompt_harmful", "response_refusal", None],
    ]


def test_the_layout_is_recorded_in_the_shard_and_an_unknown_one_is_refused_by_name(tmp_path: Path):
    rows = pq.read_table(FIXTURE / "shards" / "nested.parquet")
    layout.write_shard(rows, tmp_path / "flat.parquet")
    meta = pq.read_schema(tmp_path / "flat.parquet").metadata
    assert meta[b"dxi.layout"] == b"2"
    assert pq.read_schema(tmp_path / "flat.parquet").names == list(layout.SHARD_SCHEMA.names)
    future = layout.to_shard(rows)
    pq.write_table(
        future.replace_schema_metadata({b"dxi.layout": b"3"}), tmp_path / "future.parquet"
    )
    with pytest.raises(
        layout.UnknownLayout, match=r"future\.parquet: shard layout '3' is not one this version"
    ):
        layout.layout_of(tmp_path / "future.parquet")


def test_a_parquet_file_in_shards_that_is_no_shard_is_skipped_by_name_and_never_compacted(
    tmp_path: Path, caplog
):
    """A file another program wrote (an answers.parquet copied into shards/: no ``key`` column; a
    table with a column no shard has) stopped every command with exit code 70 (trial 9)."""
    root = old_cache(tmp_path / "cache")
    before = scored(root)
    stray = root / "shards" / "answers.parquet"
    pq.write_table(pa.table({"question_id": ["q"], "predicted": ["A"]}), stray)
    extra = root / "shards" / "zz-extra.parquet"
    rows = pq.read_table(root / "shards" / "nested.parquet")
    pq.write_table(rows.append_column("question_id", pa.array(["q"] * rows.num_rows)), extra)
    cache = Cache(root)
    assert len(cache) == 32
    assert cache.warnings == [
        f"cache: {stray} is not a cache shard (no key or status column: another program's Parquet file?); "
        "skipped: move it out of the cache's shards/ folder",
        f"cache: {extra} is not a cache shard (column(s) question_id that no shard has: another "
        "program's Parquet file?); skipped: move it out of the cache's shards/ folder",
    ]
    assert_same(before, scored(root))
    caplog.clear()
    assert main(["cache", "compact", "--cache-dir", str(root)]) == 0
    assert stray.exists() and extra.exists()
    left = [r.getMessage() for r in caplog.records if r.getMessage().endswith("; left as it is.")]
    assert len(left) == 2 and all("is not a cache shard" in m for m in left)
    assert_same(before, scored(root))


def test_cache_compact_rewrites_old_shards_in_place_idempotently_beside_a_running_writer(
    tmp_path: Path, capsys
):
    root = old_cache(tmp_path / "cache")
    before = scored(root)
    extra = (
        pl.from_arrow(layout.read_nested(root / "shards" / "nested.parquet", SCHEMA.names))
        .head(3)
        .with_columns(pl.col("key") + "-again", pl.col("created_at") + 1000)
    )  # rows a running writer appends meanwhile
    writer = Cache(root)
    for row in extra.to_dicts():
        writer.append(row)  # in its (locked) log, not yet a shard

    assert main(["cache", "compact", "--cache-dir", str(root)]) == 0
    out = capsys.readouterr().out
    assert (
        f"wrote {root / 'shards' / 'nested.parquet'} (32 rows, flat layout) from 1 shard(s)" in out
    )
    assert "1 shard(s) rewritten as 1" in out
    assert layout.layout_of(root / "shards" / "nested.parquet") == layout.FLAT_LAYOUT
    assert len(list(root.glob("wal/*.jsonl"))) == 1  # the writer's live log was left to it
    assert_same(before, scored(root))

    assert main(["cache", "compact", "--cache-dir", str(root)]) == 0  # idempotent
    assert (
        "nothing to compact (every shard is flat, none to merge below 1,000,000 rows)"
        in capsys.readouterr().out
    )
    writer.close()  # its log becomes a second (flat) shard
    shards = sorted(root.glob("shards/*.parquet"))
    assert [pq.read_metadata(p).num_rows for p in shards] == [
        3,
        32,
    ]  # the writer's name (digits) sorts first
    assert (
        main(["cache", "compact", "--cache-dir", str(root)]) == 0
    )  # the two small shards merged into one
    assert "2 shard(s) rewritten as 1" in capsys.readouterr().out
    (merged,) = root.glob("shards/*.parquet")
    assert merged == shards[-1] and layout.layout_of(merged) == layout.FLAT_LAYOUT
    with Cache(root) as cache:
        assert cache.scan().select("key").collect().height == 35 and len(cache) == 35  # no row lost
    assert_same(before, scored(root))  # the appended rows are copies (newer) of three requests


def test_cache_compact_merges_consecutive_small_shards_keeping_every_row_in_its_place(
    tmp_path: Path, capsys
):
    rows = pq.read_table(FIXTURE / "shards" / "nested.parquet")
    root = tmp_path / "cache"
    (root / "shards").mkdir(parents=True)
    for k, name in enumerate("abcd"):  # nested, flat, nested, flat: 8 rows each
        part = rows.slice(8 * k, 8)
        if k % 2:
            layout.write_shard(part, root / "shards" / f"{name}.parquet")
        else:
            pq.write_table(part, root / "shards" / f"{name}.parquet")
    reference = scored(old_cache(tmp_path / "old"))
    with Cache(tmp_path / "old") as cache:
        in_order = cache.scan().collect()

    def compact(
        target_rows: int | None = None,
    ) -> list[tuple[Path, int, int]]:  # dxi cache compact's work
        with Cache(root) as cache:
            done = cache.compact_shards(*([] if target_rows is None else [target_rows]))
        return [(shard, rows, len(held)) for shard, rows, held in done]

    assert compact(20) == [
        (root / "shards" / "b.parquet", 16, 2),
        (root / "shards" / "d.parquet", 16, 2),
    ]
    assert sorted(p.name for p in root.glob("shards/*")) == ["b.parquet", "d.parquet"]
    assert compact(20) == []  # 16 + 16 > 20: nothing to compact
    assert compact() == [(root / "shards" / "d.parquet", 32, 2)]  # 2 shards rewritten as 1
    (merged,) = root.glob("shards/*.parquet")
    assert merged.name == "d.parquet" and pq.read_metadata(merged).num_rows == 32
    with Cache(root) as cache:
        assert cache.scan().collect().equals(in_order)  # the same rows in the same order
    assert_same(reference, scored(root))


def test_cache_compact_sets_a_damaged_old_shard_aside_instead_of_rewriting_it(
    tmp_path: Path, capsys
):
    root = old_cache(tmp_path / "cache")
    shard = root / "shards" / "nested.parquet"
    data = bytearray(shard.read_bytes())
    data[len(data) // 3] ^= 0xFF  # a flipped byte inside a page
    shard.write_bytes(bytes(data))
    with Cache(root) as cache:
        assert cache.compact_shards() == []  # nothing to compact (dxi cache compact's work)
    assert not shard.exists() and len(list(root.glob("quarantine/nested.parquet.*"))) == 1


def test_remote_compaction_merges_shards_of_both_layouts_into_one_flat_shard(tmp_path: Path):
    shared = tmp_path / "shared"
    rows = pq.read_table(FIXTURE / "shards" / "nested.parquet")
    (shared / "shards").mkdir(
        parents=True
    )  # nested, as an older version uploaded it (the remote's layout 1)
    pq.write_table(rows.slice(0, 16), shared / "shards" / "1-old.parquet")
    old = (shared / "shards" / "1-old.parquet").read_bytes()
    (shared / "manifests").mkdir()
    (shared / "manifests" / "1-old.json").write_bytes(
        Manifest("1-old", len(old), hashlib.sha256(old).hexdigest(), 16).to_json()
    )
    local = tmp_path / "w" / "shards"
    local.mkdir(parents=True)
    layout.write_shard(rows.slice(16), local / "2-new.parquet")  # flat, uploaded today
    Remote(f"file://{shared}", tmp_path / "w").upload(local / "2-new.parquet")
    assert Remote(f"file://{shared}", tmp_path / "c").compact(target_rows=100) == (2, 1)
    (merged,) = [
        p for p in (shared / "parts").rglob("*.parquet") if not p.name.endswith(".keys.parquet")
    ]
    assert layout.layout_of(merged) == layout.FLAT_LAYOUT
    # the fixture predates the cache-write columns: they read as nulls from both
    assert layout.read_nested(merged, SCHEMA.names).equals(
        layout.read_nested(FIXTURE / "shards" / "nested.parquet", SCHEMA.names)
    )
