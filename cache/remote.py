"""A remote tier for the cache: shards shared on object storage (``s3://``, ``gs://``) or a shared folder
(``file://``), through pyarrow's filesystems.

Layout under the URI's prefix::

    shards/<stem>.parquet     whole shards, immutable, each under its globally unique name
    manifests/<stem>.json     one per shard, written after it: {"shard", "bytes", "sha256", "rows", "replaces"}

**Writing stays local.** Rows go to the local cache exactly as without a remote (log, flock, shard by
rename: ``cache.store``). Each shard, once compacted, is uploaded under its own name (``shard_written``,
in a background thread), then its manifest is written; a reader only ever reads shards a manifest names,
so it never sees a part of one (an object store's upload is whole or absent; on a ``file://`` folder the
shard and its manifest are written to a temporary name and renamed). ``finish`` waits for the uploads and
uploads whatever local shard has no manifest yet (a failed upload, an earlier run's, a killed process's
recovered log): uploads are idempotent by name, so the next run uploads the rest.

**Reading.** ``pull`` downloads every shard the remote's manifests name and the local cache lacks into
``<cache-dir>/remote/`` (checked against the manifest's size and sha256: a damaged transfer is refused
and fetched again next time); the cache then reads local and remote shards through the same functions
(``Cache._shards`` -> ``visible``), so its integrity checks (footers, page checksums, quarantine) apply to
remote shards as to local ones; a local copy found damaged is set aside and downloaded again at once
(``refetch``, once per shard and process), so the run reads it instead of sending its requests again
(only when that copy is damaged too are they sent). Shards are read in name order, local and remote alike, so a tie between
two rows of one request (the same ``created_at``) is broken the same way on every machine.

**Compaction** (``compact``, ``dxi cache compact``) merges small shards into one, written under a new name
with a manifest whose ``replaces`` lists every shard it holds the rows of (transitively); then the old
manifests and shards are deleted. A reader that sees both the new manifest and the old ones reads only
the new shard; a reader that listed the old manifests and finds a shard gone lists again. Safe beside
writers (it touches only shards it listed). Run one compaction at a time: two at once lose nothing but
may keep copies of some rows, which scoring ignores (one row per request, newest first) and the next
compaction drops.

Credentials come from the standard environment (S3: ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` /
``AWS_SESSION_TOKEN``, ``AWS_PROFILE``, instance roles; GCS: ``GOOGLE_APPLICATION_CREDENTIALS`` or the
metadata server) and are never part of the URI (refused), of the cache, of messages or of reports. The
S3 endpoint of an S3-compatible store (MinIO, Ceph, moto) is read from ``?endpoint=URL`` in the URI, else
``AWS_ENDPOINT_URL_S3``, else ``AWS_ENDPOINT_URL``, and passed explicitly: pyarrow's S3 filesystem itself
ignores those variables (apache/arrow#49643). The region: ``?region=``, else ``AWS_REGION`` /
``AWS_DEFAULT_REGION``.
"""
from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

import orjson
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from . import layout, verify

log = logging.getLogger("dxi.cache")

MIRROR = "remote"  # <cache-dir>/remote/{shards,manifests}: the local copies of remote shards
PARALLEL = 8  # manifests and shards fetched at once


class RemoteError(OSError):
    """The remote tier cannot be reached or used; the message names the URI (without credentials)."""


@dataclass(frozen=True)
class Manifest:
    """One remote shard: its ``stem`` (the shard is ``shards/<stem>.parquet``), size in ``bytes``, ``sha256``
    (hex, of the file's bytes), ``rows``, and the stems of the shards whose rows it holds (``replaces``:
    empty for a shard a run wrote, the merged shards for a compacted one)."""

    stem: str
    bytes: int
    sha256: str
    rows: int
    replaces: tuple[str, ...] = ()

    def to_json(self) -> bytes:
        return orjson.dumps({"shard": f"{self.stem}.parquet", "bytes": self.bytes, "sha256": self.sha256,
                             "rows": self.rows, "replaces": list(self.replaces), "version": 1})

    @classmethod
    def from_json(cls, data: bytes) -> Manifest:
        doc = orjson.loads(data)
        shard = doc["shard"]
        if not isinstance(shard, str) or not shard.endswith(".parquet") or "/" in shard:
            raise ValueError(f"shard {shard!r} is not a shard name")
        return cls(shard[: -len(".parquet")], int(doc["bytes"]), str(doc["sha256"]), int(doc["rows"]),
                   tuple(str(s) for s in doc.get("replaces") or ()))


def live(manifests: dict[str, Manifest]) -> dict[str, Manifest]:
    """The manifests whose shard no other manifest replaces: the shards to read."""
    replaced = {s for m in manifests.values() for s in m.replaces}
    return {stem: m for stem, m in manifests.items() if stem not in replaced}


def display(uri: str) -> str:
    """``uri`` without its query (endpoint, region): what messages show."""
    parts = urlsplit(uri)
    return f"{parts.scheme}://{parts.netloc}{parts.path}"


def open_uri(uri: str, env: dict[str, str] | None = None) -> tuple[pafs.FileSystem, str]:
    """``(filesystem, base path)`` for ``s3://bucket/prefix``, ``gs://bucket/prefix`` or ``file:///dir``
    (see the module docstring for endpoints and credentials). Raises RemoteError for another scheme or
    credentials written into the URI."""
    env = dict(os.environ) if env is None else env
    parts = urlsplit(uri)
    scheme = parts.scheme.lower()
    if "@" in parts.netloc:
        raise RemoteError(f"--cache-remote {scheme}://...: credentials do not belong in the URI; give them in the "
                          "environment (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, GOOGLE_APPLICATION_CREDENTIALS)")
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    path = unquote(parts.path).strip("/")
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise RemoteError(f"--cache-remote {uri}: a file:// URI names a folder on this machine (file:///dir)")
        return pafs.LocalFileSystem(), "/" + path
    if scheme in ("s3", "gs", "gcs"):
        if not parts.netloc:
            raise RemoteError(f"--cache-remote {display(uri)}: name the bucket ({scheme}://BUCKET/PREFIX)")
        base = f"{parts.netloc}/{path}".rstrip("/")
    else:
        raise RemoteError(f"--cache-remote {display(uri)}: unknown scheme {scheme!r}; use s3://, gs:// or file://")
    if scheme == "s3":
        endpoint = query.get("endpoint") or env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
        options: dict = {"region": query.get("region") or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
                         or "us-east-1", "connect_timeout": 10.0, "request_timeout": 60.0}
        if endpoint:
            ep = urlsplit(endpoint if "://" in endpoint else f"https://{endpoint}")
            options |= {"endpoint_override": ep.netloc, "scheme": ep.scheme or "https"}
        return pafs.S3FileSystem(**options), base
    return pafs.GcsFileSystem(**({"endpoint_override": query["endpoint"], "scheme": "http"}
                                 if "endpoint" in query else {})), base


@dataclass
class Remote:
    """The remote tier at ``uri`` for the local cache at ``root`` (see the module docstring).

    ``pull()`` brings the remote's shards here; ``visible(local_shards)`` is what the cache reads;
    ``shard_written(path)`` uploads a new local shard in the background; ``finish()`` waits for the
    uploads, uploads what is still missing and returns the failures (empty when all is uploaded).
    ``warnings`` lists what went wrong (also logged)."""

    uri: str
    root: Path
    mirror_root: Path | None = None  # where the remote's shards are copied (default: <root>/remote; dxi view: its own folder)
    fs: pafs.FileSystem = field(init=False, repr=False)
    base: str = field(init=False)
    warnings: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.root = Path(self.root)
        self.fs, self.base = open_uri(self.uri)
        self.name = display(self.uri)
        self._uploader: ThreadPoolExecutor | None = None
        self._pending: list[Future] = []
        self._failed: list[str] = []
        self._mirrored: dict[str, Manifest] | None = None  # the local copies' manifests
        self._refetched: set[str] = set()  # stems whose damaged local copy was downloaded again (once each)
        self.uploaded = 0  # shards this process uploaded
        self.downloaded = 0

    # ---- paths ------------------------------------------------------------------------------
    def _remote(self, *parts: str) -> str:
        return "/".join([self.base, *parts]) if self.base else "/".join(parts)

    def _local_shards(self) -> list[Path]:
        """The local cache's own shards (the layout of ``cache.store``)."""
        return sorted((self.root / "shards").glob("*.parquet"))

    @property
    def mirror(self) -> Path:
        return Path(self.mirror_root) if self.mirror_root is not None else self.root / MIRROR

    def _warn(self, message: str) -> None:
        self.warnings.append(message)
        log.warning(message)

    def _put(self, path: str, data: bytes) -> None:
        """Write ``data`` at ``path`` whole or not at all: an object store's upload is atomic; on a local
        folder it is written to a temporary name and renamed."""
        if isinstance(self.fs, pafs.LocalFileSystem):
            self.fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
            tmp = f"{path.rsplit('/', 1)[0]}/.{uuid.uuid4().hex}.tmp"
            try:
                with self.fs.open_output_stream(tmp) as out:
                    out.write(data)
                self.fs.move(tmp, path)
            except BaseException:
                with contextlib.suppress(OSError):
                    self.fs.delete_file(tmp)
                raise
            return
        with self.fs.open_output_stream(path) as out:
            out.write(data)

    def _get(self, path: str) -> bytes:
        # a random-access file read whole: one ranged GET (a stream reads in small parts, one request each:
        # measured 60 times slower for a 40 MB shard)
        with self.fs.open_input_file(path) as f:
            return f.read()

    # ---- listing ------------------------------------------------------------------------------
    def manifests(self, known: dict[str, Manifest] | None = None) -> dict[str, Manifest]:
        """Every manifest on the remote, by stem (unreadable ones skipped with a warning); those in ``known``
        are not fetched again (a manifest never changes under its name). Raises RemoteError when the remote
        cannot be listed."""
        known = known or {}
        try:
            infos = self.fs.get_file_info(pafs.FileSelector(self._remote("manifests"), allow_not_found=True))
        except (OSError, pa.ArrowException) as exc:
            raise RemoteError(f"cannot list {self.name}/manifests: {exc}") from None
        names = [info.path.rsplit("/", 1)[-1] for info in infos if info.type == pafs.FileType.File]
        stems = [n[: -len(".json")] for n in names if n.endswith(".json") and not n.startswith(".")]
        out = {stem: known[stem] for stem in stems if stem in known}

        def fetch(stem: str) -> Manifest | None:
            try:
                return Manifest.from_json(self._get(self._remote("manifests", f"{stem}.json")))
            except FileNotFoundError:
                return None  # deleted by a compaction meanwhile
            except (OSError, ValueError, KeyError, TypeError, orjson.JSONDecodeError) as exc:
                self._warn(f"cache: remote manifest {self.name}/manifests/{stem}.json is unreadable ({exc}); skipped")
                return None

        with ThreadPoolExecutor(PARALLEL, thread_name_prefix="dxi-list") as pool:
            for m in pool.map(fetch, [s for s in stems if s not in known]):
                if m is not None:
                    out[m.stem] = m
        return out

    # ---- reading ------------------------------------------------------------------------------
    def pull(self) -> int:
        """Download every live remote shard not in the local cache (its own shards or the mirror), each
        checked against its manifest; drop local copies a compaction replaced. Returns the number of shards
        downloaded. A shard deleted meanwhile (a compaction) makes it list again, up to three times.
        Raises RemoteError when the remote cannot be listed."""
        (self.mirror / "shards").mkdir(parents=True, exist_ok=True)
        (self.mirror / "manifests").mkdir(parents=True, exist_ok=True)
        self._remove_abandoned()
        fetched = 0
        for _ in range(3):
            self._mirrored = None
            current = live(self.manifests(self._mirror_manifests()))
            local = {p.stem for p in self._local_shards()}
            wanted = []
            for stem, m in sorted(current.items()):
                if stem in local or (self.mirror / "shards" / f"{stem}.parquet").exists():
                    self._keep_manifest(m)
                else:
                    wanted.append(m)
            with ThreadPoolExecutor(PARALLEL, thread_name_prefix="dxi-pull") as pool:
                outcomes = list(pool.map(self._download, wanted))
            fetched += outcomes.count("ok")
            if "gone" not in outcomes:
                break
        self._mirrored = None
        replaced = {s for m in self._mirror_manifests().values() for s in m.replaces}
        for stem in replaced:  # rows now in a compacted shard held here
            (self.mirror / "shards" / f"{stem}.parquet").unlink(missing_ok=True)
            (self.mirror / "manifests" / f"{stem}.json").unlink(missing_ok=True)
        self._mirrored = None
        self.downloaded += fetched
        return fetched

    def _download(self, m: Manifest) -> str:
        """Fetch one shard into the mirror, checked against its manifest: "ok", "gone" (deleted meanwhile by a
        compaction) or "failed" (with a warning)."""
        try:
            data = self._get(self._remote("shards", f"{m.stem}.parquet"))
        except FileNotFoundError:
            return "gone"
        except (OSError, pa.ArrowException) as exc:
            self._warn(f"cache: could not download {self.name}/shards/{m.stem}.parquet ({exc}); its rows are not "
                       "read this time")
            return "failed"
        if len(data) != m.bytes or hashlib.sha256(data).hexdigest() != m.sha256:
            self._warn(f"cache: {self.name}/shards/{m.stem}.parquet does not match its manifest (size or sha256); "
                       "not read, fetched again next time")
            return "failed"
        target = self.mirror / "shards" / f"{m.stem}.parquet"
        tmp = target.with_name(f".{m.stem}.{uuid.uuid4().hex[:8]}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, target)
        self._keep_manifest(m)
        return "ok"

    def can_refetch(self, shard: Path) -> bool:
        """Whether ``shard`` is a local copy of a remote shard (under ``remote/shards/``, its manifest held
        here) not yet downloaded again by this process."""
        return (shard.parent == self.mirror / "shards" and shard.stem not in self._refetched
                and shard.stem in self._mirror_manifests())

    def refetch(self, shard: Path) -> bool:
        """Download the remote shard ``shard`` is a local copy of again (its damaged copy was set aside by the
        cache), checked against its manifest: True when a fresh copy is in place. Once per shard and process
        (``can_refetch``): a copy damaged again is left to the cache to set aside, and its requests are sent
        again. A failed download is warned about (``_download``)."""
        if not self.can_refetch(shard):
            return False
        self._refetched.add(shard.stem)
        if self._download(self._mirror_manifests()[shard.stem]) != "ok":
            return False
        self.downloaded += 1
        return True

    def _keep_manifest(self, m: Manifest) -> None:
        path = self.mirror / "manifests" / f"{m.stem}.json"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{m.stem}.{uuid.uuid4().hex[:8]}.tmp")
            tmp.write_bytes(m.to_json())
            os.replace(tmp, path)
            self._mirrored = None  # read again when next needed (never changed in place: readers hold the old one)

    def _remove_abandoned(self) -> None:
        for tmp in [*self.mirror.glob("shards/.*.tmp"), *self.mirror.glob("manifests/.*.tmp")]:
            with contextlib.suppress(FileNotFoundError):
                if time.time() - tmp.stat().st_mtime > 60:
                    tmp.unlink()

    def _mirror_manifests(self) -> dict[str, Manifest]:
        if self._mirrored is None:
            out = {}
            for path in (self.mirror / "manifests").glob("*.json"):
                with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                    m = Manifest.from_json(path.read_bytes())
                    out[m.stem] = m
            self._mirrored = out
        return self._mirrored

    def visible(self, local: list[Path]) -> list[Path]:
        """The shards the cache reads: ``local`` ones and the remote ones held here, less those whose rows a
        compacted shard held here has, in name order (local and remote alike)."""
        mirrored = [p for p in (self.mirror / "shards").glob("*.parquet")]
        present = {p.stem for p in mirrored}
        replaced = {s for stem, m in self._mirror_manifests().items() if stem in present for s in m.replaces}
        own = {p.stem for p in local}
        shards = [p for p in local if p.stem not in replaced]
        shards += [p for p in mirrored if p.stem not in replaced and p.stem not in own]
        return sorted(shards, key=lambda p: p.name)

    # ---- writing ------------------------------------------------------------------------------
    def upload(self, shard: Path, replaces: tuple[str, ...] = ()) -> Manifest:
        """Upload one local shard under its name, then its manifest (idempotent: the same name holds the same
        rows). Raises OSError / ArrowException when the remote refuses, and RemoteError for a shard whose pages
        fail their checksums (never uploaded: every reader would set it aside)."""
        if (damage := verify.page_checksums(shard)) is not None:
            raise RemoteError(f"{shard} is damaged ({type(damage).__name__}: {damage}); not uploaded")
        data = shard.read_bytes()
        m = Manifest(shard.stem, len(data), hashlib.sha256(data).hexdigest(),
                     pq.ParquetFile(pa.BufferReader(data)).metadata.num_rows, replaces)
        self._put(self._remote("shards", shard.name), data)
        self._put(self._remote("manifests", f"{shard.stem}.json"), m.to_json())
        self.uploaded += 1
        self._keep_manifest(m)  # so that listing the remote need not fetch it again
        return m

    def _upload_quietly(self, shard: Path) -> None:
        try:
            self.upload(shard)
        except FileNotFoundError:
            pass  # moved to quarantine meanwhile
        except RemoteError as exc:  # damaged here: set aside when the cache is read, its requests sent again
            self._warn(f"cache: {exc}")
        except (OSError, pa.ArrowException) as exc:
            self._failed.append(shard.name)
            self._warn(f"cache: could not upload {shard.name} to {self.name} ({exc}); it stays in the local cache "
                       "and the next run uploads it")

    def shard_written(self, shard: Path) -> None:
        """A shard was renamed into place in the local cache: upload it in the background."""
        if self._uploader is None:
            self._uploader = ThreadPoolExecutor(1, thread_name_prefix="dxi-upload")
        self._pending = [f for f in self._pending if not f.done()]
        self._pending.append(self._uploader.submit(self._upload_quietly, shard))

    def finish(self) -> list[str]:
        """Wait for the background uploads, then upload every local shard the remote has no manifest for
        (nor a compacted shard holding its rows). Returns the names of the shards not uploaded (empty: all
        done); the reasons are in ``warnings``."""
        if self._uploader is not None:
            self._uploader.shutdown(wait=True)
            self._uploader = None
        self._failed = []
        try:
            remote = self.manifests(self._mirror_manifests())
        except RemoteError as exc:
            self._warn(f"cache: {exc}")
            return [p.name for p in self._local_shards()]
        done = set(remote) | {s for m in remote.values() for s in m.replaces}
        for shard in self._local_shards():
            if shard.stem not in done:
                self._upload_quietly(shard)
        return sorted(self._failed)

    # ---- compaction ---------------------------------------------------------------------------
    def compact(self, target_rows: int = 1_000_000, min_shards: int = 2) -> tuple[int, int]:
        """Merge the remote's live shards smaller than ``target_rows`` into shards of up to ``target_rows``
        rows (see the module docstring). Returns (shards merged, shards written). Idempotent: with fewer than
        ``min_shards`` small shards it does nothing."""
        self._remove_stale_uploads()
        current = live(self.manifests())
        small = sorted((m for m in current.values() if m.rows < target_rows), key=lambda m: m.stem)
        groups: list[list[Manifest]] = []
        for m in small:
            if not groups or sum(g.rows for g in groups[-1]) + m.rows > target_rows:
                groups.append([])
            groups[-1].append(m)
        merged = written = 0
        self.root.mkdir(parents=True, exist_ok=True)
        for group in (g for g in groups if len(g) >= min_shards):
            tables = []
            for m in group:
                data = self._get(self._remote("shards", f"{m.stem}.parquet"))
                if len(data) != m.bytes or hashlib.sha256(data).hexdigest() != m.sha256:
                    raise RemoteError(f"{self.name}/shards/{m.stem}.parquet does not match its manifest; not compacted")
                try:  # a shard whose pages fail their checksums is never rewritten with fresh ones
                    tables.append(layout.to_shard(pq.read_table(pa.BufferReader(data), page_checksum_verification=True)))
                except Exception as exc:
                    raise RemoteError(f"{self.name}/shards/{m.stem}.parquet is damaged ({type(exc).__name__}: {exc}); "
                                      "not compacted") from None
            table = _dedupe(pa.concat_tables(tables, promote_options="default"))
            stems = tuple(sorted({m.stem for m in group} | {s for m in group for s in m.replaces}))
            name = f"{group[-1].stem.split('-', 1)[0]}-compact-{hashlib.sha256(' '.join(stems).encode()).hexdigest()[:16]}"
            tmp = self.root / f".{name}.{uuid.uuid4().hex[:8]}.tmp"
            try:
                layout.write_shard(table, tmp)  # in the flat layout, whatever the merged shards' layouts
                final = tmp.with_name(f"{name}.parquet")
                os.replace(tmp, final)
                try:
                    self.upload(final, stems)
                finally:
                    final.unlink(missing_ok=True)
            finally:
                tmp.unlink(missing_ok=True)
            for m in group:  # manifests first: a reader never finds a manifest without its shard for long
                with contextlib.suppress(FileNotFoundError):
                    self.fs.delete_file(self._remote("manifests", f"{m.stem}.json"))
            for m in group:
                with contextlib.suppress(FileNotFoundError):
                    self.fs.delete_file(self._remote("shards", f"{m.stem}.parquet"))
            merged += len(group)
            written += 1
        return merged, written

    def _remove_stale_uploads(self, age_s: float = 3600) -> None:
        """On a ``file://`` remote: delete temporary files a killed upload left (older than ``age_s``). An
        object store keeps no part of an upload that did not complete."""
        if not isinstance(self.fs, pafs.LocalFileSystem):
            return
        for folder in ("shards", "manifests"):
            for path in Path(self._remote(folder)).glob(".*.tmp"):
                with contextlib.suppress(FileNotFoundError):
                    if time.time() - path.stat().st_mtime > age_s:
                        path.unlink()


def _dedupe(table: pa.Table) -> pa.Table:
    """``table`` less exact copies of a row (same key and created_at: a row held twice), first kept."""
    import polars as pl

    frame = pl.from_arrow(table)
    return frame.unique(subset=["key", "created_at"], keep="first", maintain_order=True).to_arrow().cast(table.schema)
