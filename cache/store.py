"""A content-addressed, append-only cache of request outcomes on disk.

Layout of a cache directory::

    shards/<stem>.parquet     immutable Parquet shards (``cache.schema.SCHEMA``)
    wal/<stem>.jsonl          write-ahead logs: one orjson line per row, each log written by one process
    quarantine/               unreadable shards and damaged logs, set aside with a warning

Durability: ``append`` writes the row's line to the process's log with one ``write(2)`` on an
``O_APPEND`` file before returning, so the row is in the kernel and survives the process being
killed at any moment (SIGKILL, OOM kill, Ctrl-C); ``fsync=True`` also survives power loss, at a
measured cost (``make bench``). A log is rolled over every ``roll_rows`` rows: the full log is
compacted into a shard by a background thread (Parquet written to a temporary name, then renamed: a
shard is whole or absent) and deleted; ``close`` compacts the last one. A log left behind by a
killed process is compacted by the next process that opens the cache; a truncated last line (the
kill came mid-write) or a corrupt line is dropped with a warning, the damaged log is moved to
``quarantine/``, and only those requests are sent again; so is a line that is JSON but not a row
(``cache.verify.valid_rows``), and a damaged one (``cache.verify.line_problem``: every line is
written sealed with its CRC-32, ``append``; a line without a seal must hold its request's content
address as its key, and values an adapter gives). Shards are read only after their page checksums
are verified (``cache.verify``): the index columns' pages when the key index is loaded (the first
``has``/``append``: a run's start-up), every page before the first scan; a shard that fails (or
whose reader fails, a panic included) is moved to ``quarantine/`` and leaves the key index.

Concurrency: safe concurrent appends, no shared lock. Each process appends only to its own logs and
holds an exclusive ``flock`` on each until it is compacted; a log whose lock is free belongs to a
dead process and is recovered by whoever takes the lock first. Readers never write. Two runs on one
cache directory therefore never corrupt it; that they never both send a request is the claims' doing
(``cache.claims``, ``runner.dispatch``), with ``refresh`` after every claim. Where a request has
several rows, the one ``cache.index.newest`` picks counts (a final row over a transient failure,
then the newest).

Remote tier (``cache.remote``, optional): every shard renamed into place is also uploaded, and the
remote's objects, copied under ``remote/``, are read with the local ones (``_shards``); a shard of a
run holds only the index columns of its part of the remote, which only its key index reads
(``_key_files``).

Memory: the key index is compact (``cache.index``: ~9 bytes a key) and loaded only when first needed
(rescoring never needs it), logs are bounded by ``roll_rows``,
and ``scan`` is lazy over the shards: O(``roll_rows``), not O(rows).

Why one module over 600 lines: ``Cache`` (most of it) is one folder's write-ahead log, shards, key
index and locks, whose durability order (append, fsync, roll over, compact) is read in one place.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import logging
import os
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import orjson

from dxi.lazy import LazyModule
from dxi.served import served_by_other

from . import aside, schema, verify
from .index import CODE_FATAL, CODE_INVALID, CODE_OK, NAMES, KeyIndex, code_of, index_columns
from .schema import INDEX_COLUMNS

if TYPE_CHECKING:
    import polars as pl
    import pyarrow as pa
    import pyarrow.json as pj
    import pyarrow.parquet as pq

    from .remote import Remote
else:
    # imported when first used: opening an empty cache and appending to it (a first run) does
    # without
    pl = LazyModule("polars")
    pa, pj, pq = LazyModule("pyarrow"), LazyModule("pyarrow.json"), LazyModule("pyarrow.parquet")
layout = LazyModule(
    "dxi.cache.layout"
)  # the shards' layouts (PyArrow, NumPy): imported when first read or written

T = TypeVar("T")

log = logging.getLogger("dxi.cache")

_write, _dumps, _seal = os.write, orjson.dumps, verify.seal  # looked up once: append is hot
ROLL_ROWS = 5_000  # rows per log before it is compacted into a shard (~10 MB of log)
COMPACT_ROWS = 1_000_000  # rows per shard that ``compact_shards`` merges small shards into
COMPACT_LOCK = "compact.lock"  # flocked by ``compact_shards`` while it runs
PART_ROWS = 50_000  # rows per part of ``scan_parts`` (whole shards: a larger one is a part alone)


def prepare_compaction() -> None:
    """Import what compacting a log needs (PyArrow's JSON reader and Parquet writer, the schema)
    ahead of time: ``dxi run`` calls it on a thread during the run, so that closing the cache after
    the last reply does not pay for the imports (~60 ms)."""
    for threads in (False, True):
        _json_options(threads)
    pq.ParquetWriter  # noqa: B018 (the attribute read imports pyarrow.parquet)
    layout.write_shard  # noqa: B018 (and the shard layouts)


@cache
def _json_options(threads: bool) -> tuple[pj.ReadOptions, pj.ParseOptions]:
    """How a log is parsed. A log compacted in the background while rows are appended is parsed on
    one thread (``threads=False``), leaving the other cores to the appends (with Arrow's thread pool
    it took about half of the appending thread's core: measured, appends went from ~170,000 to
    ~80,000 rows/s while a compaction ran)."""
    return (
        pj.ReadOptions(block_size=1 << 20, use_threads=threads),
        pj.ParseOptions(explicit_schema=schema.SCHEMA, unexpected_field_behavior="ignore"),
    )


class CacheWriteError(OSError):
    """A row could not be written to the cache (a full disk, a read-only or vanished directory).
    Every row appended before it is in the log; the row that failed is not (a part of it written is
    dropped, with a warning, by the next start-up), so its request is sent again by the next run.
    ``errno`` is the system's error number when there is one."""

    def __init__(self, message: str, errno: int | None = None):
        super().__init__(message)
        self.errno = errno


class Cache:
    """The cache in directory ``root`` (created if missing).

    ``has(key)`` / ``has_many(keys)``: whether a request needs no sending (SPEC §4): its newest row
    is ``ok`` or ``invalid``, or a ``fatal`` failure; a transient failure is requested again, and so
    is a reply another model gave (``dxi.served``: set aside, its row kept).
    ``retry_invalid`` / ``retry_failed`` make invalid rows / fatal failures count as not cached.
    ``append(row)`` stores one row durably. ``scan()`` returns every row as a Polars LazyFrame.
    ``warnings`` lists what recovery found (also logged). Use as a context manager, or call
    ``close``.

    ``read_only=True`` (``dxi view``) never writes to the directory: nothing is created, recovered,
    deleted or moved (logs left by a killed writer are read as they are; an unreadable shard is
    skipped with a warning instead of being moved to quarantine/), and ``append`` raises
    CacheWriteError.
    """

    def __init__(
        self,
        root: Path | str,
        *,
        fsync: bool = False,
        retry_invalid: bool = False,
        retry_failed: bool = False,
        roll_rows: int = ROLL_ROWS,
        remote: Remote | None = None,
        roll_s: float | None = None,
        read_only: bool = False,
    ):
        self.root = Path(root)
        self.read_only = read_only
        self._set_aside: set[Path] = set()  # read-only: unreadable shards skipped, left in place
        self._foreign: set[Path] = set()  # Parquet files in shards/ that are not shards: skipped
        self.fsync = fsync
        self.retry_invalid, self.retry_failed = retry_invalid, retry_failed
        self.roll_rows = max(1, roll_rows)
        self.remote, self.roll_s = (
            remote,
            roll_s,
        )  # a remote tier (``cache.remote``): logs also roll every roll_s
        self._opened = 0.0  # monotonic seconds the current log was opened
        self.warnings: list[str] = []
        for sub in () if read_only else ("shards", "wal", "quarantine"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self._wal: Path | None = None
        self._fd: int | None = None
        self._log_rows = 0
        self._rolled = 0  # rows appended to this process's earlier logs
        self._compactor: ThreadPoolExecutor | None = None
        self._closing = False  # set by close: no more appends to leave cores to
        self._pending: list[Future] = []
        self._held: tuple[str, pa.Table] | None = None  # see close(wait=False)
        cached = (
            [CODE_OK]
            + ([] if retry_invalid else [CODE_INVALID])
            + ([] if retry_failed else [CODE_FATAL])
        )
        self._cached = tuple(
            code in cached for code in range(256)
        )  # status code -> counts as cached
        if not read_only:
            self._remove_abandoned()
            self._recover_orphans()
        self._index: KeyIndex | None = None  # loaded on first use (``_keys``): scoring only scans
        self._log_ends: dict[
            Path, tuple[int, int]
        ] = {}  # what the index read of each log: (inode, bytes)
        self._files_read: dict[
            Path, tuple[int, int, int]
        ] = {}  # the shards it read: (inode, size, mtime)
        self._lost = False  # one of them was set aside in quarantine/ since (``refresh`` reads the index whole)
        self._verifier = verify.Verifier()  # which shards' page checksums were verified

    # ---- reading ------------------------------------------------------------------------------
    def _warn(self, message: str) -> None:
        self.warnings.append(message)
        log.warning(message)

    def _local(self) -> list[Path]:
        return [
            p
            for p in sorted(self.root.glob("shards/*.parquet"))
            if p not in self._set_aside and self._is_shard(p)
        ]

    def _is_shard(self, path: Path) -> bool:
        """False for a Parquet file in shards/ that is not a cache shard (``layout.NotAShard``: an
        answers.parquet copied there), skipped with a warning naming it (once per open cache).
        Anything else is left to the readers: a layout this version does not know is refused
        when read (``layout.UnknownLayout``), a damaged footer set aside (``cache.verify``)."""
        if path in self._foreign:
            return False
        try:
            layout.layout_of(path)
        except layout.NotAShard as exc:
            self._foreign.add(path)
            self._warn(f"cache: {exc}")
            return False
        except (layout.UnknownLayout, *verify.damaged()):
            pass
        return True

    def _shards(self) -> list[Path]:
        shards = self._local()
        if self.remote is None:
            return shards
        return [
            p for p in self.remote.visible(shards) if p not in self._set_aside
        ]  # and the remote's, held here

    def _key_files(self) -> list[Path]:
        """Files only the key index reads: a shard's copies of the remote's index columns
        (``cache.remote``)."""
        if self.remote is None:
            return []
        return [p for p in self.remote.key_files(self._local()) if p not in self._set_aside]

    def _logs(self) -> list[Path]:
        return sorted(self.root.glob("wal/*.jsonl"))

    def _quarantine(self, path: Path, why: str, what: str) -> None:
        if self.read_only:
            self._set_aside.add(path)
            self._warn(f"cache: {path} {why}; skipped (read-only: left in place).")
            return
        target = self.root / "quarantine" / f"{path.name}.{uuid.uuid4().hex[:8]}"
        with contextlib.suppress(FileNotFoundError):
            os.replace(path, target)
            self._warn(f"cache: {path} {why}; moved to {target}. {what}")

    def _read_log(
        self,
        path: Path,
        live: bool,
        threads: bool = True,
        since: dict[Path, tuple[int, int]] | None = None,
    ) -> tuple[pa.Table | None, bool]:
        """The rows of one log as a table (None if the log is gone: compacted meanwhile, its shard
        holds the rows) and whether it was damaged. A truncated last line is dropped (silently for a
        live writer, which may be mid-write); corrupt lines elsewhere are skipped with a warning.
        ``since`` (path -> (inode, bytes)): only the lines after those bytes are read, and the log's
        entry is set to where the complete lines read end (the key index's ``refresh``)."""
        start = 0
        try:
            with open(path, "rb") as f:
                inode = os.fstat(f.fileno()).st_ino
                if since is not None and since.get(path, (None, 0))[0] == inode:
                    start = since[path][1]
                    f.seek(start)
                data = f.read()
        except FileNotFoundError:
            return None, False
        end = data.rfind(b"\n") + 1
        if since is not None:
            since[path] = (inode, start + end)
        damaged = False
        if end < len(data) and not live:
            damaged = True
            self._warn(
                f"cache: {path} ends with a truncated record (the writer was killed mid-write); "
                "dropped it, its request will be sent again."
            )
        if end == 0:
            return schema.SCHEMA.empty_table(), damaged
        data, end, numbers = self._checked_lines(path, data, end)
        damaged = damaged or numbers is not None
        if end == 0:
            return schema.SCHEMA.empty_table(), damaged
        read_options, parse_options = _json_options(threads)
        try:  # the complete lines, without copying them
            table = pj.read_json(
                pa.BufferReader(pa.py_buffer(data)[:end]),
                read_options=read_options,
                parse_options=parse_options,
            )
            table, bad = verify.valid_rows(
                table
            )  # JSON, but not a row: {}, a row without its key, ...
            if not bad:
                return table, damaged
            lines = data.count(b"\n", 0, end) == table.num_rows + len(
                bad
            )  # one row a line: name the lines
            self._warn(
                f"cache: {path} "
                + (
                    f"line(s) {', '.join(str(numbers[i] if numbers else i + 1) for i in bad[:5])}"
                    if lines
                    else f"{len(bad)} line(s)"
                )
                + " hold no cache row (no key, or an unknown "
                "status); dropped them."
            )
            return table, True
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            pass
        tables = []
        for n, line in zip(
            numbers or itertools.count(1), data[:end].split(b"\n")[:-1], strict=False
        ):  # a damaged line: find it, keep the rest
            try:
                one, bad = verify.valid_rows(
                    pa.Table.from_pylist([orjson.loads(line)], schema=schema.SCHEMA)
                )
            except (
                orjson.JSONDecodeError,
                pa.ArrowInvalid,
                pa.ArrowTypeError,
                TypeError,
                ValueError,
            ):
                one, bad = None, [0]
            if bad:
                damaged = True
                self._warn(
                    f"cache: {path} line {n} is corrupt or holds no cache row; skipped it, its request "
                    "will be sent again."
                )
            else:
                tables.append(one)
        return (pa.concat_tables(tables) if tables else schema.SCHEMA.empty_table()), damaged

    def _checked_lines(
        self, path: Path, data: bytes, end: int
    ) -> tuple[bytes, int, list[int] | None]:
        """The complete lines ``data[:end]`` of log ``path`` less the damaged ones
        (``verify.line_problem``: a seal that does not match; in a line without one, a key that is
        not its request's content address, or values no adapter gives), each dropped with a warning
        naming it: ``(data, end, the 1-based numbers of the lines kept)``, the numbers None when
        none was dropped (``data`` is then unchanged)."""
        lines = data[:end].split(b"\n")[:-1]
        problems = [verify.line_problem(line) for line in lines]
        if not any(problems):
            return data, end, None
        for n, problem in enumerate(problems, 1):
            if problem is not None:
                self._warn(
                    f"cache: {path} line {n} {problem}: damaged; skipped it, its request will be "
                    "sent again."
                )
        kept = [
            (n, line)
            for n, (line, problem) in enumerate(zip(lines, problems, strict=True), 1)
            if not problem
        ]
        data = b"".join(line + b"\n" for _, line in kept)
        return data, len(data), [n for n, _ in kept]

    def _remove_abandoned(self) -> None:
        """Delete files a killed process was still creating: logs not yet renamed into place (always
        empty) and shards not yet renamed into place. Each is locked by its writer while it exists,
        so a free lock means the writer is gone; files younger than a minute are left alone, as a
        live writer creates the file an instant before it locks it."""
        for path in [*self.root.glob("wal/.*.creating"), *self.root.glob("shards/.*.tmp")]:
            with contextlib.suppress(FileNotFoundError):
                if time.time() - path.stat().st_mtime < 60:
                    continue
            with (
                _try_lock(path) as locked,
                contextlib.suppress(OSError),
            ):  # read-only: left for a later run
                if locked:
                    path.unlink(missing_ok=True)

    def _recover_orphans(self) -> None:
        """Compact every log whose writer is gone (its flock is free) into a shard. Where that
        cannot be written (a read-only or full disk) the log stays, with a warning: its rows are
        read from it."""
        for path in self._logs():
            with _try_lock(path) as locked:
                if locked:
                    table, damaged = self._read_log(path, live=False)
                    if table is not None:
                        try:
                            self._compact(path, table, damaged)
                        except OSError as exc:
                            self._warn(
                                f"cache: could not compact {path} ({exc.strerror or exc}); it stays, its rows "
                                "are read from it, and a run that can write here will compact it."
                            )

    def _compact(self, wal: Path, table: pa.Table, damaged: bool = False) -> None:
        """Write ``table`` (the rows of log ``wal``) as shard ``shards/<stem>.parquet`` atomically,
        then delete the log (move it to quarantine/ when it was damaged). If the shard exists
        already, the log was compacted before a crash: only the log goes."""
        shard = self.root / "shards" / f"{wal.stem}.parquet"
        if table.num_rows and not shard.exists():
            tmp = shard.with_name(f".{wal.stem}.{uuid.uuid4().hex[:8]}.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)  # marks it as being written (see _remove_abandoned)
                layout.write_shard(table, tmp)  # the flat layout; native I/O, no GIL; page CRCs
                if self.fsync:
                    os.fsync(fd)
                os.replace(tmp, shard)
                if self.fsync:
                    _fsync_path(shard.parent)  # the rename itself
                if self.remote is not None:
                    self.remote.shard_written(shard)  # uploaded in the background
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
            finally:
                os.close(fd)
        if damaged:
            self._quarantine(wal, "was damaged", "Its readable rows are in the cache.")
        else:
            wal.unlink(missing_ok=True)

    def _keys(self) -> KeyIndex:
        """The key index, loaded from the logs and shards the first time it is needed."""
        if self._index is None:
            self._index = self._load_index()
        return self._index

    def _load_index(self) -> KeyIndex:
        self._log_ends, self._files_read = {}, {}
        return self._index_of_new_rows(own=True)

    def _index_of_new_rows(self, own: bool = False) -> KeyIndex:
        """The index of the rows not read into the key index yet: the lines appended to the logs
        since (``_log_ends``) and the shards (and remote key files) not read yet or replaced since
        (``_files_read``: path -> inode, size, mtime), all of them on the first load. Logs first,
        then shards: a log compacted meanwhile has its shard in place before it is deleted, so every
        row is seen (some twice: copies, which read as one). The rows are put in cache order
        (shards, then logs). ``own``: this process's current log too (a whole load; a refresh has
        its rows, set as appended)."""
        frames = []
        for path in self._logs():
            if (
                path == self._wal and not own
            ):  # this process's own log: its rows are in the index as appended
                continue
            table, _ = self._read_log(path, live=True, since=self._log_ends)
            if table is not None and table.num_rows:
                frames.append(index_columns(pl.from_arrow(table.select(INDEX_COLUMNS)).lazy()))
        self._log_ends = {p: end for p, end in self._log_ends.items() if p.exists()}
        listed = {}
        for path in self._shards() + self._key_files():
            with contextlib.suppress(FileNotFoundError):
                st = path.stat()
                listed[path] = (st.st_ino, st.st_size, st.st_mtime_ns)
        self._lost = any(
            any(self.root.glob(f"quarantine/{p.name}.*"))
            for p in set(self._files_read) - set(listed)
        )
        new = [p for p, seen in listed.items() if self._files_read.get(p) != seen]
        for path in new:
            if (
                path in self._files_read
            ):  # rewritten under its name since: its pages are checked again
                self._verifier.forget(path)
        shards = self._verified(new, INDEX_COLUMNS)
        self._files_read = listed
        try:  # all shards at once (fast); only if that fails is each shard checked alone
            return KeyIndex.from_frames(self._index_frames(shards) + frames)
        except (
            verify.damaged()
        ) as exc:  # pyarrow and polars raise several types for a damaged file (polars: a panic)
            if not verify.is_damage(exc):
                raise
        return KeyIndex.from_frames(self._index_frames(self._readable(shards)) + frames)

    @staticmethod
    def _index_frames(shards: list[Path]) -> list[pl.LazyFrame]:
        # the full schema, as in ``scan``: shards written by older versions lack the newer columns
        return [index_columns(verify.scan(shards).select(INDEX_COLUMNS))] if shards else []

    def _put_aside(
        self,
        shard: Path,
        exc: BaseException,
        recheck: Callable[[Path], BaseException | None],
        what: str = "Its requests will be sent again.",
    ) -> bool:
        """Move the unreadable ``shard`` (``exc`` says why) to quarantine/ with a warning. A local
        copy of a remote shard (``cache.remote``) is then downloaded again (once per process,
        checked against its manifest) and ``recheck``ed: True when that fresh copy is readable and
        in place, False when the shard's requests will be sent again (the fresh copy is damaged too,
        or could not be fetched). A fresh copy damaged again means the remote object is: it is moved
        aside there (``Remote.condemn``)."""
        while True:
            remote = self.remote if self.remote is not None and not self.read_only else None
            again = remote is not None and remote.can_refetch(shard)
            self._quarantine(
                shard,
                f"is unreadable ({type(exc).__name__}: {exc})",
                f"Fetching it again from {remote.name}." if again else what,
            )
            if not again:
                if remote is not None:
                    remote.condemn(shard, f"{type(exc).__name__}: {exc}")
                return False
            if not remote.refetch(shard):
                return False
            exc = recheck(shard)
            if exc is None:
                self._warn(
                    f"cache: {shard} fetched again from {self.remote.name}: whole; its rows are read."
                )
                return True

    def _verified(self, shards: list[Path], columns: list[str] | None = None) -> list[Path]:
        """``shards`` less those whose pages of ``columns`` (None: all) fail their checksums
        (``cache.verify``), which are moved to quarantine/ and their keys dropped from the key index
        (a remote shard's local copy fetched again first: ``_put_aside``)."""
        damaged = self._verifier.damaged(shards, columns)

        def recheck(shard: Path) -> BaseException | None:
            return next((exc for _, exc in self._verifier.damaged([shard], columns)), None)

        gone = {shard for shard, exc in damaged if not self._put_aside(shard, exc, recheck)}
        if gone:
            self._index = (
                None if columns is None else self._index
            )  # loading it: it is being built without them
            shards = [s for s in shards if s not in gone]
        return shards

    def _readable(self, shards: list[Path]) -> list[Path]:
        """``shards`` less those whose footer or index columns cannot be read, moved to quarantine/
        (a remote shard's local copy fetched again first: ``_put_aside``)."""
        readable = []
        for shard in shards:
            exc = verify.check(shard, INDEX_COLUMNS)
            if exc is None or self._put_aside(shard, exc, lambda s: verify.check(s, INDEX_COLUMNS)):
                readable.append(shard)
        return readable

    def read(self, query: Callable[[pl.LazyFrame], T]) -> T:
        """``query(self.scan())`` (every shard's pages verified first; ``read_parts`` gives the
        query the shards in parts), recovering from a damaged shard all the same: when the query
        fails with what reading damaged bytes raises (``verify.is_damage``: a reader error, a panic
        in the reader), or a shard it read is gone (set aside by another process meanwhile), every
        shard is read whole (``verify``), the unreadable ones are moved to quarantine/ with a
        warning, and the query runs again without them. Raises the original error, unchanged, when
        no shard was unreadable or gone; any other error (a bug in the query) propagates at once,
        and nothing is verified again or set aside."""
        return self._recovering(lambda: query(self.scan()))

    def read_parts(self, query: Callable[[list[pl.LazyFrame]], T]) -> T:
        """``query(self.scan_parts())``, recovering from damage as ``read`` does. For a query that
        keeps a few rows of every shard (one evaluation's): collecting and compacting the parts one
        at a time (``scoring.columns.filtered_parts``) holds those rows only, where one collect over
        every shard holds the buffers the whole shards decode to."""
        return self._recovering(lambda: query(self.scan_parts()))

    def _recovering(self, run: Callable[[], T]) -> T:
        """``run()``, and once more after setting damaged shards aside (see ``read``)."""
        try:
            return run()
        except (
            verify.damaged()
        ) as exc:  # a damaged shard raises several types (a checksum, a panic in polars)
            if (
                not (verify.is_damage(exc) or isinstance(exc, FileNotFoundError))
                or not self.verify()
            ):
                raise
        return run()

    def verify(self) -> int:
        """Read every shard whole (all columns, by pyarrow with page checksums verified, and by
        Polars); move the unreadable ones to quarantine/ with a warning and drop their keys from the
        key index (reloaded when next needed), so their requests count as not cached; a remote
        shard's local copy is fetched again first (``_put_aside``). Returns how many were moved (or
        fetched again, or gone already: set aside by another process meanwhile). An error that is
        not damage (``verify.is_damage``) propagates and sets nothing more aside."""
        moved = 0
        for shard in self._shards():
            try:
                exc = verify.check(shard)
            except FileNotFoundError:
                moved += 1  # gone meanwhile: no longer listed
                continue
            if exc is not None:
                # set aside, or replaced by a fresh copy from the remote: the query runs again
                moved += 1
                self._put_aside(
                    shard, exc, verify.check, "Its requests will be sent again by the next run."
                )
        if moved:
            self._index = None
        return moved

    def refresh(self) -> None:
        """Read into the key index the rows other processes appended since it was read (called after
        every claim is taken, ``cache.claims``: what the claim's last holder stored counts as
        cached), reading only what is new: the lines appended to the logs since, and the shards that
        were not there (or were rewritten) when it was last read. An index not loaded yet is left to
        load whole when first needed; one that cannot fold the new rows in exactly
        (``KeyIndex.update``), or that holds the keys of a shard set aside in quarantine/ since (by
        another process), is read again whole."""
        if self._index is None:
            return
        newer = self._index_of_new_rows()
        if self._lost or not self._index.update(newer):  # a shard read before was set aside since
            self._index = None

    def set_aside(self) -> aside.SetAside:
        """The shards set aside as damaged (``cache.aside``): those moved to quarantine/, the remote
        tier's moved to its quarantine/ (``Remote.set_aside``) and, read only, those skipped where
        they lie."""
        moved = aside.quarantined(self.root)
        where = [f"moved them to {self.root / 'quarantine'}/"] if moved else []
        remote = self.remote.set_aside() if self.remote is not None else []
        if remote:
            where.append(f"moved them to {self.remote.name}/quarantine/")
        if self._set_aside:
            where.append(f"skipped them where they lie in {self.root / 'shards'}/ (read-only)")
        return aside.read(moved + remote + sorted(self._set_aside), " and ".join(where))

    def status(self, key: str) -> str | None:
        """The newest row's class for ``key``: "ok", "invalid", "fatal", "transient", "set aside"
        (another model's reply: ``dxi.served``), or None if absent."""
        return NAMES.get(self._keys().get(key))

    def has(self, key: str) -> bool:
        """True when the request with this key needs no sending (see the class docstring)."""
        return self._cached[self._keys().get(key)]

    def has_many(self, keys: list[str]) -> list[bool]:
        """``has`` for many keys at once (one vectorised lookup)."""
        cached = self._cached
        return [cached[code] for code in self._keys().codes(keys)]

    def __len__(self) -> int:
        return len(self._keys())

    def scan(self) -> pl.LazyFrame:
        """Every row (shards, and the logs of this and other live writers) as one LazyFrame in the
        logical shape (``cache.layout``): the columns of ``cache.schema.SCHEMA``, then the flat
        answer columns (``cache.layout.FLAT``), whatever each shard's layout, in cache order (shards
        in name order, then the logs). Several rows may share a key; the one ``cache.index.newest``
        picks counts."""
        shards, logged = self._sources()
        frames = (
            [verify.scan(shards)] if shards else []
        ) + logged  # older shards: nulls in the newer columns
        if not frames:
            return layout.empty()
        return frames[0] if len(frames) == 1 else pl.concat(frames, how="vertical_relaxed")

    def scan_parts(self, rows: int = PART_ROWS) -> list[pl.LazyFrame]:
        """``scan()``'s rows as a list of LazyFrames in the logical shape, in its order: consecutive
        shards of up to ``rows`` rows together (a larger shard alone), then one of the logs (at
        least one frame: an empty cache gives one with no rows). A part is what a reader holds
        decoded at a time (``scoring.columns.filtered_parts``); grouping small shards keeps a cache
        of thousands of them from costing a read each."""
        shards, logged = self._sources()
        groups: list[list[Path]] = []
        held = rows
        for shard in shards:
            try:
                n = pq.read_metadata(shard).num_rows
            except FileNotFoundError:
                # set aside meanwhile: the read fails, and ``_recovering`` lists the shards again
                n = 0
            if held + n > rows:
                groups.append([])
                held = 0
            groups[-1].append(shard)
            held += n
        return [verify.scan(group) for group in groups] + logged or [layout.empty()]

    def _sources(self) -> tuple[list[Path], list[pl.LazyFrame]]:
        """The shards to read (verified) and the logs' rows (at most one frame, in the logical
        shape)."""
        held = (
            self._held
        )  # the last log handed to the compactor by close(wait=False): its rows, from memory
        logged = [
            (p.stem, t)
            for p in self._logs()
            if (held is None or p.stem != held[0])
            and (t := self._read_log(p, live=True)[0]) is not None
        ]
        shards = self._shards()  # listed after the logs were read: see _load_index
        if held is not None:
            shards = [s for s in shards if s.stem != held[0]]
            logged.append(held)
        compacted = {
            s.stem for s in shards
        }  # a log whose shard is in place is about to go: skip it
        tables = [t for stem, t in logged if t.num_rows and stem not in compacted]
        frames = (
            [layout.logical(pl.from_arrow(pa.concat_tables(tables)).lazy(), layout.NESTED)]
            if tables
            else []
        )
        return self._verified(
            shards
        ), frames  # every page checked against its checksum, once per open cache

    def compact_shards(
        self, target_rows: int = COMPACT_ROWS, on_wait: Callable[[], None] | None = None
    ) -> list[tuple[Path, int, list[Path]]]:
        """Rewrite the local shards as fewer shards of the flat layout (``cache.layout``):
        consecutive shards (in name order) below ``target_rows`` rows are merged, up to
        ``target_rows`` rows each, into one written under the name of the last of them, so every row
        keeps its place in the cache's order (ties are broken as before); a shard of the nested
        layout is rewritten in the flat one even alone. Returns, per shard written, (its path, its
        rows, the shards it holds the rows of, itself included).

        Each shard is read with its page checksums verified; the new shard is written to a temporary
        name (locked, as a log's compaction is), renamed over the last shard of its group, and only
        then are the others deleted: a reader sees every row once or, for an instant, twice (exact
        copies, which the newest-wins rule reads as one), never not at all, and a running writer
        only ever adds shards under new names, so no row is lost. A shard that fails its checksums
        is moved to quarantine/ (its requests are sent again) and its group left as it is.
        Idempotent: with every shard flat and no two consecutive ones small, nothing is written.
        Memory: one shard and one row group at a time.

        Two compactions never run at once on one cache: each holds an exclusive ``flock`` on
        ``compact.lock`` in the cache folder from before it lists the shards until its last delete,
        and a second one waits for it (then lists what the first left). Without it, two compactions
        grouping differently (``--target-rows``) each deleted shards the other had merged into its
        own: 600 keys became 350 (issue 32). ``on_wait()`` is called once when another compaction
        holds it. The remote's shards (``remote/``, copies) are the remote compaction's. Raises
        CacheWriteError on a read-only cache, OSError when a shard cannot be written (its group then
        stays as it was)."""
        if self.read_only:
            raise CacheWriteError(f"the cache {self.root} is open read-only")
        try:
            fd = os.open(self.root / COMPACT_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise CacheWriteError(
                f"cannot create {self.root / COMPACT_LOCK}: {exc.strerror or exc}", exc.errno
            ) from None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if on_wait is not None:
                    on_wait()
                fcntl.flock(fd, fcntl.LOCK_EX)  # released by the close below
            return self._compact_shards(target_rows)
        finally:
            os.close(fd)

    def _compact_shards(self, target_rows: int) -> list[tuple[Path, int, list[Path]]]:
        """``compact_shards`` under its lock."""
        groups: list[list[tuple[Path, int, int]]] = [[]]
        for shard in sorted(self.root.glob("shards/*.parquet")):
            try:
                entry = (shard, layout.layout_of(shard), pq.read_metadata(shard).num_rows)
            except FileNotFoundError:  # compacted away by another process meanwhile
                continue
            except (
                layout.UnknownLayout,
                layout.NotAShard,
            ) as exc:  # a newer version's, or not a shard: left alone, never merged across
                self._warn(f"cache: {exc}; left as it is.")
                groups.append([])
                continue
            except verify.damaged() as exc:
                self._quarantine(
                    shard,
                    f"is unreadable ({type(exc).__name__}: {exc})",
                    "Its requests will be sent again.",
                )
                continue
            held = sum(rows for _, _, rows in groups[-1])
            if entry[2] >= target_rows or held + entry[2] > target_rows:
                groups.append([])
            groups[-1].append(entry)
            if entry[2] >= target_rows:
                groups.append([])
        done = []
        for group in groups:
            if len(group) >= 2 or (group and group[0][1] == layout.NESTED):
                written = self._merge([shard for shard, _, _ in group])
                if written is not None:
                    done.append((group[-1][0], written, [shard for shard, _, _ in group]))
        if done:  # new files under known names: verify and index them afresh
            self._verifier, self._index = verify.Verifier(), None
        return done

    def _merge(self, group: list[Path]) -> int | None:
        """Write the rows of ``group`` (shards in name order) as one flat shard over the last of
        them, then delete the others (see ``compact_shards``); the rows written, or None when a
        shard was gone or damaged (then nothing changed but the damaged one's move to
        quarantine/)."""
        last = group[-1]
        unreadable: list[tuple[Path, BaseException]] = []

        def tables():
            for shard in group:
                try:
                    yield pq.read_table(shard, page_checksum_verification=True)
                except FileNotFoundError:
                    raise
                except verify.damaged() as exc:
                    unreadable.append((shard, exc))
                    raise _Unreadable from None

        tmp = last.with_name(f".{last.stem}.{uuid.uuid4().hex[:8]}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # marks it as being written (see _remove_abandoned)
            rows = layout.write_merged(tables(), tmp)
            if self.fsync:
                os.fsync(fd)
            os.replace(tmp, last)
            if self.fsync:
                _fsync_path(last.parent)
        except (FileNotFoundError, _Unreadable):
            tmp.unlink(missing_ok=True)
            for shard, exc in unreadable:
                self._quarantine(
                    shard,
                    f"is unreadable ({type(exc).__name__}: {exc})",
                    "Its requests will be sent again.",
                )
            return None
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        finally:
            os.close(fd)
        for shard in group[:-1]:  # their rows are in ``last`` now
            shard.unlink(missing_ok=True)
        return rows

    # ---- writing ------------------------------------------------------------------------------
    def _open_log(self) -> None:
        stem = f"{time.time_ns()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        tmp = self.root / "wal" / f".{stem}.creating"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        except OSError as exc:
            raise CacheWriteError(
                f"cannot create a cache log in {tmp.parent}: {exc.strerror}", exc.errno
            ) from None
        fcntl.flock(fd, fcntl.LOCK_EX)  # held until compacted: marks the log as live
        self._wal = self.root / "wal" / f"{stem}.jsonl"
        os.replace(tmp, self._wal)  # visible to others only once locked
        self._fd = fd
        self._log_rows = 0
        self._opened = time.monotonic()

    def check_writable(self) -> None:
        """Raise CacheWriteError (naming the folder) unless a file can be created, written and
        removed in ``wal/`` and ``shards/``: called before a run's first request, so that a
        read-only cache is found before any reply would be lost."""
        for sub, suffix in (
            ("wal", "creating"),
            ("shards", "tmp"),
        ):  # names _remove_abandoned clears
            probe = self.root / sub / f".probe-{os.getpid()}-{uuid.uuid4().hex[:8]}.{suffix}"
            try:
                fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                try:
                    os.write(fd, b"\n")
                finally:
                    os.close(fd)
                    probe.unlink(missing_ok=True)
            except OSError as exc:
                raise CacheWriteError(
                    f"the cache cannot be written: cannot create a file in {probe.parent} "
                    f"({exc.strerror or exc})",
                    exc.errno,
                ) from None

    def append(self, row: dict) -> None:
        """Store one row (a dict with the columns of ``SCHEMA``) durably before returning."""
        self.append_many((row,))

    def append_many(self, rows: Sequence[dict]) -> None:
        """Store rows (dicts with the columns of ``SCHEMA``) durably before returning, in one
        write(2): a batch's results read together (``runner.batch.driver``) cost one system call,
        not one each. Raises CacheWriteError (nothing of ``rows`` is then counted as stored; the
        complete lines a full disk took are read back by the next start-up, a cut one dropped)."""
        fd = self._fd
        if fd is None:
            if self.read_only:
                raise CacheWriteError(f"the cache {self.root} is open read-only")
            self._closing = False  # appending again after close
            self._open_log()
            fd = self._fd
        # one write(2) on an O_APPEND file: the rows are in the kernel when it returns; each line
        # sealed with its CRC-32 (``cache.verify.seal``)
        data = (
            _seal(_dumps(rows[0]))
            if len(rows) == 1
            else b"".join([_seal(_dumps(row)) for row in rows])
        )
        try:
            written = _write(fd, data)
        except OSError as exc:
            raise CacheWriteError(
                f"cannot write to the cache log {self._wal}: {exc.strerror}", exc.errno
            ) from None
        if written != len(data):  # a full disk takes what fits, then refuses the rest
            raise CacheWriteError(
                f"cannot write to the cache log {self._wal}: only {written} of {len(data)} bytes "
                f"of {'a row' if len(rows) == 1 else f'{len(rows)} rows'} were written (is the disk full?)"
            )
        if self.fsync:
            os.fsync(fd)
        index = self._index
        if index is None:
            index = self._keys()
        for row in rows:
            aside = served_by_other(row.get("provider"), row.get("model"), row.get("served_model"))
            index.set(row["key"], code_of(row["status"], row.get("error_kind"), aside))
        self._log_rows += len(rows)
        if self._log_rows >= self.roll_rows:
            self._roll()

    def roll_if_due(self) -> None:
        """Roll the log over if it holds rows and is ``roll_s`` old (with a remote tier: called
        every second from the thread that appends, ``runner.distributed.setup``, so ``append``
        itself pays nothing for it)."""
        if (
            self._fd is not None
            and self._log_rows
            and self.roll_s is not None
            and time.monotonic() - self._opened >= self.roll_s
        ):
            self._roll()

    def _roll(self) -> None:
        """Start a new log; compact the full one in the background (its lock is held until then)."""
        wal, fd = self._wal, self._fd
        self._rolled += self._log_rows
        self._open_log()
        if self._compactor is None:
            self._compactor = ThreadPoolExecutor(1, thread_name_prefix="dxi-compact")
        self._pending = [f for f in self._pending if not f.done()]
        self._pending.append(self._compactor.submit(self._compact_own, wal, fd))

    def _compact_own(self, wal: Path, fd: int) -> None:
        """Compact one of this process's logs, then release it. While rows are still being appended
        the log is parsed on one thread, leaving the other cores to the appends; once ``close`` has
        begun, on all."""
        try:
            table, _ = self._read_log(wal, live=True, threads=self._closing)
        except Exception as exc:  # the log stays; the next run recovers it
            self._compaction_failed(wal, exc)
            table = None
        if table is None:
            os.close(fd)
            return
        self._compact_table(wal, fd, table)

    def _compact_table(self, wal: Path, fd: int, table: pa.Table) -> None:
        """Write ``table`` (the rows of this process's log ``wal``) as its shard, then release the
        log."""
        try:
            self._compact(wal, table)
        except Exception as exc:  # the log stays; the next run recovers it
            self._compaction_failed(wal, exc)
        finally:
            os.close(fd)

    def _compaction_failed(self, wal: Path, exc: Exception) -> None:
        self._warn(
            f"cache: could not compact {wal} ({type(exc).__name__}: {exc}); it stays and the next "
            "run will compact it."
        )

    def close(self, wait: bool = True) -> None:
        """Compact this process's logs into shards and release them. Safe to call twice.

        ``wait=False`` (``dxi run``, before scoring): the logs rolled over before are compacted
        first (as with ``wait``), then the last log is parsed here and its shard written on the
        compactor thread (PyArrow's writer, without the GIL) while the caller goes on; until then
        ``scan`` reads those rows from memory, and the log stays in place until its shard is (a kill
        meanwhile loses nothing: the next run compacts the log). A later ``close()`` (the context's
        exit) waits for it."""
        self._closing = True
        # the logs rolled over before (and a last one handed over): shards first
        self._finish_compactions()
        if self._fd is not None:
            wal, fd = self._wal, self._fd
            self._fd = self._wal = None
            self._rolled += self._log_rows
            self._log_rows = 0
            if wait:
                self._compact_own(wal, fd)
            else:
                self._hand_over(wal, fd)
        if wait:
            self._held = None

    def _finish_compactions(self) -> None:
        if self._compactor is not None:
            self._compactor.shutdown(wait=True)
            self._compactor = None
            self._pending = []

    def _hand_over(self, wal: Path, fd: int) -> None:
        """``close(wait=False)``'s last log: parsed now, kept for ``scan``, its shard written in the
        background."""
        try:
            table, _ = self._read_log(wal, live=True)
        except Exception as exc:  # the log stays; the next run recovers it
            self._compaction_failed(wal, exc)
            table = None
        if table is None:
            os.close(fd)
            return
        self._held = (wal.stem, table)
        if self._compactor is None:
            self._compactor = ThreadPoolExecutor(1, thread_name_prefix="dxi-compact")
        self._pending.append(self._compactor.submit(self._compact_table, wal, fd, table))

    def __enter__(self) -> Cache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def rows_appended(self) -> int:
        """Rows appended by this process so far."""
        return self._rolled + self._log_rows


class _Unreadable(Exception):
    """A shard to merge failed its verified read (``Cache._merge``)."""


@contextlib.contextmanager
def _try_lock(path: Path, create: bool = False):
    """Yield whether an exclusive flock on ``path`` could be taken at once (False if the file is
    gone, unless ``create`` makes it, or another process holds it); the lock is held inside the
    block."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644) if create else os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        yield False
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
