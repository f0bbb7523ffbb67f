"""The content-addressed Parquet cache: ``Cache(dir)`` with ``has(key)``, ``append(row)``,
``scan()``."""

from . import schema
from .schema import FAILED, FATAL, INVALID, OK, TRANSIENT
from .store import Cache, CacheWriteError

__all__ = [
    "COLUMNS",
    "FAILED",
    "FATAL",
    "INVALID",
    "OK",
    "SCHEMA",
    "TRANSIENT",
    "Cache",
    "CacheWriteError",
]


def __getattr__(name: str) -> object:
    """``SCHEMA`` and ``COLUMNS``, built when first used (``cache.schema``)."""
    if name in ("SCHEMA", "COLUMNS"):
        return getattr(schema, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
