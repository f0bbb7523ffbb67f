"""The remote cache tier (``cache/remote.py``, ``--cache-remote``) on a real S3 server (moto, 127.0.0.1) and a
``file://`` folder: sharded runs at once, then scoring from an empty local cache; a SIGKILL during uploads;
uploads that fail and are finished by the next run; compaction beside readers; credentials kept out."""
from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import time
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dxi.cache import Cache
from dxi.cache.remote import Manifest, Remote, RemoteError, live, open_uri
from dxi.cache.store import ROLL_ROWS
from dxi.runner import distributed

from .conftest import DXI, without_requests
from .fake_provider import serve
from .servers import CREDENTIALS, moto_s3
from .synthetic import data_dir

TASKS = 240


def dxi(command: str, url: str | None, data: Path, cache: Path, out: Path, *extra: str) -> list[str]:
    model = ["--model", f"systemone:fake@{url}"] if url else []
    return [DXI, command, *model, "--data-dir", str(data), "--cache-dir", str(cache), "--out", str(out), "-q", *extra]


def summary(out: Path) -> dict:
    return orjson.loads((out / "summary.json").read_bytes())


def check_whole(s3, prefix: str = "dxi") -> dict[str, Manifest]:
    """Every manifest on the remote points at a whole shard (its size and sha256), every shard object is a
    readable Parquet file; returns the manifests."""
    client = s3.client()
    manifests = {}
    for key in s3.keys(f"{prefix}/manifests/"):
        m = Manifest.from_json(client.get_object(Bucket=s3.bucket, Key=key)["Body"].read())
        data = client.get_object(Bucket=s3.bucket, Key=f"{prefix}/shards/{m.stem}.parquet")["Body"].read()
        assert (len(data), hashlib.sha256(data).hexdigest()) == (m.bytes, m.sha256)
        manifests[m.stem] = m
    for key in s3.keys(f"{prefix}/shards/"):
        assert pq.ParquetFile(pa.BufferReader(client.get_object(Bucket=s3.bucket, Key=key)["Body"].read())).metadata
    return manifests


def test_three_shards_at_once_on_s3_then_score_from_an_empty_cache_equals_one_process(tmp_path: Path):
    data = data_dir(tmp_path / "data", TASKS)
    with moto_s3() as s3, serve(model="fake", p_first=None, p_yes=None, record=False, latency="0.002") as server:
        env = {**os.environ, **s3.env}
        procs = [subprocess.Popen(dxi("run", server.url, data, tmp_path / f"cache{k}", tmp_path / f"out{k}",
                                      "--shard", f"{k}/3", "--cache-remote", s3.uri()),
                                  env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE) for k in range(3)]
        outputs = [p.communicate(timeout=120) for p in procs]
        assert [p.returncode for p in procs] == [0, 0, 0], outputs
        stats = server.stats()
        assert (stats["arrivals"], stats["keys_ok"], stats["duplicates"]) == (TASKS, TASKS, 0)  # none sent twice
        for k, (_, err) in enumerate(outputs):
            assert f"shard {k}/3".encode() in err and b"1/3 of each provider's limits" in err
        manifests = check_whole(s3)
        assert sum(m.rows for m in manifests.values()) == TASKS
        empty = tmp_path / "empty"
        scored = subprocess.run(dxi("score", None, data, empty, tmp_path / "scored", "--cache-remote", s3.uri()),
                                env=env, capture_output=True)
        assert scored.returncode == 0, scored.stderr
        with serve(model="fake", p_first=None, p_yes=None, record=False) as single:  # the reference: one process
            assert subprocess.run(dxi("run", single.url, data, tmp_path / "one", tmp_path / "single")).returncode == 0
        for text in [*(o + e for o, e in outputs), scored.stdout + scored.stderr]:  # no credentials anywhere
            assert CREDENTIALS["AWS_SECRET_ACCESS_KEY"].encode() not in text
        assert not any(CREDENTIALS["AWS_SECRET_ACCESS_KEY"].encode() in p.read_bytes()
                       for p in tmp_path.rglob("*") if p.is_file())
    assert without_requests(summary(tmp_path / "scored")) == without_requests(summary(tmp_path / "single"))


def test_a_file_remote_is_read_by_estimate_and_run_and_a_rerun_sends_nothing(tmp_path: Path):
    data = data_dir(tmp_path / "data", 60)
    remote = f"file://{tmp_path / 'shared'}"
    with serve(model="fake", p_first=None, p_yes=None, record=False) as server:
        assert subprocess.run(dxi("run", server.url, data, tmp_path / "a", tmp_path / "o1", "--cache-remote",
                                  remote)).returncode == 0
        assert sorted(p.parent.name for p in (tmp_path / "shared").rglob("*") if p.is_file()) == ["manifests", "shards"]
        first = server.stats()["arrivals"]
        est = subprocess.run(dxi("estimate", server.url, data, tmp_path / "b", tmp_path / "o2", "--json",
                                 "--cache-remote", remote), capture_output=True)
        assert orjson.loads(est.stdout)["total"]["new"] == 0  # another machine sees the rows through the remote
        assert subprocess.run(dxi("run", server.url, data, tmp_path / "b", tmp_path / "o3", "--cache-remote",
                                  remote)).returncode == 0
        assert server.stats()["arrivals"] == first == 60
    assert summary(tmp_path / "o3")["models"][0]["requests"]["cache_hits"] == 60


def test_sigkill_during_uploads_leaves_only_whole_shards_and_the_rerun_sends_only_what_is_missing(tmp_path: Path):
    tasks = 600
    data = data_dir(tmp_path / "data", tasks)
    cache = tmp_path / "cache"
    with moto_s3() as s3, serve(model="fake", p_first=None, p_yes=None, record=False, latency="0.02") as server:
        env = {**os.environ, **s3.env}
        cmd = dxi("run", server.url, data, cache, tmp_path / "out", "--cache-remote", s3.uri(), "--upload-every", "0.2",
                  "--max-in-flight", "4")  # ~3 s of sending: a shard uploaded every 0.2 s meanwhile
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while len(s3.keys("dxi/manifests/")) < 2:  # uploading as it goes: kill it between or during uploads
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        check_whole(s3)  # no partial object visible
        kept = Cache(cache).scan().collect()["key"].n_unique()
        before = server.stats()["arrivals"]
        assert 0 < kept < tasks
        assert subprocess.run(cmd[:-2], env=env, stdout=subprocess.DEVNULL).returncode == 0  # (16 in flight)
        assert server.stats()["arrivals"] - before == tasks - kept  # only what was missing
        manifests = check_whole(s3)
        local = {p.stem for p in (cache / "shards").glob("*.parquet")}
        assert local <= set(manifests)  # every local shard uploaded, the killed run's included
        assert sum(m.rows for m in manifests.values()) == tasks


def test_uploads_that_fail_give_exit_code_5_and_the_next_run_uploads_the_rest(tmp_path: Path, monkeypatch):
    cache = tmp_path / "cache"
    with moto_s3(monkeypatch) as s3:
        remote = Remote(s3.uri(), cache)
        assert remote.pull() == 0
        with Cache(cache, roll_rows=2) as c:
            for i in range(5):
                c.append(_row(f"k{i}", float(i)))
        assert remote.finish() == []
        first = set(live(remote.manifests()))
    assert len(first) == 3
    with Cache(cache, roll_rows=2) as c:  # another run writes while the remote is away
        c.append(_row("k9", 9.0))
    with moto_s3(monkeypatch) as gone:  # a fresh server: the earlier one is stopped (the endpoint refuses)
        pass
    d = distributed.Distributed(remote=Remote(f"s3://{gone.bucket}/dxi?endpoint={gone.endpoint}", cache))
    assert d.finish() == distributed.EXIT_UPLOAD
    with moto_s3(monkeypatch) as s3:
        again = Remote(s3.uri(), cache)
        assert again.finish() == [] and again.uploaded == 4  # all of them: idempotent by name
        assert again.finish() == [] and again.uploaded == 4  # nothing more to do


def test_compaction_merges_small_shards_and_readers_see_the_same_rows(tmp_path: Path, monkeypatch):
    with moto_s3(monkeypatch) as s3:
        _write_through(s3, tmp_path / "w", [*(_row(f"k{i}", float(i)) for i in range(10)),
                                             _row("k0", 20.0, status="invalid")], roll_rows=3)  # a newer row for k0
        reader = Remote(s3.uri(), tmp_path / "r")
        assert reader.pull() == 4
        before = Cache(tmp_path / "r", remote=reader).scan().collect().sort("key", "created_at")
        assert before.height == 11

        assert Remote(s3.uri(), tmp_path / "c").compact(target_rows=100) == (4, 1)
        manifests = check_whole(s3)
        assert len(manifests) == 1 and len(s3.keys("dxi/shards/")) == 1
        (merged,) = manifests.values()
        assert sorted(merged.replaces) == sorted(p.stem for p in (tmp_path / "r" / "remote" / "shards").glob("*.parquet"))
        assert Remote(s3.uri(), tmp_path / "c").compact(target_rows=100) == (0, 0)  # idempotent

        assert reader.pull() == 1  # the merged shard; the four it replaces are dropped here
        with Cache(tmp_path / "r", remote=reader) as c:
            after = c.scan().collect().sort("key", "created_at")
            assert c.status("k0") == "invalid"
        assert after.equals(before)
        fresh = Remote(s3.uri(), tmp_path / "fresh")
        assert fresh.pull() == 1
        assert Cache(tmp_path / "fresh", remote=fresh).scan().collect().sort("key", "created_at").equals(before)


def test_a_shard_that_does_not_match_its_manifest_is_never_read(tmp_path: Path, monkeypatch):
    with moto_s3(monkeypatch) as s3:
        _write_through(s3, tmp_path / "w", [_row("k1", 1.0)])
        (key,) = s3.keys("dxi/shards/")
        s3.client().put_object(Bucket=s3.bucket, Key=key, Body=b"PAR1 damaged PAR1")
        reader = Remote(s3.uri(), tmp_path / "r")
        assert reader.pull() == 0
        assert "does not match its manifest" in reader.warnings[0]
        assert Cache(tmp_path / "r", remote=reader).scan().collect().height == 0


def test_uris_and_credentials():
    fs, base = open_uri("s3://bucket/some/prefix?endpoint=http://127.0.0.1:9000&region=eu-west-1", env={})
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


def _write_through(s3, where: Path, rows: list[dict], roll_rows: int = ROLL_ROWS) -> None:
    """Append ``rows`` to a cache at ``where`` with ``s3``'s remote tier (a shard every ``roll_rows`` rows)
    and finish its uploads, every one of which must succeed."""
    writer = Remote(s3.uri(), where)
    with Cache(where, roll_rows=roll_rows, remote=writer) as c:
        for row in rows:
            c.append(row)
    assert writer.finish() == []


def _row(key: str, created_at: float, status: str = "ok") -> dict:
    return {"key": key, "provider": "systemone", "model": "m", "endpoint": "e", "params": "{}", "sample": 0,
            "prompt_version": "v", "eval": "when2call", "task_id": f"when2call/{key}", "task_digest": "d",
            "request_body": "{}", "status": status, "error": None, "error_kind": None, "http_status": 200,
            "attempts": 1, "raw_reply": "{}", "served_model": "m", "input_tokens": 1, "output_tokens": 1,
            "latency_ms": 1.0, "created_at": created_at, "answers": [], "repaired": False}


def test_a_remote_shard_damaged_here_is_quarantined_like_a_local_one_and_fetched_again_at_once(tmp_path: Path,
                                                                                               monkeypatch):
    with moto_s3(monkeypatch) as s3:
        _write_through(s3, tmp_path / "w", [_row("k1", 1.0), _row("k2", 2.0)])
        (shard,) = (tmp_path / "w" / "shards").glob("*.parquet")
        for damage in ("footer", "page"):  # found when the key index loads; found by the first scan
            reader = Remote(s3.uri(), tmp_path / damage)
            assert reader.pull() == 1
            copy = tmp_path / damage / "remote" / "shards" / shard.name
            data = bytearray(copy.read_bytes())
            if damage == "footer":
                del data[-20:]
            else:  # a byte flipped in the last page of the first column: only the page checksums see it
                key = pq.ParquetFile(copy).metadata.row_group(0).column(0)
                start = key.dictionary_page_offset if key.has_dictionary_page and key.dictionary_page_offset else \
                    key.data_page_offset
                data[start + key.total_compressed_size - 2] ^= 0xFF
            copy.write_bytes(bytes(data))
            with Cache(tmp_path / damage, remote=reader) as c:  # the same process reads the fresh copy
                if damage == "footer":
                    assert (c.status("k1"), c.status("k2"), len(c)) == ("ok", "ok", 2)
                assert c.read(lambda rows: sorted(rows.collect()["key"])) == ["k1", "k2"]
                assert copy.read_bytes() == shard.read_bytes() and reader.downloaded == 2
                assert len(c.warnings) == 2 and "quarantine" in c.warnings[0] and "Fetching it again" in c.warnings[0]
                assert c.warnings[1] == f"cache: {copy} fetched again from {reader.name}: whole; its rows are read."
            assert len(list((tmp_path / damage / "quarantine").glob(f"{shard.name}.*"))) == 1
            assert reader.pull() == 0  # nothing left to fetch


def test_a_remote_shard_damaged_on_the_remote_too_is_fetched_again_once_then_its_requests_are_sent(tmp_path: Path,
                                                                                                  monkeypatch):
    with moto_s3(monkeypatch) as s3:
        _write_through(s3, tmp_path / "w", [_row("k1", 1.0)])
        (shard,) = (tmp_path / "w" / "shards").glob("*.parquet")
        damaged = shard.read_bytes()[:-20]  # the remote's own copy damaged, its manifest agreeing with it
        client = s3.client()
        client.put_object(Bucket=s3.bucket, Key=f"dxi/shards/{shard.name}", Body=damaged)
        m = Manifest(shard.stem, len(damaged), hashlib.sha256(damaged).hexdigest(), 1)
        client.put_object(Bucket=s3.bucket, Key=f"dxi/manifests/{shard.stem}.json", Body=m.to_json())
        reader = Remote(s3.uri(), tmp_path / "r")
        assert reader.pull() == 1
        with Cache(tmp_path / "r", remote=reader) as c:
            assert c.status("k1") is None and len(c) == 0  # its request will be sent again
            assert c.read(lambda rows: rows.collect().height) == 0
            assert reader.downloaded == 2  # the pull and one fetch again, no more
            assert ["Fetching it again" in w for w in c.warnings] == [True, False]
            assert "Its requests will be sent again." in c.warnings[1]
        assert len(list((tmp_path / "r" / "quarantine").glob(f"{shard.name}.*"))) == 2


def test_the_run_file_names_the_remote_and_dxi_cache_compact_merges_it(tmp_path: Path):
    data = data_dir(tmp_path / "data", 40)
    shared = tmp_path / "shared"
    with serve(model="fake", p_first=None, p_yes=None, record=False) as server:
        for k in range(2):  # two shards, two files: the key is read from the run file
            run_file = tmp_path / f"run{k}.toml"
            run_file.write_text(f'data_dir = "{data}"\ncache_dir = "cache{k}"\nout = "out{k}"\n'
                                f'cache_remote = "file://{shared}"\n[[models]]\nprovider = "systemone"\n'
                                f'model = "fake"\n[providers.systemone]\nkind = "systemone"\nbase_url = "{server.url}"\n')
            assert subprocess.run([DXI, "run", str(run_file), "-q", "--shard", f"{k}/2"]).returncode == 0
    assert len(list((shared / "manifests").glob("*.json"))) == 2
    compact = [DXI, "cache", "compact", "--cache-remote", f"file://{shared}", "--cache-dir", str(tmp_path / "tmp")]
    done = subprocess.run(compact, capture_output=True, text=True)
    assert done.returncode == 0 and "merged 2 shard(s) into 1" in done.stdout
    assert "nothing to merge" in subprocess.run(compact, capture_output=True, text=True).stdout
    assert len(list((shared / "manifests").glob("*.json"))) == len(list((shared / "shards").glob("*.parquet"))) == 1
    scored = subprocess.run([DXI, "score", str(tmp_path / "run0.toml"), "--cache-dir", str(tmp_path / "empty"),
                             "--out", str(tmp_path / "scored"), "-q"], capture_output=True)
    assert scored.returncode == 0, scored.stderr
    assert summary(tmp_path / "scored")["models"][0]["usage"]["replies"] == 40  # both shards' rows, once each


def test_a_run_whose_uploads_fail_exits_5_and_the_next_run_uploads_them_sending_nothing(tmp_path: Path):
    data = data_dir(tmp_path / "data", 30)
    remote = tmp_path / "shared"
    remote.mkdir()
    (remote / "shards").write_text("not a folder")  # the store refuses every shard
    cmd = [DXI, "run", "--model", "embedded:sparrow-nano-general-v1.1", "--data-dir", str(data), "--cache-dir",
           str(tmp_path / "cache"), "--out", str(tmp_path / "out"), "-q", "--cache-remote", f"file://{remote}"]
    failed = subprocess.run(cmd, capture_output=True, text=True)
    assert failed.returncode == distributed.EXIT_UPLOAD == 5, failed.stderr
    assert "could not be uploaded" in failed.stderr and "the next run" in failed.stderr
    (remote / "shards").unlink()
    again = subprocess.run(cmd, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    assert "uploaded 1 shard(s)" in again.stderr
    assert summary(tmp_path / "out")["models"][0]["requests"]["sent"] == 0  # all cached: only the upload was left
    assert len(list((remote / "manifests").glob("*.json"))) == 1


def test_a_reader_that_listed_before_a_compaction_lists_again_and_loses_no_row(tmp_path: Path, monkeypatch):
    with moto_s3(monkeypatch) as s3:
        _write_through(s3, tmp_path / "w", [_row(f"k{i}", float(i)) for i in range(6)], roll_rows=2)
        reader = Remote(s3.uri(), tmp_path / "r")
        stale = reader.manifests()  # listed just before the compaction ...
        assert Remote(s3.uri(), tmp_path / "c").compact(target_rows=100) == (3, 1)
        listings = []

        def listing(known=None):
            listings.append(1)
            return stale if len(listings) == 1 else Remote.manifests(reader, known)

        monkeypatch.setattr(reader, "manifests", listing)
        assert reader.pull() == 1  # ... so its shards were gone: it listed again and took the merged one
        assert len(listings) == 2
        assert sorted(Cache(tmp_path / "r", remote=reader).scan().collect()["key"]) == [f"k{i}" for i in range(6)]
