"""Anthropic's Message Batches for the ``anthropic`` adapter's Messages requests. Types: the
anthropic SDK's ``types/messages/message_batch*.py`` and ``batch_create_params.py``; resource
``resources/messages/batches.py``.

* **Create**: ``POST {base}/v1/messages/batches`` ``{"requests": [{"custom_id": KEY, "params":
  BODY}]}`` (BODY byte for byte the synchronous body): at most 100,000 requests or 256 MB, whichever
  comes first; ``custom_id`` 1-64 characters of ``[A-Za-z0-9_-]`` (the cache key is 64 hex digits).
* **No tag**: a Message Batch carries nothing of the client's (no metadata, no name). A kill between
  the provider's reply to the create and the ledger's record of it leaves a batch only the provider
  knows. So before each create, the newest batch of the listing (``GET {base}/v1/messages/batches
  ?limit=1``: "most recently created batches are returned first",
  platform.claude.com/docs/en/api/listing-message-batches) is recorded with the entry's intent: its
  id and its ``created_at``, the provider's own clock (``reference``). A rerun looks for the batch
  (``find``) among those listed before that one (created after it, by the provider's clock: this
  machine's clock plays no part) with the entry's number of requests that no other ledger entry
  knows, and adopts every one that matches (results are matched by custom id, so a batch that was
  another client's stores nothing). Reading the listing back to the reference without a match is
  proof that the create made no batch; only then is the entry abandoned as never created. An entry
  recorded without a reference (by an earlier version, or when the listing could not be read) is
  looked for within ``WIDE_S`` of the intent by this machine's clock, said as such (docs/batch.md,
  "the window").
* **Status**: ``processing_status`` ``in_progress``, ``canceling``, ``ended`` (within 24 hours:
  requests not processed by then are ``expired``); ``request_counts``: processing, succeeded,
  errored, canceled, expired.
* **Results**: ``GET results_url`` (JSONL, in no set order): ``{"custom_id", "result": {"type":
  "succeeded", "message"} | {"type": "errored", "error": ErrorResponse} | {"type": "canceled"} |
  {"type": "expired"}}``; available for 29 days after creation.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import orjson

from .batches import (
    CANCELLED,
    COMPLETED,
    EXPIRED,
    WIDE_S,
    BatchAPI,
    BatchLimits,
    BatchLost,
    BatchStatus,
    NoBatchAPI,
    ResultLine,
    chunks,
    iso_time,
)
from .errors import MalformedReply
from .http import error_for, same_origin

# an errored result's error type -> the HTTP status the synchronous API answers it with
# (platform.claude.com /docs/en/api/errors), so that it is classified as the synchronous reply would
# be
STATUS_OF = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "billing_error": 402,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "timeout_error": 504,
    "overloaded_error": 529,
}


def status_of(doc: dict) -> BatchStatus:
    """A ``MessageBatch`` (anthropic ``types/messages/message_batch.py``) as a BatchStatus."""
    counts = doc.get("request_counts") if isinstance(doc.get("request_counts"), dict) else {}
    state = str(doc.get("processing_status") or "")
    outcome = None
    if state == "ended":
        outcome = (
            CANCELLED
            if doc.get("cancel_initiated_at")
            else EXPIRED
            if counts.get("expired")
            else COMPLETED
        )
    output = {"results_url": doc["results_url"]} if doc.get("results_url") else {}
    total = sum(v for v in counts.values() if isinstance(v, int)) if counts else None
    return BatchStatus(
        str(doc.get("id")),
        state,
        outcome,
        dict(counts),
        output,
        None,
        iso_time(doc.get("created_at")),
        total,
    )


class AnthropicBatch(BatchAPI):
    """Message Batches under the adapter's base URL."""

    LIMITS = BatchLimits(100_000, 256_000_000)
    taggable = False
    name = "anthropic"
    RETENTION = "Anthropic keeps a batch's results 29 days after its creation"

    @property
    def url(self) -> str:
        return f"{self.adapter.base_url}/v1/messages/batches"

    def head(self, key: str) -> bytes:
        return b'{"custom_id":"' + key.encode() + b'","params":'

    async def create(
        self, entry_id: str, path: Path, file_id: str | None, n: int, size: int
    ) -> BatchStatus:
        body = chunks(path, b'{"requests":[', b",", b"]}")
        try:
            return status_of(await self.call("POST", self.url, body))
        except BatchLost:
            raise NoBatchAPI(
                f"{self.what}: {self.adapter.base_url} has no batch API (POST "
                "/v1/messages/batches answered 404: a server without Message Batches); "
                "batch mode stopped for this model",
                404,
            ) from None

    async def get(self, batch_id: str) -> BatchStatus:
        return status_of(await self.call("GET", f"{self.url}/{batch_id}"))

    async def reference(self) -> dict | None:
        """The newest batch listed now: ``{"newest": its id, "created_at": its RFC 3339 creation
        time (the provider's clock)}``, or ``{"empty": True}`` when there is none (every batch
        listed later is newer than a create made now)."""
        page = await self.call("GET", f"{self.url}?limit=1")
        data = [d for d in page.get("data") or [] if isinstance(d, dict)]
        if not data:
            return {"empty": True}
        return {"newest": str(data[0].get("id")), "created_at": data[0].get("created_at")}

    async def find(
        self, entry_id: str, since: float, n: int, known: set[str], ref: dict | None = None
    ) -> list[BatchStatus]:
        found = []
        self.listed, self.listed_all = 0, False
        newest = ref.get("newest") if ref else None
        # the oldest a candidate may be: the reference's creation (the provider's clock), or,
        # without a reference, WIDE_S before the intent by this machine's clock
        floor = iso_time(ref.get("created_at")) if ref else since - WIDE_S
        async for items, last in self.pages(f"{self.url}?limit=100", "data"):
            for status in map(status_of, items):
                # newest first (documented): from the reference on, every batch listed is older
                # than the create
                older = floor is not None and (status.created or 0) < floor
                if status.batch_id == newest or older:
                    self.listed_all = ref is not None
                    return found
                self.listed += 1
                if status.total == n and status.batch_id not in known:
                    found.append(status)
            self.listed_all = last
        return found

    def next_page(self, page: dict, items: list[dict]) -> str | None:
        if not page.get("has_more"):
            return None
        return f"after_id={page.get('last_id') or items[-1].get('id')}"

    async def cancel(self, batch_id: str) -> BatchStatus:
        return status_of(await self.call("POST", f"{self.url}/{batch_id}/cancel", {}))

    async def results(self, status: BatchStatus) -> AsyncIterator[list[ResultLine]]:
        url = status.output.get("results_url")
        if not url:
            return
        if url.startswith("/"):
            url = self.adapter.base_url + url
        if not same_origin(url, self.adapter.base_url):  # the key is sent to the base URL alone
            url = f"{self.url}/{status.batch_id}/results"  # the documented address there
        async for lines in self.lines(url):
            yield [self.result(raw) for raw in lines]

    def result(self, raw: bytes) -> ResultLine:
        """One line of the results file (see the module docstring)."""
        try:
            doc = orjson.loads(raw)
            key, result = doc["custom_id"], doc["result"]
            kind = result["type"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            return ResultLine(
                "",
                error=MalformedReply(
                    "a result line that is not a MessageBatchIndividualResponse",
                    raw[:2000].decode("utf-8", "replace"),
                ),
            )
        if kind == "succeeded":
            return ResultLine(key, orjson.dumps(result.get("message")), doc=result.get("message"))
        if kind == "errored":
            error = result.get("error") if isinstance(result.get("error"), dict) else {}
            inner = error.get("error") if isinstance(error.get("error"), dict) else {}
            return ResultLine(
                key,
                error=error_for(
                    STATUS_OF.get(str(inner.get("type")), 500), orjson.dumps(error), {}, self.what
                ),
            )
        return ResultLine(key)  # canceled, expired: not run, given back
