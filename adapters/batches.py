"""The providers' batch APIs: what ``dxi run --batch`` (``runner.batch.driver``) uses to send the
requests of a model asynchronously at the batch price, one module per wire format beside the adapter
whose bodies its lines carry: ``openai_batch`` (OpenAI's Files and Batches endpoints, and the
servers that implement them), ``anthropic_batch`` (Message Batches), ``gemini_batch`` (the Gemini
Batch API, inline or through the Files API). ``batch_api(adapter)`` gives an adapter's, or None when
its provider has no batch API (decision models, the embedded model, local servers, logprob
requests).

Every batch line carries the request's body **as is** (the same bytes a synchronous call sends) and
its cache key as the line's id (``custom_id``, Gemini's ``key``): a 64-character hex sha256, within
Anthropic's ``[A-Za-z0-9_-]{1,64}``. Results are matched to requests by that id, never by position.
A result's body goes through the adapter's own ``decode``; a per-request error is classified by
``http.error_for`` as the synchronous reply with that status would be.

The shapes here (``BatchStatus``, ``ResultLine``) are what the runner sees of any provider. Errors:
the adapter error tree (``adapters.errors``); ``BatchLost`` when the provider no longer knows a
batch or its results (404); ``NoBatchAPI`` when the host has no batch endpoints at all (a 404 to the
upload or create).
"""

from __future__ import annotations

import importlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import aiohttp
import orjson

from .errors import AdapterError, Fatal, MalformedReply, ProviderStop, Transient
from .http import error_for, post, redact, transport_failure
from .json_body import load_reply

if TYPE_CHECKING:
    from .base import Adapter, Request
    from .http import HTTPAdapter

RUNNING = None
COMPLETED, EXPIRED, CANCELLED, FAILED, LOST = "completed", "expired", "cancelled", "failed", "lost"
OUTCOMES = (COMPLETED, EXPIRED, CANCELLED, FAILED, LOST)
LINE_BYTES = (
    64 << 20
)  # the longest result line read; a longer one is given back (its reply is read no further)
# the pages of the provider's batch (or file) listing that ``find`` / ``delete_input`` read at most
MAX_PAGES = 100
# a provider without a tag, an entry recorded without a reference (``BatchAPI.find``): the batches
# created within this many seconds before its intent, by this machine's clock, are candidates
WIDE_S = 86_400

# adapter kind -> "module:Class" of its batch protocol, imported on first use
KINDS = {
    "openai": "dxi.adapters.openai_batch:OpenAIBatch",
    "anthropic": "dxi.adapters.anthropic_batch:AnthropicBatch",
    "gemini": "dxi.adapters.gemini_batch:GeminiBatch",
}


def iso_time(value: object) -> float | None:
    """Unix seconds of an RFC 3339 time (``2026-12-02T03:12:09.5Z``, as Anthropic and Google write
    them); None when it is not one."""
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


class BatchLost(AdapterError):
    """The provider answers 404 for a batch it accepted, or for its results: gone (deleted, or past
    the provider's retention: OpenAI keeps output files 30 days, Anthropic results 29 days after
    creation, Gemini files 48 hours)."""


class NoBatchAPI(Fatal):
    """The host answers 404 where the batch API uploads or creates: it has no batch API (a server
    that implements the synchronous endpoint only). Batch mode stops for the model; nothing is sent
    twice."""


def not_found(what: str, method: str, url: str) -> str:
    """The words of a 404 from the batch API: what asked, and where (the path only: no query, no
    key)."""
    return f"{what}: {method} {urlsplit(url).path}: HTTP 404 (not found)"


@dataclass(frozen=True, slots=True)
class BatchLimits:
    """What one batch may hold, as each provider documents it: ``max_requests`` requests and
    ``max_bytes`` bytes of input (the file uploaded, or the create request's body);
    ``inline_bytes``: up to this, the requests go inline in the create request (Gemini), above it
    through the Files API."""

    max_requests: int
    max_bytes: int
    inline_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class BatchStatus:
    """A batch as the provider reports it: ``batch_id`` (the provider's), ``state`` (its own word),
    ``outcome`` (None while it runs; else one of ``OUTCOMES``), ``counts`` (its request counts),
    ``output`` (where the results are: file ids, a results URL, inline), ``tag`` (the ledger entry
    id it carries; None where the provider has no tag), ``created`` (Unix seconds) and ``total``
    (requests held)."""

    batch_id: str
    state: str
    outcome: str | None = None
    counts: dict[str, int] = field(default_factory=dict)
    output: dict = field(default_factory=dict)
    tag: str | None = None
    created: float | None = None
    total: int | None = None


@dataclass(frozen=True, slots=True)
class ResultLine:
    """One request's result: ``key`` (its custom id = cache key) and either ``body`` (the reply, as
    the synchronous endpoint returns it) or ``error`` (a per-request error, classified as
    synchronously); both None: not attempted (the batch expired or was cancelled first), given back.
    ``doc`` is ``body`` parsed, from the line's own parse (``Adapter.decode_parsed`` reads it rather
    than parsing ``body`` again)."""

    key: str
    body: bytes | None = None
    error: AdapterError | None = None
    doc: Any = None


class BatchAPI:
    """One provider's batch protocol over a started ``HTTPAdapter`` (its session, headers and base
    URL).

    Subclasses give ``LIMITS``, ``taggable`` (whether a batch carries our tag) and ``line`` /
    ``upload`` / ``create`` / ``get`` / ``find`` / ``cancel`` / ``results``. The input of a batch is
    a file of lines (``line(request)`` each, in ``lines`` order), written by the runner before
    anything is sent."""

    LIMITS = BatchLimits(50_000, 200 << 20)
    taggable = True
    name = ""
    RETENTION = "the provider keeps results for a limited time"  # how long, in words, for messages

    def __init__(self, adapter: HTTPAdapter):
        self.adapter = adapter
        self.limits = self.LIMITS
        self._head_bytes: int | None = None  # len(head(key)), the same for every key (``split``)
        # what the last ``find`` read of the provider's listing: whether every batch it lists
        # (False: it stopped at MAX_PAGES, or where its order says older batches begin), and how
        # many it read
        self.listed_all = False
        self.listed = 0

    # ---- HTTP ---------------------------------------------------------------------------------
    @property
    def what(self) -> str:
        return f"{self.adapter.label} (batch)"

    def headers(self, **extra: str) -> dict[str, str]:
        """The adapter's headers (its key included) with ``extra``; ``Content-Type`` dropped when
        ``extra`` sets it to ""."""
        out = {**self.adapter._headers, "Accept-Encoding": "identity", **extra}
        return {k: v for k, v in out.items() if v != ""}

    def session(self) -> aiohttp.ClientSession:
        session = self.adapter._session
        if session is None:
            raise RuntimeError(f"{type(self).__name__} used before the adapter was started")
        return session

    async def call(
        self,
        method: str,
        url: str,
        body: object = None,
        headers: dict[str, str] | None = None,
        max_bytes: int = 64 << 20,
    ) -> dict:
        """One request to the batch API, its JSON reply as a dict; raises the adapter errors
        (``post``), and BatchLost for a 404 (the batch or file is unknown to the provider)."""
        data = orjson.dumps(body) if isinstance(body, (dict, list)) else body
        try:
            payload = await post(
                self.session(),
                url,
                data,
                headers or self.headers(),
                self.what,
                self.adapter.retry_after_from_body,
                self.adapter._secrets,
                max_bytes,
                method,
            )
        except ProviderStop as exc:
            if exc.status == 404:  # (not "unknown model": the URL names a batch or a file)
                raise BatchLost(not_found(self.what, method, url), 404) from None
            raise
        try:
            doc = orjson.loads(payload) if payload.strip() else {}
        except orjson.JSONDecodeError:
            raise Transient(
                f"{self.what}: {method} {url}: the reply is not JSON: "
                f"{payload[:200].decode('utf-8', 'replace')}"
            ) from None
        return doc if isinstance(doc, dict) else {"value": doc}

    @staticmethod
    def checked(raw: bytes, line: ResultLine) -> ResultLine:
        """``line``, the reading of the result line ``raw``, unless ``raw`` names a key twice
        anywhere (the reply's ``usage`` or ``choices`` twice: which one the provider meant is
        ambiguous, and the line's own parse kept the last silently): then the request's result is
        that MalformedReply, as the synchronous endpoint's reply would be
        (``json_body.load_reply``), never its body. A line already an error, or without a key, is
        left as it is."""
        if line.error is not None or not line.key:
            return line
        try:
            load_reply(raw)
        except MalformedReply as exc:
            return ResultLine(line.key, error=exc)
        return line

    async def lines(
        self, url: str, headers: dict[str, str] | None = None
    ) -> AsyncIterator[list[bytes]]:
        """The lines of a JSONL file at ``url`` as they arrive, a list for each piece read from the
        network (up to 64 KiB: the lines it completes; never the whole file in memory). A line
        longer than ``LINE_BYTES`` is given as ``b""``, read no further; blank lines are left out.
        Raises as ``call`` does."""
        secrets = self.adapter._secrets
        try:
            async with self.session().get(
                url, headers=headers or self.headers(), allow_redirects=False
            ) as resp:
                if resp.status >= 300:
                    payload = redact(await resp.content.read(64 << 10), secrets)
                    error = error_for(
                        resp.status,
                        payload,
                        resp.headers,
                        self.what,
                        self.adapter.retry_after_from_body,
                        secrets,
                    )
                    if resp.status == 404:
                        raise BatchLost(not_found(self.what, "GET", url), 404)
                    raise error
                held = bytearray()  # the start of a line the last piece did not complete
                skipping = False  # within a line longer than LINE_BYTES
                async for chunk in resp.content.iter_chunked(1 << 16):
                    got: list[bytes] = []
                    start = 0
                    while (end := chunk.find(b"\n", start)) >= 0:
                        if skipping:
                            got.append(b"")
                        else:
                            if held:
                                held += chunk[start:end]
                                line = bytes(held)
                            else:
                                line = chunk[start:end]
                            if line and not line.isspace():
                                got.append(line)
                        held.clear()
                        skipping = False
                        start = end + 1
                    if not skipping:
                        held += chunk[start:]
                        if len(held) > LINE_BYTES:
                            held.clear()
                            skipping = True
                    if got:
                        yield [redact(line, secrets) for line in got]
                if skipping:
                    yield [b""]
                elif held.strip():
                    yield [redact(bytes(held), secrets)]
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, TimeoutError) as exc:
            why = transport_failure(exc, self.adapter._secrets)
            raise Transient(f"{self.what}: {why}") from None

    # ---- the protocol -------------------------------------------------------------------------
    def line(self, request: Request) -> bytes:
        """The input line of ``request`` (no newline), its body embedded byte for byte:
        ``head(key)``, the body, then ``}``."""
        return self.head(request.key) + request.body + b"}"

    def head(self, key: str) -> bytes:
        """What comes before the body in the input line of the request with cache key ``key``."""
        raise NotImplementedError

    def split(self, line: bytes) -> tuple[str, bytes]:
        """An input line back into (key, body bytes): the inverse of ``line`` (a cache key is 64
        characters, so every line's head has one length)."""
        start = line.index(b'"') + 1
        start = line.index(b'"', start) + 3  # past the id's name, '":"'
        if self._head_bytes is None:
            self._head_bytes = len(self.head("0" * 64))
        return line[start : start + 64].decode(), line[self._head_bytes : -1]

    async def upload(self, entry_id: str, path: Path, n: int, size: int) -> str | None:
        """Upload the input file ``path`` (``n`` lines, ``size`` bytes) where the provider takes a
        file; its file id, or None when the requests go in the create request itself."""
        return None

    async def create(
        self, entry_id: str, path: Path, file_id: str | None, n: int, size: int
    ) -> BatchStatus:
        """Create the batch of the lines in ``path`` (or of the uploaded ``file_id``), tagged
        ``entry_id`` where the provider allows a tag."""
        raise NotImplementedError

    async def get(self, batch_id: str) -> BatchStatus:
        raise NotImplementedError

    async def reference(self) -> dict | None:
        """Where the provider's batch listing stood just before a create, in the provider's own
        terms (never this machine's clock), recorded with the entry's intent (``ref``) so that
        ``find`` can tell the batches created after it; None where the provider tags batches (the
        tag finds them) or the listing could not be read. Raises the adapter errors."""
        return None

    async def find(
        self, entry_id: str, since: float, n: int, known: set[str], ref: dict | None = None
    ) -> list[BatchStatus]:
        """The provider's batches that may be the ledger entry ``entry_id`` whose ``create`` was cut
        before its reply was recorded: those tagged ``entry_id``; where there is no tag, those of
        ``n`` requests that no other entry knows (``known``: batch ids) created after the listing's
        state ``ref`` (``reference``), or, without one, within a wide window around ``since`` (Unix
        seconds, this machine's clock). Sets ``listed_all`` (the listing covered every batch that
        could be the entry: an empty result is then proof that none was created) and ``listed``
        (how many batches it read)."""
        raise NotImplementedError

    async def cancel(self, batch_id: str) -> BatchStatus:
        raise NotImplementedError

    def file_url(self, file_id: str) -> str:
        """Where a file of the provider's Files API is deleted (``DELETE``); providers without one
        never call it."""
        raise NotImplementedError

    def files_of(self, file_id: str | None, output: dict) -> list[str]:
        """The provider's files of a batch: its input ``file_id`` (when uploaded) and the result
        files named in its ``output`` (``BatchStatus.output``, as the ledger keeps it); [] where the
        provider holds no file of ours (Anthropic: the results are the batch's own)."""
        return []

    async def delete_files(self, ids: list[str]) -> int:
        """Delete the files ``ids`` at the provider (``DELETE file_url(id)``): how many it deleted;
        a file it no longer knows (404) is gone already, not counted. Raises the other adapter
        errors."""
        deleted = 0
        for one in ids:
            try:
                await self.call("DELETE", self.file_url(one))
                deleted += 1
            except BatchLost:  # gone already
                pass
        return deleted

    def next_page(self, page: dict, items: list[dict]) -> str | None:
        """The query parameter that asks a listing for the page after ``page`` (whose items are
        ``items``: not empty), as the provider pages (``after=ID``, ``pageToken=T``); None when
        ``page`` is the last."""
        raise NotImplementedError

    async def pages(self, url: str, field: str) -> AsyncIterator[tuple[list[dict], bool]]:
        """The pages of the provider's listing at ``url`` (its query begun: ``?limit=100``), each
        as its items (the objects under ``field``) and whether it is the last one; at most
        ``MAX_PAGES`` pages. Raises as ``call`` does."""
        query = None
        for _ in range(MAX_PAGES):
            page = await self.call("GET", url + (f"&{query}" if query else ""))
            items = [d for d in page.get(field) or [] if isinstance(d, dict)]
            query = self.next_page(page, items) if items else None
            yield items, query is None
            if query is None:
                return

    # where the provider lists its files (``pages``' url and field), and the id of a listed file
    # when it is the input file dxi uploaded for an entry (``upload`` names it after the entry)
    FILES: tuple[str, str] | None = None

    def input_of(self, item: dict, entry_id: str) -> str | None:
        return None

    async def delete_input(self, entry_id: str, file_id: str | None) -> int:
        """Delete the input file of the ledger entry ``entry_id`` at the provider, for an entry that
        never became a batch: ``file_id`` when the ledger recorded it, else the files this
        protocol's ``upload`` names after the entry (found by listing the provider's files,
        ``FILES`` and ``input_of``: only a file dxi uploaded carries that name). Returns how many
        were deleted (0 where the provider takes no file). Raises the adapter errors."""
        ids = [file_id] if file_id else []
        if not file_id and self.FILES is not None:
            async for items, _ in self.pages(self.adapter.base_url + self.FILES[0], self.FILES[1]):
                ids += [one for item in items if (one := self.input_of(item, entry_id))]
        return await self.delete_files(ids)

    def results(self, status: BatchStatus) -> AsyncIterator[list[ResultLine]]:
        """The results of an ended batch as they are read: a list for each piece of the results read
        (those of ``lines``), each line's result in it."""
        raise NotImplementedError


async def chunks(
    path: Path,
    head: bytes = b"",
    sep: bytes = b",",
    tail: bytes = b"",
    frame: Callable[[bytes], bytes] | None = None,
    size: int = 1 << 20,
) -> AsyncIterator[bytes]:
    """A create request's body streamed from the input file ``path``: ``head``, the lines (each
    through ``frame``, when given) joined by ``sep``, then ``tail``, in pieces of about ``size``
    bytes."""
    held = bytearray(head)
    first = True
    with open(path, "rb") as f:
        for raw in f:
            line = raw.rstrip(b"\n")
            if not line:
                continue
            held += (b"" if first else sep) + (line if frame is None else frame(line))
            first = False
            if len(held) >= size:
                yield bytes(held)
                held.clear()
    held += tail
    yield bytes(held)


def batch_api(adapter: Adapter) -> BatchAPI | None:
    """The batch protocol of ``adapter`` (started before use), or None when its provider has
    none."""
    ref = KINDS.get(adapter.kind)
    if ref is None:
        return None
    module, _, cls = ref.partition(":")
    return getattr(importlib.import_module(module), cls)(adapter)


def supports(kind: str) -> bool:
    """Whether the adapter ``kind`` has a batch API."""
    return kind in KINDS
