"""The content-addressed Parquet cache: ``Cache(dir)`` with ``has(key)``, ``append(row)``, ``scan()``."""
from .schema import COLUMNS, FAILED, FATAL, INVALID, OK, SCHEMA, TRANSIENT
from .store import Cache, CacheWriteError

__all__ = ["COLUMNS", "FAILED", "FATAL", "INVALID", "OK", "SCHEMA", "TRANSIENT", "Cache", "CacheWriteError"]
