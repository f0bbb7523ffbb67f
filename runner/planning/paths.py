"""The folders and files a command will write, checked before it sends, scores or reads anything: an
output folder that cannot be written used to surface after every request was sent (``dxi run --out
README.md/x``: ``NotADirectoryError``, exit 1), a cache folder that cannot be written as three
chained tracebacks, an export to ``/proc/x.csv`` as a Polars traceback (issue 32).

Each check creates the folder (as the command would) and creates and removes a file in it, which is
what root is refused too (a folder under a regular file, a read-only file system, ``/proc``,
``/sys``); ``os.access`` would say yes to root. (``dxi export``'s TARGET is tried in the nearest
folder of its path that exists instead, and made only as it is written: a refused export leaves no
folder behind.) The errors name the flag and the path and say why:

* an output (``--out``, ``dxi export``'s TARGET, ``dxi data fetch --data-dir``, ``dxi fetch-model
  --dir``): ``UsageError``, exit code 2;
* the cache (``cache_folder``): a path that cannot be a folder (a file in the way) is bad input,
  exit 2; a folder that cannot be written (permissions, a read-only or full file system) is
  ``CacheFolderError``, exit code 4, as a cache write that fails during a run;
* an output inside the cache folder (``outside_cache``): ``UsageError``, exit code 2.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from ..errors import CacheFolderError, UsageError

_IN_THE_WAY = (errno.ENOTDIR, errno.EEXIST)  # a file where a folder is expected


def _why(path: Path, exc: OSError) -> str:
    """Why ``path`` cannot be a writable folder: the file in the way, else the system's reason."""
    for part in (path, *path.parents):
        if part.exists() and not part.is_dir():
            return f"{part} is a file, not a folder"
    return exc.strerror or str(exc)


def _probe(folder: Path) -> None:
    """Create ``folder`` (and its parents) and a file in it, then remove the file; OSError when
    either fails."""
    folder.mkdir(parents=True, exist_ok=True)
    probe = folder / f".dxi-write-check-{os.getpid()}"
    fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, b"\0")  # a full disk refuses a byte, not always an empty file
    finally:
        os.close(fd)
        probe.unlink(missing_ok=True)


def _probe_uncreated(folder: Path) -> None:
    """Whether ``folder`` could be created (with its missing parents) and a file written in it,
    found without leaving anything behind: a folder and a file are made in the nearest of ``folder``
    and its parents that exists, then removed (``dxi export`` makes TARGET's folder only when it
    writes, so that a refused export creates nothing). OSError when they cannot be."""
    here = next(part for part in (folder, *folder.parents) if part.exists())
    if not here.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(here))
    if here == folder:
        _probe(folder)
        return
    trial = here / f".dxi-write-check-{os.getpid()}.d"
    trial.mkdir()
    try:
        _probe(trial)
    finally:
        trial.rmdir()


def output_folder(path: Path, flag: str, create: bool = True) -> None:
    """Make sure the output folder ``path`` (given as ``flag``, e.g. ``--out``) can be written:
    created if missing (with ``create``; otherwise left as it is, its writing tried in the nearest
    folder there). UsageError (exit code 2) naming ``flag``, the path and why, otherwise."""
    try:
        (_probe if create else _probe_uncreated)(path)
    except OSError as exc:
        why = _why(path, exc)
        raise UsageError(
            f"{flag} {path}: cannot write there ({why}); nothing was done: give another folder"
        ) from None


def outside_cache(path: Path, cache_dir: Path, flag: str) -> None:
    """UsageError (exit code 2) naming ``flag`` when the output ``path`` is the cache folder
    ``cache_dir`` or inside it: the cache owns its folder (an answers.parquet written into its
    ``shards/`` was read as a shard, and stopped every command), and a command's outputs never mix
    with it."""
    out, cache = path.resolve(), cache_dir.resolve()
    if out == cache or cache in out.parents:
        raise UsageError(
            f"{flag} {path}: inside the cache folder {cache_dir}, which holds only the cache's own "
            "files; nothing was done: give a folder outside it"
        )


def output_file(path: Path, flag: str, create: bool = True) -> None:
    """Make sure the file ``path`` (given as ``flag``) can be written: not a folder, its folder
    writable (created if missing, with ``create``: as ``output_folder``). UsageError (exit code 2)
    otherwise. (``runner.export`` refuses a folder too, for its library callers.)"""
    if path.is_dir():
        raise UsageError(f"{flag} {path} is a folder: give the file to write")
    try:
        (_probe if create else _probe_uncreated)(path.parent)
    except OSError as exc:
        why = _why(path.parent, exc)
        raise UsageError(
            f"{flag} {path}: cannot write there ({why}); nothing was done: give another file"
        ) from None


def no_cache(path: Path) -> UsageError:
    """The usage error (exit code 2) of a command that reads a cache folder that is not there
    (``dxi score``, ``report``, ``view``, ``export``, ``dxi batches list|cancel|resume``)."""
    return UsageError(f"no cache at {path}: run `dxi run` first, or pass --cache-dir")


def cache_to_read(path: Path, flag: str = "--cache-dir", required: bool = False) -> None:
    """A cache a command reads (``dxi estimate``, ``dxi batches list``): UsageError (exit code 2)
    when a file is where the folder, or one of its parents, should be, or with ``required`` when
    the folder is not there (``no_cache``). Nothing is created."""
    for part in (path, *path.parents):
        if part.exists():
            if not part.is_dir():
                raise UsageError(
                    f"{flag} {path}: cannot be the cache ({part} is a file, not a folder)"
                )
            break
    if required and not path.is_dir():
        raise no_cache(path)


def cache_folder(path: Path, flag: str = "--cache-dir") -> None:
    """Make sure the cache folder ``path`` can be made (created if missing, as the run would) and
    written. UsageError (exit code 2) when a file is in the way; CacheFolderError (exit code 4) when
    it cannot be created or written. A cache that exists (its ``shards/`` folder there) is left to
    the cache itself: a run with something new opens its log before the first request and stops with
    exit code 4 when it cannot (``cache.Cache``), while a run with nothing new, or a rescore, needs
    no write at all (a read-only cache is scored)."""
    for part in (path, *path.parents):
        if part.exists() and not part.is_dir():
            raise UsageError(
                f"{flag} {path}: cannot be the cache ({part} is a file, not a folder); "
                "nothing was sent"
            )
        if part.exists():
            break
    if (path / "shards").is_dir():
        return
    try:
        _probe(path)
    except OSError as exc:
        why = _why(path, exc)
        if exc.errno in _IN_THE_WAY or why.endswith("is a file, not a folder"):
            raise UsageError(
                f"{flag} {path}: cannot be the cache ({why}); nothing was sent"
            ) from None
        raise CacheFolderError(
            f"{flag} {path}: the cache cannot be written ({why}); nothing was sent: "
            f"fix the folder (or give another {flag}) and rerun"
        ) from None
