"""A remote tier for the cache: rows shared on object storage (``s3://``, ``gs://``) or a shared
folder (``file://``), through pyarrow's filesystems, partitioned by key so that a shard reads only
its part.

Layout under the URI's prefix (layout 2; ``cache.partition`` for the nodes)::

    parts/b<LL>/<III>/<stem>.parquet        rows whose keys lie in node (LL, III), flat shard layout
    parts/b<LL>/<III>/<stem>.keys.parquet   the same rows' index columns (``cache.schema.INDEX_COLUMNS``)
    parts/b<LL>/<III>/<stem>.json           the manifest, written last: {"shard", "bytes", "sha256", "rows",
                                            "replaces", "node", "keys": {"bytes", "sha256"}, "version": 2}
    quarantine/<stem>.*                     damaged objects moved aside, with <stem>.json saying why
    shards/<stem>.parquet, manifests/<stem>.json   layout 1 (dxi before the partitions): read, never written

**Writing stays local.** Rows go to the local cache exactly as without a remote (log, flock, shard
by rename: ``cache.store``). Each shard, once compacted, is uploaded in a background thread
(``shard_written``), split by node at the writer's level (``partition.upload_level``: one object per
upload for a single process, a few for one shard of N): per node its rows, their index columns, then
the manifest. A reader reads only objects a manifest names, so it never sees a part of one (an
object store's upload is whole or absent; on a ``file://`` folder each file is written to a
temporary name and renamed). ``finish`` waits for the uploads, uploads whatever local shard was not
(a failed upload, an earlier run's, a killed process's recovered log), puts back any of its own
objects the remote lost or set aside (``recheck``), and compacts.

**Reading** (``pull``). A process that reads everything (scoring, ``dxi view``, export, a run that
is not a shard) lists every node and copies each live object's rows it lacks into
``<cache-dir>/remote/shards/``. Shard K of N (``part``) lists only the nodes its key range meets
that hold objects (one listing of each level's folders says which) and copies only their index
columns (``remote/keys/``): its key index, nothing it does not own, and nothing but what says
whether a request is cached. Nodes are listed coarse levels first (a level's folders looked up after
the coarser level was listed), so an object a compaction moved to a finer node is seen in one place
or the other, never in neither. Every
object is checked against its manifest (size, sha256) and its pages against their checksums before
it is read; the cache then reads the copies through the same functions as its own shards
(``Cache._shards`` -> ``visible``; ``key_files`` for the index), so its integrity checks apply to
them too. Objects are read in name order, so a tie between two rows of one request (the same
``created_at``) is broken the same way on every machine.

**Damage** (``quarantine``). An object whose bytes do not match its manifest (twice: once may be the
transfer), whose listed size does not, or whose pages fail their checksums is moved to
``quarantine/`` on the remote: copied there, then its manifest, index and rows deleted (an object
store has no rename; two processes doing it at once both succeed). No process reads it again, its
keys count as cached nowhere, and the next run of the shard that owns them sends them again and
uploads a good copy; the process that uploaded it puts it back from its own local shard at its next
``finish``. A local copy found damaged is set aside by the cache and downloaded again at once
(``refetch``, once per object and process); when the fresh copy is damaged too, the remote object is
moved aside (``condemn``).

**Compaction.** Each node's objects stay few without a person: at the end of a run (``finish``), and
during it once a node holds more than ``MAX_OBJECTS``, the process that owns a node (the shard whose
range holds the node's first key; every node for a single process) merges the node's small objects,
and every process merges its own uploads in the nodes it does not own. A merge larger than
``TARGET_ROWS`` is split into the finer nodes it covers (``partition.split_level``). ``compact``
(``dxi cache compact``) rewrites the whole remote that way, layout 1 included. A merged object's
manifest ``replaces`` the objects it holds the rows of, within its node's range: a reader that sees
both reads only the new one where every part of its range the old one held is replaced (``live``);
then the old objects are deleted. Two merges of one node at once lose nothing but may keep copies of
some rows, which scoring ignores (one row per request, newest first) and the next merge drops.

Credentials come from the standard environment (S3: ``AWS_ACCESS_KEY_ID`` /
``AWS_SECRET_ACCESS_KEY`` / ``AWS_SESSION_TOKEN``, ``AWS_PROFILE``, instance roles; GCS:
``GOOGLE_APPLICATION_CREDENTIALS`` or the metadata server) and are never part of the URI (refused),
of the cache, of messages or of reports. The S3 endpoint of an S3-compatible store (MinIO, Ceph,
moto) is read from ``?endpoint=URL`` in the URI, else ``AWS_ENDPOINT_URL_S3``, else
``AWS_ENDPOINT_URL``, and passed explicitly: pyarrow's S3 filesystem itself ignores those variables
(apache/arrow#49643). The region: ``?region=``, else ``AWS_REGION`` / ``AWS_DEFAULT_REGION``.

Why one module over 600 lines: ``Remote`` (most of it) is one object store's protocol, its
manifests, uploads, pulls, compaction and quarantine sharing the object layout and the rule of which
manifest is live; split by operation, each part would re-read that rule from another module.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import socket
import time
import uuid
from collections import defaultdict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

import orjson
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from . import layout, verify
from .index import prefixes
from .partition import (
    LEVELS,
    ROOT,
    SPACE,
    Node,
    covered,
    node_indexes,
    nodes_meeting,
    shard_range,
    split_level,
    upload_level,
)
from .schema import INDEX_COLUMNS

log = logging.getLogger("dxi.cache")

# <cache-dir>/remote/{shards,keys,manifests,uploaded}: the local copies of remote objects
MIRROR = "remote"
PARALLEL = 8  # manifests and objects fetched at once
TARGET_ROWS = (
    20_000  # rows per node a merge aims at (about 14 MB of realistic rows): 10M rows reach level 10
)
MAX_OBJECTS = (
    16  # objects in a node past which a run merges them (its owner all small ones, another its own)
)


class RemoteError(OSError):
    """The remote tier cannot be reached or used; the message names the URI (without
    credentials)."""


@dataclass(frozen=True)
class Manifest:
    """One remote object: its ``stem``, the size in ``bytes`` and ``sha256`` (hex) of its rows'
    file, its ``rows``, the stems of the objects whose rows it holds within its node (``replaces``:
    empty for an upload, the merged objects for a compacted one), its ``node`` (None: layout 1, the
    whole key space) and the size and sha256 of its index file (``keys_bytes``, ``keys_sha256``;
    layout 2 only)."""

    stem: str
    bytes: int
    sha256: str
    rows: int
    replaces: tuple[str, ...] = ()
    node: Node | None = None
    keys_bytes: int | None = None
    keys_sha256: str | None = None

    def to_json(self) -> bytes:
        doc = {
            "shard": f"{self.stem}.parquet",
            "bytes": self.bytes,
            "sha256": self.sha256,
            "rows": self.rows,
            "replaces": list(self.replaces),
            "version": 1,
        }
        if self.node is not None:
            doc |= {
                "node": self.node.path,
                "keys": {"bytes": self.keys_bytes, "sha256": self.keys_sha256},
                "version": 2,
            }
        return orjson.dumps(doc)

    @classmethod
    def from_json(cls, data: bytes) -> Manifest:
        doc = orjson.loads(data)
        shard = doc["shard"]
        if not isinstance(shard, str) or not shard.endswith(".parquet") or "/" in shard:
            raise ValueError(f"shard {shard!r} is not a shard name")
        node = keys = None
        if doc.get("node") is not None:
            node, keys = Node.parse(str(doc["node"])), doc["keys"]
        return cls(
            shard[: -len(".parquet")],
            int(doc["bytes"]),
            str(doc["sha256"]),
            int(doc["rows"]),
            tuple(str(s) for s in doc.get("replaces") or ()),
            node,
            None if keys is None else int(keys["bytes"]),
            None if keys is None else str(keys["sha256"]),
        )

    @property
    def span(self) -> tuple[int, int]:
        """The key prefixes its rows may have: ``[lo, hi)``."""
        return (0, SPACE) if self.node is None else (self.node.lo, self.node.hi)

    @property
    def place(self) -> Node:
        """The node it counts in for compaction (layout 1: the root)."""
        return ROOT if self.node is None else self.node

    def path(self, kind: str = "rows") -> str:
        """Its object's path under the prefix: ``kind`` "rows", "keys" or "manifest"."""
        if self.node is None:
            return (
                f"manifests/{self.stem}.json"
                if kind == "manifest"
                else f"shards/{self.stem}.parquet"
            )
        suffix = {"rows": ".parquet", "keys": ".keys.parquet", "manifest": ".json"}[kind]
        return f"parts/{self.node.path}/{self.stem}{suffix}"


def live(manifests: dict[str, Manifest], lo: int = 0, hi: int = SPACE) -> dict[str, Manifest]:
    """The manifests a reader of key range ``[lo, hi)`` reads: those meeting the range, less those
    whose part of the range is covered by the nodes of manifests that replace them (a merge's
    pieces)."""
    replacing: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for m in manifests.values():
        for stem in m.replaces:
            replacing[stem].append(m.span)
    out = {}
    for stem, m in manifests.items():
        a, b = max(lo, m.span[0]), min(hi, m.span[1])
        if a < b and not covered(a, b, replacing.get(stem, [])):
            out[stem] = m
    return out


def display(uri: str) -> str:
    """``uri`` without its query (endpoint, region): what messages show."""
    parts = urlsplit(uri)
    return f"{parts.scheme}://{parts.netloc}{parts.path}"


def open_uri(uri: str, env: dict[str, str] | None = None) -> tuple[pafs.FileSystem, str]:
    """``(filesystem, base path)`` for ``s3://bucket/prefix``, ``gs://bucket/prefix`` or
    ``file:///dir`` (see the module docstring for endpoints and credentials). Raises RemoteError for
    another scheme or credentials written into the URI."""
    env = dict(os.environ) if env is None else env
    parts = urlsplit(uri)
    scheme = parts.scheme.lower()
    if "@" in parts.netloc:
        raise RemoteError(
            f"--cache-remote {scheme}://...: credentials do not belong in the URI; give them in the "
            "environment (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, GOOGLE_APPLICATION_CREDENTIALS)"
        )
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    path = unquote(parts.path).strip("/")
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise RemoteError(
                f"--cache-remote {uri}: a file:// URI names a folder on this machine (file:///dir)"
            )
        return pafs.LocalFileSystem(), "/" + path
    if scheme in ("s3", "gs", "gcs"):
        if not parts.netloc:
            raise RemoteError(
                f"--cache-remote {display(uri)}: name the bucket ({scheme}://BUCKET/PREFIX)"
            )
        base = f"{parts.netloc}/{path}".rstrip("/")
    else:
        raise RemoteError(
            f"--cache-remote {display(uri)}: unknown scheme {scheme!r}; use s3://, gs:// or file://"
        )
    if scheme == "s3":
        endpoint = (
            query.get("endpoint") or env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
        )
        options: dict = {
            "region": query.get("region")
            or env.get("AWS_REGION")
            or env.get("AWS_DEFAULT_REGION")
            or "us-east-1",
            "connect_timeout": 10.0,
            "request_timeout": 60.0,
        }
        if endpoint:
            ep = urlsplit(endpoint if "://" in endpoint else f"https://{endpoint}")
            options |= {"endpoint_override": ep.netloc, "scheme": ep.scheme or "https"}
        return pafs.S3FileSystem(**options), base
    return pafs.GcsFileSystem(
        **(
            {"endpoint_override": query["endpoint"], "scheme": "http"}
            if "endpoint" in query
            else {}
        )
    ), base


@dataclass
class Listing:
    """What one listing of the remote found: the ``manifests`` (by stem), the ``sizes`` of the
    objects listed (by path under the prefix), and the ``nodes`` listed (None: all of them)."""

    manifests: dict[str, Manifest]
    sizes: dict[str, int]
    nodes: set[Node] | None


def local_stem(stem: str) -> str:
    """The local shard an uploaded object came from: its stem up to the node tag
    (``<shard>.p08-03f``)."""
    return stem.split(".", 1)[0]


def _parquet(table: pa.Table, keys: bool = False) -> bytes:
    """``table`` as the bytes of a rows file (the flat shard layout) or, with ``keys``, of an index
    file."""
    sink = pa.BufferOutputStream()
    if keys:
        pq.write_table(table.select(INDEX_COLUMNS), sink, **layout.WRITE_OPTIONS)
    else:
        layout.write_shard(table, sink)
    return sink.getvalue().to_pybytes()


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _by_node(table: pa.Table, level: int) -> list[tuple[Node, pa.Table]]:
    """``table``'s rows split by their node at ``level``, in node order (each part keeps the rows'
    order)."""
    if level == 0 or not table.num_rows:
        return [(ROOT, table)] if table.num_rows else []
    import numpy as np

    index = node_indexes(prefixes(table["key"].to_pylist()), level)
    out = []
    for i in np.unique(index):
        out.append((Node(level, int(i)), table.filter(pa.array(index == i))))
    return out


@dataclass
class Remote:
    """The remote tier at ``uri`` for the local cache at ``root`` (see the module docstring).

    ``part``: ``(K, N)`` when this process is shard K of N (it reads only its key range, index
    columns only, and uploads at ``partition.upload_level(N)``); None: it reads everything.
    ``mirror_root``: where copies go (default ``<root>/remote``; ``dxi view``: its own folder).

    ``pull()`` brings the remote's objects here; ``visible(local_shards)`` is what the cache scans
    and ``key_files()`` what only its key index reads; ``shard_written(path)`` uploads a new local
    shard in the background; ``finish()`` waits for the uploads, uploads what is still missing,
    compacts, and returns the shards not uploaded (empty when all is done). ``warnings`` lists what
    went wrong (also logged)."""

    uri: str
    root: Path
    mirror_root: Path | None = None
    part: tuple[int, int] | None = None
    fs: pafs.FileSystem = field(init=False, repr=False)
    base: str = field(init=False)
    warnings: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.root = Path(self.root)
        self.fs, self.base = open_uri(self.uri)
        self.name = display(self.uri)
        self.keys_only = self.part is not None and self.part[1] > 1
        self.range = shard_range(*self.part) if self.keys_only else (0, SPACE)
        self.level = upload_level(self.part[1] if self.part else 1)
        self._uploader: ThreadPoolExecutor | None = None
        self._pending: list[Future] = []
        self._failed: list[str] = []
        self._mirrored: dict[str, Manifest] | None = None  # the manifests held here
        self._refetched: set[str] = (
            set()
        )  # stems whose damaged local copy was downloaded again (once each)
        self._mine: set[str] = set()  # objects this process uploaded or wrote by merging
        self.uploaded = 0  # local shards this process uploaded
        self.downloaded = 0
        self.read_bytes = 0  # bytes of objects and manifests downloaded
        self.requests = 0  # listings and downloads made (each one request on an object store, or a page of a listing)

    # ---- paths and small I/O ------------------------------------------------------------------
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
        """Write ``data`` at ``path`` (under the prefix) whole or not at all: an object store's
        upload is atomic; on a local folder it is written to a temporary name and renamed."""
        path = self._remote(path)
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
        # a random-access file read whole: one ranged GET (a stream reads in small parts, one
        # request each: measured 60 times slower for a 40 MB shard)
        self.requests += 1
        with self.fs.open_input_file(self._remote(path)) as f:
            data = f.read()
        self.read_bytes += len(data)
        return data

    def _delete(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.delete_file(self._remote(path))

    # ---- start-up checks ---------------------------------------------------------------------
    def check(self, writable: bool = False) -> None:
        """Raise RemoteError (naming the URI) unless the remote's bucket (or, on ``file://``, the
        folder holding the cache's folder) exists and can be listed, and with ``writable`` unless an
        object can be written and deleted there: called before a run sends anything, so that a
        missing bucket or refused credentials stop it at once rather than when its first upload
        fails."""
        top = (
            self.base.split("/", 1)[0]
            if not isinstance(self.fs, pafs.LocalFileSystem)
            else str(Path(self.base).parent)
        )
        try:
            info = self.fs.get_file_info(top)
        except (OSError, pa.ArrowException):
            # (credentials allowed on the prefix only may not see the bucket: the listing decides)
            info = None
        if info is not None and info.type == pafs.FileType.NotFound:
            what = "the bucket" if not isinstance(self.fs, pafs.LocalFileSystem) else "the folder"
            raise RemoteError(f"{what} {top} of {self.name} does not exist")
        self._files(
            "parts"
        )  # RemoteError when it cannot be listed (refused credentials, not a folder)
        if writable:
            probe = f"probes/{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            try:
                self._put(probe, b"{}")
                self._delete(probe)
            except (OSError, pa.ArrowException) as exc:
                raise RemoteError(f"cannot write to {self.name}: {exc}") from None

    # ---- listing ------------------------------------------------------------------------------
    def _entries(self, path: str, recursive: bool = False) -> list[pafs.FileInfo]:
        """What ``path`` (under the prefix) holds, files and folders (all below it with
        ``recursive``); nothing when it does not exist. Raises RemoteError when it cannot be
        listed."""
        self.requests += 1
        try:
            return self.fs.get_file_info(
                pafs.FileSelector(self._remote(path), allow_not_found=True, recursive=recursive)
            )
        except (OSError, pa.ArrowException) as exc:
            raise RemoteError(f"cannot list {self.name}/{path}: {exc}") from None

    def _files(self, path: str, recursive: bool = False) -> list[pafs.FileInfo]:
        """The files ``path`` holds (``_entries``), less hidden ones (a ``file://`` upload's
        temporary files)."""
        return [
            i
            for i in self._entries(path, recursive)
            if i.type == pafs.FileType.File and not i.base_name.startswith(".")
        ]

    def _present(self, level: list[Node]) -> list[Node]:
        """Those of ``level``'s nodes (all of one level) whose folder exists on the remote, in
        ``level``'s order: one listing of the level's folders (at most 1,024 names), so that a shard
        lists only the nodes of its range that hold objects, not every node it meets (a three-shard
        run's reader met 459 nodes and listed each of them, the ~6 that held objects included). Two
        nodes or fewer (an upload's, a wide shard's coarse levels) are returned as they are: looking
        their folders up would cost as many requests as listing them."""
        if len(level) <= 2:
            return level
        folder = f"parts/b{level[0].level:02d}"
        names = {i.base_name for i in self._entries(folder) if i.type == pafs.FileType.Directory}
        return [n for n in level if n.path.rpartition("/")[2] in names]

    def listing(self, nodes: list[list[Node]] | None = None) -> Listing:
        """Every manifest of the remote (``nodes`` None), or those of layout 1 and of ``nodes``
        (lists of one level each, listed coarse levels first), with the sizes of the objects beside
        them. Manifests held here are not fetched again (one never changes under its name);
        unreadable ones are skipped with a warning. Raises RemoteError when the remote cannot be
        listed."""
        start = len(self.base) + 1 if self.base else 0
        files: list[pafs.FileInfo] = self._files("manifests") + self._files("shards")
        if nodes is None:
            for level in LEVELS:  # one listing a level, coarse first
                files += self._files(f"parts/b{level:02d}", recursive=True)
        else:
            with ThreadPoolExecutor(PARALLEL, thread_name_prefix="dxi-list") as pool:
                for level in nodes:  # coarse first: each level's folders looked up after the last's
                    for found in pool.map(
                        lambda n: self._files(f"parts/{n.path}"), self._present(level)
                    ):
                        files += found
        sizes = {i.path[start:]: i.size for i in files}
        wanted: list[tuple[str, Node | None]] = []
        for path in sizes:
            if not path.endswith(".json"):
                continue
            if path.startswith("manifests/"):
                wanted.append((path[len("manifests/") : -len(".json")], None))
            elif path.startswith("parts/"):
                folder, _, name = path[len("parts/") :].rpartition("/")
                with contextlib.suppress(ValueError):
                    wanted.append((name[: -len(".json")], Node.parse(folder)))
        known = self._mirror_manifests()
        out = {
            stem: known[stem] for stem, node in wanted if stem in known and known[stem].node == node
        }

        def fetch(item: tuple[str, Node | None]) -> Manifest | None:
            stem, node = item
            path = (
                f"parts/{node.path}/{stem}.json" if node is not None else f"manifests/{stem}.json"
            )
            try:
                m = Manifest.from_json(self._get(path))
            except FileNotFoundError:
                return None  # deleted by a compaction meanwhile
            except (OSError, ValueError, KeyError, TypeError, orjson.JSONDecodeError) as exc:
                self._warn(
                    f"cache: remote manifest {self.name}/{path} is unreadable ({exc}); skipped"
                )
                return None
            if m.stem != stem or m.node != node:
                self._warn(
                    f"cache: remote manifest {self.name}/{path} names another object ({m.path()}); skipped"
                )
                return None
            return m

        with ThreadPoolExecutor(PARALLEL, thread_name_prefix="dxi-list") as pool:
            for m in pool.map(fetch, [w for w in wanted if w[0] not in out]):
                if m is not None:
                    out[m.stem] = m
        listed = None if nodes is None else {n for level in nodes for n in level}
        return Listing(out, sizes, listed)

    def manifests(self) -> dict[str, Manifest]:
        """Every manifest on the remote, by stem (``listing()``)."""
        return self.listing().manifests

    def _reading(self) -> list[list[Node]] | None:
        """The nodes this process reads: those its range meets (None: all)."""
        return nodes_meeting(*self.range) if self.keys_only else None

    def _sized(self, m: Manifest, sizes: dict[str, int]) -> str | None:
        """Why the listed sizes of ``m``'s objects do not match its manifest (None when they do); it
        starts with "missing" when an object is not there at all."""
        got = sizes.get(m.path("rows"))
        if got is None:
            return "missing: its rows are not there"
        if got != m.bytes:
            return f"its rows are {got} bytes, its manifest says {m.bytes}"
        if m.node is not None:
            got = sizes.get(m.path("keys"))
            if got != m.keys_bytes:
                return (
                    "missing: its index file is not there"
                    if got is None
                    else f"its index file is {got} bytes, its manifest says {m.keys_bytes}"
                )
        return None

    # ---- reading ------------------------------------------------------------------------------
    def _held(self, m: Manifest) -> Path | None:
        """This cache's copy of ``m`` that this process reads (its rows, or in a shard its index),
        if any."""
        for folder in ("keys", "shards") if self.keys_only else ("shards",):
            path = self.mirror / folder / f"{m.stem}.parquet"
            if path.exists():
                return path
        return None

    def _prepare_mirror(self) -> None:
        """Create the mirror's folders; if they hold another remote's copies (``source`` names the
        remote they came from), empty them first, with a warning: copies, manifests and upload
        records describe one remote."""
        source = self.mirror / "source"
        with contextlib.suppress(FileNotFoundError):
            if source.read_text() != self.name:
                self._warn(
                    f"cache: {self.mirror} held the copies of {source.read_text()}; emptied for {self.name}"
                )
                for sub in ("shards", "keys", "manifests", "uploaded"):
                    shutil.rmtree(self.mirror / sub, ignore_errors=True)
                source.unlink()
                self._mirrored = None
        for sub in ("shards", "keys", "manifests", "uploaded"):
            (self.mirror / sub).mkdir(parents=True, exist_ok=True)
        if not source.exists():
            source.write_text(self.name)
        self._remove_abandoned()

    def pull(self) -> int:
        """Copy every live object this process reads (see the module docstring) that the local cache
        lacks, each checked against its manifest and its page checksums (a damaged one is moved
        aside on the remote: ``quarantine``); drop copies the remote no longer has (merged, or moved
        aside). Returns the number of objects downloaded. An object deleted meanwhile (a merge)
        makes it list again, up to three times. Raises RemoteError when the remote cannot be
        listed."""
        self._prepare_mirror()
        own = {p.stem for p in self._local_shards()}
        fetched = 0
        for attempt in range(3):
            listing = self.listing(self._reading())
            current = live(listing.manifests, *self.range)
            missing = False
            for m in list(current.values()):
                why = self._sized(m, listing.sizes)
                if why is None or local_stem(m.stem) in own:
                    continue
                del current[m.stem]
                if why.startswith("missing") and attempt < 2:
                    missing = True  # perhaps deleted by a merge as the listing ran: listed again
                else:
                    self.quarantine(m, why)
            wanted = []
            for stem, m in sorted(current.items()):
                if local_stem(stem) in own or self._held(m) is not None:
                    self._keep_manifest(m)
                else:
                    wanted.append(m)
            with ThreadPoolExecutor(PARALLEL, thread_name_prefix="dxi-pull") as pool:
                outcomes = list(pool.map(self._download, wanted))
            fetched += outcomes.count("ok")
            if "gone" not in outcomes and not missing:
                break
        self._prune(listing, current)
        if self.keys_only and (old := [m for m in current.values() if m.node is None]):
            self._warn(
                f"cache: {len(old)} object(s) of {self.name} ({sum(m.rows for m in old):,} rows) have the layout "
                "before key partitions and are read whole by every shard; `dxi cache compact --cache-remote` "
                "moves them into the partitions"
            )
        self.downloaded += fetched
        return fetched

    def _prune(self, listing: Listing, current: dict[str, Manifest]) -> None:
        """Drop the copies (and manifests) of objects in the nodes listed that are no longer live
        there."""
        for stem, m in list(self._mirror_manifests().items()):
            if stem in current or (
                m.node is not None and listing.nodes is not None and m.node not in listing.nodes
            ):
                continue
            if m.node is not None and not m.place.meets(*self.range):
                continue
            for folder in ("shards", "keys"):
                (self.mirror / folder / f"{stem}.parquet").unlink(missing_ok=True)
            if local_stem(stem) not in {p.stem for p in self._local_shards()}:
                (self.mirror / "manifests" / f"{stem}.json").unlink(missing_ok=True)
        self._mirrored = None

    def _fetch(self, m: Manifest, kind: str) -> bytes | str:
        """``m``'s rows (``kind`` "rows") or index ("keys") checked against its manifest: the bytes,
        or "gone" (deleted meanwhile), "failed" (could not be read; warned) or "damaged" (moved
        aside)."""
        size, sha = (
            (m.bytes, m.sha256)
            if kind == "rows" or m.node is None
            else (m.keys_bytes, m.keys_sha256)
        )
        path = m.path(kind)
        for _ in range(2):  # a mismatch once may be the transfer's: fetched again before judging
            try:
                data = self._get(path)
            except FileNotFoundError:
                return "gone"
            except (OSError, pa.ArrowException) as exc:
                self._warn(
                    f"cache: could not download {self.name}/{path} ({exc}); its rows are not read this time"
                )
                return "failed"
            if len(data) == size and _sha(data) == sha:
                return data
        self.quarantine(m, f"{path} does not match its manifest (size or sha256)")
        return "damaged"

    def _download(self, m: Manifest, folder: str | None = None) -> str:
        """Fetch one object into the mirror's ``folder`` (default: "keys" in a shard, else
        "shards"): its index file into keys/ (a layout-1 object's rows, whole), its rows into
        shards/; "ok", "gone", "failed" or "damaged" (its pages failed their checksums, or it does
        not match its manifest: moved aside on the remote)."""
        folder = folder or ("keys" if self.keys_only else "shards")
        kind = "keys" if folder == "keys" and m.node is not None else "rows"
        data = self._fetch(m, kind)
        if isinstance(data, str):
            return data
        target = self.mirror / folder / f"{m.stem}.parquet"
        tmp = target.with_name(f".{m.stem}.{uuid.uuid4().hex[:8]}.tmp")
        tmp.write_bytes(data)
        problem = verify.Verifier().damaged([tmp])
        if problem:
            tmp.unlink(missing_ok=True)
            exc = problem[0][1]
            self.quarantine(m, f"{m.path(kind)} is damaged ({type(exc).__name__}: {exc})")
            return "damaged"
        os.replace(tmp, target)
        self._keep_manifest(m)
        return "ok"

    def is_copy(self, path: Path) -> bool:
        """Whether ``path`` is this cache's copy of a remote object (its manifest held here)."""
        return (
            path.parent in (self.mirror / "shards", self.mirror / "keys")
            and path.stem in self._mirror_manifests()
        )

    def can_refetch(self, shard: Path) -> bool:
        """Whether ``shard`` is a copy of a remote object not yet downloaded again by this
        process."""
        return self.is_copy(shard) and shard.stem not in self._refetched

    def refetch(self, shard: Path) -> bool:
        """Download the remote object ``shard`` is a copy of again (its damaged copy was set aside
        by the cache), checked against its manifest: True when a fresh copy is in place. Once per
        object and process (``can_refetch``); a copy damaged again is for ``condemn``. A failed
        download is warned about."""
        if not self.can_refetch(shard):
            return False
        self._refetched.add(shard.stem)
        if self._download(self._mirror_manifests()[shard.stem], shard.parent.name) != "ok":
            return False
        self.downloaded += 1
        return True

    def condemn(self, shard: Path, why: str) -> None:
        """The copy ``shard``, fetched again by this process (``refetch``), was damaged again: the
        remote object is damaged in a way its sha256 and checksums did not show; move it aside there
        (``quarantine``), so no process reads it again. Nothing for a copy not fetched again."""
        m = self._mirror_manifests().get(shard.stem)
        if (
            m is not None
            and shard.stem in self._refetched
            and local_stem(m.stem) not in {p.stem for p in self._local_shards()}
        ):
            self.quarantine(m, f"a fresh copy is damaged too ({why})")

    def _keep_manifest(self, m: Manifest) -> None:
        path = self.mirror / "manifests" / f"{m.stem}.json"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{m.stem}.{uuid.uuid4().hex[:8]}.tmp")
            tmp.write_bytes(m.to_json())
            os.replace(tmp, path)
            # read again when next needed (never changed in place: readers hold the old one)
            self._mirrored = None

    def _remove_abandoned(self) -> None:
        for tmp in [
            *self.mirror.glob("shards/.*.tmp"),
            *self.mirror.glob("keys/.*.tmp"),
            *self.mirror.glob("manifests/.*.tmp"),
        ]:
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

    def _copies(self, folders: tuple[str, ...], own: set[str]) -> list[Path]:
        """The copies held in ``folders`` of the live objects this process reads, less those of
        ``own`` local shards (their rows are read from the shards), in name order."""
        current = live(self._mirror_manifests(), *self.range)
        out = []
        for stem in current:
            if local_stem(stem) in own:
                continue
            for folder in folders:
                path = self.mirror / folder / f"{stem}.parquet"
                if path.exists():
                    out.append(path)
                    break
        return sorted(out, key=lambda p: p.name)

    def visible(self, local: list[Path]) -> list[Path]:
        """The shards the cache scans: ``local`` ones and, for a process that reads everything, the
        copies of the remote's live objects held here, in name order (local and remote alike). A
        shard scans only its local shards: it holds only the index of the remote's rows
        (``key_files``)."""
        if self.keys_only:
            return list(local)
        shards = list(local) + self._copies(("shards",), {p.stem for p in local})
        return sorted(shards, key=lambda p: p.name)

    def key_files(self, local: list[Path]) -> list[Path]:
        """The files whose index columns a shard's key index also reads: its copies of the index of
        the live objects in its range (or their rows, when held), in name order. Empty for a process
        that reads everything (``visible`` has them)."""
        return self._copies(("keys", "shards"), {p.stem for p in local}) if self.keys_only else []

    # ---- damage -------------------------------------------------------------------------------
    def quarantine(self, m: Manifest, why: str) -> None:
        """Move ``m``'s objects aside on the remote: each copied under ``quarantine/`` with a record
        of why, then its manifest, index and rows deleted (manifest first: readers stop seeing it at
        once). Safe beside other processes doing the same (both succeed) and beside readers (a
        reader that listed it finds it gone and lists again). Its local copies here are dropped.
        Failures are warned about."""
        names = [m.path("rows")] + ([m.path("keys")] if m.node is not None else [])
        try:
            if isinstance(
                self.fs, pafs.LocalFileSystem
            ):  # a folder must exist before a file is copied into
                # it (an object store has none): without it the copy failed as "not found" and was
                # taken for an object moved aside meanwhile, so the object was deleted, not moved
                # (issue 32)
                self.fs.create_dir(self._remote("quarantine"), recursive=True)
            for path in names:
                with contextlib.suppress(
                    FileNotFoundError
                ):  # the object gone: moved aside by another process
                    self.fs.copy_file(
                        self._remote(path), self._remote("quarantine", path.rsplit("/", 1)[-1])
                    )
            self._put(
                f"quarantine/{m.stem}.json",
                orjson.dumps(
                    {
                        "manifest": orjson.loads(m.to_json()),
                        "reason": why,
                        "at": time.time(),
                        "by": socket.gethostname(),
                    }
                ),
            )
            self._delete(m.path("manifest"))
            for path in names:
                self._delete(path)
        except (OSError, pa.ArrowException) as exc:
            self._warn(
                f"cache: {self.name}/{m.path()} is damaged ({why}) and could not be moved aside ({exc}); "
                "it is not read here"
            )
            return
        for folder in ("shards", "keys"):
            (self.mirror / folder / f"{m.stem}.parquet").unlink(missing_ok=True)
        if local_stem(m.stem) not in {p.stem for p in self._local_shards()}:
            (self.mirror / "manifests" / f"{m.stem}.json").unlink(missing_ok=True)
        self._mirrored = None
        self._warn(
            f"cache: {self.name}/{m.path()} is damaged ({why}); moved to {self.name}/quarantine/. Its requests "
            "count as not cached: the next run of the shard that owns them sends them again"
        )

    def set_aside(self) -> list[Path]:
        """Copies here of the rows of the objects moved to the remote's ``quarantine/`` and not put
        back (their record still there), for ``cache.aside`` to tell their requests (``Cache.
        set_aside``): one listing of ``quarantine/``, and each object downloaded once, into the
        mirror's ``quarantine/`` (an object moved aside never changes). One that cannot be fetched
        is left out, warned about. Nothing for a shard of several: it reads index columns only."""
        if self.keys_only:
            return []
        try:
            stems = self._quarantined()
        except RemoteError as exc:
            self._warn(f"cache: {exc}; what it set aside as damaged is not told apart")
            return []
        folder, out = self.mirror / "quarantine", []
        for stem in sorted(stems):
            target = folder / f"{stem}.parquet"
            if not target.is_file():
                try:
                    data = self._get(f"quarantine/{stem}.parquet")
                except FileNotFoundError:
                    continue
                except (OSError, pa.ArrowException) as exc:
                    self._warn(
                        f"cache: could not download {self.name}/quarantine/{stem}.parquet ({exc}); "
                        "its requests are not told apart"
                    )
                    continue
                folder.mkdir(parents=True, exist_ok=True)
                tmp = folder / f".{stem}.{uuid.uuid4().hex[:8]}.tmp"
                tmp.write_bytes(data)
                os.replace(tmp, target)
            out.append(target)
        return out

    def _quarantined(self) -> set[str]:
        """The stems moved aside whose record is still in ``quarantine/`` (not yet put back by their
        uploader)."""
        return {
            i.base_name[: -len(".json")]
            for i in self._files("quarantine")
            if i.base_name.endswith(".json")
        }

    # ---- writing ------------------------------------------------------------------------------
    def _put_object(
        self,
        node: Node,
        stem: str,
        table: pa.Table,
        replaces: tuple[str, ...] = (),
        data: bytes | None = None,
    ) -> Manifest:
        """Upload ``table`` (rows of ``node``) as object ``stem``: rows (``data``: the bytes of a
        flat shard file holding exactly them, else written here), index, then manifest."""
        data, keys = data if data is not None else _parquet(table), _parquet(table, keys=True)
        m = Manifest(
            stem, len(data), _sha(data), table.num_rows, replaces, node, len(keys), _sha(keys)
        )
        self._put(m.path("rows"), data)
        self._put(m.path("keys"), keys)
        self._put(m.path("manifest"), m.to_json())
        self._keep_manifest(m)  # so that listing the remote need not fetch it again
        self._mine.add(stem)
        return m

    def _read_local(self, shard: Path) -> pa.Table:
        """A local shard's rows, pages verified (RemoteError for a damaged one: never uploaded, as
        every reader would set it aside)."""
        try:
            return pq.read_table(shard, page_checksum_verification=True)
        except FileNotFoundError:
            raise
        except Exception as exc:
            if verify.is_damage(exc):
                raise RemoteError(
                    f"{shard} is damaged ({type(exc).__name__}: {exc}); not uploaded"
                ) from None
            raise

    def upload(self, shard: Path) -> list[Manifest]:
        """Upload one local shard, split by node at this process's level (idempotent: the same names
        hold the same rows), and record its objects in ``remote/uploaded/``. Raises OSError /
        ArrowException when the remote refuses, and RemoteError for a shard whose pages fail their
        checksums (never uploaded)."""
        if (damage := verify.page_checksums(shard)) is not None:
            raise RemoteError(
                f"{shard} is damaged ({type(damage).__name__}: {damage}); not uploaded"
            )
        pieces = [
            self._put_object(node, f"{shard.stem}.{node.tag}", part, data=data)
            for node, (part, data) in self._pieces(shard, self.level).items()
        ]
        self._write_record(shard.stem, pieces)
        self.uploaded += 1
        return pieces

    def _pieces(self, shard: Path, level: int) -> dict[Node, tuple[pa.Table, bytes | None]]:
        """A local shard's rows split by node at ``level``: per node its rows and, when one node
        holds them all and the shard is flat, the shard's own bytes (uploaded as they are, not
        written again)."""
        parts = _by_node(self._read_local(shard), level)
        whole = (
            shard.read_bytes()
            if len(parts) == 1 and layout.layout_of(shard) == layout.FLAT_LAYOUT
            else None
        )
        return {node: (part, whole) for node, part in parts}

    def _write_record(self, stem: str, pieces: list[Manifest]) -> None:
        """Record (or rewrite) the objects the local shard ``stem`` was uploaded as
        (``remote/uploaded/``)."""
        record = self.mirror / "uploaded" / f"{stem}.json"
        record.parent.mkdir(parents=True, exist_ok=True)
        tmp = record.with_name(f".{stem}.{uuid.uuid4().hex[:8]}.tmp")
        tmp.write_bytes(orjson.dumps([orjson.loads(m.to_json()) for m in pieces]))
        os.replace(tmp, record)

    def _record(self, stem: str) -> list[Manifest] | None:
        """The objects the local shard ``stem`` was uploaded as (None: not uploaded by this
        layout)."""
        try:
            return [
                Manifest.from_json(orjson.dumps(doc))
                for doc in orjson.loads((self.mirror / "uploaded" / f"{stem}.json").read_bytes())
            ]
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError, orjson.JSONDecodeError):
            return None  # unreadable: uploaded again (same names, same rows)

    def _upload_quietly(self, shard: Path) -> list[Manifest]:
        try:
            return self.upload(shard)
        except FileNotFoundError:
            pass  # moved to quarantine meanwhile
        except (
            RemoteError
        ) as exc:  # damaged here: set aside when the cache is read, its requests sent again
            self._warn(f"cache: {exc}")
        except (OSError, pa.ArrowException) as exc:
            self._failed.append(shard.name)
            self._warn(
                f"cache: could not upload {shard.name} to {self.name} ({exc}); it stays in the local cache "
                "and the next run uploads it"
            )
        return []

    def shard_written(self, shard: Path) -> None:
        """A shard was renamed into place in the local cache: upload it in the background (then
        merge a node that passed ``MAX_OBJECTS``)."""
        if self._uploader is None:
            self._uploader = ThreadPoolExecutor(1, thread_name_prefix="dxi-upload")
        self._pending = [f for f in self._pending if not f.done()]
        self._pending.append(self._uploader.submit(self._upload_and_merge, shard))

    def _upload_and_merge(self, shard: Path) -> None:
        pieces = self._upload_quietly(shard)
        if pieces:
            try:
                self.self_compact([[m.node for m in pieces if m.node is not None]], final=False)
            except (OSError, pa.ArrowException) as exc:
                self._warn(
                    f"cache: merging objects on {self.name} failed ({exc}); left for a later run"
                )

    def finish(self) -> list[str]:
        """Wait for the background uploads; upload every local shard not yet uploaded; put back
        those of its objects the remote lost or moved aside (``recheck``); then merge
        (``self_compact``). Returns the names of the shards not uploaded (empty: all done); the
        reasons are in ``warnings``."""
        if self._uploader is not None:
            self._uploader.shutdown(wait=True)
            self._uploader = None
        self._failed = []
        self._prepare_mirror()
        try:
            listing = self.listing(self._reading())
            quarantined = self._quarantined()
        except RemoteError as exc:
            self._warn(f"cache: {exc}")
            return [p.name for p in self._local_shards()]
        old = set(listing.manifests) | {
            s for m in listing.manifests.values() if m.node is None for s in m.replaces
        }
        for shard in self._local_shards():
            record = self._record(shard.stem)
            if record is None:
                if shard.stem not in old:  # (uploaded by an earlier version: layout 1)
                    self._upload_quietly(shard)
            else:
                self.recheck(shard, record, listing, quarantined)
        try:
            self.self_compact(self._reading(), final=True)
        except (OSError, pa.ArrowException) as exc:
            self._warn(
                f"cache: merging objects on {self.name} failed ({exc}); left for a later run"
            )
        return sorted(set(self._failed))

    def recheck(
        self, shard: Path, record: list[Manifest], listing: Listing, quarantined: set[str]
    ) -> None:
        """Put back, under a new name, those of ``shard``'s uploaded objects (``record``) the remote
        lost or set aside: one listed whose sizes do not match its manifest (moved aside first), one
        moved to ``quarantine/`` (its record there is then deleted), one gone whose keys no live
        object holds. One gone whose keys another object holds was merged: it leaves the record
        (never checked again)."""
        redo, merged = [], set()
        rows: dict[Node, tuple[pa.Table, bytes | None]] | None = None
        try:
            for m in record:
                if listing.nodes is not None and m.node not in listing.nodes:
                    # not listed here (the shard's range changed): left to a process that reads it
                    continue
                if m.stem in listing.manifests:
                    if (why := self._sized(m, listing.sizes)) is not None:
                        self.quarantine(m, why)
                        redo.append(m)
                    continue
                if m.stem in quarantined:
                    redo.append(m)
                    continue
                if rows is None:
                    rows = self._pieces(shard, m.node.level)
                if m.node not in rows or self._held_elsewhere(rows[m.node][0], m, listing):
                    merged.add(m.stem)
                else:
                    redo.append(m)
            for m in redo:
                if rows is None:
                    rows = self._pieces(shard, m.node.level)
                if (
                    m.node in rows
                ):  # under a new name: an object never changes under its name (readers hold manifests)
                    stem = f"{m.stem.split('.r', 1)[0]}.r{uuid.uuid4().hex[:8]}"
                    again = self._put_object(m.node, stem, rows[m.node][0], data=rows[m.node][1])
                    record = [again if r.stem == m.stem else r for r in record]
                    self._delete(f"quarantine/{m.stem}.json")
                    self._warn(
                        f"cache: {self.name}/{m.path()} was missing or damaged; uploaded again from {shard} "
                        f"as {again.path()}"
                    )
        except RemoteError as exc:
            self._warn(f"cache: {exc}")
        except (OSError, pa.ArrowException) as exc:
            self._failed.append(shard.name)
            self._warn(
                f"cache: could not upload {shard.name} again to {self.name} ({exc}); the next run tries again"
            )
        if merged or redo:
            self._write_record(shard.stem, [m for m in record if m.stem not in merged])

    def _held_elsewhere(self, rows: pa.Table, m: Manifest, listing: Listing) -> bool:
        """Whether every key of ``rows`` (``m``'s, gone from the remote) is in a live object listed
        in its node (read from the copies held here, or their index files fetched)."""
        want = set(prefixes(rows["key"].to_pylist()).tolist())
        for other in sorted(live(listing.manifests, *m.span).values(), key=lambda o: o.stem):
            copies = (
                self.mirror / folder / f"{other.stem}.parquet" for folder in ("shards", "keys")
            )
            path = next((p for p in copies if p.exists()), None)
            if path is not None:
                keys = pq.read_table(path, columns=["key"])["key"]
            else:
                data = self._fetch(other, "keys" if other.node is not None else "rows")
                if isinstance(data, str):
                    continue
                keys = pq.read_table(pa.BufferReader(data), columns=["key"])["key"]
            want -= set(prefixes(keys.to_pylist()).tolist())
            if not want:
                return True
        return not want

    # ---- compaction ---------------------------------------------------------------------------
    def self_compact(
        self, nodes: list[list[Node]] | None, final: bool, target_rows: int = TARGET_ROWS
    ) -> int:
        """Merge, in the nodes listed (``nodes``; None: all), the small objects of each node this
        process owns (``Node.owned_by`` its range) and its own uploads in the others: at the end of
        a run (``final``) where there are two or more, during it where a node holds more than
        ``MAX_OBJECTS``. Returns the objects merged."""
        listing = self.listing(nodes)
        groups: dict[Node, list[Manifest]] = defaultdict(list)
        for m in live(listing.manifests, *self.range).values():
            groups[m.place].append(m)
        merged = 0
        for node in sorted(groups):
            group = groups[node]
            if node.owned_by(*self.range):
                candidates = [m for m in group if m.rows < target_rows]
            else:
                candidates = [m for m in group if m.stem in self._mine]
            if len(candidates) >= 2 and (final or len(group) > MAX_OBJECTS):
                done = self._merge(node, candidates, target_rows)
                merged += len(candidates) if done is not None else 0
        return merged

    def compact(self, target_rows: int = TARGET_ROWS, min_shards: int = 2) -> tuple[int, int]:
        """Rewrite the whole remote as ``self_compact`` leaves a node, every node and every object
        (layout 1 included, moved into the partitions): per node, coarse levels first, its objects
        merged and split into the finer nodes their rows fill (``target_rows`` a node). Returns
        (objects merged, objects written). Idempotent: a node holding one object at its level (and
        fewer than ``min_shards`` small ones) is left as it is."""
        self._remove_stale_uploads()
        listing = self.listing()
        groups: dict[Node, list[Manifest]] = defaultdict(list)
        for m in live(listing.manifests).values():
            groups[m.place].append(m)
        merged = written = 0
        for level in LEVELS:
            for node in sorted(n for n in list(groups) if n.level == level):
                group = groups.pop(node)
                out = split_level(sum(m.rows for m in group), node.level, target_rows)
                if (
                    len(group) < min_shards
                    and out == node.level
                    and all(m.node is not None for m in group)
                ):
                    continue
                new = self._merge(node, group, target_rows)
                if new is None:
                    continue
                merged += len(group)
                written += len(new)
                for m in new:
                    if m.node != node:
                        groups[m.node].append(m)
        return merged, written

    def _merge(self, node: Node, group: list[Manifest], target_rows: int) -> list[Manifest] | None:
        """Merge ``group`` (objects of ``node``) into new objects at the level their rows call for,
        then delete them. Each is read checked against its manifest and its checksums (a damaged one
        is moved aside and left out); returns the new objects, or None when one was gone (merged by
        another process meanwhile: nothing was written)."""
        group = sorted(group, key=lambda m: m.stem)
        level = split_level(sum(m.rows for m in group), node.level, target_rows)
        work = self.root / f".remote-merge-{uuid.uuid4().hex[:8]}"
        kept: list[Manifest] = []
        try:
            for n, m in enumerate(
                group
            ):  # each object's rows split by node into files on disk: one object in memory
                data = self._fetch(m, "rows")
                if data == "gone":
                    return None
                if isinstance(data, str):
                    continue
                try:
                    table = layout.to_shard(
                        pq.read_table(pa.BufferReader(data), page_checksum_verification=True)
                    )
                except Exception as exc:
                    if not verify.is_damage(exc):
                        raise
                    self.quarantine(m, f"{m.path()} is damaged ({type(exc).__name__}: {exc})")
                    continue
                kept.append(m)
                for sub, part in _by_node(table, level):
                    (work / sub.tag).mkdir(parents=True, exist_ok=True)
                    pq.write_table(part, work / sub.tag / f"{n:06d}.parquet")
            if not kept:
                return []
            stems = tuple(m.stem for m in kept)
            name = f"{kept[-1].stem.split('-', 1)[0]}-compact-{_sha(' '.join(stems).encode())[:16]}"
            new = []
            for folder in sorted(work.iterdir()) if work.exists() else []:
                sub = Node.from_tag(folder.name)
                table = _dedupe(
                    pa.concat_tables([pq.read_table(p) for p in sorted(folder.iterdir())])
                )
                new.append(self._put_object(sub, f"{name}.{sub.tag}", table, stems))
        finally:
            shutil.rmtree(work, ignore_errors=True)
        for (
            m
        ) in kept:  # manifests first: a reader never finds a manifest without its objects for long
            self._delete(m.path("manifest"))
        for m in kept:
            self._delete(m.path("rows"))
            if m.node is not None:
                self._delete(m.path("keys"))
        return new

    def _remove_stale_uploads(self, age_s: float = 3600) -> None:
        """On a ``file://`` remote: delete temporary files a killed upload left (older than
        ``age_s``). An object store keeps no part of an upload that did not complete."""
        if not isinstance(self.fs, pafs.LocalFileSystem):
            return
        for path in Path(self.base).rglob(".*.tmp"):
            with contextlib.suppress(FileNotFoundError):
                if time.time() - path.stat().st_mtime > age_s:
                    path.unlink()


def _dedupe(table: pa.Table) -> pa.Table:
    """``table`` less exact copies of a row (same key and created_at: a row held twice), first
    kept."""
    import polars as pl

    frame = pl.from_arrow(table)
    return (
        frame.unique(subset=["key", "created_at"], keep="first", maintain_order=True)
        .to_arrow()
        .cast(table.schema)
    )
