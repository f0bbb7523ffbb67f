"""The view's private folder: where its snapshots (and a remote cache's mirror) go, never in the
cache.

One folder per ``dxi view`` process, ``<tmp>/dxi-view-<pid>-<start>-<random>``, named after the
process (its pid and its start time in clock ticks since boot, from ``/proc/<pid>/stat``: a pid the
system has given to another process since does not match). A server that is killed (SIGKILL, a power
cut of the process) cannot remove its folder, so every view removes, when it starts, the folders of
views that no longer run (``remove_stale``): only folders of this user, only when their process is
gone.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

PREFIX = "dxi-view-"
_NAME = re.compile(rf"^{PREFIX}(\d+)-(\d+)-")


def start_ticks(pid: int) -> int | None:
    """Process ``pid``'s start time (clock ticks since boot, field 22 of ``/proc/<pid>/stat``); None
    when it does not run or ``/proc`` is not there."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[19])


def running(pid: int, start: int) -> bool:
    """Whether the process that made a folder named with ``pid`` and ``start`` still runs."""
    ticks = start_ticks(pid)
    if ticks is not None:
        return start == 0 or ticks == start
    if Path("/proc/self/stat").exists():  # /proc is there and has no such process
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def remove_stale(tmp: Path | str | None = None) -> list[Path]:
    """Remove the view folders under ``tmp`` (default: the system's temporary folder) whose process
    no longer runs and that belong to this user; returns those removed. Folders of running views, of
    other users and with other names are left alone."""
    root = Path(tmp or tempfile.gettempdir())
    removed = []
    try:
        entries = list(os.scandir(root))
    except OSError:
        return removed
    for entry in entries:
        match = _NAME.match(entry.name)
        if match is None or not entry.is_dir(follow_symlinks=False):
            continue
        try:
            if entry.stat(follow_symlinks=False).st_uid != os.getuid():
                continue
        except OSError:
            continue
        if not running(int(match[1]), int(match[2])):
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(Path(entry.path))
    return removed


def private_home(tmp: Path | str | None = None) -> tempfile.TemporaryDirectory:
    """A new private folder for this process (after removing stale ones, ``remove_stale``); its
    ``cleanup()`` removes it."""
    remove_stale(tmp)
    pid = os.getpid()
    return tempfile.TemporaryDirectory(prefix=f"{PREFIX}{pid}-{start_ticks(pid) or 0}-", dir=tmp)
