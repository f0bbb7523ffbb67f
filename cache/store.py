"""A content-addressed, append-only cache of request outcomes on disk.

Layout of a cache directory::

    shards/<stem>.parquet     immutable Parquet shards (``cache.schema.SCHEMA``)
    wal/<stem>.jsonl          one write-ahead log per writing process: one orjson line per row
    quarantine/               unreadable shards and logs, set aside with a warning

Durability: ``append`` writes the row's line to the process's own log and flushes it to the kernel before
returning, so a row that was appended survives the process being killed at any moment (``fsync=True``
also survives power loss, at a cost). ``close`` compacts the log into a shard (written to a temporary
name, then renamed: a shard is whole or absent) and deletes the log. A log left behind by a killed
process is compacted by the next process that opens the cache; a truncated last line (the kill came
mid-write) is dropped with a warning, and its request is simply sent again.

Concurrency: each process appends only to its own log and holds an exclusive ``flock`` on it while
alive; readers never write. Two runs on one cache directory therefore never corrupt it; they may both
send a request neither had cached when it started (the newest row then wins).
"""
from __future__ import annotations

import fcntl
import logging
import os
import time
import uuid
from pathlib import Path

import orjson
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from .schema import FAILED, FATAL, INDEX_COLUMNS, INVALID, OK, SCHEMA

log = logging.getLogger("dxi.cache")
_POLARS_SCHEMA = pl.from_arrow(SCHEMA.empty_table()).schema


class Cache:
    """The cache in directory ``root`` (created if missing).

    ``has(key)``: whether a request needs no sending (SPEC §4): its newest row is ``ok`` or ``invalid``,
    or a ``fatal`` failure; a transient failure is requested again. ``retry_invalid`` / ``retry_failed``
    make invalid rows / fatal failures count as not cached. ``append(row)`` stores one row durably.
    ``scan()`` returns every row as a Polars LazyFrame. Use as a context manager, or call ``close``.
    """

    def __init__(self, root: Path | str, *, fsync: bool = False, retry_invalid: bool = False,
                 retry_failed: bool = False):
        self.root = Path(root)
        self.fsync = fsync
        self.retry_invalid, self.retry_failed = retry_invalid, retry_failed
        self.warnings: list[str] = []
        for sub in ("shards", "wal", "quarantine"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self._wal: Path | None = None
        self._fd: int | None = None
        self._appended = 0
        self._index: dict[str, str] = {}
        self._recover_orphans()
        self._load_index()

    # ---- reading ------------------------------------------------------------------------------
    def _warn(self, message: str) -> None:
        self.warnings.append(message)
        log.warning(message)

    def _shards(self) -> list[Path]:
        return sorted(self.root.glob("shards/*.parquet"))

    def _quarantine(self, path: Path, why: str) -> None:
        target = self.root / "quarantine" / f"{path.name}.{uuid.uuid4().hex[:8]}"
        os.replace(path, target)
        self._warn(f"cache: {path} is unreadable ({why}); moved to {target}. Its requests will be sent again.")

    def _read_log(self, path: Path, live: bool) -> list[dict]:
        """Rows of one log. A truncated last line is ignored (silently for a live writer, which may be
        mid-write); corrupt lines elsewhere are skipped with a warning."""
        try:
            data = path.read_bytes()
        except FileNotFoundError:  # compacted by its owner meanwhile: its shard holds the rows
            return []
        lines = data.split(b"\n")
        tail = lines.pop()  # b"" when the file ends with a newline
        if tail and not live:
            self._warn(f"cache: {path} ends with a truncated record (the writer was killed mid-write); "
                       "dropped it, its request will be sent again.")
        rows = []
        for n, line in enumerate(lines, 1):
            try:
                rows.append(orjson.loads(line))
            except orjson.JSONDecodeError:
                self._warn(f"cache: {path} line {n} is corrupt; skipped it, its request will be sent again.")
        return rows

    def _live_logs(self) -> list[Path]:
        return [p for p in sorted(self.root.glob("wal/*.jsonl")) if p != self._wal]

    def _recover_orphans(self) -> None:
        """Compact every log whose writer is gone (its flock is free) into a shard; delete logs a killed
        writer was still creating (always empty; left alone for a minute, as a live writer renames it
        within microseconds)."""
        for path in self.root.glob("wal/.*.creating"):
            try:
                if time.time() - path.stat().st_mtime < 60:
                    continue
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                path.unlink(missing_ok=True)
            except BlockingIOError:
                pass
            finally:
                os.close(fd)
        for path in self._live_logs():
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:  # compacted by another process meanwhile
                continue
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # a live writer holds it
                self._compact(path, self._read_log(path, live=False))
            finally:
                os.close(fd)

    def _compact(self, wal: Path, rows: list[dict]) -> None:
        """Write ``rows`` of log ``wal`` as shard ``shards/<stem>.parquet`` (atomically), then delete the log.
        If the shard already exists the log was compacted before a crash: only the log is deleted."""
        shard = self.root / "shards" / f"{wal.stem}.parquet"
        if rows and not shard.exists():
            tmp = shard.with_suffix(".parquet.tmp")
            pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), tmp, compression="zstd")
            if self.fsync:
                _fsync_file(tmp)
            os.replace(tmp, shard)
            if self.fsync:
                _fsync_file(shard.parent)  # the rename itself
        wal.unlink(missing_ok=True)

    def _load_index(self) -> None:
        frames = []
        for shard in self._shards():
            try:
                frames.append(pl.from_arrow(pq.read_table(shard, columns=INDEX_COLUMNS)))
            except Exception as exc:  # pyarrow raises several types for a damaged file
                self._quarantine(shard, f"{type(exc).__name__}: {exc}")
        for path in self._live_logs():
            rows = self._read_log(path, live=True)
            if rows:
                frames.append(pl.DataFrame([{c: r.get(c) for c in INDEX_COLUMNS} for r in rows],
                                           schema={"key": pl.String, "status": pl.String,
                                                   "error_kind": pl.String, "created_at": pl.Float64}))
        if not frames:
            return
        newest = (pl.concat(frames, how="vertical_relaxed").sort("created_at")
                  .unique("key", keep="last", maintain_order=False))
        status = newest.select(
            "key", pl.when(pl.col("status") == FAILED).then(pl.col("error_kind")).otherwise(pl.col("status")))
        self._index = dict(status.iter_rows())

    def status(self, key: str) -> str | None:
        """The newest row's class for ``key``: "ok", "invalid", "fatal", "transient", or None if absent."""
        return self._index.get(key)

    def has(self, key: str) -> bool:
        """True when the request with this key needs no sending (see the class docstring)."""
        s = self._index.get(key)
        return s == OK or (s == INVALID and not self.retry_invalid) or (s == FATAL and not self.retry_failed)

    def __len__(self) -> int:
        return len(self._index)

    def scan(self) -> pl.LazyFrame:
        """Every row (shards, and the logs of this and other live writers) as one LazyFrame with the
        columns of ``cache.schema.SCHEMA``. Several rows may share a key; the newest ``created_at`` wins."""
        frames = []
        shards = [str(s) for s in self._shards()]
        if shards:  # shards of an older schema lack the newest columns: read them as nulls
            frames.append(pl.scan_parquet(shards, schema=_POLARS_SCHEMA, missing_columns="insert"))
        logged = [r for p in sorted(self.root.glob("wal/*.jsonl")) for r in self._read_log(p, live=True)]
        if logged:
            frames.append(pl.from_arrow(pa.Table.from_pylist(logged, schema=SCHEMA)).lazy())
        if not frames:
            return pl.from_arrow(SCHEMA.empty_table()).lazy()
        return pl.concat(frames, how="vertical_relaxed")

    # ---- writing ------------------------------------------------------------------------------
    def _open_log(self) -> None:
        stem = f"{time.time_ns()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        tmp = self.root / "wal" / f".{stem}.creating"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)  # held until close: marks the log as live
        self._wal = self.root / "wal" / f"{stem}.jsonl"
        os.replace(tmp, self._wal)  # visible to others only once locked
        self._fd = fd

    def append(self, row: dict) -> None:
        """Store one row (a dict with the columns of ``SCHEMA``) durably before returning."""
        if self._fd is None:
            self._open_log()
        line = orjson.dumps(row) + b"\n"
        os.write(self._fd, line)  # one write(2) of an O_APPEND file: in the kernel once this returns
        if self.fsync:
            os.fsync(self._fd)
        self._appended += 1
        status = row["status"]
        self._index[row["key"]] = row.get("error_kind") if status == FAILED else status

    def close(self) -> None:
        """Compact this process's log into a shard and release it. Safe to call twice."""
        if self._fd is None:
            return
        wal, fd = self._wal, self._fd
        self._fd = None
        self._compact(wal, self._read_log(wal, live=False))
        os.close(fd)
        self._wal = None

    def __enter__(self) -> Cache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def rows_appended(self) -> int:
        """Rows appended by this process so far."""
        return self._appended


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

