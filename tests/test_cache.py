"""The content-addressed cache: what counts as cached, durability of appended rows, recovery."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import orjson
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dxi.adapters import Request
from dxi.cache import SCHEMA, Cache, layout
from dxi.cache.verify import seal

from .helpers import events
from .helpers.rows import read_only_files, row


def test_request_key_covers_everything_but_secrets():
    base = Request("systemone", "m", "/v1/systemone", b'{"a":1}')
    variants = [
        Request("openai", "m", "/v1/systemone", b'{"a":1}'),
        Request("systemone", "n", "/v1/systemone", b'{"a":1}'),
        Request("systemone", "m", "/x", b'{"a":1}'),
        Request("systemone", "m", "/v1/systemone", b'{"a":2}'),
        Request("systemone", "m", "/v1/systemone", b'{"a":1}', sample=1),
        Request("systemone", "m", "/v1/systemone", b'{"a":1}', params='{"temperature":0}'),
        Request("systemone", "m", "/v1/systemone", b'{"a":1}', prompt_version="other"),
    ]
    keys = {base.key} | {v.key for v in variants}
    assert len(keys) == 8
    assert base.key == Request("systemone", "m", "/v1/systemone", b'{"a":1}').key
    assert len(base.key) == 64


def test_has_follows_what_counts_as_cached(tmp_path: Path):
    with Cache(tmp_path) as cache:
        cache.append(row("ok1"))
        cache.append(row("inv", "invalid"))
        cache.append(row("fatal", "failed", "fatal"))
        cache.append(row("trans", "failed", "transient"))
        assert [cache.has(k) for k in ("ok1", "inv", "fatal", "trans", "absent")] == [
            True,
            True,
            True,
            False,
            False,
        ]
    reopened = Cache(tmp_path, retry_invalid=True, retry_failed=True)
    assert [reopened.has(k) for k in ("ok1", "inv", "fatal", "trans")] == [
        True,
        False,
        False,
        False,
    ]
    assert len(reopened) == 4


def test_newest_row_wins(tmp_path: Path):
    with Cache(tmp_path) as cache:
        cache.append(row("k", "failed", "transient", created_at=1.0))
    with Cache(tmp_path) as cache:
        assert not cache.has("k")
        cache.append(row("k", "ok", created_at=2.0))
    cache = Cache(tmp_path)
    assert cache.status("k") == "ok"
    assert cache.scan().collect().height == 2  # both rows are kept on disk


def test_close_compacts_the_log_into_one_shard(tmp_path: Path):
    with Cache(tmp_path) as cache:
        for i in range(10):
            cache.append(row(f"k{i}"))
        assert len(list(tmp_path.glob("wal/*.jsonl"))) == 1
        assert cache.scan().collect().height == 10  # rows in the log are visible before compaction
    assert list(tmp_path.glob("wal/*")) == []
    shards = list(tmp_path.glob("shards/*.parquet"))
    assert len(shards) == 1
    assert (
        layout.layout_of(shards[0]) == layout.FLAT_LAYOUT
    )  # new shards have the flat answer layout
    frame = pl.from_arrow(layout.read_nested(shards[0], SCHEMA.names))
    assert frame.height == 10 and frame["answers"].list.len().to_list() == [1] * 10


def test_close_without_waiting_scans_the_last_log_from_memory_while_its_shard_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    from dxi.cache import store

    written = []
    real_compact = Cache._compact

    def compact(
        self, wal, table, damaged=False
    ):  # the last log's shard is written only once the scan is done
        while table.num_rows == 2 and not written:
            time.sleep(0.001)
        real_compact(self, wal, table, damaged)

    monkeypatch.setattr(Cache, "_compact", compact)
    with Cache(tmp_path, roll_rows=4) as cache:
        for i in range(
            10
        ):  # two logs rolled over (compacted in the background), the last one of 2 rows
            cache.append(row(f"k{i}", created_at=float(i)))
        cache.close(
            wait=False
        )  # the rolled logs' shards are in place; the last log is parsed, not yet written
        assert (
            len(list(tmp_path.glob("shards/*.parquet"))) == 2
            and len(list(tmp_path.glob("wal/*.jsonl"))) == 1
        )
        parsed = []
        real_read = store.Cache._read_log
        monkeypatch.setattr(
            store.Cache,
            "_read_log",
            lambda self, *a, **k: parsed.append(1) or real_read(self, *a, **k),
        )
        keys = cache.scan().select("key").collect()["key"].to_list()
        assert (
            sorted(keys) == [f"k{i}" for i in range(10)] and parsed == []
        )  # the last log's rows from memory
        written.append(True)
    assert list(tmp_path.glob("wal/*")) == [] and len(list(tmp_path.glob("shards/*.parquet"))) == 3
    again = Cache(tmp_path)
    assert sorted(again.scan().select("key").collect()["key"].to_list()) == [
        f"k{i}" for i in range(10)
    ]
    assert again.has_many([f"k{i}" for i in range(10)]) == [True] * 10


KILLED_WRITER = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, {root!r})
    from dxi.cache import Cache
    from tests.helpers.rows import row
    cache = Cache({path!r})
    for i in range(5):
        cache.append(row(f"k{{i}}"))
    os.write(cache._fd, b'{{"key": "half-writ')  # a record cut off mid-write
    os.kill(os.getpid(), 9)
""")


@pytest.mark.process
def test_rows_survive_sigkill_and_a_truncated_record_is_dropped(tmp_path: Path):
    root = str(Path(__file__).parents[1])
    proc = subprocess.run(
        [sys.executable, "-c", KILLED_WRITER.format(root=root, path=str(tmp_path))]
    )
    assert proc.returncode == -9
    assert len(list(tmp_path.glob("wal/*.jsonl"))) == 1  # left behind by the killed writer
    cache = Cache(tmp_path)
    assert [cache.has(f"k{i}") for i in range(5)] == [True] * 5
    assert any("truncated record" in w for w in cache.warnings)
    assert list(tmp_path.glob("wal/*.jsonl")) == []  # compacted into a shard
    assert cache.scan().collect()["key"].sort().to_list() == [f"k{i}" for i in range(5)]
    again = Cache(tmp_path)  # recovery is not repeated, nothing is duplicated
    assert again.scan().collect().height == 5 and again.warnings == []


def test_corrupt_shard_is_set_aside_and_only_its_keys_are_lost(tmp_path: Path):
    with Cache(tmp_path) as cache:
        cache.append(row("a"))
    with Cache(tmp_path) as cache:
        cache.append(row("b"))
    shards = sorted(tmp_path.glob("shards/*.parquet"))
    assert len(shards) == 2
    shards[0].write_bytes(shards[0].read_bytes()[:50])  # truncate the first shard
    cache = Cache(tmp_path)
    assert (cache.has("a"), cache.has("b")) == (False, True)
    assert any("unreadable" in w and "quarantine" in w for w in cache.warnings)
    assert len(list(tmp_path.glob("quarantine/*"))) == 1
    assert cache.scan().collect()["key"].to_list() == ["b"]


def test_a_live_writers_log_is_read_not_stolen(tmp_path: Path):
    writer = Cache(tmp_path)
    writer.append(row("live"))
    reader = Cache(tmp_path)  # another process would see the same: the writer's flock is held
    assert reader.has("live")
    assert len(list(tmp_path.glob("wal/*.jsonl"))) == 1
    writer.close()
    assert list(tmp_path.glob("wal/*.jsonl")) == []
    assert Cache(tmp_path).has("live")


def test_empty_cache_scans_with_the_schema(tmp_path: Path):
    frame = Cache(tmp_path).scan().collect()
    assert frame.height == 0 and "answers" in frame.columns


@pytest.mark.process
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_two_writers_on_one_cache(tmp_path: Path):
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).parents[1])!r})
        from dxi.cache import Cache
        from tests.helpers.rows import row
        with Cache({str(tmp_path)!r}) as cache:
            for i in range(2000):
                cache.append(row(f"{{sys.argv[1]}}{{i}}"))
    """)
    procs = [subprocess.Popen([sys.executable, "-c", code, name]) for name in ("x", "y")]
    assert [p.wait() for p in procs] == [0, 0]
    frame = Cache(tmp_path).scan().collect()
    assert frame.height == 4000 and frame["key"].n_unique() == 4000


def test_logs_roll_over_into_shards_and_every_row_stays_visible(tmp_path: Path):
    with Cache(tmp_path, roll_rows=10) as cache:
        for i in range(35):
            cache.append(row(f"k{i}", created_at=float(i)))
            assert (
                cache.scan().select("key").collect().height == i + 1
            )  # never a row missing mid-compaction
        assert cache.has_many([f"k{i}" for i in range(35)] + ["absent"]) == [True] * 35 + [False]
    assert list(tmp_path.glob("wal/*")) == []
    assert sorted(pl.read_parquet(s).height for s in tmp_path.glob("shards/*.parquet")) == [
        5,
        10,
        10,
        10,
    ]
    again = Cache(tmp_path)
    assert len(again) == 35 and again.scan().collect()["key"].n_unique() == 35


def test_rows_appended_together_are_one_write_of_their_lines_and_each_counts_as_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """``append_many`` (a batch's results read together): one write(2) of exactly the lines
    ``append`` would write one by one, every key looked up as cached after it returns, and the log
    rolled over once past ``roll_rows``."""
    from dxi.cache import store

    writes: list[bytes] = []

    def write(fd: int, data: bytes) -> int:
        writes.append(bytes(data))
        return os.write(fd, data)

    rows = [
        row("a"),
        row("b", "invalid"),
        row("c", "failed", "fatal"),
        row("d", "failed", "transient"),
    ]
    monkeypatch.setattr(store, "_write", write)
    with Cache(tmp_path / "many", roll_rows=6) as cache:
        cache.append_many(rows)
        assert writes == [b"".join(seal(orjson.dumps(r)) for r in rows)]
        assert [cache.has(k) for k in "abcde"] == [True, True, True, False, False]
        cache.append_many(
            [row(f"k{i}") for i in range(3)]
        )  # 7 rows: past roll_rows, the log rolls over
        assert len(writes) == 2 and cache.scan().select("key").collect().height == 7
    assert sorted(
        pl.read_parquet(s).height for s in (tmp_path / "many").glob("shards/*.parquet")
    ) == [7]
    with Cache(tmp_path / "one") as cache:
        for r in rows:
            cache.append(r)
    assert writes[2:] == [seal(orjson.dumps(r)) for r in rows]


def test_key_index_merges_batches_and_the_newest_row_wins(monkeypatch: pytest.MonkeyPatch):
    from dxi.cache import index

    monkeypatch.setattr(index, "MERGE_AT", 3)
    keys = [hashlib.sha256(str(i).encode()).hexdigest() for i in range(7)]
    idx = index.KeyIndex()
    for k in keys:
        idx.set(k, index.CODE_TRANSIENT)
    idx.set(keys[0], index.CODE_OK)  # after its first row was merged into the arrays
    idx.set("not-hex", index.CODE_FATAL)
    assert len(idx) == 8
    expected = [index.CODE_OK] + [index.CODE_TRANSIENT] * 6 + [index.CODE_FATAL, index.ABSENT]
    probe = keys + ["not-hex", "a" * 64]
    assert [idx.get(k) for k in probe] == expected
    assert idx.get_many(probe).tolist() == expected


def test_a_corrupt_log_line_is_skipped_and_the_log_set_aside(tmp_path: Path):
    (tmp_path / "wal").mkdir()
    lines = [seal(orjson.dumps(row(k)))[:-1] for k in ("a", "b", "c")]
    lines[1] = lines[1][:40] + b"\x00garbage" + lines[1][40:]
    (tmp_path / "wal" / "1-1-dead.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    cache = Cache(tmp_path)
    assert [cache.has(k) for k in "abc"] == [True, False, True]
    assert any("line 2 does not match its checksum (crc32): damaged" in w for w in cache.warnings)
    assert (
        list(tmp_path.glob("wal/*")) == []
        and len(list(tmp_path.glob("quarantine/1-1-dead.jsonl.*"))) == 1
    )
    assert sorted(cache.scan().collect()["key"].to_list()) == ["a", "c"]


def test_verify_sets_aside_a_shard_damaged_outside_the_index_columns(tmp_path: Path):
    with Cache(tmp_path) as cache:
        for i in range(50):
            cache.append(row(f"k{i}", request_body="x" * (100 + i)))
    (shard,) = tmp_path.glob("shards/*.parquet")
    meta = pq.ParquetFile(shard).metadata.row_group(0)
    body = next(
        meta.column(c)
        for c in range(meta.num_columns)
        if meta.column(c).path_in_schema == "request_body"
    )
    data = bytearray(shard.read_bytes())
    data[body.data_page_offset + 20 : body.data_page_offset + 60] = b"\x00" * 40
    shard.write_bytes(bytes(data))
    cache = Cache(tmp_path)  # start-up verifies only the index columns' pages: they are intact
    assert cache.has("k0") and cache.warnings == []
    assert (
        cache.scan().collect().height == 0
    )  # a scan verifies every page first: the shard is set aside
    assert any(
        "CRC checksum verification failed" in w and "quarantine" in w for w in cache.warnings
    )
    assert (
        list(tmp_path.glob("shards/*.parquet")) == []
        and len(list(tmp_path.glob("quarantine/*"))) == 1
    )
    assert (
        cache.has("k0") is False and Cache(tmp_path).has("k0") is False
    )  # never left in the key index


APPENDER = textwrap.dedent("""
    import sys
    sys.path.insert(0, {root!r})
    from dxi.cache import Cache
    from tests.helpers.rows import row
    cache = Cache({path!r}, roll_rows=40)
    for i in range(100_000):
        key = f"{{sys.argv[1]}}-{{i}}"
        cache.append(row(key, request_body="x" * 2000))
        print(key, flush=True)
""")


# Each run is killed at a point of its own events: after its N-th append returned (the appender
# prints the key), or mid-compaction (``tests.helpers.events``: a log's shard written, not yet in
# place, the log kept), of a log it rolled or of the killed writer's log it recovered at start.
KILL_POINTS = ["append:97", "compaction:1", "append:260", "compaction:3"]


@pytest.mark.process
def test_rows_appended_survive_kills_at_points_of_the_run_while_logs_roll_and_compact(
    tmp_path: Path,
):
    root = str(Path(__file__).parents[1])
    appended: list[str] = []
    for run, point in enumerate(KILL_POINTS):
        event, n = point.split(":")
        log = tmp_path.parent / f"events-{run}.jsonl"
        env = events.env(log, kill_at=point if event == "compaction" else None)
        proc = subprocess.Popen(
            [sys.executable, "-c", APPENDER.format(root=root, path=str(tmp_path)), f"r{run}"],
            stdout=subprocess.PIPE,
            env=env,
        )
        if event == "append":
            appended += [proc.stdout.readline().decode().strip() for _ in range(int(n))]
            proc.kill()
        else:
            # it kills itself there: every whole line it printed is a row whose append had returned
            appended += [line.decode().strip() for line in proc.stdout if line.endswith(b"\n")]
        assert proc.wait() == -signal.SIGKILL
        assert event == "append" or events.reached(log, point)
        cache = Cache(tmp_path)  # recovers the killed writer's logs
        assert all(cache.has_many(appended))  # every row whose append had returned
        keys = cache.scan().select("key").collect()["key"]
        assert keys.n_unique() == keys.len()  # and none twice
    assert list(tmp_path.glob("wal/*.jsonl")) == []
    assert len(appended) > 97 + 260


def test_a_shard_written_before_a_column_existed_reads_beside_newer_ones(tmp_path: Path):
    """A shard without ``repaired`` (written before that column was added) first, then newer ones:
    the key index and every scan read both, the old rows with nulls in the new column."""
    from dxi.cache.schema import SCHEMA

    newer = (
        "repaired",
        "cached_input_tokens",
        "cache_write_tokens",
        "cache_write_1h_tokens",
        "cut_off",
        "transport",
        "batch_id",
        "retry_waits_s",
        "ttft_s",
    )
    old_schema = pa.schema([f for f in SCHEMA if f.name not in newer])
    (tmp_path / "shards").mkdir(parents=True)
    old = pl.DataFrame([{k: v for k, v in row("old").items() if k != "repaired"}]).to_arrow()
    pq.write_table(
        old.select(old_schema.names).cast(old_schema), tmp_path / "shards" / "0000-old.parquet"
    )
    with Cache(tmp_path) as cache:
        cache.append(
            row(
                "new",
                repaired=False,
                cache_write_tokens=20,
                cache_write_1h_tokens=5,
                cut_off="thinking",
                transport="batch",
                batch_id="batch_1",
                retry_waits_s=[1.5, 3.25],
                ttft_s=0.25,
            )
        )
    cache = Cache(tmp_path)
    assert cache.has("old") and cache.has("new") and len(cache) == 2
    rows = (
        cache.scan()
        .select(
            "key",
            "repaired",
            "cache_write_tokens",
            "cache_write_1h_tokens",
            "cut_off",
            "transport",
            "batch_id",
            "retry_waits_s",
            "ttft_s",
        )
        .collect()
    )
    assert rows.sort("key").rows() == [
        ("new", False, 20, 5, "thinking", "batch", "batch_1", [1.5, 3.25], 0.25),
        ("old", None, None, None, None, None, None, None, None),
    ]


def test_a_cache_that_cannot_be_written_is_still_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """A read-only cache (here: creating files fails with EROFS, as root ignores permissions): a
    killed run's log cannot be compacted, so it stays and its rows are read from it; appending
    raises CacheWriteError naming the directory."""
    from dxi.cache import CacheWriteError

    with Cache(tmp_path) as cache:
        cache.append(row("k1"))
        os.close(cache._fd)  # as if killed: the log stays, uncompacted, its lock released
        cache._fd, cache._wal = None, None
    read_only_files(monkeypatch)
    cache = Cache(tmp_path)
    assert any("could not compact" in w and "Read-only file system" in w for w in cache.warnings)
    assert cache.has("k1") and cache.scan().collect()["key"].to_list() == ["k1"]
    with pytest.raises(
        CacheWriteError,
        match=f"cannot create a cache log in {tmp_path / 'wal'}: Read-only file system",
    ):
        cache.append(row("k2"))
