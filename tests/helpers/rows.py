"""Cache rows written by hand (``row``), a row's log line as the cache writes it (``sealed``) and a
read-only file system for the cache (``read_only_files``)."""

from __future__ import annotations

import os

import orjson
import pytest


def row(
    key: str, status: str = "ok", error_kind: str | None = None, created_at: float = 1.0, **extra
) -> dict:
    """A cache row of request ``key`` (a When2Call task answered "A" at 0.9 unless ``status`` is
    "failed"), ``created_at`` in Unix seconds; ``extra`` replaces any field."""
    base = {
        "key": key,
        "provider": "embedded",
        "model": "m",
        "endpoint": "/v1/systemone",
        "params": "{}",
        "sample": 0,
        "prompt_version": "p",
        "eval": "when2call",
        "task_id": f"when2call/{key}",
        "task_digest": "d",
        "request_body": "{}",
        "status": status,
        "error": None,
        "error_kind": error_kind,
        "http_status": None,
        "attempts": 1,
        "raw_reply": None,
        "served_model": None,
        "input_tokens": None,
        "output_tokens": None,
        "latency_ms": 1.0,
        "created_at": created_at,
        "answers": [
            {
                "question_id": "answer",
                "status": "ok",
                "predicted": "A",
                "p_predicted": 0.9,
                "p_yes": None,
                "probabilities": [{"option": "A", "p": 0.9}, {"option": "B", "p": 0.1}],
                "error": None,
                "warning": None,
            }
        ]
        if status != "failed"
        else None,
    }
    return base | extra


def sealed(record: object) -> bytes:
    """``record``'s log line as the cache writes it (``cache.verify.seal``: its CRC-32 last),
    without the newline: a hand-made key is accepted in a sealed line."""
    from dxi.cache import verify

    return verify.seal(orjson.dumps(record))[:-1]


def read_only_files(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cache's ``os.open`` as on a read-only file system: creating a file fails with EROFS."""
    from dxi.cache import store

    real_open = os.open

    def read_only(path, flags, *args):
        if flags & os.O_CREAT:
            raise OSError(30, "Read-only file system")
        return real_open(path, flags, *args)

    monkeypatch.setattr(store.os, "open", read_only)
