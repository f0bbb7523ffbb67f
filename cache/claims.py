"""Claims: which process may send a model's requests to a cache folder, so that two processes on one
cache never both send the same request (issue 23).

One lock file per model configuration (``identity``: an opaque digest of adapter, model, endpoint,
parameters and prompt version), ``claims/<identity>.lock``, holds **open-file-description byte-range
locks** (``F_OFD_SETLK``, Linux ≥ 3.15): the kernel drops them when the holder's file is closed or
the process dies however it dies (kill -9, OOM kill, a reboot), so a claim is never left stale; they
are owned by an open file, not a process, so two claims made by one process conflict as two
processes' would; and they go through the file system's own locking (local disks; NFSv4 and Lustre
lease them across machines).

* A process sending every request of the model (no ``--shard``) write-locks bytes [1, ∞).
* A shard K/N write-locks one byte of its own (``_shard_byte``) and read-locks N's marker byte
  ``1 + N``, after checking, under a short write lock on byte 0, that no marker of another N is
  held: shards of one run (the same N) claim side by side, while two shardings of one model (``0/2``
  beside ``0/3``) overlap and exclude each other, as a shard and an unsharded run do.

A claim that cannot be taken names its holder: each claim writes ``claims/<identity>.<part>.holder``
(process id, host, when, the model's label) once taken; the file is only read to word messages,
never to decide. ``take`` never blocks; ``wait`` polls until the claim is free (the holder ended, or
died).

The batch ledger (``cache.ledger``) claims batched requests itself: a request in an open batch is
claimed by that batch whoever holds the model's lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import orjson

CLAIMS_DIR = "claims"
_FLOCK = (
    "hhqqi4x"  # struct flock on Linux: l_type, l_whence, l_start, l_len, l_pid (padded to 32 bytes)
)
_MARKERS = 1  # byte 1 + N: read-locked by every shard process of N shards
_SHARDS = 1 << 40  # shard K of N: byte _SHARDS + N(N-1)/2 + K


@dataclass(frozen=True, slots=True)
class Holder:
    """Who holds a claim, as its holder file says (``pid`` None when it cannot be read: the holder
    was between taking the lock and writing the file, or its file is gone)."""

    pid: int | None
    host: str | None = None
    since: float | None = None
    label: str | None = None

    def __str__(self) -> str:
        if self.pid is None:
            return "another process"
        where = "" if self.host in (None, socket.gethostname()) else f" on {self.host}"
        since = (
            ""
            if self.since is None
            else f", since {time.strftime('%H:%M:%S', time.localtime(self.since))}"
        )
        return f"process {self.pid}{where}{since}"


class Claim:
    """A model's requests claimed by this process until ``release()`` (or the process ends)."""

    def __init__(self, fd: int, holder_file: Path):
        self._fd: int | None = fd
        self.holder_file = holder_file

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Give the claim back (closing the lock file drops every lock this claim holds). Safe to
        call twice."""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

    def __enter__(self) -> Claim:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _lock(fd: int, kind: int, start: int, length: int) -> bool:
    """Set an OFD lock (``F_RDLCK``/``F_WRLCK``/``F_UNLCK``) on [start, start + length) (length 0:
    to the end and beyond) without waiting; False when another open file holds a conflicting one."""
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack(_FLOCK, kind, os.SEEK_SET, start, length, 0))
    except (BlockingIOError, PermissionError):
        return False
    return True


def _free(fd: int, start: int, length: int) -> bool:
    """Whether no other open file holds any lock on [start, start + length)."""
    found = fcntl.fcntl(
        fd, fcntl.F_OFD_GETLK, struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, start, length, 0)
    )
    return struct.unpack(_FLOCK, found)[0] == fcntl.F_UNLCK


def _shard_byte(index: int, count: int) -> int:
    return _SHARDS + count * (count - 1) // 2 + index


def _part(shard: tuple[int, int] | None) -> str:
    return "all" if shard is None else f"{shard[0]}of{shard[1]}"


def _take_shard(fd: int, index: int, count: int) -> bool:
    """Claim shard ``index`` of ``count`` on the open lock file ``fd`` (see the module
    docstring)."""
    deadline = time.monotonic() + 5.0
    while not _lock(
        fd, fcntl.F_WRLCK, 0, 1
    ):  # the entry mutex: held by a claimant for microseconds
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)
    try:
        marker = _MARKERS + count
        if not (
            _free(fd, _MARKERS, marker - _MARKERS) and _free(fd, marker + 1, _SHARDS - marker - 1)
        ):
            return (
                False  # another sharding of this model, or an unsharded run (it holds every marker)
            )
        if not _lock(fd, fcntl.F_RDLCK, marker, 1):
            return False
        if not _lock(fd, fcntl.F_WRLCK, _shard_byte(index, count), 1):
            _lock(fd, fcntl.F_UNLCK, marker, 1)
            return False
        return True
    finally:
        _lock(fd, fcntl.F_UNLCK, 0, 1)


def holder(root: Path | str, identity: str, shard: tuple[int, int] | None = None) -> Holder:
    """Who holds (or last held) the claim of ``identity`` (and ``shard``) in the cache folder
    ``root``: its holder file, or ``Holder(None)`` when none can be read. A claim of another part (a
    shard against the whole model) is looked for too."""
    folder = Path(root) / CLAIMS_DIR
    files = [folder / f"{identity}.{_part(shard)}.holder"]
    files += sorted(p for p in folder.glob(f"{identity}.*.holder") if p not in files)
    for path in files:
        with contextlib.suppress(OSError, orjson.JSONDecodeError, TypeError, KeyError):
            doc = orjson.loads(path.read_bytes())
            return Holder(int(doc["pid"]), doc.get("host"), doc.get("since"), doc.get("label"))
    return Holder(None)


def take(
    root: Path | str, identity: str, label: str, shard: tuple[int, int] | None = None
) -> Claim | Holder:
    """Claim the requests of the model ``identity`` (all of them, or those of ``shard`` = (K, N)) in
    the cache folder ``root`` without waiting: a ``Claim``, or the ``Holder`` of a conflicting
    claim. ``label`` names the model in the holder file. Raises OSError when the claims folder
    cannot be written."""
    folder = Path(root) / CLAIMS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / f"{identity}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        got = _lock(fd, fcntl.F_WRLCK, _MARKERS, 0) if shard is None else _take_shard(fd, *shard)
    except BaseException:
        os.close(fd)
        raise
    if not got:
        os.close(fd)
        return holder(root, identity, shard)
    holder_file = folder / f"{identity}.{_part(shard)}.holder"
    tmp = holder_file.with_name(f".{holder_file.name}.{os.getpid()}")
    with contextlib.suppress(
        OSError
    ):  # only for messages: a claim that cannot say who holds it still holds
        tmp.write_bytes(
            orjson.dumps(
                {
                    "pid": os.getpid(),
                    "host": socket.gethostname(),
                    "since": time.time(),
                    "label": label,
                }
            )
        )
        os.replace(tmp, holder_file)
    return Claim(fd, holder_file)


async def wait(
    root: Path | str,
    identity: str,
    label: str,
    shard: tuple[int, int] | None = None,
    on_wait: Callable[[Holder], None] | None = None,
    poll_s: float = 0.5,
) -> Claim:
    """``take``, trying again every ``poll_s`` seconds until the claim is free; ``on_wait(holder)``
    is called once, when the first try finds it held. Cancelling the wait takes nothing."""
    told = False
    while True:
        got = take(root, identity, label, shard)
        if isinstance(got, Claim):
            return got
        if not told and on_wait is not None:
            on_wait(got)
        told = True
        await asyncio.sleep(poll_s)
