"""Two processes on one cache (issue 32): two ``dxi cache compact`` at once with different groupings
lose no row (real processes, many small shards)."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from dxi.cache import Cache

from .conftest import DXI
from .helpers.rows import row


def _key(i: int) -> str:
    return hashlib.sha256(f"k{i}".encode()).hexdigest()


@pytest.mark.process
def test_two_compactions_at_once_with_different_groups_lose_no_row(tmp_path: Path):
    """600 keys in 200 shards of 3 rows; ``--target-rows 7`` and ``--target-rows 11`` group them
    differently, so without the lock each deleted shards whose rows the other had just merged (600
    keys became 350). Three rounds, each on a fresh cache, both processes started together."""
    for round_ in range(3):
        root = tmp_path / f"cache{round_}"
        with Cache(root, roll_rows=3) as cache:
            for i in range(600):
                cache.append(row(_key(i), created_at=float(i)))
        assert len(list(root.glob("shards/*.parquet"))) == 200
        procs = [
            subprocess.Popen(
                [DXI, "cache", "compact", "--cache-dir", str(root), "--target-rows", str(n)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            for n in (7, 11)
        ]
        outs = [p.communicate(timeout=300) for p in procs]
        assert [p.returncode for p in procs] == [0, 0], outs
        shards = sorted(root.glob("shards/*.parquet"))
        assert (
            sum(pq.read_metadata(s).num_rows for s in shards) == 600
        )  # every row once: none lost, none copied
        with Cache(root, read_only=True) as cache:
            keys = cache.scan().select("key").collect()["key"].to_list()
            assert sorted(keys) == sorted(_key(i) for i in range(600))
            assert all(cache.has_many([_key(i) for i in range(600)]))
        assert list(root.glob("quarantine/*")) == []


def test_refresh_reads_only_what_other_processes_appended_since(tmp_path: Path):
    """``Cache.refresh`` (after every claim): the lines appended to another writer's log since, and
    the shards that appeared (or were rewritten) since, nothing read before."""
    from dxi.cache import index as index_mod
    from dxi.cache import store

    with Cache(tmp_path, roll_rows=10_000) as first:
        for i in range(100):
            first.append(row(_key(i)))
    (old_shard,) = tmp_path.glob("shards/*.parquet")
    reader = Cache(tmp_path)
    assert reader.has(_key(0)) and not reader.has(_key(100))
    read_shards: list[list[Path]] = []
    real = store.Cache._index_frames
    reader._index_frames = lambda shards: (
        read_shards.append(shards) or real(shards)
    )  # the reader's reads only
    writer = Cache(tmp_path)  # another writer, its log live (locked) until it closes
    writer.append(row(_key(100)))
    writer.append(row(_key(101), "failed", "transient"))
    reader.refresh()
    assert reader.has(_key(100)) and reader.status(_key(101)) == "transient" and read_shards == [[]]
    writer.append(row(_key(101)))  # its retry, answered
    reader.refresh()  # only the line appended since
    assert reader.status(_key(101)) == "ok" and read_shards == [[], []]
    writer.close()  # its log becomes a shard: the only one read
    reader.refresh()
    (new_shard,) = set(tmp_path.glob("shards/*.parquet")) - {old_shard}
    assert (
        read_shards[-1] == [new_shard] and reader.status(_key(101)) == "ok" and len(reader) == 102
    )
    reader.refresh()  # nothing new
    assert read_shards[-1] == [] and len(reader) == 102
    # a key whose rows are an invalid reply and a deterministic failure: only their times decide,
    # which the index does not keep; it is read again whole, and the newer row counts
    with Cache(tmp_path) as other:
        other.append(
            row(_key(0), "failed", "transient", created_at=99.0)
        )  # a clock ahead: ok still counts
        other.append(row(_key(200), "invalid", created_at=5.0))
    reader.refresh()
    assert (
        reader.status(_key(0)) == "ok"
        and reader.status(_key(200)) == "invalid"
        and reader._index is not None
    )
    with Cache(tmp_path) as other:
        other.append(row(_key(200), "failed", "fatal", created_at=4.0))  # appended later, but older
    reader.refresh()
    assert (
        reader._index is None and reader.status(_key(200)) == "invalid"
    )  # read whole: the newer row counts
    assert index_mod.RANK[index_mod.CODE_INVALID] == index_mod.RANK[index_mod.CODE_FATAL]
    # a shard another process set aside as damaged: its keys leave the index (read again whole)
    new_shard.rename(tmp_path / "quarantine" / f"{new_shard.name}.0badf00d")
    reader.refresh()
    assert reader._index is None and not reader.has(_key(100)) and reader.has(_key(99))


def test_the_key_index_ranks_an_appended_row_as_scoring_does(tmp_path: Path):
    """``KeyIndex.set`` (a row appended in this process) follows ``cache.index.newest``: a transient
    failure appended after a final row (a race) leaves the key cached, before and after the index's
    merge, and on disk; a final row after a final row is the newer."""
    from dxi.cache import index as index_mod

    idx = index_mod.KeyIndex()
    a, b = _key(1), _key(2)
    idx.set(a, index_mod.CODE_OK)
    idx.set(a, index_mod.CODE_TRANSIENT)
    idx.set(b, index_mod.CODE_TRANSIENT)
    idx.set(b, index_mod.CODE_INVALID)
    assert [idx.get(a), idx.get(b)] == [index_mod.CODE_OK, index_mod.CODE_INVALID]
    idx._merge()  # in the sorted arrays now
    idx.set(a, index_mod.CODE_TRANSIENT)
    idx.set(b, index_mod.CODE_FATAL)  # a final row after a final row: the newer
    assert [idx.get(a), idx.get(b)] == [index_mod.CODE_OK, index_mod.CODE_FATAL]
    with Cache(tmp_path) as cache:
        cache.append(row(a, created_at=1.0))
        cache.append(row(a, "failed", "transient", created_at=2.0))
        assert cache.has(a)
    with Cache(tmp_path) as cache:
        assert cache.status(a) == "ok"
