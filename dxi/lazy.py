"""A module imported when it is first used, for modules on `dxi run`'s path to its first request
that need a heavy library only later (the cache needs Polars to read shards and logs, not to open an
empty cache).

It is how a module declares, at its top, the imports it defers for start-up time (instead of imports
inside functions, which hide a module's dependencies): ``pl = LazyModule("polars")`` or ``_files =
LazyModule("dxi.runner.outputs.files")`` beside the other imports, then ``pl.col(...)`` or
``_files.score(...)`` where it is used (``runner.session``, ``runner.rescore``,
``runner.open_batches``, ``runner.dispatch``, ``runner.cli``, ``runner.signals``). ``dxi.layers``
counts such a declaration as an import. An attribute, once read, is kept: a test that replaces it
later (``monkeypatch.setattr`` on the module) is not seen through a LazyModule that has already read
it."""

from __future__ import annotations

import importlib
from types import ModuleType


class LazyModule:
    """Stands for module ``name`` (``pl = LazyModule("polars")``): the module is imported when an
    attribute is first read, and every attribute read is the module's own. Use it only for attribute
    access (``pl.col``), never where the module object itself is needed."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str) -> object:
        module: ModuleType = importlib.import_module(self._name)
        value = getattr(module, attr)
        setattr(self, attr, value)  # kept: later reads of it are plain attribute reads
        return value

    def __repr__(self) -> str:
        return f"<lazy module {self._name!r}>"
