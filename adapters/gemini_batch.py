"""The Gemini Batch API for the ``gemini`` adapter's generateContent requests. Types: google-genai's
``batches.py`` (its ``_mldev`` converters give the REST shapes) and ``types.py`` (``BatchJob``,
``InlinedRequest``, ``InlinedResponse``, ``JobState``, ``File``); ai.google.dev/api/batch-mode.

* **Create**: ``POST {base}/v1beta/models/{model}:batchGenerateContent`` ``{"batch": {"displayName":
  ENTRY, "inputConfig": {"fileName": "files/..."}}}``: a JSONL file of ``{"key": KEY, "request":
  BODY}`` lines uploaded through the Files API (resumable upload, ``POST
  {base}/upload/v1beta/files``, ``displayName`` ENTRY). BODY is byte for byte the synchronous body.
  The reply is an Operation whose ``metadata`` is the batch (``GenerateContentBatch``). **Always a
  file**: the inline form (``{"requests": {"requests": [{"request": BODY, "metadata": {"key":
  KEY}}]}}``, under 20 MB) is documented to return each request's ``metadata`` with its response, in
  input order, but the backend has been reported to do neither (python-genai #2008: no metadata;
  #1909: out of order past ~10,000 requests), leaving nothing to match a response to its request by.
  The file's result lines carry the ``key``. The inline form stays available
  (``BatchLimits.inline_bytes``) and inline results are read (batches of earlier versions): a
  response without its ``metadata.key`` is matched to nothing (never by position).
* **Tag**: ``displayName`` is the ledger entry's id; ``GET {base}/v1beta/batches`` lists batches.
  Its order is not documented: ``find`` reads every page (up to ``MAX_PAGES`` of 100).
* **Input files** that never became a batch (a kill between the upload and the create) are found by
  their ``displayName`` (``GET {base}/v1beta/files``) and deleted (``DELETE
  {base}/v1beta/files/...``). Once a batch's results are collected (or it ended without any), its
  input file and responses file are deleted (``files_of``) rather than left to the 48-hour expiry,
  counted against the project's 20 GB of files until then.
* **Status**: ``BATCH_STATE_PENDING``, ``_RUNNING``; it ends ``_SUCCEEDED``, ``_FAILED``,
  ``_CANCELLED`` or ``_EXPIRED`` (batches pending or running for 48 hours expire). ``batchStats``:
  request counts.
* **Results**: in the batch's ``output``: ``inlinedResponses.inlinedResponses[]`` (``{"response"} |
  {"error"}``, with the request's ``metadata``) or ``responsesFile``, downloaded from ``GET
  {base}/download/v1beta/{file}:download?alt=media``: JSONL lines ``{"key", "response"} | {"key",
  "error"}``, matched by key. Files are kept 48 hours (a 404 after that: ``BatchLost``). An error is
  a ``google.rpc.Status`` (a gRPC code), classified as the HTTP status the synchronous API answers
  it with.
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
    chunks,
    iso_time,
)
from .errors import MalformedReply, Transient
from .http import error_for, redact, redirected, same_origin, transport_failure

ENDED = {
    "BATCH_STATE_SUCCEEDED": COMPLETED,
    "BATCH_STATE_FAILED": FAILED,
    "BATCH_STATE_CANCELLED": CANCELLED,
    "BATCH_STATE_EXPIRED": EXPIRED,
    "JOB_STATE_SUCCEEDED": COMPLETED,
    "JOB_STATE_FAILED": FAILED,
    "JOB_STATE_CANCELLED": CANCELLED,
    "JOB_STATE_EXPIRED": EXPIRED,
}
# google.rpc.Code -> the HTTP status Google's APIs map it to (google/rpc/code.proto)
HTTP_OF_GRPC = {
    1: 499,
    2: 500,
    3: 400,
    4: 504,
    5: 404,
    6: 409,
    7: 403,
    8: 429,
    9: 400,
    10: 409,
    11: 400,
    12: 501,
    13: 500,
    14: 503,
    15: 500,
    16: 401,
}
KEY_HEAD = b'{"key":"'
REQUEST_HEAD = b'","request":'
KEY_LEN = 64
INLINE_PIECE = 256  # inline responses handed to the runner at a time (``BatchAPI.results``)


def _batch_of(op: dict) -> dict:
    """The ``GenerateContentBatch`` of an Operation (its ``metadata``), or the batch itself."""
    meta = op.get("metadata")
    return meta if isinstance(meta, dict) and ("state" in meta or "displayName" in meta) else op


def status_of(op: dict) -> BatchStatus:
    """An Operation (or a batch) as a BatchStatus; inline responses are left out (``results`` reads
    them)."""
    batch = _batch_of(op)
    stats = batch.get("batchStats") if isinstance(batch.get("batchStats"), dict) else {}
    counts = {k: int(v) for k, v in stats.items() if str(v).isdigit()}
    output = (
        batch.get("output")
        if isinstance(batch.get("output"), dict)
        else (op.get("response") if isinstance(op.get("response"), dict) else {})
    )
    where = (
        {"responses_file": output["responsesFile"]}
        if output.get("responsesFile")
        else ({"inline": True} if "inlinedResponses" in output else {})
    )
    state = str(batch.get("state") or "")
    name = str(op.get("name") or batch.get("name") or "")
    return BatchStatus(
        name,
        state,
        ENDED.get(state),
        counts,
        where,
        batch.get("displayName"),
        iso_time(batch.get("createTime")),
        counts.get("requestCount"),
    )


def _parsed(raw: bytes) -> object:
    """A line of the responses file parsed; None when it is not JSON (``result`` says so)."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None


def _keyed(item: object) -> object:
    """An inline response with its request's key (``metadata.key``) on top, as the file's lines
    carry it."""
    meta = item.get("metadata") if isinstance(item, dict) else None
    return {**item, "key": meta.get("key")} if isinstance(meta, dict) else item


def _inline(line: bytes) -> bytes:
    """An input line ``{"key": K, "request": B}`` as an inline request
    ``{"request": B, "metadata": {"key": K}}``."""
    key = line[len(KEY_HEAD) : len(KEY_HEAD) + KEY_LEN]
    body = line[len(KEY_HEAD) + KEY_LEN + len(REQUEST_HEAD) : -1]
    return b'{"request":' + body + b',"metadata":{"key":"' + key + b'"}}'


class GeminiBatch(BatchAPI):
    """The Gemini Batch API under the adapter's base URL."""

    LIMITS = BatchLimits(200_000, 2_000_000_000, inline_bytes=None)  # always a file (see above)
    name = "gemini"
    RETENTION = "Google keeps a file of the Gemini API 48 hours"

    @property
    def model_path(self) -> str:
        return "models/" + self.adapter.model.removeprefix("models/")

    def head(self, key: str) -> bytes:
        return KEY_HEAD + key.encode() + REQUEST_HEAD

    async def upload(self, entry_id: str, path: Path, n: int, size: int) -> str | None:
        if self.limits.inline_bytes is not None and size <= self.limits.inline_bytes:
            return None
        start = self.headers(
            **{
                "X-Goog-Upload-Protocol": "resumable",
                "X-Goog-Upload-Command": "start",
                "X-Goog-Upload-Header-Content-Length": str(size),
                "X-Goog-Upload-Header-Content-Type": "application/jsonl",
            }
        )
        try:
            async with self.session().post(
                f"{self.adapter.base_url}/upload/v1beta/files",
                headers=start,
                data=orjson.dumps({"file": {"displayName": entry_id}}),
                allow_redirects=False,
            ) as resp:
                payload = await resp.read()
                if resp.status == 404:
                    raise NoBatchAPI(
                        f"{self.what}: {self.adapter.base_url} has no batch API (POST "
                        "/upload/v1beta/files answered 404: a server without the Gemini "
                        "Files API); batch mode stopped for this model",
                        404,
                    )
                if resp.status >= 300:
                    raise error_for(
                        resp.status,
                        redact(payload, self.adapter._secrets),
                        resp.headers,
                        self.what,
                        secrets=self.adapter._secrets,
                    )
                target = resp.headers.get("X-Goog-Upload-URL")
            if not target:
                raise Transient(f"{self.what}: the upload was not given an upload URL")
            if not same_origin(target, self.adapter.base_url):  # the key goes nowhere else
                raise redirected(
                    resp.status,
                    {"Location": target},
                    f"{self.what}: the upload URL",
                    self.adapter._secrets,
                )
            with open(path, "rb") as f:
                async with self.session().post(
                    target,
                    data=f,
                    headers=self.headers(
                        **{
                            "Content-Type": "",
                            "Content-Length": str(size),
                            "X-Goog-Upload-Offset": "0",
                            "X-Goog-Upload-Command": "upload, finalize",
                        }
                    ),
                    allow_redirects=False,
                ) as resp:
                    payload = await resp.read()
                    if resp.status >= 300:
                        raise error_for(
                            resp.status,
                            redact(payload, self.adapter._secrets),
                            resp.headers,
                            self.what,
                            secrets=self.adapter._secrets,
                        )
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, TimeoutError) as exc:
            why = transport_failure(exc, self.adapter._secrets)
            raise Transient(f"{self.what}: {why}") from None
        try:
            name = orjson.loads(payload)["file"]["name"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            raise Transient(f"{self.what}: the upload's reply names no file") from None
        return name

    async def create(
        self, entry_id: str, path: Path, file_id: str | None, n: int, size: int
    ) -> BatchStatus:
        url = f"{self.adapter.base_url}/v1beta/{self.model_path}:batchGenerateContent"
        head = b'{"batch":{"displayName":' + orjson.dumps(entry_id) + b',"inputConfig":'
        if file_id is not None:
            body = head + b'{"fileName":' + orjson.dumps(file_id) + b"}}}"
            return status_of(await self.call("POST", url, body))
        return status_of(
            await self.call(
                "POST",
                url,
                chunks(path, head + b'{"requests":{"requests":[', b",", b"]}}}}", _inline),
            )
        )

    async def get(self, batch_id: str) -> BatchStatus:
        return status_of(await self.call("GET", f"{self.adapter.base_url}/v1beta/{batch_id}"))

    def next_page(self, page: dict, items: list[dict]) -> str | None:
        token = page.get("nextPageToken")
        return f"pageToken={token}" if token else None

    async def find(
        self, entry_id: str, since: float, n: int, known: set[str], ref: dict | None = None
    ) -> list[BatchStatus]:
        found = []
        self.listed, self.listed_all = 0, False
        # every page: the listing's order is not documented
        url = f"{self.adapter.base_url}/v1beta/batches?pageSize=100"
        async for ops, last in self.pages(url, "operations"):
            self.listed += len(ops)
            found += [s for s in map(status_of, ops) if s.tag == entry_id]
            self.listed_all = last
        return found

    FILES = ("/v1beta/files?pageSize=100", "files")

    def input_of(self, item: dict, entry_id: str) -> str | None:
        named = item.get("displayName") == entry_id and isinstance(item.get("name"), str)
        return item["name"] if named else None

    def file_url(self, file_id: str) -> str:
        return f"{self.adapter.base_url}/v1beta/{file_id}"

    def files_of(self, file_id: str | None, output: dict) -> list[str]:
        return [f for f in (file_id, output.get("responses_file")) if isinstance(f, str)]

    async def cancel(self, batch_id: str) -> BatchStatus:
        await self.call("POST", f"{self.adapter.base_url}/v1beta/{batch_id}:cancel", {})
        return await self.get(batch_id)

    async def results(self, status: BatchStatus) -> AsyncIterator[list[ResultLine]]:
        if status.output.get("responses_file"):
            url = f"{self.adapter.base_url}/download/v1beta/{status.output['responses_file']}:download?alt=media"
            async for lines in self.lines(url):
                yield [self.checked(raw, self.result(_parsed(raw), raw)) for raw in lines]
            return
        if not status.output.get("inline"):
            return
        op = await self.call(
            "GET", f"{self.adapter.base_url}/v1beta/{status.batch_id}", max_bytes=1 << 30
        )
        batch = _batch_of(op)
        output = (
            batch.get("output")
            if isinstance(batch.get("output"), dict)
            else op.get("response") or {}
        )
        inline = output.get("inlinedResponses") if isinstance(output, dict) else None
        items = inline.get("inlinedResponses") if isinstance(inline, dict) else None
        if not isinstance(items, list):
            raise BatchLost(
                f"{self.what}: batch {status.batch_id} ended without its inline responses"
            )
        for start in range(0, len(items), INLINE_PIECE):
            yield [self.result(_keyed(item), b"") for item in items[start : start + INLINE_PIECE]]

    def result(self, doc: object, raw: bytes) -> ResultLine:
        """One response: ``{"key", "response"}`` or ``{"key", "error"}`` (a
        ``google.rpc.Status``)."""
        if not isinstance(doc, dict) or not isinstance(doc.get("key"), str):
            return ResultLine(
                "",
                error=MalformedReply(
                    "a result that is not a keyed GenerateContentResponse",
                    raw[:2000].decode("utf-8", "replace"),
                ),
            )
        key = doc["key"]
        if isinstance(doc.get("response"), dict):
            return ResultLine(key, orjson.dumps(doc["response"]), doc=doc["response"])
        error = doc.get("error") or doc.get("status")
        error = error if isinstance(error, dict) else {}
        code = error.get("code") if isinstance(error.get("code"), int) else 13
        status = code if code >= 100 else HTTP_OF_GRPC.get(code, 500)
        return ResultLine(
            key, error=error_for(status, orjson.dumps({"error": error}), {}, self.what)
        )
