"""Past one machine (docs/distributed.md): N ``dxi run --shard K/N`` processes at once against one provider
(total throughput and wall against one process), the upload rate of compacted shards to an S3 server
(moto, on 127.0.0.1), and a fresh machine's start-up from the remote cache alone: fetching the shards its
manifests name and loading the key index of ``REMOTE_KEYS`` cached requests (seconds and peak memory).

``DXI_BENCH_REMOTE_KEYS`` scales the last one (default 10,000,000; the shards are written as compaction
leaves them, 1,000,000 rows each, index columns only).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from dxi.cache import SCHEMA, Cache
from dxi.cache.remote import Remote

from . import Result
from .bench_cache import _keys, realistic_row

TASKS = 3000
LATENCY_S = 0.01
IN_FLIGHT = 32
UPLOAD_SHARDS = 20
REMOTE_KEYS = int(os.environ.get("DXI_BENCH_REMOTE_KEYS", 10_000_000))
REMOTE_SHARD_ROWS = 1_000_000


def _dxi() -> str:
    return str(Path(sys.executable).with_name("dxi"))


def shards_at_once(tmp: Path) -> list[Result]:
    """One process, then 2 and 4 shard processes at once, each with its own local cache (no coordinator:
    each keeps 1/N of the in-flight limit), against one provider in its own process."""
    from tests.fake_provider import serve
    from tests.synthetic import data_dir

    data = data_dir(tmp / "data", TASKS)
    walls = {}
    for n in (1, 2, 4):
        with serve(model="bench", p_first=None, p_yes=None, record=False, latency=str(LATENCY_S)) as server:
            cmd = [_dxi(), "run", "--model", f"systemone:bench@{server.url}", "--data-dir", str(data), "-q",
                   "--max-in-flight", str(IN_FLIGHT)]
            started = time.perf_counter()
            procs = [subprocess.Popen([*cmd, "--cache-dir", str(tmp / f"c{n}-{k}"), "--out", str(tmp / f"o{n}-{k}"),
                                       *(["--shard", f"{k}/{n}"] if n > 1 else [])], stdout=subprocess.DEVNULL)
                     for k in range(n)]
            assert [p.wait(600) for p in procs] == [0] * n
            walls[n] = time.perf_counter() - started
            stats = server.stats()
            assert (stats["ok"], stats["duplicates"]) == (TASKS, 0)
    if shutil.which("redis-server"):
        from tests.servers import redis_server

        with redis_server() as url, serve(model="bench", p_first=None, p_yes=None, record=False,
                                          latency=str(LATENCY_S)) as server:
            cmd = [_dxi(), "run", "--model", f"systemone:bench@{server.url}", "--data-dir", str(data), "-q",
                   "--max-in-flight", str(IN_FLIGHT), "--coordinator", url]
            started = time.perf_counter()
            procs = [subprocess.Popen([*cmd, "--cache-dir", str(tmp / f"r-{k}"), "--out", str(tmp / f"ro-{k}"),
                                       "--shard", f"{k}/2"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                      env={**os.environ, "DXI_RUN_ID": "bench"}) for k in range(2)]
            assert [p.wait(600) for p in procs] == [0, 0]
            walls["coordinated"] = time.perf_counter() - started
            assert server.stats()["ok"] == TASKS
    floor = TASKS * LATENCY_S / IN_FLIGHT
    out = [Result("distributed", "one process: wall (start to exit)", walls[1], "s", "", None,
                  f"{TASKS:,} requests, {LATENCY_S * 1000:g} ms latency, {IN_FLIGHT} in flight: {TASKS / walls[1]:,.0f} req/s "
                  f"(the latency floor alone {floor:.2f} s)")]
    for n in (2, 4):
        out.append(Result("distributed", f"{n} shards at once: total throughput vs one process", walls[1] / walls[n], "×",
                          "", None, f"wall {walls[n]:.2f} s, {TASKS / walls[n]:,.0f} req/s in all; each shard keeps "
                          f"{IN_FLIGHT // n} in flight (1/{n} of the limit) and starts its own interpreter (~1 s)"))
    if "coordinated" in walls:
        wall = walls["coordinated"]
        out.append(Result("distributed", "2 shards with --coordinator: total throughput vs one process", walls[1] / wall, "×",
                          "", None, f"wall {wall:.2f} s, {TASKS / wall:,.0f} req/s in all; {IN_FLIGHT} in flight leased "
                          "through Redis for both, each attempt booked there (one round trip)"))
    return out


def _moto():
    from tests.servers import moto_s3

    return moto_s3()


def upload_rate(tmp: Path) -> list[Result]:
    body = '{"model":"bench","state":"' + "x" * 1100 + '"}'
    reply = '{"model":"bench","answers":{"answer":{"type":"choice","choice":"B"}}}'
    with Cache(tmp / "up", roll_rows=5_000) as cache:
        for k in _keys(UPLOAD_SHARDS * 5_000):
            cache.append(realistic_row(k, body, reply))
    shards = sorted((tmp / "up" / "shards").glob("*.parquet"))
    size = sum(p.stat().st_size for p in shards)
    with _moto() as s3:
        os.environ.update(s3.env)
        remote = Remote(s3.uri(), tmp / "up")
        started = time.perf_counter()
        assert remote.finish() == []
        took = time.perf_counter() - started
    return [Result("distributed", "remote upload rate (moto S3 on 127.0.0.1)", len(shards) / took, "shards/s", "", None,
                   f"{len(shards)} compacted shards of 5,000 rows ({size / len(shards) / 2**20:.1f} MB each, "
                   f"{size / took / 2**20:.1f} MB/s), shard then manifest each, one upload thread")]


FRESH = """
import sys, time
from pathlib import Path
from dxi.cache import Cache
from dxi.cache.remote import Remote
root = Path(sys.argv[2])
started = time.perf_counter()
remote = Remote(sys.argv[1], root)
fetched = remote.pull()
pulled = time.perf_counter() - started
with Cache(root, remote=remote) as cache:
    n = len(cache)
took = time.perf_counter() - started
hwm = next(line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM"))  # this process's
print(fetched, n, pulled, took, hwm)  # (ru_maxrss would count the parent's peak: Linux keeps it across fork)
"""


def remote_index(tmp: Path) -> list[Result]:
    """A fresh machine (empty local cache) loads the key index of REMOTE_KEYS requests from the remote."""
    src = tmp / "src"
    (src / "shards").mkdir(parents=True)
    rng = np.random.default_rng(0)
    for n, start in enumerate(range(0, REMOTE_KEYS, REMOTE_SHARD_ROWS)):
        size = min(REMOTE_SHARD_ROWS, REMOTE_KEYS - start)
        raw = np.frombuffer(rng.bytes(32 * size), dtype="S32")
        keys = pl.Series("key", raw, dtype=pl.Binary).bin.encode("hex")
        columns = {f.name: pa.nulls(size, f.type) for f in SCHEMA}
        columns |= {"key": keys.to_arrow().cast(pa.string()), "status": pa.array(np.full(size, "ok", dtype=object), pa.string()),
                    "created_at": pa.array(np.arange(start, start + size, dtype=np.float64) + 1.7e9)}
        pq.write_table(pa.table(columns, schema=SCHEMA), src / "shards" / f"{1_700_000_000_000_000_000 + n}-0-bench.parquet",
                       compression="zstd", write_page_checksum=True)
    with _moto() as s3:
        os.environ.update(s3.env)
        assert Remote(s3.uri(), src).finish() == []
        out = subprocess.run([sys.executable, "-c", FRESH, s3.uri(), str(tmp / "fresh")], capture_output=True, text=True,
                             check=True, env={**os.environ, **s3.env}).stdout.split()
    fetched, n, pulled, took, rss_kb = int(out[0]), int(out[1]), float(out[2]), float(out[3]), int(out[4])
    assert n == REMOTE_KEYS
    return [Result("distributed", f"fresh machine: key index of {REMOTE_KEYS:,} keys from remote manifests", took, "s", "",
                   None, f"{fetched} shards of {REMOTE_SHARD_ROWS:,} rows fetched in {pulled:.1f} s (moto, loopback), "
                   f"index loaded in {took - pulled:.1f} s; peak RSS {rss_kb / 1024:,.0f} MB")]


def run() -> list[Result]:
    with tempfile.TemporaryDirectory(prefix="dxi-bench-distributed-") as tmp:
        root = Path(tmp)
        return shards_at_once(root / "a") + upload_rate(root / "b") + remote_index(root / "c")


if __name__ == "__main__":
    for r in run():
        print(r)
