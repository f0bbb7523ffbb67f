"""Shared by the tests of what scoring selects (test_selection, test_selection_differs): a second
keyless model, the flags that point a command at a test's folders, and reading its summary.json."""

from __future__ import annotations

from pathlib import Path

import orjson

ROBOT = "embedded:sparrow-nano-robot-v1.2"  # a second model that needs no server


def where(data: Path, tmp: Path, out: str) -> list[str]:
    """``--data-dir``, ``--cache-dir`` (tmp/cache), ``--out`` (tmp/out) and ``-q``."""
    return [
        "--data-dir",
        str(data),
        "--cache-dir",
        str(tmp / "cache"),
        "--out",
        str(tmp / out),
        "-q",
    ]


def summary(tmp: Path, out: str) -> dict:
    """tmp/out/summary.json, read."""
    return orjson.loads((tmp / out / "summary.json").read_bytes())
