"""Turning an Outcome into the cache row that records it (``cache.schema.SCHEMA``); the keys of a
model's rows in the cache (``keys_of``)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from dxi.adapters import Fatal, MalformedReply, Request
from dxi.cache import FAILED, FATAL, TRANSIENT
from dxi.evals import Task

from .retry import Outcome

if TYPE_CHECKING:
    from dxi.cache import Cache
    from dxi.evals import Suite

    from ..planning.plan import ModelRun


def make_row(
    task: Task,
    request: Request,
    outcome: Outcome,
    transport: str = "sync",
    batch_id: str | None = None,
) -> dict:
    """The row for one request's final outcome: ok / invalid with the parsed answers, or failed with
    the error and whether it is ``transient`` (requested again next run) or ``fatal`` (kept).
    ``transport`` says what brought it ("sync": a call of its own; "batch": a provider batch,
    ``batch_id``)."""
    row = {
        "key": request.key,
        "provider": request.kind,
        "model": request.model,
        "endpoint": request.endpoint,
        "params": request.params,
        "sample": request.sample,
        "prompt_version": request.prompt_version,
        "eval": task.eval,
        "task_id": task.id,
        "task_digest": task.digest,
        "request_body": request.body.decode("utf-8"),
        "attempts": outcome.attempts,
        "retry_waits_s": [round(w, 3) for w in outcome.waits_s],
        "latency_ms": outcome.latency_ms,
        "created_at": time.time(),
        "ttft_s": None if outcome.ttft_s is None else round(outcome.ttft_s, 6),
        "raw_reply": outcome.body.decode("utf-8", "replace") if outcome.body is not None else None,
        "status": None,
        "error": None,
        "error_kind": None,
        "http_status": None,
        "served_model": None,
        "input_tokens": None,
        "output_tokens": None,
        "answers": None,
        "repaired": None,
        "cached_input_tokens": None,
        "cache_write_tokens": None,
        "cache_write_1h_tokens": None,
        "cut_off": None,
        "transport": transport,
        "batch_id": batch_id,
    }
    reply, error = outcome.reply, outcome.error
    if reply is not None:
        row |= {
            "status": reply.status,
            "error": reply.error,
            "served_model": reply.served_model,
            "input_tokens": reply.input_tokens,
            "output_tokens": reply.output_tokens,
            "answers": [a.as_row() for a in reply.answers],
            "repaired": reply.repaired,
            "cached_input_tokens": reply.cached_input_tokens,
            "cache_write_tokens": reply.cache_write_tokens,
            "cache_write_1h_tokens": reply.cache_write_1h_tokens,
            "cut_off": reply.cut_off,
        }
    else:
        assert error is not None
        row |= {
            "status": FAILED,
            "error": str(error),
            "http_status": error.status,
            "error_kind": FATAL if isinstance(error, Fatal) else TRANSIENT,
        }
        if isinstance(error, MalformedReply) and row["raw_reply"] is None:
            row["raw_reply"] = error.raw
    return row


def keys_of(cache: Cache, run: ModelRun, suite: Suite) -> list[str]:
    """The keys of the cache's rows of ``run``'s model, each once: the rows of its configuration
    (adapter, model, endpoint, parameters and prompt version, as its first request carries them),
    among which is every request of the model the cache has a row of, since a key covers them."""
    import polars as pl

    first = next(run.requests(suite), None)
    if first is None:
        return []
    r = first[2]
    return (
        cache.scan()
        .filter(
            (pl.col("provider") == r.kind)
            & (pl.col("model") == r.model)
            & (pl.col("endpoint") == r.endpoint)
            & (pl.col("params") == r.params)
            & (pl.col("prompt_version") == r.prompt_version)
        )
        .select("key")
        .unique()
        .collect()["key"]
        .to_list()
    )
