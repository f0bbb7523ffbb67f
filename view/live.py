"""Following a cache that is still being filled: ``dxi view`` rescoring in the background.

An engineer keeps the view open while an overnight run fills the cache. ``Live`` holds the snapshot
being served (a ``data.Browser``) and, every ``interval`` seconds, looks whether the cache changed:
the names, sizes and modification times of its shards and logs (``signature``: one directory listing
each, no file is opened), and of the remote tier's mirrored shards after pulling newer ones (at most
every ``remote_every`` seconds). When they changed it builds a new snapshot (``Browser.rebuild``:
the same scoring, in a child process) while the old one is still served, then serves the new one and
removes the old one's snapshot. A run that writes all night changes its log every second, so a new
rebuild starts no sooner than ``settle`` seconds, and twice the last rebuild's time, after the last
one ended: the view follows the run without taking its cores. Every page shows the time its snapshot
read the cache ("as of") and whether a newer one is being built. A rebuild that fails keeps the old
snapshot and shows why.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path

from .data import Browser

log = logging.getLogger("dxi.view")


def signature(*folders: Path) -> tuple[tuple[str, int, int], ...]:
    """(path, size, mtime in ns) of every shard (``shards/*.parquet``) and log (``wal/*.jsonl``)
    under ``folders`` (the cache, the remote's mirror), sorted: it changes when a row is appended, a
    log rolls into a shard or a shard is compacted."""
    out = []
    for folder in folders:
        for sub, suffix in (("shards", ".parquet"), ("wal", ".jsonl")):
            try:
                entries = list(os.scandir(folder / sub))
            except OSError:
                continue
            for e in entries:
                if e.name.endswith(suffix) and not e.name.startswith("."):
                    try:
                        st = e.stat()
                    except OSError:  # removed meanwhile (compacted)
                        continue
                    out.append((e.path, st.st_size, st.st_mtime_ns))
    return tuple(sorted(out))


class Live:
    """The snapshot served (``browser``) and its replacement by newer ones (see the module
    docstring). ``building`` is True while a newer snapshot is being built; ``failed`` the last
    rebuild's error (None once one succeeds)."""

    def __init__(
        self,
        browser: Browser,
        interval: float = 5.0,
        remote_every: float = 60.0,
        settle: float = 30.0,
        child: bool = True,
    ):
        self.browser, self.interval, self.remote_every, self.child = (
            browser,
            interval,
            remote_every,
            child,
        )
        self.settle = settle
        self.building = False
        self.failed: str | None = None
        self._pulled = time.monotonic()
        self._next = 0.0  # monotonic time before which no rebuild starts (``settle``)
        self._seen = self._signature(pull=False)

    def _folders(self) -> list[Path]:
        source = self.browser.source
        folders = [Path(self.browser.cache_dir)]
        if source is not None and source.remote is not None:
            folders.append(source.remote.mirror)
        return folders

    def _signature(self, pull: bool = True) -> tuple:
        source = self.browser.source
        if (
            pull
            and source is not None
            and source.remote is not None
            and time.monotonic() - self._pulled >= self.remote_every
        ):
            self._pulled = time.monotonic()
            try:
                source.remote.pull()
            except (
                OSError
            ) as exc:  # the remote unreachable for a while: what is mirrored is still served
                log.warning("dxi view: remote cache: %s", exc)
        return signature(*self._folders())

    async def check(self) -> bool:
        """Look once; build and swap in a newer snapshot if the cache changed. True when it
        swapped."""
        if self.building or self.browser.source is None or time.monotonic() < self._next:
            return False
        seen = await asyncio.to_thread(self._signature)
        if seen == self._seen:
            return False
        self.building = True
        started = time.monotonic()
        try:
            new = await asyncio.to_thread(self.browser.rebuild, self.child)
        except Exception as exc:  # noqa: BLE001 (any failure: keep serving the old snapshot, say why)
            self.failed = f"{type(exc).__name__}: {exc}"
            log.warning(
                "dxi view: rescoring failed, still showing the cache as of before: %s", self.failed
            )
            self._seen = seen  # tried on this state; a further change tries again
            return False
        finally:
            self.building = False
            self._next = time.monotonic() + max(self.settle, 2 * (time.monotonic() - started))
        old, self.browser, self._seen, self.failed = self.browser, new, seen, None
        old.workdir.cleanup()  # its snapshot only: the private folder is the new one's too
        return True

    async def watch(self) -> None:
        """``check`` every ``interval`` seconds, until cancelled."""
        while True:
            await asyncio.sleep(self.interval)
            await self.check()

    def close(self) -> None:
        self.browser.close()
