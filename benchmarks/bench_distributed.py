"""Past one machine (docs/distributed.md): N ``dxi run --shard K/N`` processes at once against one
provider (total throughput and wall against one process), Redis calls per request with
``--coordinator`` (Redis's own ``INFO commandstats``) and how long any shard waited without sending,
the upload rate of compacted shards to an S3 server (moto, on 127.0.0.1), and a shard's start-up
from a large remote cache: what it reads, how long its key index takes, its peak memory, against a
process that reads the whole remote (as every shard did before the remote was partitioned).

``DXI_BENCH_REMOTE_KEYS`` sizes the remote (default 1,000,000 rows of ~700 bytes on disk each, laid
out as ``dxi cache compact --cache-remote`` leaves a large remote: one object per level-10 node). A
remote of 10,000,000 rows (7 GB) does not fit this machine's bench budget, and shard 0/100 never
lists but its own ~11 nodes, so its 10M start-up is measured on exactly what it reads of one: those
nodes, built alone at 10M's rows each (~9,800); the ratio of bytes read to its share is measured on
the whole 1M remote and holds at 10M (the same nodes, ten times the rows each).
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
import orjson
import polars as pl
import pyarrow as pa

from dxi.cache import SCHEMA, Cache
from dxi.cache.partition import FINEST, Node, nodes_meeting, shard_range
from dxi.cache.remote import Manifest, Remote, _parquet, _sha

from . import Result
from .bench_cache import _keys, realistic_row

TASKS = 3000
LATENCY_S = 0.01
IN_FLIGHT = 32
UPLOAD_SHARDS = 20
REMOTE_KEYS = int(os.environ.get("DXI_BENCH_REMOTE_KEYS", 1_000_000))
ROW_BYTES = 700  # on disk, as the issue measured real rows (700-775 bytes)
# what the client sends to Redis (every other command in commandstats runs inside the scripts) (a
# run with a cost bound also reads the spend once at its end, an HGET, which the scripts use too:
# none here)
CLIENT_COMMANDS = (
    "evalsha",
    "eval",
    "script|load",
    "ping",
    "subscribe",
    "unsubscribe",
    "hello",
    "client|setinfo",
    "select",
    "auth",
)


def _dxi() -> str:
    return str(Path(sys.executable).with_name("dxi"))


def _longest_gap(cache: Path) -> float:
    """The longest time (s) between two consecutive replies stored by one shard (its cache's
    created_at)."""
    times = Cache(cache).scan().select("created_at").collect()["created_at"].sort().to_numpy()
    return float(np.diff(times).max()) if len(times) > 1 else 0.0


def shards_at_once(tmp: Path) -> list[Result]:
    """One process, then 2 and 4 shard processes at once, each with its own local cache (no
    coordinator: each keeps 1/N of the in-flight limit), then 2 and 4 with ``--coordinator`` (the
    limit shared): wall, and with the coordinator Redis's calls per request and each shard's longest
    wait between replies."""
    from tests.fakes.fake_provider import serve
    from tests.helpers.synthetic import data_dir

    data = data_dir(tmp / "data", TASKS)
    walls, calls, gaps = {}, {}, {}

    def start(n: int, tag: str, extra: list[str], env: dict | None = None) -> float:
        with serve(
            model="bench", p_first=None, p_yes=None, record=False, latency=str(LATENCY_S)
        ) as server:
            cmd = [
                _dxi(),
                "run",
                "--model",
                f"systemone:bench@{server.url}",
                "--data-dir",
                str(data),
                "-q",
                "--max-in-flight",
                str(IN_FLIGHT),
                *extra,
            ]
            started = time.perf_counter()
            procs = [
                subprocess.Popen(
                    [
                        *cmd,
                        "--cache-dir",
                        str(tmp / f"{tag}-{k}"),
                        "--out",
                        str(tmp / f"{tag}-o{k}"),
                        *(["--shard", f"{k}/{n}"] if n > 1 else []),
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    env=env,
                )
                for k in range(n)
            ]
            assert [p.wait(600) for p in procs] == [0] * n
            wall = time.perf_counter() - started
            stats = server.stats()
            assert (stats["ok"], stats["duplicates"]) == (TASKS, 0)
        return wall

    for n in (1, 2, 4):
        walls[n] = start(n, f"p{n}", [])
    if shutil.which("redis-server"):
        import redis

        from tests.helpers.servers import redis_server

        for n in (2, 4):
            with redis_server() as url:
                client = redis.Redis.from_url(url)
                before = client.info("commandstats")
                walls[f"c{n}"] = start(
                    n, f"c{n}", ["--coordinator", url], {**os.environ, "DXI_RUN_ID": f"bench{n}"}
                )
                after = client.info("commandstats")
                used = {
                    k.removeprefix("cmdstat_"): v["calls"] - before.get(k, {}).get("calls", 0)
                    for k, v in after.items()
                }
                client.close()
            calls[n] = (
                sum(used.get(c, 0) for c in CLIENT_COMMANDS),
                sum(used.values()) - sum(used.get(c, 0) for c in CLIENT_COMMANDS),
            )
            gaps[n] = max(_longest_gap(tmp / f"c{n}-{k}") for k in range(n))
    floor = TASKS * LATENCY_S / IN_FLIGHT
    out = [
        Result(
            "distributed",
            "one process: wall (start to exit)",
            walls[1],
            "s",
            "",
            None,
            f"{TASKS:,} requests, {LATENCY_S * 1000:g} ms latency, {IN_FLIGHT} in flight: {TASKS / walls[1]:,.0f} req/s "
            f"(the latency floor alone {floor:.2f} s)",
        )
    ]
    for n in (2, 4):
        out.append(
            Result(
                "distributed",
                f"{n} shards at once: total throughput vs one process",
                walls[1] / walls[n],
                "×",
                "",
                None,
                f"wall {walls[n]:.2f} s, {TASKS / walls[n]:,.0f} req/s in all; each shard keeps "
                f"{IN_FLIGHT // n} in flight (1/{n} of the limit) and starts its own interpreter (~1 s)",
            )
        )
    for n in sorted(calls):
        client_calls, scripted = calls[n]
        out.append(
            Result(
                "distributed",
                f"{n} shards with --coordinator: total throughput vs one process",
                walls[1] / walls[f"c{n}"],
                "×",
                "",
                None,
                f"wall {walls[f'c{n}']:.2f} s, {TASKS / walls[f'c{n}']:,.0f} req/s in all; {IN_FLIGHT} in flight "
                "shared through Redis, a slot taken and given back per attempt",
            )
        )
        out.append(
            Result(
                "distributed",
                f"{n} shards with --coordinator: Redis calls per request (INFO commandstats)",
                client_calls / TASKS,
                "calls",
                "≤ 3",
                client_calls / TASKS <= 3,
                f"{client_calls:,} calls from the clients for {TASKS:,} requests (script calls, connections, "
                f"pub/sub); the scripts ran {scripted / TASKS:.0f} commands per request inside Redis",
            )
        )
        wall = walls[f"c{n}"]
        out.append(
            Result(
                "distributed",
                f"{n} shards with --coordinator: longest wait of any shard between replies",
                gaps[n],
                "s",
                "≤ 10% of the run (every shard progresses)",
                gaps[n] <= 0.1 * wall,
                f"the most time between two consecutive replies stored by one shard, in a run of {wall:.1f} s "
                "(before: 20-60 s, a shard holding its slots between requests while the others polled)",
            )
        )
    return out


def _moto():
    from tests.helpers.servers import moto_s3

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
        for (
            shard
        ) in shards:  # as the upload thread does, one after another (no merge: finish would)
            remote.upload(shard)
        took = time.perf_counter() - started
    return [
        Result(
            "distributed",
            "remote upload rate (moto S3 on 127.0.0.1)",
            len(shards) / took,
            "shards/s",
            "",
            None,
            f"{len(shards)} compacted shards of 5,000 rows ({size / len(shards) / 2**20:.1f} MB each, "
            f"{size / took / 2**20:.1f} MB/s), each its rows, index and manifest, one after another",
        )
    ]


def build_remote(root: Path, nodes: dict[int, int]) -> int:
    """A ``file://`` remote at ``root``: for each level-10 node index in ``nodes``, one object of
    that many rows (random keys in the node, ~``ROW_BYTES`` bytes a row on disk), as a full
    compaction of a large remote leaves it; returns its bytes."""
    rng = np.random.default_rng(0)
    total = 0
    for i, n in sorted(nodes.items()):
        node = Node(FINEST, i)
        low = rng.integers(0, 1 << (64 - FINEST), size=n, dtype=np.uint64)
        prefixes = np.uint64(node.lo) + low
        tails = np.frombuffer(rng.bytes(24 * n), dtype="S24")
        keys = pl.Series([f"{p:016x}" for p in prefixes.tolist()]) + pl.Series(
            tails, dtype=pl.Binary
        ).bin.encode("hex")
        columns = {f.name: pa.nulls(n, f.type) for f in SCHEMA if f.name != "answers"}
        columns |= {
            "key": keys.to_arrow().cast(pa.string()),
            "status": pa.array(["ok"] * n, pa.string()),
            "created_at": pa.array(np.full(n, 1.7e9)),
            "raw_reply": _filler(rng, n),
        }
        table = pa.table(columns)
        data, index = _parquet(table), _parquet(table, keys=True)
        m = Manifest(
            f"1700000000000000000-bench-{i:04d}.{node.tag}",
            len(data),
            _sha(data),
            n,
            (),
            node,
            len(index),
            _sha(index),
        )
        folder = root / "parts" / node.path
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{m.stem}.parquet").write_bytes(data)
        (folder / f"{m.stem}.keys.parquet").write_bytes(index)
        (folder / f"{m.stem}.json").write_bytes(m.to_json())
        total += len(data) + len(index)
    return total


def _filler(rng: np.random.Generator, n: int) -> pa.Array:
    """``n`` distinct strings of random hex (never repeated: about ``ROW_BYTES`` bytes each once
    compressed)."""
    blob = rng.bytes(ROW_BYTES * n).hex()
    width = 2 * ROW_BYTES
    offsets = pa.array(np.arange(0, width * n + 1, width, dtype=np.int32))
    return pa.StringArray.from_buffers(n, offsets.buffers()[1], pa.py_buffer(blob.encode()))


def _spread(rows: int) -> dict[int, int]:
    """``rows`` spread over the 1,024 level-10 nodes as uniform keys fall (multinomial)."""
    counts = np.random.default_rng(1).multinomial(rows, [1 / (1 << FINEST)] * (1 << FINEST))
    return {i: int(c) for i, c in enumerate(counts) if c}


START = """
import sys, time, orjson
from pathlib import Path
from dxi.cache import Cache
from dxi.cache.remote import Remote
uri, root, part = sys.argv[1], Path(sys.argv[2]), orjson.loads(sys.argv[3])
started = time.perf_counter()
remote = Remote(uri, root, part=None if part is None else tuple(part))
fetched = remote.pull()
pulled = time.perf_counter() - started
with Cache(root, remote=remote) as cache:
    n = len(cache)
took = time.perf_counter() - started
hwm = next(line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM"))  # this process's
print(orjson.dumps({"fetched": fetched, "keys": n, "pulled": pulled, "took": took, "rss_kb": int(hwm),
                    "bytes": remote.read_bytes, "requests": remote.requests}).decode())
"""


def _start(uri: str, root: Path, part: tuple[int, int] | None) -> dict:
    """A fresh process's start-up from the remote alone (empty local cache): pull, then its key
    index."""
    out = subprocess.run(
        [sys.executable, "-c", START, uri, str(root), orjson.dumps(part).decode()],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return orjson.loads(out)


def remote_start(tmp: Path) -> list[Result]:
    """Goal 1: a shard's start-up reads only its part, against a reader of everything (the old
    start-up)."""
    remote = tmp / "remote"
    total = build_remote(remote, _spread(REMOTE_KEYS))
    uri = f"file://{remote}"
    full = _start(uri, tmp / "full", None)
    s100 = _start(uri, tmp / "s100", (0, 100))
    assert full["keys"] == REMOTE_KEYS
    # what shard 0/100 reads of a remote of 10M rows, built alone: the level-10 nodes its range
    # meets, each holding a 1,024th of 10M rows (the others it never lists); measured exactly, not
    # extrapolated
    part = tmp / "part"
    mine = [n.index for n in nodes_meeting(*shard_range(0, 100))[-1]]
    build_remote(part, {i: 10_000_000 // (1 << FINEST) for i in mine})
    big = _start(f"file://{part}", tmp / "big", (0, 100))
    share = total / 100
    note = (
        f"{REMOTE_KEYS:,} rows ({total / 2**20:,.0f} MB, {ROW_BYTES} bytes a row, one object a level-10 node) on a "
        "file:// remote (local disk: on S3 add the requests' latency)"
    )
    return [
        Result(
            "distributed",
            f"shard 0/100 start-up: bytes read / its share of the remote ({REMOTE_KEYS:,} rows)",
            s100["bytes"] / share,
            "×",
            "≤ 2×",
            s100["bytes"] / share <= 2,
            f"{s100['bytes'] / 2**20:.2f} MB read (index files of {s100['fetched']} nodes and their manifests; "
            f"{s100['requests']} requests) against a share of {share / 2**20:.1f} MB; {note}. At 10M: the same nodes, "
            "10× the rows each, the same ratio",
        ),
        Result(
            "distributed",
            "shard 0/100 start-up at 10M rows: key index loaded",
            big["took"],
            "s",
            "≤ 2 s",
            big["took"] <= 2,
            f"its part of a 10M remote built alone ({len(mine)} nodes of {10_000_000 // (1 << FINEST):,} rows, "
            f"{big['keys']:,} keys): {big['bytes'] / 2**20:.1f} MB and {big['requests']} requests read, "
            f"{big['pulled']:.2f} s of it to fetch (shard 0/100 of {REMOTE_KEYS:,} here: {s100['took']:.2f} s)",
        ),
        Result(
            "distributed",
            "shard 0/100 start-up at 10M rows: peak RSS",
            big["rss_kb"] / 1024,
            "MB",
            "≤ 500 MB",
            big["rss_kb"] / 1024 <= 500,
            f"{big['keys']:,} keys (the index takes ~9 bytes a key) and the process (Python, Polars, PyArrow; shard "
            f"0/100 of {REMOTE_KEYS:,} here: {s100['rss_kb'] / 1024:.0f} MB)",
        ),
        Result(
            "distributed",
            "a process reading the whole remote (every shard's start-up before partitions)",
            full["took"],
            "s",
            "",
            None,
            f"{full['bytes'] / 2**20:,.0f} MB read, peak RSS {full['rss_kb'] / 1024:,.0f} MB, key index of "
            f"{full['keys']:,}: {full['took'] / max(s100['took'], 1e-9):.0f}× a shard of 100's start-up; at 10M "
            f"rows, {10_000_000 * ROW_BYTES / 2**30:.1f} GB for every shard",
        ),
    ]


def run() -> list[Result]:
    with tempfile.TemporaryDirectory(prefix="dxi-bench-distributed-") as tmp:
        root = Path(tmp)
        return shards_at_once(root / "a") + upload_rate(root / "b") + remote_start(root / "c")


if __name__ == "__main__":
    for r in run():
        print(r)
