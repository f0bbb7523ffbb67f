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

# An errored result carries no HTTP status, only the ``ErrorResponse`` the synchronous call would
# have answered with (anthropic SDK ``types/messages/message_batch_errored_result.py``); it is given
# the status that call would have had, so that ``error_for`` classifies it as that reply
# (docs/batch.md: transient, rate limited, deterministic, or a stop of the provider or model):
#
# * ``STATUS_OF``: ``error.type``, every ``ErrorType`` of anthropic 2.17's
#   ``types/shared/error_type.py`` with the status of its exception in ``_exceptions.py``
#   (``GatewayTimeoutErrorObject`` is ``timeout_error``: 504; ``billing_error``: 402, a QUOTA stop,
#   ``provider_errors``; the memory stores' ``memory_precondition_failed_error`` and
#   ``memory_path_conflict_error``, and ``conflict_error``: 409, as
#   ``resources/beta/memory_stores/memories.py`` documents a failed precondition, Transient like any
#   409), and ``request_too_large`` (413, platform.claude.com/docs/en/api/errors; not in the SDK's
#   list);
# * ``STATUS_OF_CODE``: ``error.details.error_code``, which "names the cause; branch on it rather
#   than on message ... Treat an unrecognized error_code as the bare type" (``_exceptions.py``,
#   ``APIStatusError.error_code``): the status ``_error_classes.py``'s ``ERROR_CLASSES`` gives each
#   code the Messages API raises (``resources/messages/messages.py``, its ``Raises:``), so that
#   ``storage_not_ready`` or ``cmek_key_unreachable`` (503: "try again") is given back whatever its
#   type, and a spend limit (429, 402) stops the provider
#   (``provider_errors.ANTHROPIC_SPEND_CODES``);
# * neither known (a type or code newer than this table): 500, Transient. The request is given back
#   and submitted again, at most ``--max-attempts`` times in all, then stored as a transient failure
#   that the next run sends again: an errored result is not billed, so a wrong guess costs a few
#   resubmissions, where taking an unknown error as deterministic would keep a failure that may not
#   be one (and as a stop, end the provider's run).
#
# ``tests/test_batch_protocol.py`` checks both tables against the installed SDK.
STATUS_OF = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "billing_error": 402,
    "permission_error": 403,
    "not_found_error": 404,
    "memory_precondition_failed_error": 409,
    "memory_path_conflict_error": 409,
    "conflict_error": 409,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "timeout_error": 504,
    "overloaded_error": 529,
}
UNKNOWN_STATUS = 500
STATUS_OF_CODE = (
    dict.fromkeys(
        (
            "available_tools_limit_exceeded",
            "claude_code_key_creator_not_member",
            "claude_code_version_too_old",
            "cmek_key_disabled",
            "cmek_key_network_blocked",
            "compaction_block_ambiguous",
            "compaction_block_misplaced",
            "compaction_content_mismatch",
            "compaction_incomplete_turn",
            "compaction_nothing_to_summarize",
            "compaction_signature_invalid",
            "compaction_too_many_tool_references",
            "compaction_tool_changes_mismatch",
            "image_dimensions_too_large",
            "organization_on_hold",
            "organization_url_fetch_disabled",
            "request_body_encoding_invalid",
            "request_body_encoding_unsupported",
            "thread_already_continued",
            "thread_continue_in_flight",
            "thread_fingerprint_mismatch",
            "thread_unsupported_request",
            "tool_name_conflict",
            "tool_reference_unresolved",
            "user_profile_required",
        ),
        400,
    )
    | dict.fromkeys(
        ("linked_organization_billing_unavailable", "linked_organization_spend_limit_reached"), 402
    )
    | dict.fromkeys(("user_profile_billing_not_authorized", "user_profile_not_billable"), 403)
    | {"thread_not_found": 404, "skill_read_blocked_undecryptable": 409}
    | {"request_body_too_large_after_decoding": 413}
    | dict.fromkeys(
        ("contract_spend_limit_reached", "enforced_spend_limit_reached", "ramp_limit_exceeded"), 429
    )
    | dict.fromkeys(("cmek_key_unreachable", "storage_not_ready"), 503)
    | {"compaction_unavailable": 529}
)


def errored_status(error: dict) -> int:
    """The HTTP status of an errored result's ``ErrorResponse`` (``error``): its
    ``error.details.error_code``'s where known, else its ``error.type``'s, else ``UNKNOWN_STATUS``
    (see the tables above)."""
    inner = error.get("error") if isinstance(error.get("error"), dict) else {}
    details = inner.get("details") if isinstance(inner.get("details"), dict) else {}
    code = details.get("error_code")
    if isinstance(code, str) and code in STATUS_OF_CODE:
        return STATUS_OF_CODE[code]
    return STATUS_OF.get(str(inner.get("type")), UNKNOWN_STATUS)


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
            yield [self.checked(raw, self.result(raw)) for raw in lines]

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
            return ResultLine(
                key, error=error_for(errored_status(error), orjson.dumps(error), {}, self.what)
            )
        return ResultLine(key)  # canceled, expired: not run, given back
