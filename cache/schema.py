"""The cache row: one per request outcome (a reply, or a final failure). Parquet columns only, no
pickle.

Row status: ``ok`` (every answer valid), ``invalid`` (a reply arrived; at least one answer invalid,
see ``answers[].error``), ``failed`` (no usable reply: ``error_kind`` is ``transient`` after the
retry budget, or ``fatal`` for a deterministic 4xx-class failure). ``created_at`` is Unix time in
seconds; where a key has several rows the newest final row wins (``cache.index.newest``: ranked
first). Columns are only ever added (nullable), so shards written by an older version read with
nulls in the new columns.

The Arrow types (``SCHEMA``, ``ANSWER``, ``PROBABILITY``) and ``COLUMNS`` are built when first used
(``__getattr__``): PyArrow and NumPy, which it imports, are ~50 ms of a first run's start-up that
the run does without until its first log is compacted (issue 14).
"""

from __future__ import annotations

from functools import cache

OK, INVALID, FAILED = "ok", "invalid", "failed"
TRANSIENT, FATAL = "transient", "fatal"
# what the key index reads of a row (``cache.index.index_columns``): its key and class, and the
# columns that tell a reply another model gave (``dxi.served.served_by_other``)
INDEX_COLUMNS = ["key", "status", "error_kind", "created_at", "provider", "model", "served_model"]


@cache
def _arrow() -> dict[str, object]:
    """The Arrow types of the cache row, built once."""
    import pyarrow as pa

    PROBABILITY = pa.struct([("option", pa.string()), ("p", pa.float64())])
    ANSWER = pa.struct(
        [
            ("question_id", pa.string()),
            ("status", pa.string()),
            ("predicted", pa.string()),
            ("p_predicted", pa.float64()),
            ("p_yes", pa.float64()),
            ("probabilities", pa.list_(PROBABILITY)),
            ("error", pa.string()),
            ("warning", pa.string()),
        ]
    )

    SCHEMA = pa.schema(
        [
            ("key", pa.string()),  # sha256 hex of the canonical request (adapters.base.Request.key)
            (
                "provider",
                pa.string(),
            ),  # adapter kind, ``Request.kind`` (the column's name since the first shards)
            ("model", pa.string()),
            ("endpoint", pa.string()),
            ("params", pa.string()),  # canonical JSON of sampling parameters
            ("sample", pa.int32()),  # epoch index
            ("prompt_version", pa.string()),
            ("eval", pa.string()),
            ("task_id", pa.string()),
            ("task_digest", pa.string()),  # evals.Task.digest
            ("request_body", pa.string()),  # the exact bytes sent (UTF-8 JSON)
            ("status", pa.string()),  # ok | invalid | failed
            ("error", pa.string()),
            ("error_kind", pa.string()),  # transient | fatal (failed rows only)
            ("http_status", pa.int32()),
            ("attempts", pa.int32()),
            ("raw_reply", pa.string()),
            ("served_model", pa.string()),
            ("input_tokens", pa.int64()),
            ("output_tokens", pa.int64()),
            ("latency_ms", pa.float64()),  # of the final attempt
            ("created_at", pa.float64()),  # Unix seconds
            ("answers", pa.list_(ANSWER)),
            (
                "repaired",
                pa.bool_(),
            ),  # a language model's JSON arrived in one Markdown code fence (SPEC §6);
            # null for rows written before this column and for failures
            (
                "cached_input_tokens",
                pa.int64(),
            ),  # of input_tokens, those read from the provider's prompt cache
            (
                "cache_write_tokens",
                pa.int64(),
            ),  # of input_tokens, those written to it (Anthropic: its 5-minute cache)
            (
                "cache_write_1h_tokens",
                pa.int64(),
            ),  # of input_tokens, those written to Anthropic's 1-hour cache
            (
                "cut_off",
                pa.string(),
            ),  # a reply cut off at the token limit: "thinking" (before any answer) or
            # "answer"; null otherwise, for failures and for rows written before it
            (
                "transport",
                pa.string(),
            ),  # what brought the outcome: "sync" (a call of its own) or "batch" (a provider
            # batch, docs/batch.md); null for rows written before this column (sync)
            ("batch_id", pa.string()),  # the provider's batch id of a batch row
            (
                "retry_waits_s",
                pa.list_(pa.float64()),
            ),  # seconds waited before each retry, from the end of the attempt
            # before it (attempts - 1 values; null in rows written before it)
            ("ttft_s", pa.float64()),  # a streamed reply's time to first token, seconds from
            # sending (its total time: latency_ms); null when not
            # streamed, and in rows written before it
        ]
    )
    return {
        "PROBABILITY": PROBABILITY,
        "ANSWER": ANSWER,
        "SCHEMA": SCHEMA,
        "COLUMNS": tuple(SCHEMA.names),
    }


def __getattr__(name: str) -> object:
    if name in ("PROBABILITY", "ANSWER", "SCHEMA", "COLUMNS"):
        return _arrow()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
