"""The remote cache tier (``cache/remote.py``, ``--cache-remote``) on a real S3 server (moto,
127.0.0.1) and a ``file://`` folder: sharded runs at once, then scoring from an empty local cache; a
shard reading only the index of its part; a remote of the old layout read, resumed and migrated; a
SIGKILL during uploads; uploads that fail and are finished by the next run; merges beside readers
and writers; damaged objects moved aside, requested again once and put back by their uploader; a
missing bucket refused before anything is sent; credentials kept out."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dxi.cache import Cache
from dxi.cache.index import prefixes
from dxi.cache.partition import Node, nodes_meeting, shard_range
from dxi.cache.remote import MAX_OBJECTS, Manifest, Remote, RemoteError, live, open_uri
from dxi.cache.store import ROLL_ROWS
from dxi.runner.distributed import setup as distributed
from dxi.runner.planning.shard import Shard

from .conftest import DXI, FIXTURES, without_requests
from .fakes.fake_provider import serve
from .helpers.runs import MODEL, dxi_command, run_fake
from .helpers.servers import CREDENTIALS, moto_s3
from .helpers.synthetic import data_dir

TASKS = 240


def dxi(
    command: str, url: str | None, data: Path, cache: Path, out: Path, *extra: str
) -> list[str]:
    """``dxi <command> -q`` of the System One fake ``fake`` served at ``url`` (None: no model
    named), with the flags ``extra``."""
    models = [f"systemone:fake@{url}"] if url else []
    return dxi_command(data, cache, out, "-q", *extra, models=models, command=command)


def summary(out: Path) -> dict:
    return orjson.loads((out / "summary.json").read_bytes())


def check_whole(s3, prefix: str = "dxi") -> dict[str, Manifest]:
    """Every manifest on the remote points at whole objects (the sizes and sha256 of its rows and
    its index), each a readable Parquet file in the node the manifest names, holding only keys of
    that node; returns the live manifests."""
    client = s3.client()

    def get(key: str) -> bytes:
        return client.get_object(Bucket=s3.bucket, Key=key)["Body"].read()

    manifests = {}
    for key in s3.keys(f"{prefix}/"):
        if not key.endswith(".json") or key.startswith(f"{prefix}/quarantine/"):
            continue
        m = Manifest.from_json(get(key))
        assert f"{prefix}/{m.path('manifest')}" == key
        data = get(f"{prefix}/{m.path('rows')}")
        assert (len(data), hashlib.sha256(data).hexdigest()) == (m.bytes, m.sha256)
        table = pq.read_table(pa.BufferReader(data))
        assert table.num_rows == m.rows
        if m.node is not None:
            keys = get(f"{prefix}/{m.path('keys')}")
            assert (len(keys), hashlib.sha256(keys).hexdigest()) == (m.keys_bytes, m.keys_sha256)
            index = pq.read_table(pa.BufferReader(keys))
            assert index.column_names == [
                "key",
                "status",
                "error_kind",
                "created_at",
                "provider",
                "model",
                "served_model",
            ]
            assert index["key"].to_pylist() == table["key"].to_pylist()
            assert all(
                m.node.lo <= p < m.node.hi for p in prefixes(table["key"].to_pylist()).tolist()
            )
        manifests[m.stem] = m
    return live(manifests)


@pytest.mark.server
@pytest.mark.process
def test_three_shards_at_once_on_s3_then_score_from_an_empty_cache_equals_one_process(
    tmp_path: Path,
):
    data = data_dir(tmp_path / "data", TASKS)
    with (
        moto_s3() as s3,
        serve(model="fake", p_first=None, p_yes=None, record=False, latency="0.002") as server,
    ):
        env = {**os.environ, **s3.env}
        procs = [
            subprocess.Popen(
                dxi(
                    "run",
                    server.url,
                    data,
                    tmp_path / f"cache{k}",
                    tmp_path / f"out{k}",
                    "--shard",
                    f"{k}/3",
                    "--cache-remote",
                    s3.uri(),
                ),
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            for k in range(3)
        ]
        outputs = [p.communicate(timeout=120) for p in procs]
        assert [p.returncode for p in procs] == [0, 0, 0], outputs
        stats = server.stats()
        assert (stats["arrivals"], stats["keys_ok"], stats["duplicates"]) == (
            TASKS,
            TASKS,
            0,
        )  # none sent twice
        for k, (_, err) in enumerate(outputs):
            assert f"shard {k}/3".encode() in err and b"1/3 of each provider's limits" in err
        manifests = check_whole(s3)
        assert sum(m.rows for m in manifests.values()) == TASKS
        empty = tmp_path / "empty"
        scored = subprocess.run(
            dxi("score", None, data, empty, tmp_path / "scored", "--cache-remote", s3.uri()),
            env=env,
            capture_output=True,
        )
        assert scored.returncode == 0, scored.stderr
        with serve(
            model="fake", p_first=None, p_yes=None, record=False
        ) as single:  # the reference: one process
            assert (
                subprocess.run(
                    dxi("run", single.url, data, tmp_path / "one", tmp_path / "single")
                ).returncode
                == 0
            )
        for text in [
            *(o + e for o, e in outputs),
            scored.stdout + scored.stderr,
        ]:  # no credentials anywhere
            assert CREDENTIALS["AWS_SECRET_ACCESS_KEY"].encode() not in text
        assert not any(
            CREDENTIALS["AWS_SECRET_ACCESS_KEY"].encode() in p.read_bytes()
            for p in tmp_path.rglob("*")
            if p.is_file()
        )
    assert without_requests(summary(tmp_path / "scored")) == without_requests(
        summary(tmp_path / "single")
    )


@pytest.mark.process
def test_a_file_remote_is_read_by_estimate_and_run_and_a_rerun_sends_nothing(tmp_path: Path):
    data = data_dir(tmp_path / "data", 60)
    remote = f"file://{tmp_path / 'shared'}"
    with serve(model="fake", p_first=None, p_yes=None, record=False) as server:
        assert run_fake(server.url, data, tmp_path / "a", tmp_path / "o1", cache_remote=remote) == 0
        files = sorted(
            str(p.relative_to(tmp_path / "shared"))
            for p in (tmp_path / "shared").rglob("*")
            if p.is_file()
        )
        (stem,) = {
            f.rsplit("/", 1)[-1].split(".")[0] for f in files
        }  # one upload: a single process writes at level 0
        assert [f.replace(stem, "S") for f in files] == [
            "parts/b00/000/S.p00-000.json",
            "parts/b00/000/S.p00-000.keys.parquet",
            "parts/b00/000/S.p00-000.parquet",
        ]
        first = server.stats()["arrivals"]
        est = subprocess.run(
            dxi(
                "estimate",
                server.url,
                data,
                tmp_path / "b",
                tmp_path / "o2",
                "--json",
                "--cache-remote",
                remote,
            ),
            capture_output=True,
        )
        assert (
            orjson.loads(est.stdout)["total"]["new"] == 0
        )  # another machine sees the rows through the remote
        assert run_fake(server.url, data, tmp_path / "b", tmp_path / "o3", cache_remote=remote) == 0
        assert server.stats()["arrivals"] == first == 60
    assert summary(tmp_path / "o3")["models"][0]["requests"]["cache_hits"] == 60


def _keys(n: int, seed: str = "k") -> list[str]:
    return [hashlib.sha256(f"{seed}{i}".encode()).hexdigest() for i in range(n)]


@pytest.mark.server
def test_a_shard_reads_only_the_index_of_its_part(tmp_path: Path, monkeypatch):
    keys = _keys(800)
    with moto_s3(monkeypatch) as s3:
        for k in range(
            4
        ):  # four shards, each writing its own keys (level 4: 16 nodes, 4 per shard)
            shard = Shard(k, 4)
            _write_through(
                s3,
                tmp_path / f"w{k}",
                [_row(key, 1.0) for key in keys if shard.owns(key)],
                part=(k, 4),
            )
        manifests = check_whole(s3)
        assert sorted(m.node for m in manifests.values()) == [
            Node(4, i) for i in range(16)
        ]  # one object a node
        whole = sum(m.bytes + m.keys_bytes for m in manifests.values())
        reader = Remote(s3.uri(), tmp_path / "r", part=(1, 4))
        assert reader.pull() == 4  # nodes 4..7 of level 4: shard 1's quarter of the key space
        # layout 1's two folders, its one node at levels 0 and 2, the folders of levels 4 to 10,
        # the 4 nodes of its range that hold objects (not all 342 it meets), 4 manifests, 4 indexes
        assert reader.requests == 2 + 2 + 4 + 4 + 4 + 4
        assert sorted(
            p.name.split(".")[1] for p in (tmp_path / "r" / "remote" / "keys").glob("*.parquet")
        ) == [f"p04-00{i}" for i in range(4, 8)]
        assert (
            list((tmp_path / "r" / "remote" / "shards").glob("*")) == []
        )  # no rows: the index only
        assert reader.read_bytes < whole / 4  # its quarter's index files and manifests
        with Cache(tmp_path / "r", remote=reader) as c:
            mine = [key for key in keys if Shard(1, 4).owns(key)]
            assert all(c.has_many(mine)) and not any(
                c.has_many([key for key in keys if not Shard(1, 4).owns(key)])
            )
            assert c.scan().collect().height == 0  # a shard scores its own rows only
        full = Remote(s3.uri(), tmp_path / "f")
        assert full.pull() == 16
        assert Cache(tmp_path / "f", remote=full).scan().collect()[
            "key"
        ].sort().to_list() == sorted(keys)


@pytest.mark.server
@pytest.mark.process
def test_a_remote_of_the_old_layout_is_scored_resumed_and_moved_into_the_partitions(tmp_path: Path):
    data = data_dir(
        tmp_path / "data", 40
    )  # the fixture's 40 tasks (tests/fixtures/make_remote_layout1.py)
    assert (
        subprocess.run(
            dxi_command(data, tmp_path / "one", tmp_path / "single", "-q", models=[MODEL])
        ).returncode
        == 0
    )  # the reference: one process, no remote
    reference = without_requests(summary(tmp_path / "single"))
    with moto_s3() as s3:
        client = s3.client()
        old = FIXTURES / "remote-layout1"
        for path in sorted(old.rglob("*")):
            if path.is_file():
                client.put_object(
                    Bucket=s3.bucket, Key=f"dxi/{path.relative_to(old)}", Body=path.read_bytes()
                )
        env = {**os.environ, **s3.env}

        def dxi_(command: str, where: str, *extra: str) -> subprocess.CompletedProcess:
            done = subprocess.run(
                dxi_command(
                    data,
                    tmp_path / where,
                    tmp_path / f"{where}-out",
                    "-q",
                    "--cache-remote",
                    s3.uri(),
                    *extra,
                    models=[MODEL],
                    command=command,
                ),
                env=env,
                capture_output=True,
            )
            assert done.returncode == 0, done.stderr
            return done

        dxi_("score", "empty")
        assert without_requests(summary(tmp_path / "empty-out")) == reference
        for k in (1, 0):  # the shards of today's assignment resume it: nothing to send
            done = dxi_("run", f"c{k}", "--shard", f"{k}/2")
            assert summary(tmp_path / f"c{k}-out")["models"][0]["requests"]["sent"] == 0
            if k == 1:
                assert (
                    b"read whole by every shard" in done.stderr
                    and b"dxi cache compact --cache-remote" in done.stderr
                )
                assert len(s3.keys("dxi/manifests/")) == 2
        assert (
            s3.keys("dxi/manifests/") == s3.keys("dxi/shards/") == []
        )  # shard 0, the root's owner, merged them
        (merged,) = check_whole(s3).values()
        assert merged.rows == 40 and merged.node == Node(0, 0)
        dxi_("score", "after")
        assert without_requests(summary(tmp_path / "after-out")) == reference
    shared = tmp_path / "shared"  # dxi cache compact moves an old remote into the partitions too
    shutil.copytree(FIXTURES / "remote-layout1", shared)
    compact = subprocess.run(
        [
            DXI,
            "cache",
            "compact",
            "--cache-remote",
            f"file://{shared}",
            "--cache-dir",
            str(tmp_path / "t"),
        ],
        capture_output=True,
        text=True,
    )
    assert compact.returncode == 0 and "merged 2 object(s) into 1" in compact.stdout, compact.stdout
    assert sorted(p.parts[-4] for p in shared.rglob("*") if p.is_file()) == ["parts"] * 3


@pytest.mark.server
@pytest.mark.process
def test_sigkill_during_uploads_leaves_only_whole_objects_and_the_rerun_sends_only_what_is_missing(
    tmp_path: Path,
):
    tasks = 600
    data = data_dir(tmp_path / "data", tasks)
    cache = tmp_path / "cache"
    with (
        moto_s3() as s3,
        serve(model="fake", p_first=None, p_yes=None, record=False, latency="0.02") as server,
    ):
        env = {**os.environ, **s3.env}
        cmd = dxi(
            "run",
            server.url,
            data,
            cache,
            tmp_path / "out",
            "--cache-remote",
            s3.uri(),
            "--upload-every",
            "0.2",
            "--max-in-flight",
            "4",
        )  # ~3 s of sending: a shard uploaded every 0.2 s meanwhile
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while (
            sum(k.endswith(".json") for k in s3.keys("dxi/parts/")) < 2
        ):  # kill it between or during uploads
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        check_whole(s3)  # no partial object visible
        kept = Cache(cache).scan().collect()["key"].n_unique()
        before = server.stats()["arrivals"]
        assert 0 < kept < tasks
        assert (
            subprocess.run(cmd[:-2], env=env, stdout=subprocess.DEVNULL).returncode == 0
        )  # (16 in flight)
        assert server.stats()["arrivals"] - before == tasks - kept  # only what was missing
        manifests = check_whole(s3)
        local = sorted(p.stem for p in (cache / "shards").glob("*.parquet"))
        assert (
            sorted(p.stem for p in (cache / "remote" / "uploaded").glob("*.json")) == local
        )  # the killed run's too
        assert (
            len(manifests) == 1 and sum(m.rows for m in manifests.values()) == tasks
        )  # merged at the end


@pytest.mark.server
def test_uploads_that_fail_give_exit_code_5_and_the_next_run_uploads_the_rest(
    tmp_path: Path, monkeypatch
):
    cache = tmp_path / "cache"
    with moto_s3(monkeypatch) as s3:
        remote = Remote(s3.uri(), cache)
        assert remote.pull() == 0
        with Cache(cache, roll_rows=2) as c:
            for i in range(5):
                c.append(_row(f"k{i}", float(i)))
        assert remote.finish() == [] and remote.uploaded == 3
        (merged,) = live(remote.manifests()).values()  # the three uploads merged at the end
        assert merged.rows == 5
    with Cache(cache, roll_rows=2) as c:  # another run writes while the remote is away
        c.append(_row("k9", 9.0))
    with moto_s3(
        monkeypatch
    ) as gone:  # a fresh server: the earlier one is stopped (the endpoint refuses)
        pass
    d = distributed.Distributed(
        remote=Remote(f"s3://{gone.bucket}/dxi?endpoint={gone.endpoint}", cache)
    )
    assert d.finish() == distributed.EXIT_UPLOAD
    with moto_s3(
        monkeypatch
    ) as s3:  # another remote: the copies and records of the first are set aside
        again = Remote(s3.uri(), cache)
        assert again.finish() == [] and again.uploaded == 4  # all of them: idempotent by name
        assert again.finish() == [] and again.uploaded == 4  # nothing more to do
        assert sum(m.rows for m in check_whole(s3).values()) == 6


@pytest.mark.server
def test_merges_keep_each_node_to_a_few_objects_beside_other_writers_and_readers(
    tmp_path: Path, monkeypatch
):
    # 60 keys in node (4, 5) of the key space, which shards 0 and 1 of 3 share (its owner: shard 0,
    # its first key's)
    keys = ["5" + k[1:] for k in _keys(60)]
    node = Node(4, 5)
    assert {next(k for k in range(3) if Shard(k, 3).owns(key)) for key in keys} == {0, 1}
    with moto_s3(monkeypatch) as s3:
        writers = [Remote(s3.uri(), tmp_path / f"w{k}", part=(k, 3)) for k in range(2)]
        caches = [Cache(tmp_path / f"w{k}", roll_rows=1, remote=w) for k, w in enumerate(writers)]
        lister = Remote(s3.uri(), tmp_path / "l")
        counts = []
        for n, key in enumerate(keys):  # two shards writing at once, an upload per row
            k = 0 if Shard(0, 3).owns(key) else 1
            caches[k].append(_row(key, float(n)))
            caches[k]._finish_compactions()  # its shard written (and its upload begun) ...
            for f in writers[
                k
            ]._pending:  # ... and uploaded, the node merged if it passed MAX_OBJECTS
                f.result()
            counts.append(len(live(lister.listing([[node]]).manifests)))
        assert counts[:MAX_OBJECTS] == list(range(1, MAX_OBJECTS + 1))  # an object per upload ...
        assert (
            max(counts) == MAX_OBJECTS and min(counts[MAX_OBJECTS:]) <= 2
        )  # ... merged as the node passed MAX_OBJECTS
        mid = Remote(s3.uri(), tmp_path / "mid")  # a reader between the writers' ends
        for c, w in zip(caches, writers, strict=True):
            c.close()
            assert w.finish() == []
            mid.pull()
            assert Cache(tmp_path / "mid", remote=mid).scan().collect()["key"].n_unique() == len(
                keys
            )
        manifests = check_whole(s3)
        assert (
            len(manifests) == 1 and next(iter(manifests.values())).node == node
        )  # the owner merged both at its end
        fresh = Remote(s3.uri(), tmp_path / "fresh")
        fresh.pull()
        assert sorted(Cache(tmp_path / "fresh", remote=fresh).scan().collect()["key"]) == sorted(
            keys
        )  # every row once


@pytest.mark.server
def test_a_shard_that_does_not_match_its_manifest_is_moved_aside_and_put_back_by_its_uploader(
    tmp_path: Path, monkeypatch
):
    with moto_s3(monkeypatch) as s3:
        _write_through(s3, tmp_path / "w", [_row("k1", 1.0)])
        (manifest,) = check_whole(s3).values()
        key = f"dxi/{manifest.path('rows')}"
        good = s3.client().get_object(Bucket=s3.bucket, Key=key)["Body"].read()
        bad = bytearray(good)
        bad[len(bad) // 2] ^= 0xFF  # the same size: only the sha256 shows it
        s3.client().put_object(Bucket=s3.bucket, Key=key, Body=bytes(bad))
        reader = Remote(s3.uri(), tmp_path / "r")
        assert reader.pull() == 0
        assert (
            "does not match its manifest" in reader.warnings[0] and "moved to" in reader.warnings[0]
        )
        assert Cache(tmp_path / "r", remote=reader).scan().collect().height == 0
        assert f"dxi/quarantine/{manifest.stem}.parquet" in s3.keys("dxi/quarantine/")
        assert check_whole(s3) == {}  # no process reads it again
        again = Remote(s3.uri(), tmp_path / "r2")
        assert again.pull() == 0 and again.warnings == []
        owner = Remote(
            s3.uri(), tmp_path / "w"
        )  # its uploader's next run puts it back from its local shard
        assert owner.finish() == []
        assert any("uploaded again" in w for w in owner.warnings)
        (back,) = check_whole(
            s3
        ).values()  # under a new name (an object never changes under its name) ...
        assert back.stem.startswith(f"{manifest.stem}.r") and (back.node, back.rows) == (
            manifest.node,
            manifest.rows,
        )
        assert (
            s3.client().get_object(Bucket=s3.bucket, Key=f"dxi/{back.path('rows')}")["Body"].read()
            == good
        )
        assert f"dxi/quarantine/{manifest.stem}.json" not in s3.keys("dxi/quarantine/")  # handled
        assert reader.pull() == 1
        assert owner.finish() == [] and list(check_whole(s3)) == [back.stem]  # ... recorded: once


def test_uris_and_credentials():
    fs, base = open_uri(
        "s3://bucket/some/prefix?endpoint=http://127.0.0.1:9000&region=eu-west-1", env={}
    )
    assert (type(fs).__name__, base) == ("S3FileSystem", "bucket/some/prefix")
    fs, base = open_uri("gs://bucket/p", env={})
    assert (type(fs).__name__, base) == ("GcsFileSystem", "bucket/p")
    fs, base = open_uri("file:///tmp/x/", env={})
    assert (type(fs).__name__, base) == ("LocalFileSystem", "/tmp/x")
    with pytest.raises(RemoteError, match="credentials do not belong in the URI") as err:
        open_uri("s3://AKIA:secret@bucket/p", env={})
    assert "secret" not in str(err.value)
    with pytest.raises(RemoteError, match="unknown scheme"):
        open_uri("ftp://host/dir", env={})


def test_nodes_and_shard_ranges_agree():
    for n in (1, 3, 4, 100, 1024):
        ranges = [shard_range(k, n) for k in range(n)]
        assert (
            ranges[0][0] == 0
            and ranges[-1][1] == 2**64
            and all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))
        )
        for k in (0, n // 2, n - 1):
            levels = nodes_meeting(*ranges[k])
            assert [len(level) for level in levels][0] == 1
            finest = levels[
                -1
            ]  # at level 10, a shard of N lists at most 1024/N + 1 nodes, and never 2× its share
            assert len(finest) <= 1024 // n + 2 and len(finest) / 1024 <= max(2 / n, 2 / 1024)


def _write_through(
    s3,
    where: Path,
    rows: list[dict],
    roll_rows: int = ROLL_ROWS,
    part: tuple[int, int] | None = None,
) -> None:
    """Append ``rows`` to a cache at ``where`` with ``s3``'s remote tier (a shard every
    ``roll_rows`` rows) and finish its uploads, every one of which must succeed."""
    writer = Remote(s3.uri(), where, part=part)
    with Cache(where, roll_rows=roll_rows, remote=writer) as c:
        for row in rows:
            c.append(row)
    assert writer.finish() == []


def _upload_each(s3, where: Path, rows: list[dict], roll_rows: int) -> None:
    """Write ``rows`` to a local cache at ``where`` (a shard every ``roll_rows`` rows), then upload
    each shard as its own object (no merge at the end, as ``finish`` would)."""
    with Cache(where, roll_rows=roll_rows) as c:
        for row in rows:
            c.append(row)
    writer = Remote(s3.uri(), where)
    for shard in sorted((where / "shards").glob("*.parquet")):
        writer.upload(shard)


def _row(key: str, created_at: float, status: str = "ok") -> dict:
    return {
        "key": key,
        "provider": "systemone",
        "model": "m",
        "endpoint": "e",
        "params": "{}",
        "sample": 0,
        "prompt_version": "v",
        "eval": "when2call",
        "task_id": f"when2call/{key}",
        "task_digest": "d",
        "request_body": "{}",
        "status": status,
        "error": None,
        "error_kind": None,
        "http_status": 200,
        "attempts": 1,
        "raw_reply": "{}",
        "served_model": "m",
        "input_tokens": 1,
        "output_tokens": 1,
        "latency_ms": 1.0,
        "created_at": created_at,
        "answers": [],
        "repaired": False,
    }


@pytest.mark.server
def test_compaction_merges_small_objects_and_readers_see_the_same_rows(tmp_path: Path, monkeypatch):
    with moto_s3(monkeypatch) as s3:
        _upload_each(
            s3,
            tmp_path / "w",
            [*(_row(f"k{i}", float(i)) for i in range(10)), _row("k0", 20.0, status="invalid")],
            roll_rows=3,
        )  # a newer row for k0
        reader = Remote(s3.uri(), tmp_path / "r")
        assert reader.pull() == 4
        before = Cache(tmp_path / "r", remote=reader).scan().collect().sort("key", "created_at")
        assert before.height == 11

        assert Remote(s3.uri(), tmp_path / "c").compact(target_rows=100) == (4, 1)
        manifests = check_whole(s3)
        assert len(manifests) == 1 and sum(k.endswith(".json") for k in s3.keys("dxi/parts/")) == 1
        (merged,) = manifests.values()
        assert sorted(merged.replaces) == sorted(
            p.stem for p in (tmp_path / "r" / "remote" / "shards").glob("*.parquet")
        )
        assert Remote(s3.uri(), tmp_path / "c").compact(target_rows=100) == (0, 0)  # idempotent

        assert reader.pull() == 1  # the merged object; the four it replaces are dropped here
        assert len(list((tmp_path / "r" / "remote" / "shards").glob("*.parquet"))) == 1
        with Cache(tmp_path / "r", remote=reader) as c:
            after = c.scan().collect().sort("key", "created_at")
            assert c.status("k0") == "invalid"
        assert after.equals(before)
        fresh = Remote(s3.uri(), tmp_path / "fresh")
        assert fresh.pull() == 1
        assert (
            Cache(tmp_path / "fresh", remote=fresh)
            .scan()
            .collect()
            .sort("key", "created_at")
            .equals(before)
        )
        assert (
            Remote(s3.uri(), tmp_path / "s").compact(target_rows=3)[1] > 1
        )  # 11 rows, 3 a node: split, level 2 and finer
        split = check_whole(s3).values()
        assert (
            all(m.node.level >= 2 and m.rows <= 3 for m in split)
            and sum(m.rows for m in split) == 11
        )
        assert Remote(s3.uri(), tmp_path / "s").compact(target_rows=3) == (0, 0)
        assert fresh.pull() == len(split)
        assert (
            list((tmp_path / "fresh" / "remote" / "shards").glob("*compact*.p00-000.parquet")) == []
        )  # dropped here
        assert (
            Cache(tmp_path / "fresh", remote=fresh)
            .scan()
            .collect()
            .sort("key", "created_at")
            .equals(before)
        )


@pytest.mark.server
def test_a_remote_shard_damaged_here_is_quarantined_like_a_local_one_and_fetched_again_at_once(
    tmp_path: Path, monkeypatch
):
    with moto_s3(monkeypatch) as s3:
        _write_through(s3, tmp_path / "w", [_row("k1", 1.0), _row("k2", 2.0)])
        (m,) = check_whole(s3).values()
        original = (
            s3.client().get_object(Bucket=s3.bucket, Key=f"dxi/{m.path('rows')}")["Body"].read()
        )
        for damage in ("footer", "page"):  # found when the key index loads; found by the first scan
            reader = Remote(s3.uri(), tmp_path / damage)
            assert reader.pull() == 1
            copy = tmp_path / damage / "remote" / "shards" / f"{m.stem}.parquet"
            data = bytearray(copy.read_bytes())
            if damage == "footer":
                del data[-20:]
            else:
                # a byte flipped in the last page of the first column: only the page checksums see
                # it
                key = pq.ParquetFile(copy).metadata.row_group(0).column(0)
                start = (
                    key.dictionary_page_offset
                    if key.has_dictionary_page and key.dictionary_page_offset
                    else key.data_page_offset
                )
                data[start + key.total_compressed_size - 2] ^= 0xFF
            copy.write_bytes(bytes(data))
            with Cache(
                tmp_path / damage, remote=reader
            ) as c:  # the same process reads the fresh copy
                if damage == "footer":
                    assert (c.status("k1"), c.status("k2"), len(c)) == ("ok", "ok", 2)
                assert c.read(lambda rows: sorted(rows.collect()["key"])) == ["k1", "k2"]
                assert copy.read_bytes() == original and reader.downloaded == 2
                assert (
                    len(c.warnings) == 2
                    and "quarantine" in c.warnings[0]
                    and "Fetching it again" in c.warnings[0]
                )
                assert (
                    c.warnings[1]
                    == f"cache: {copy} fetched again from {reader.name}: whole; its rows are read."
                )
            assert len(list((tmp_path / damage / "quarantine").glob(f"{copy.name}.*"))) == 1
            assert reader.pull() == 0  # nothing left to fetch
            assert list(check_whole(s3)) == [m.stem]  # the remote's object was whole: left in place


@pytest.mark.server
def test_a_shards_copy_of_the_index_damaged_here_is_fetched_again(tmp_path: Path, monkeypatch):
    keys = _keys(40)
    with moto_s3(monkeypatch) as s3:
        _write_through(s3, tmp_path / "w", [_row(key, 1.0) for key in keys], part=(0, 2))
        reader = Remote(s3.uri(), tmp_path / "r", part=(0, 2))
        assert reader.pull() >= 1
        copies = sorted((tmp_path / "r" / "remote" / "keys").glob("*.parquet"))
        original = copies[0].read_bytes()
        copies[0].write_bytes(original[:-20])
        with Cache(tmp_path / "r", remote=reader) as c:
            assert all(c.has_many([key for key in keys if Shard(0, 2).owns(key)]))
            assert "Fetching it again" in c.warnings[0]
        assert copies[0].read_bytes() == original


@pytest.mark.server
def test_an_object_damaged_on_the_remote_with_a_manifest_agreeing_is_moved_aside_at_once(
    tmp_path: Path, monkeypatch
):
    with moto_s3(monkeypatch) as s3:
        _write_through(s3, tmp_path / "w", [_row("k1", 1.0)])
        (m,) = check_whole(s3).values()
        client = s3.client()
        damaged = client.get_object(Bucket=s3.bucket, Key=f"dxi/{m.path('rows')}")["Body"].read()[
            :-20
        ]
        client.put_object(
            Bucket=s3.bucket, Key=f"dxi/{m.path('rows')}", Body=damaged
        )  # its manifest agreeing with it
        agreeing = Manifest(
            m.stem,
            len(damaged),
            hashlib.sha256(damaged).hexdigest(),
            1,
            (),
            m.node,
            m.keys_bytes,
            m.keys_sha256,
        )
        client.put_object(
            Bucket=s3.bucket, Key=f"dxi/{m.path('manifest')}", Body=agreeing.to_json()
        )
        reader = Remote(s3.uri(), tmp_path / "r")
        assert reader.pull() == 0  # its pages fail: moved aside before anything reads it
        assert "is damaged" in reader.warnings[0] and "moved to" in reader.warnings[0]
        with Cache(tmp_path / "r", remote=reader) as c:
            assert c.status("k1") is None and len(c) == 0  # its request will be sent again
        assert check_whole(s3) == {} and Remote(s3.uri(), tmp_path / "r2").pull() == 0


@pytest.mark.process
def test_dxi_cache_compact_merges_the_shards_of_a_run_file(tmp_path: Path):
    data = data_dir(tmp_path / "data", 40)
    shared = tmp_path / "shared"
    with serve(model="fake", p_first=None, p_yes=None, record=False) as server:
        for k in range(2):  # two shards, two files: the key is read from the run file
            run_file = tmp_path / f"run{k}.toml"
            run_file.write_text(
                f'data_dir = "{data}"\ncache_dir = "cache{k}"\nout = "out{k}"\n'
                f'cache_remote = "file://{shared}"\n[evals]\nselect = ["when2call"]\n'
                f'[[models]]\nprovider = "systemone"\n'
                f'model = "fake"\n[providers.systemone]\nkind = "systemone"\nbase_url = "{server.url}"\n'
            )
            assert (
                subprocess.run([DXI, "run", str(run_file), "-q", "--shard", f"{k}/2"]).returncode
                == 0
            )
    manifests = lambda: sorted(shared.rglob("*.json"))  # noqa: E731
    assert manifests() and all(p.parts[-3] == "b02" for p in manifests())  # two shards: level 2
    compact = [
        DXI,
        "cache",
        "compact",
        "--cache-remote",
        f"file://{shared}",
        "--cache-dir",
        str(tmp_path / "tmp"),
        "--target-rows",
        "100",
    ]
    done = subprocess.run(compact, capture_output=True, text=True)
    assert done.returncode == 0 and (
        "merged" in done.stdout or "nothing to merge" in done.stdout
    ), done.stdout
    assert "nothing to merge" in subprocess.run(compact, capture_output=True, text=True).stdout
    scored = subprocess.run(
        [
            DXI,
            "score",
            str(tmp_path / "run0.toml"),
            "--cache-dir",
            str(tmp_path / "empty"),
            "--out",
            str(tmp_path / "scored"),
            "-q",
        ],
        capture_output=True,
    )
    assert scored.returncode == 0, scored.stderr
    assert (
        summary(tmp_path / "scored")["models"][0]["usage"]["replies"] == 40
    )  # both shards' rows, once each


@pytest.mark.process
def test_a_run_whose_uploads_fail_exits_5_and_the_next_run_uploads_them_sending_nothing(
    tmp_path: Path,
):
    data = data_dir(tmp_path / "data", 30)
    remote = tmp_path / "shared"
    (remote / "parts" / "b00").mkdir(parents=True)
    (remote / "parts" / "b00" / "000").write_text(
        "not a folder"
    )  # the store refuses every object of level 0
    cmd = dxi_command(
        data,
        tmp_path / "cache",
        tmp_path / "out",
        "-q",
        "--cache-remote",
        f"file://{remote}",
        models=[MODEL],
    )
    failed = subprocess.run(cmd, capture_output=True, text=True)
    assert failed.returncode == distributed.EXIT_UPLOAD == 5, failed.stderr
    assert "could not be uploaded" in failed.stderr and "the next run" in failed.stderr
    (remote / "parts" / "b00" / "000").unlink()
    again = subprocess.run(cmd, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    assert "uploaded 1 shard(s)" in again.stderr
    assert (
        summary(tmp_path / "out")["models"][0]["requests"]["sent"] == 0
    )  # all cached: only the upload was left
    assert len(list(remote.rglob("*.json"))) == 1


@pytest.mark.server
@pytest.mark.process
def test_a_missing_bucket_or_folder_stops_a_run_before_anything_is_sent(tmp_path: Path):
    data = data_dir(tmp_path / "data", 10)
    with moto_s3() as s3, serve(model="fake", p_first=None, p_yes=None, record=False) as server:
        env = {**os.environ, **s3.env}
        unlistable = tmp_path / "unlistable"
        unlistable.mkdir()
        (unlistable / "parts").write_text("not a folder")
        for uri, what in (
            (f"s3://no-such-bucket-{s3.bucket}/dxi", "the bucket no-such-bucket-.* does not exist"),
            (f"file://{tmp_path / 'nowhere' / 'dxi'}", "the folder .* does not exist"),
            (f"file://{unlistable}", "cannot list"),
        ):
            done = subprocess.run(
                dxi("run", server.url, data, tmp_path / "c", tmp_path / "o", "--cache-remote", uri),
                env=env,
                capture_output=True,
                text=True,
            )
            assert done.returncode == 2 and re.search(what, done.stderr), done.stderr
        assert server.stats()["arrivals"] == 0


@pytest.mark.server
def test_a_reader_that_listed_before_a_compaction_lists_again_and_loses_no_row(
    tmp_path: Path, monkeypatch
):
    with moto_s3(monkeypatch) as s3:
        _upload_each(s3, tmp_path / "w", [_row(f"k{i}", float(i)) for i in range(6)], roll_rows=2)
        reader = Remote(s3.uri(), tmp_path / "r")
        stale = reader.listing()  # listed just before the compaction ...
        assert Remote(s3.uri(), tmp_path / "c").compact(target_rows=100) == (3, 1)
        listings = []

        def listing(nodes=None):
            listings.append(1)
            return stale if len(listings) == 1 else Remote.listing(reader, nodes)

        monkeypatch.setattr(reader, "listing", listing)
        assert (
            reader.pull() == 1
        )  # ... so its objects were gone: it listed again and took the merged one
        assert len(listings) == 2
        assert sorted(Cache(tmp_path / "r", remote=reader).scan().collect()["key"]) == [
            f"k{i}" for i in range(6)
        ]


@pytest.mark.server
@pytest.mark.process
def test_a_damaged_object_is_requested_again_once_and_put_back_by_the_shard_that_uploaded_it(
    tmp_path: Path,
):
    data = data_dir(tmp_path / "data", 60)
    with moto_s3() as s3, serve(model="fake", p_first=None, p_yes=None, record=False) as server:
        env = {**os.environ, **s3.env}

        def run(k: int, cache: str) -> subprocess.CompletedProcess:
            done = subprocess.run(
                dxi(
                    "run",
                    server.url,
                    data,
                    tmp_path / cache,
                    tmp_path / f"{cache}-out",
                    "--shard",
                    f"{k}/2",
                    "--cache-remote",
                    s3.uri(),
                ),
                env=env,
                capture_output=True,
            )
            assert done.returncode == 0, done.stderr
            return done

        def score(where: str, code: int = 0) -> dict:
            done = subprocess.run(
                dxi(
                    "score",
                    None,
                    data,
                    tmp_path / where,
                    tmp_path / f"{where}-out",
                    "--cache-remote",
                    s3.uri(),
                ),
                env=env,
                capture_output=True,
            )
            assert done.returncode == code, done.stderr
            return summary(tmp_path / f"{where}-out")

        def sent(runner) -> int:
            before = server.stats()["arrivals"]
            runner()
            return server.stats()["arrivals"] - before

        assert sent(lambda: [run(k, f"c{k}") for k in range(2)]) == 60
        whole = score("whole")
        damaged = next(
            m for m in check_whole(s3).values() if m.node == Node(2, 0)
        )  # one of shard 0's objects
        key = f"dxi/{damaged.path('rows')}"
        data_ = bytearray(s3.client().get_object(Bucket=s3.bucket, Key=key)["Body"].read())
        data_[len(data_) // 2] ^= 0xFF  # its bytes no longer match its manifest (the same size)
        s3.client().put_object(Bucket=s3.bucket, Key=key, Body=bytes(data_))

        short = score(
            "short", 1
        )  # a reader of everything finds it, moves it aside, and scores without its rows:
        assert (
            short["models"][0]["usage"]["replies"] == 60 - damaged.rows
        )  # answers missing, so provisional (exit 1)
        assert short["complete"] is False
        assert f"dxi/quarantine/{damaged.stem}.parquet" in s3.keys("dxi/quarantine/")
        assert damaged.stem not in check_whole(s3)
        assert (
            sent(lambda: run(0, "again")) == damaged.rows
        )  # requested again by the shard that owns them ...
        assert sent(lambda: run(0, "again2")) == 0  # ... once: a good copy is on the remote
        assert without_requests(score("fixed")) == without_requests(whole)
        owner = run(0, "c0")  # the shard that uploaded it puts its own copy back, sending nothing
        assert b"uploaded again" in owner.stderr
        assert f"dxi/quarantine/{damaged.stem}.json" not in s3.keys("dxi/quarantine/")
        # then merged at its end with the rows sent again: two rows of each of those requests (the
        # newest read)
        assert [m.rows for m in check_whole(s3).values() if m.node == Node(2, 0)] == [
            2 * damaged.rows
        ]
        assert without_requests(score("after")) == without_requests(whole)


def test_a_file_remotes_first_damaged_object_is_moved_aside_not_deleted(tmp_path: Path):
    """Issue 32: on a ``file://`` remote the folder ``quarantine/`` did not exist yet when the first
    damaged object was copied into it; the copy failed as "not found", was taken for an object
    another process had moved aside, and the object was deleted. It is moved aside, byte for byte,
    with its record."""
    shared = tmp_path / "shared"
    writer = Remote(f"file://{shared}", tmp_path / "w")
    with Cache(tmp_path / "w", remote=writer) as c:
        c.append(_row("k1", 1.0))
    assert writer.finish() == []
    (manifest,) = writer.listing().manifests.values()
    rows = shared / manifest.path("rows")
    good = rows.read_bytes()
    bad = bytearray(good)
    bad[len(bad) // 2] ^= 0xFF  # the same size: only the sha256 shows it
    rows.write_bytes(bytes(bad))
    assert not (shared / "quarantine").exists()
    reader = Remote(f"file://{shared}", tmp_path / "r")
    assert reader.pull() == 0
    assert "does not match its manifest" in reader.warnings[0] and "moved to" in reader.warnings[0]
    assert not rows.exists() and not (shared / manifest.path("manifest")).exists()
    assert (shared / "quarantine" / rows.name).read_bytes() == bytes(bad)  # moved aside, as it was
    assert (shared / "quarantine" / manifest.path("keys").rsplit("/", 1)[-1]).is_file()
    record = orjson.loads((shared / "quarantine" / f"{manifest.stem}.json").read_bytes())
    assert (
        "does not match its manifest" in record["reason"]
        and record["manifest"]["sha256"] == manifest.sha256
    )


def test_what_the_remote_moved_aside_is_told_as_set_aside_like_the_local_quarantine(tmp_path: Path):
    """The answers of an object moved to the remote's quarantine/ were reported as "the run is
    incomplete (interrupted, ...)", where a local shard set aside says "set aside as damaged"
    (``cache.aside``): ``Cache.set_aside`` reads the remote's quarantine too, from a copy fetched
    once."""
    shared = tmp_path / "shared"
    writer = Remote(f"file://{shared}", tmp_path / "w")
    with Cache(tmp_path / "w", remote=writer) as c:
        c.append(_row("k1", 1.0))
        c.append(_row("k2", 2.0))
    assert writer.finish() == []
    (manifest,) = writer.listing().manifests.values()
    # the object intact, its manifest not agreeing: moved aside whole, its requests readable
    path = shared / manifest.path("manifest")
    doc = orjson.loads(path.read_bytes())
    path.write_bytes(orjson.dumps(doc | {"sha256": "0" * 64}))
    reader = Remote(f"file://{shared}", tmp_path / "r")
    assert reader.pull() == 0 and "moved to" in reader.warnings[0]
    with Cache(tmp_path / "r", remote=reader) as c:
        assert len(c) == 0
        aside = c.set_aside()
        assert (aside.shards, aside.unread) == (1, 0)
        assert sorted(aside.keys) == ["k1", "k2"]
        assert aside.where == f"moved them to file://{shared}/quarantine/"
        copy = tmp_path / "r" / "remote" / "quarantine" / f"{manifest.stem}.parquet"
        assert copy.read_bytes() == (shared / "quarantine" / copy.name).read_bytes()
        requests = reader.requests
        assert c.set_aside().keys == aside.keys and reader.requests == requests + 1  # a listing
    # put back by its uploader (its record gone): no longer set aside
    (shared / "quarantine" / f"{manifest.stem}.json").unlink()
    with Cache(tmp_path / "r", remote=Remote(f"file://{shared}", tmp_path / "r")) as c:
        assert c.set_aside().shards == 0


async def test_score_says_answers_lost_to_the_remotes_quarantine_were_set_aside(
    tmp_path: Path, capsys
):
    """``dxi score`` on another machine, after the remote moved an object aside: its answers are
    "set aside as damaged", with the remote's quarantine named, not "the run is incomplete" (they
    were, with ``set_aside`` null)."""
    import asyncio

    from dxi.runner.cli import main

    from .fakes.fake_provider import FakeProvider
    from .helpers.synthetic import when2call_row

    data_dir(tmp_path / "data", 6)
    rest = tmp_path / "rest" / "when2call" / "when2call_test_mcq.jsonl"  # the last 3 tasks
    rest.parent.mkdir(parents=True)
    rest.write_bytes(b"".join(orjson.dumps(when2call_row(i, 0)) + b"\n" for i in range(3, 6)))
    uri = f"file://{tmp_path / 'shared'}"
    async with FakeProvider(model=None) as server:
        model = ["--model", f"systemone:m1@{server.url}", "-q", "--out", str(tmp_path / "o")]
        # the first 3 tasks to the remote; the last 3 in the reader's own cache
        first = [
            *model,
            "--data-dir",
            str(tmp_path / "data"),
            "--limit",
            "3",
            "--evals",
            "when2call",
        ]
        first += ["--cache-dir", str(tmp_path / "w"), "--cache-remote", uri]
        assert await asyncio.to_thread(main, ["run", *first]) == 0
        local = [*model, "--data-dir", str(tmp_path / "rest"), "--cache-dir", str(tmp_path / "r")]
        assert await asyncio.to_thread(main, ["run", *local, "--evals", "when2call"]) == 0
    (manifest,) = Remote(uri, tmp_path / "probe").listing().manifests.values()
    path = tmp_path / "shared" / manifest.path("manifest")
    path.write_bytes(orjson.dumps(orjson.loads(path.read_bytes()) | {"sha256": "0" * 64}))
    capsys.readouterr()
    args = [*model[:2], "--data-dir", str(tmp_path / "data"), "--all-tasks", "--cache-remote", uri]
    args += ["--evals", "when2call"]  # the synthetic data's one evaluation
    args += ["--cache-dir", str(tmp_path / "r"), "--out", str(tmp_path / "s"), "-q"]
    assert main(["score", *args]) == 1
    block = summary(tmp_path / "s")["models"][0]["evals"]["when2call"]
    assert (block["n"], block["missing"], block["set_aside"]) == (6, 3, 3)
    assert block["reason"] == (
        "3 answer(s) not in the cache: set aside as damaged (the cache found their rows unreadable "
        f"and moved them to {uri}/quarantine/): they are not scored, and `dxi run` with "
        "--all-tasks requests them again"
    )
