"""Two processes on one cache (issue 32): two ``dxi cache compact`` at once with different groupings lose no
row (real processes, many small shards)."""
from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pyarrow.parquet as pq

from dxi.cache import Cache

from .conftest import DXI
from .test_cache import row


def _key(i: int) -> str:
    return hashlib.sha256(f"k{i}".encode()).hexdigest()


def test_two_compactions_at_once_with_different_groups_lose_no_row(tmp_path: Path):
    """600 keys in 200 shards of 3 rows; ``--target-rows 7`` and ``--target-rows 11`` group them differently,
    so without the lock each deleted shards whose rows the other had just merged (600 keys became 350).
    Three rounds, each on a fresh cache, both processes started together."""
    for round_ in range(3):
        root = tmp_path / f"cache{round_}"
        with Cache(root, roll_rows=3) as cache:
            for i in range(600):
                cache.append(row(_key(i), created_at=float(i)))
        assert len(list(root.glob("shards/*.parquet"))) == 200
        procs = [subprocess.Popen([DXI, "cache", "compact", "--cache-dir", str(root), "--target-rows", str(n)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE) for n in (7, 11)]
        outs = [p.communicate(timeout=300) for p in procs]
        assert [p.returncode for p in procs] == [0, 0], outs
        shards = sorted(root.glob("shards/*.parquet"))
        assert sum(pq.read_metadata(s).num_rows for s in shards) == 600  # every row once: none lost, none copied
        with Cache(root, read_only=True) as cache:
            keys = cache.scan().select("key").collect()["key"].to_list()
            assert sorted(keys) == sorted(_key(i) for i in range(600))
            assert all(cache.has_many([_key(i) for i in range(600)]))
        assert list(root.glob("quarantine/*")) == []
