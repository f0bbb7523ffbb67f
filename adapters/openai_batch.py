"""OpenAI's Batch API for the ``openai`` adapter's Chat Completions requests, and any server
implementing OpenAI's Files and Batches endpoints (Azure OpenAI's v1 API, the OpenAI-compatible
hosts that document ``/v1/batches``). Types: the openai SDK's ``types/batch*.py``,
``file_object.py``; resources ``batches.py``, ``files.py``.

* **Input**: a JSONL file, one line per request ``{"custom_id": KEY, "method": "POST", "url":
  "/v1/chat/completions", "body": BODY}`` (BODY byte for byte the synchronous body), uploaded to
  ``POST {base}/files`` (multipart, ``purpose=batch``). At most 50,000 requests and 200 MB per file
  (``BatchCreateParams.input_file_id``).
* **Create**: ``POST {base}/batches`` ``{"input_file_id", "endpoint": "/v1/chat/completions",
  "completion_window": "24h", "metadata": {"dxi_entry": ENTRY}}``: the metadata tag (16 pairs,
  values up to 512 characters) finds the batch again by listing (``GET {base}/batches``) when a kill
  came between the provider's reply and the ledger's record of it. The listing's order is not relied
  on: every page is read (up to ``MAX_PAGES`` of 100).
* **No batch API**: a host that answers 404 to ``POST {base}/files`` or ``POST {base}/batches``
  implements the synchronous endpoint only: ``NoBatchAPI`` (batch mode stops for the model).
* **Input files** are named ``{ENTRY}.jsonl`` (``purpose=batch``): one uploaded for an entry that
  never became a batch (a kill between the upload and the create) is found by that name (``GET
  {base}/files``) and deleted (``DELETE {base}/files/{id}``). Once a batch's results are collected
  (or it ended without any), its input, output and error files are deleted (``files_of``): OpenAI
  keeps a file until it is deleted, counted against the organisation's storage.
* **Status** ``validating``, ``in_progress``, ``finalizing``, ``cancelling``; it ends ``completed``,
  ``expired`` (after the 24-hour window; what was done is in the output file), ``cancelled`` or
  ``failed`` (the input was refused whole: ``errors``).
* **Results**: ``GET {base}/files/{output_file_id}/content`` then the ``error_file_id``'s: lines
  ``{"id", "custom_id", "response": {"status_code", "request_id", "body"} | null, "error": {"code",
  "message"} | null}``, in no set order. A request not run before the batch expired or was cancelled
  has the error code ``batch_expired`` / ``batch_cancelled``: given back.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import orjson

from .batches import (
    CANCELLED,
    COMPLETED,
    EXPIRED,
    FAILED,
    BatchAPI,
    BatchLimits,
    BatchLost,
    BatchStatus,
    NoBatchAPI,
    ResultLine,
)
from .errors import MalformedReply, Transient
from .http import error_for

ENDPOINT = "/v1/chat/completions"
TAG = "dxi_entry"
ENDED = {"completed": COMPLETED, "expired": EXPIRED, "cancelled": CANCELLED, "failed": FAILED}
NOT_RUN = frozenset({"batch_expired", "batch_cancelled"})


def status_of(doc: dict) -> BatchStatus:
    """A ``Batch`` object (openai ``types/batch.py``) as a BatchStatus."""
    counts = doc.get("request_counts") if isinstance(doc.get("request_counts"), dict) else {}
    metadata = doc.get("metadata") if isinstance(doc.get("metadata"), dict) else {}
    output = {k: doc[k] for k in ("output_file_id", "error_file_id") if doc.get(k)}
    if doc.get("errors"):
        output["errors"] = doc["errors"]
    state = str(doc.get("status") or "")
    return BatchStatus(
        str(doc.get("id")),
        state,
        ENDED.get(state),
        dict(counts),
        output,
        metadata.get(TAG),
        doc.get("created_at"),
        counts.get("total"),
    )


class OpenAIBatch(BatchAPI):
    """The Files and Batches endpoints under the adapter's base URL."""

    LIMITS = BatchLimits(50_000, 200_000_000)
    name = "openai"
    RETENTION = "OpenAI keeps a batch's output file 30 days"

    def head(self, key: str) -> bytes:
        return (
            b'{"custom_id":"'
            + key.encode()
            + b'","method":"POST","url":"'
            + ENDPOINT.encode()
            + b'","body":'
        )

    async def upload(self, entry_id: str, path: Path, n: int, size: int) -> str | None:
        with open(path, "rb") as f:
            form = aiohttp.FormData()
            form.add_field("purpose", "batch")
            form.add_field(
                "file", f, filename=f"{entry_id}.jsonl", content_type="application/jsonl"
            )
            try:
                doc = await self.call(
                    "POST",
                    f"{self.adapter.base_url}/files",
                    form,
                    self.headers(**{"Content-Type": ""}),
                )
            except BatchLost:
                raise self._no_api("POST /files") from None
        if not isinstance(doc.get("id"), str):
            raise Transient(f"{self.what}: the upload's reply has no file id")
        return doc["id"]

    async def create(
        self, entry_id: str, path: Path, file_id: str | None, n: int, size: int
    ) -> BatchStatus:
        try:
            doc = await self.call(
                "POST",
                f"{self.adapter.base_url}/batches",
                {
                    "input_file_id": file_id,
                    "endpoint": ENDPOINT,
                    "completion_window": "24h",
                    "metadata": {TAG: entry_id},
                },
            )
        except BatchLost:
            raise self._no_api("POST /batches") from None
        return status_of(doc)

    def _no_api(self, where: str) -> NoBatchAPI:
        return NoBatchAPI(
            f"{self.what}: {self.adapter.base_url} has no batch API ({where} answered "
            "404: a server without OpenAI's Files and Batches endpoints); batch mode "
            "stopped for this model",
            404,
        )

    async def get(self, batch_id: str) -> BatchStatus:
        return status_of(await self.call("GET", f"{self.adapter.base_url}/batches/{batch_id}"))

    def next_page(self, page: dict, items: list[dict]) -> str | None:
        return f"after={items[-1].get('id')}" if page.get("has_more") else None

    async def find(
        self, entry_id: str, since: float, n: int, known: set[str], ref: dict | None = None
    ) -> list[BatchStatus]:
        found = []
        self.listed, self.listed_all = 0, False
        # every page: the listing's order is not documented
        async for data, last in self.pages(f"{self.adapter.base_url}/batches?limit=100", "data"):
            self.listed += len(data)
            found += [s for s in map(status_of, data) if s.tag == entry_id]
            self.listed_all = last
        return found

    FILES = ("/files?purpose=batch&limit=1000", "data")

    def input_of(self, item: dict, entry_id: str) -> str | None:
        named = item.get("filename") == f"{entry_id}.jsonl" and item.get("purpose") == "batch"
        return item["id"] if named and isinstance(item.get("id"), str) else None

    def file_url(self, file_id: str) -> str:
        return f"{self.adapter.base_url}/files/{file_id}"

    def files_of(self, file_id: str | None, output: dict) -> list[str]:
        return [
            f
            for f in (file_id, output.get("output_file_id"), output.get("error_file_id"))
            if isinstance(f, str)
        ]

    async def cancel(self, batch_id: str) -> BatchStatus:
        return status_of(
            await self.call("POST", f"{self.adapter.base_url}/batches/{batch_id}/cancel", {})
        )

    async def results(self, status: BatchStatus) -> AsyncIterator[list[ResultLine]]:
        for name in ("output_file_id", "error_file_id"):
            file_id = status.output.get(name)
            if not file_id:
                continue
            async for lines in self.lines(f"{self.adapter.base_url}/files/{file_id}/content"):
                yield [self.checked(raw, self.result(raw)) for raw in lines]

    def result(self, raw: bytes) -> ResultLine:
        """One line of an output or error file (see the module docstring)."""
        try:
            doc = orjson.loads(raw)
            key = doc["custom_id"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            return ResultLine(
                "",
                error=MalformedReply(
                    "a result line that is not a batch output line",
                    raw[:2000].decode("utf-8", "replace"),
                ),
            )
        response, error = doc.get("response"), doc.get("error")
        if isinstance(response, dict) and isinstance(response.get("status_code"), int):
            body = orjson.dumps(response.get("body"))
            if response["status_code"] < 300:
                return ResultLine(key, body, doc=response.get("body"))
            return ResultLine(key, error=error_for(response["status_code"], body, {}, self.what))
        if isinstance(error, dict) and error.get("code") in NOT_RUN:
            return ResultLine(key)
        message = error.get("message") if isinstance(error, dict) else None
        return ResultLine(
            key,
            error=Transient(
                f"{self.what}: the batch could not run this request "
                f"({(error or {}).get('code') if isinstance(error, dict) else None}: {message})"
            ),
        )
