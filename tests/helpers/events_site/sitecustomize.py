"""Loaded by Python at start-up in a process whose PYTHONPATH starts with this folder
(``tests.helpers.events.env``): the events of dxi a test watches (see ``tests/helpers/events.py``).

Nothing of dxi is imported here (start-up stays as it is): each watched module is wrapped as it is
imported, through a finder on ``sys.meta_path``. Without ``DXI_TEST_EVENTS`` this does nothing."""

from __future__ import annotations

import functools
import os
import signal
import sys
from collections import Counter

LOG = os.environ.get("DXI_TEST_EVENTS")
KILL_AT = os.environ.get("DXI_TEST_KILL_AT")
_counts: Counter[str] = Counter()


def event(name: str, *data: object) -> None:
    """Append ``[name, n, pid, *data]`` to the log (one write: lines of processes sharing it stay
    whole); kill this process if it is the point ``DXI_TEST_KILL_AT`` names."""
    import json

    _counts[name] += 1
    n = _counts[name]
    line = json.dumps([name, n, os.getpid(), *data]) + "\n"
    fd = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
    point, _, how = (KILL_AT or "").partition("/")  # "<event>:<n>[/INT]": SIGINT instead
    if point == f"{name}:{n}":
        os.kill(os.getpid(), signal.SIGINT if how == "INT" else signal.SIGKILL)


def _layout(module) -> None:
    write_shard = module.write_shard

    @functools.wraps(write_shard)
    def watched(*args, **kwargs):
        result = write_shard(*args, **kwargs)
        event("compaction")
        return result

    module.write_shard = watched


def _shared_limits(module) -> None:
    cls = module.SharedLimiter
    slot = cls._slot

    @functools.wraps(slot)
    async def watched(self, cost):
        wait, booked_at, rate, member = await slot(self, cost)
        event("booking", booked_at, booked_at + wait)
        return wait, booked_at, rate, member

    cls._slot = watched


def _limits(module) -> None:
    reserve = module.Pacer.reserve

    @functools.wraps(reserve)
    def watched(self, cost=1.0):
        wait = reserve(self, cost)
        event("pacing", self.rate, cost, self._next - cost / self.rate)
        return wait

    module.Pacer.reserve = watched


def _store(module) -> None:
    cls = module.Cache
    append_many = cls.append_many

    @functools.wraps(append_many)
    def watched(self, rows, *args, **kwargs):
        result = append_many(self, rows, *args, **kwargs)
        event("append", len(rows))
        return result

    cls.append_many = watched


def _staging(module) -> None:
    clear = module._clear

    @functools.wraps(clear)
    def watched(*args, **kwargs):
        moved = clear(*args, **kwargs)
        event("committing", moved)
        return moved

    module._clear = watched
    mark = module._mark

    @functools.wraps(mark)
    def marked(folder):
        mark(folder)
        event("marked")

    module._mark = marked


def _cli(module) -> None:
    main = module.main

    @functools.wraps(main)
    def watched(*args, **kwargs):
        code = main(*args, **kwargs)
        event("returned", code)
        return code

    module.main = watched


WATCH = {
    "cli": _cli,
    "layout": _layout,
    "limits": _limits,
    "shared_limits": _shared_limits,
    "staging": _staging,
    "store": _store,
}  # by the module's last name (dxi.cache.layout, ...)


class _Finder:
    """Finds a watched module as the other finders do, and wraps it once it has run."""

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        hook = WATCH.get(name.rpartition(".")[2]) if name.startswith("dxi.") else None
        if hook is None:
            return None
        for finder in sys.meta_path:
            if finder is cls or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            hook(module)

        spec.loader.exec_module = exec_module
        return spec


if LOG:
    sys.meta_path.insert(0, _Finder)
