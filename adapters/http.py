"""HTTP plumbing shared by the network adapters: one POST that maps statuses to the error tree, and
reading a 429's headers (how long to wait; the provider's own limits), and ``HTTPAdapter``, the base
of the hosted-model adapters (base URL, API key from the environment, session)."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import math
import os
import re
import time
import zlib
from collections.abc import Awaitable, Callable, Iterable, Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import orjson
import yarl

from dxi.hosts import is_loopback
from dxi.stored import as_count  # noqa: F401 (re-exported: the adapters read usage with it)

from .base import Adapter, Limits, ModelSpec, Progress, Request, canonical_params
from .credentials import KeyCommand
from .errors import (
    KEY,
    REDIRECT,
    UNREACHABLE,
    AdapterError,
    Fatal,
    IdleTimeout,
    MalformedReply,
    ProviderStop,
    RateLimited,
    ReplyTooLarge,
    Retryable,
    Transient,
    Unreachable,
    status_kind,
)
from .json_body import (  # noqa: F401 (re-exported: the adapters read replies with them)
    load_json,
    load_reply,
)
from .provider_errors import (
    body_error,
    error_doc,
    prompt_too_long,
    provider_stop,
    streaming_refused,
)
from .streaming import STREAM_MODES, Assembler, SSEParser

_DELTA_SECONDS = re.compile(r"\d+(?:\.\d+)?")  # RFC 9110 §10.2.3 delay-seconds (decimals tolerated)


def reply_time(headers: Mapping[str, str] | None) -> float:
    """The reply's own time as Unix seconds: its ``Date`` header (RFC 9110 §6.6.1), so that absolute
    reset times are measured against the server's clock, not ours; the local clock when it has
    none."""
    value = None
    if headers is not None:
        value = next((v for k, v in headers.items() if k.lower() == "date"), None)
    if value:
        with contextlib.suppress(TypeError, ValueError, IndexError, OverflowError):
            when = parsedate_to_datetime(value)
            return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()
    return time.time()


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header: delay-seconds ("7", "1.5") or an HTTP date,
    measured against ``now`` (the reply's ``Date``, Unix seconds; default the local clock). None
    when absent or not one of those forms: a negative, non-finite ("inf", "nan") or otherwise
    unreadable value is ignored."""
    if value is None:
        return None
    text = value.strip()
    if _DELTA_SECONDS.fullmatch(text):
        return float(text)
    if not text or text[0].isdigit() or text[0] in "+-.":
        return None  # "-5", "1e9", "12abc": not a documented form
    with contextlib.suppress(TypeError, ValueError, IndexError, OverflowError):
        when = parsedate_to_datetime(text)
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        return max(0.0, when.timestamp() - (time.time() if now is None else now))
    return None


_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ms|h|m|s)")
_EPOCH = 1e9  # a bare number above this is a Unix time, not a number of seconds


def parse_reset(value: str | None, now: float | None = None) -> float | None:
    """Seconds until a rate-limit window resets, from a reset header: a duration as OpenAI sends it
    (``"20ms"``, ``"1s"``, ``"6m0s"``, ``"1h2m3.5s"``), a bare number of seconds, a Unix time, or an
    RFC 3339 / HTTP date (Anthropic's ``anthropic-ratelimit-*-reset``); absolute times are measured
    against ``now`` (the reply's ``Date``; default the local clock). None when absent, unreadable,
    negative or not finite; an absolute time already past is 0."""
    if value is None:
        return None
    now = time.time() if now is None else now
    text = value.strip()
    with contextlib.suppress(ValueError):
        number = float(text)
        if not math.isfinite(number) or number < 0:
            return None
        return max(0.0, number - now) if number > _EPOCH else number
    parts = _DURATION.findall(text)
    if parts and "".join(n + u for n, u in parts) == text:
        scale = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
        return sum(float(n) * scale[u] for n, u in parts)
    with contextlib.suppress(ValueError):
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        return max(0.0, when.timestamp() - now)
    return parse_retry_after(text, now)


# (reset header, the matching "remaining" header): OpenAI-compatible servers, then Anthropic
_RESETS = (
    ("x-ratelimit-reset-requests", "x-ratelimit-remaining-requests"),
    ("x-ratelimit-reset-tokens", "x-ratelimit-remaining-tokens"),
    ("anthropic-ratelimit-requests-reset", "anthropic-ratelimit-requests-remaining"),
    ("anthropic-ratelimit-tokens-reset", "anthropic-ratelimit-tokens-remaining"),
    ("anthropic-ratelimit-input-tokens-reset", "anthropic-ratelimit-input-tokens-remaining"),
    ("anthropic-ratelimit-output-tokens-reset", "anthropic-ratelimit-output-tokens-remaining"),
)


def rate_limit_wait(headers: Mapping[str, str]) -> float | None:
    """Seconds a 429's headers ask us to wait, in order of precedence: ``retry-after-ms``
    (milliseconds), ``Retry-After`` (seconds or an HTTP date, measured against the reply's
    ``Date``), then the reset headers (``x-ratelimit-reset-requests`` / ``-tokens``,
    ``anthropic-ratelimit-*-reset``): of those whose ``remaining`` is 0 the longest, else the
    longest of all. None when no header says."""
    h = {k.lower(): v for k, v in headers.items()}
    now = reply_time(h)
    ms = h.get("retry-after-ms", "").strip()
    if _DELTA_SECONDS.fullmatch(
        ms
    ):  # OpenAI's; negative or non-finite values are ignored like Retry-After's
        return float(ms) / 1000
    if (wait := parse_retry_after(h.get("retry-after"), now)) is not None:
        return wait
    resets = [
        (parse_reset(h.get(reset), now), h.get(remaining, "").strip() == "0")
        for reset, remaining in _RESETS
    ]
    exhausted = [w for w, empty in resets if w is not None and empty]
    known = exhausted or [w for w, _ in resets if w is not None]
    return max(known) if known else None


def rate_limit_quota(headers: Mapping[str, str]) -> tuple[float | None, float | None]:
    """The provider's own (requests per minute, tokens per minute) from
    ``x-ratelimit-limit-requests`` / ``-tokens`` or ``anthropic-ratelimit-requests-limit`` /
    ``-tokens-limit``; None where not stated. (Some providers state a per-day request limit here:
    the runner treats these figures as ceilings only, and still slows down on every 429.)"""
    h = {k.lower(): v for k, v in headers.items()}

    def number(*names: str) -> float | None:
        for name in names:
            with contextlib.suppress(KeyError, ValueError):
                value = float(h[name])
                if value > 0:
                    return value
        return None

    return (
        number("x-ratelimit-limit-requests", "anthropic-ratelimit-requests-limit"),
        number("x-ratelimit-limit-tokens", "anthropic-ratelimit-tokens-limit"),
    )


def rate_limited(message: str, headers: Mapping[str, str], status: int = 429) -> RateLimited:
    """The RateLimited error for a 429 (or 529) response with these headers."""
    rpm, tpm = rate_limit_quota(headers)
    return RateLimited(message, rate_limit_wait(headers), status, rpm=rpm, tpm=tpm)


def session(max_in_flight: int, attempt_timeout_s: float) -> aiohttp.ClientSession:
    """A client session whose connection pool matches the provider's in-flight limit, with a
    per-read timeout and no total timeout (a long run is never cut off by aiohttp's 5-minute
    default). Bodies are decompressed by ``read_body``, not by aiohttp (which accepts a gzip body
    cut before its trailer), and only gzip and deflate are asked for."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=max(1, max_in_flight)),
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=attempt_timeout_s),
        auto_decompress=False,
        headers={"Accept-Encoding": "gzip, deflate"},
    )


PREFIX_BYTES = 2000  # what is kept of a reply too large to read
_WBITS = zlib.MAX_WBITS | 32  # gzip or zlib, told by the header


async def read_body(resp: aiohttp.ClientResponse, max_bytes: int, what: str) -> bytes:
    """The body of ``resp``, decoded (``Content-Encoding`` gzip or deflate), read no further than
    ``max_bytes`` decoded bytes: memory never grows with the size of a reply. A gzip body of several
    members (RFC 1952 §2.2: "a gzip file consists of a series of members", as a server that
    compresses its reply in parts writes it) is decoded member after member, as ``gzip.decompress``
    and curl do. Raises ReplyTooLarge (with the first ``PREFIX_BYTES``) past the bound, and
    Transient for a compressed body that ends before its end (a member's trailer: CRC and length) or
    fails its check (bytes after a member that do not start another), or an encoding not asked
    for."""
    encoding = resp.headers.get("Content-Encoding", "").strip().lower()
    if encoding in ("", "identity"):
        decoder = None
    elif encoding in ("gzip", "x-gzip", "deflate"):
        decoder = zlib.decompressobj(_WBITS)
    else:
        raise Transient(
            f"{what}: a reply in Content-Encoding {encoding!r}, which was not asked for",
            resp.status,
        )
    if decoder is None and resp.content_length is not None and resp.content_length <= max_bytes:
        return await resp.read()  # its length is stated and within the bound: read it at once
    out = bytearray()

    def add(data: bytes) -> None:
        out.extend(data)
        if len(out) > max_bytes:
            raise ReplyTooLarge(
                f"reply larger than {max_bytes} bytes",
                bytes(out[:PREFIX_BYTES]),
                max_bytes,
                resp.status,
            )

    try:
        async for chunk in resp.content.iter_chunked(1 << 16):
            if decoder is None:
                add(chunk)
                continue
            data = chunk
            while data:  # bounded steps: a small compressed chunk may expand enormously
                if decoder.eof:  # a member ended and more follows: the next member
                    decoder = zlib.decompressobj(_WBITS)
                add(decoder.decompress(data, max_bytes + 1 - len(out)))
                data = decoder.unused_data if decoder.eof else decoder.unconsumed_tail
        if decoder is not None:
            add(decoder.flush())
            if not decoder.eof:
                raise Transient(
                    f"{what}: the {encoding} body ended before its end (its trailer is missing): "
                    "a transport error",
                    resp.status,
                )
    except zlib.error as exc:
        raise Transient(f"{what}: the {encoding} body is damaged ({exc})", resp.status) from None
    except ReplyTooLarge:
        resp.close()  # read no further
        raise
    return bytes(out)


def _snippet(payload: bytes) -> str:
    return payload[:300].decode("utf-8", "replace")


_KEY_HEADERS = frozenset({"authorization", "x-api-key", "x-goog-api-key", "api-key"})
REDACTED = b"[REDACTED]"


def secrets_in(headers: Mapping[str, str]) -> tuple[bytes, ...]:
    """The API keys ``headers`` carry (the token of ``Authorization: Bearer KEY``, ``x-api-key`` and
    the like), as bytes to redact from what comes back."""
    found = []
    for name, value in headers.items():
        if name.lower() in _KEY_HEADERS and value:
            token = value.split(" ", 1)[-1].strip()
            if len(token) >= 6:  # a real key; never redact a word
                found.append(token.encode())
    return tuple(found)


def redact(payload: bytes, secrets: tuple[bytes, ...]) -> bytes:
    """``payload`` with every occurrence of each secret replaced by ``[REDACTED]``: a provider that
    echoes the key ("Incorrect API key provided: sk-...") must not put it in the cache, logs or
    reports."""
    for secret in secrets:
        if secret in payload:
            payload = payload.replace(secret, REDACTED)
    return payload


def redact_prefix(prefix: bytes, secrets: tuple[bytes, ...]) -> bytes:
    """``redact`` for the first bytes of a longer body (what is kept of a reply too large): a secret
    the cut split is redacted too (its first 4 bytes or more at the very end), so a server that
    places the key across the cut cannot have all but its last bytes kept."""
    out = redact(prefix, secrets)
    for secret in secrets:
        for n in range(len(secret) - 1, 3, -1):
            if out.endswith(secret[:n]):
                return out[:-n] + REDACTED
    return out


def _redacted(text: str, secrets: tuple[bytes, ...]) -> str:
    """``text`` (a message quoting the provider) with ``secrets`` redacted."""
    return redact(text.encode(), secrets).decode("utf-8", "replace")


DEFAULT_MAX_REPLY_BYTES = Limits.max_reply_bytes
TOO_LONG = (
    "the prompt, with the output budget it asks for, is longer than the model's context: a model "
    "or server with a longer context, or a smaller output budget (max_tokens, "
    "max_completion_tokens, maxOutputTokens)"
)
IDLE = "no byte of the reply within the idle timeout (--timeout)"
WHOLE_REPLY = (
    ": a reply sent whole (not streamed) arrives only once generated, so the timeout bounds the "
    "model's whole thinking: give a --timeout longer than its longest thinking, or stream it "
    "(--stream always): streaming is the way to let a model think longer than --timeout"
)
FIRST_BYTE = (
    ": streamed, nothing of the reply arrived: a model may send nothing while it thinks before its "
    "first token (OpenAI's Chat Completions streams no reasoning), so give a --timeout longer than "
    "its longest time to first token at the effort you run"
)
ERROR_BYTES = 64 << 10  # what is read of an error reply


def same_origin(url: str | yarl.URL, base: str | yarl.URL) -> bool:
    """Whether ``url`` is at ``base``'s origin (scheme, host and port): the only address an API key
    is sent to."""
    a, b = yarl.URL(str(url)), yarl.URL(str(base))
    return a.is_absolute() and b.is_absolute() and a.origin() == b.origin()


def redirected(
    status: int, headers: Mapping[str, str], what: str, secrets: tuple[bytes, ...] = ()
) -> ProviderStop:
    """The stop a 3xx reply means: a redirect is never followed (``post`` and every request with a
    key: ``allow_redirects=False``), since following it would send the request, and the headers
    that carry the key, to an address the user never named. ProviderStop (cause ``REDIRECT``: every
    request to that base URL would meet it) naming the target (``Location``, the key redacted)."""
    location = next((v for k, v in headers.items() if k.lower() == "location"), "")
    target = redact(location.encode(), secrets).decode("utf-8", "replace")[:300]
    return ProviderStop(
        f"{what}: HTTP {status}: the server redirects to {target or '(no Location given)'}; not "
        "followed (a request, and its API key, is only sent to the base URL named); if that "
        "address is the API's, name it as the base URL",
        REDIRECT,
        status,
    )


def error_for(
    status: int,
    payload: bytes,
    headers: Mapping[str, str],
    what: str,
    retry_after_from_body: Callable[[bytes], float | None] | None = None,
    secrets: tuple[bytes, ...] = (),
) -> AdapterError:
    """The error a non-2xx reply means (``payload``: its body, redacted already): a redirect (3xx)
    stops the provider (``redirected``, ``secrets`` redacted from its target); ProviderStop for
    what every request to the provider would meet alike (``provider_errors.provider_stop``),
    RateLimited (429, 529, and 503 with a Retry-After, with that wait, or the one
    ``retry_after_from_body`` reads from the body), Transient (408, 409, 425, other 5xx) or Fatal
    (other 4xx, with what to check), as ``errors.status_kind`` classifies them; ``x-should-retry``
    as ``post`` describes. The one reading of an error reply: ``post`` and the batch calls
    (``adapters.batches``)."""
    if 300 <= status < 400:
        return redirected(status, headers, what, secrets)
    snippet = _snippet(payload)
    stop = provider_stop(status, payload, what, snippet, reply_time(headers))
    if stop is not None:
        return stop
    should_retry = headers.get("x-should-retry", "").strip().lower()
    wait = rate_limit_wait(headers) if status == 503 else None
    kind = status_kind(status, wait is not None, should_retry)  # the one table: adapters.errors
    if kind is RateLimited:  # a 503 that says when to come back is a rate limit
        error: Retryable = rate_limited(
            f"{what}: HTTP {status} rate limited: {snippet}", headers, status
        )
        if error.retry_after is None and retry_after_from_body is not None:
            error.retry_after = retry_after_from_body(payload)
    elif kind is Transient:
        error = Transient(f"{what}: HTTP {status}: {snippet}", status)
    else:
        hint = {
            400: "check the model's parameters and that the server supports this request",
            422: "check the request and model",
        }.get(status, "check the request and model")
        if status == 400 and prompt_too_long(error_doc(payload)):
            hint = TOO_LONG
        return Fatal(f"{what}: HTTP {status} ({hint}): {snippet}", status)
    if should_retry == "false":
        error.should_retry = False
        error.args = (f"{error} (x-should-retry: false: not retried in this run)",)
    return error


async def post(
    client: aiohttp.ClientSession,
    url: str | yarl.URL,
    body: bytes,
    headers: dict[str, str],
    what: str,
    retry_after_from_body: Callable[[bytes], float | None] | None = None,
    secrets: tuple[bytes, ...] = (),
    max_bytes: int = DEFAULT_MAX_REPLY_BYTES,
    method: str = "POST",
) -> bytes:
    """POST ``body`` to ``url`` (or another ``method``: the batch APIs' GET) and return the response
    body of a 2xx (read by ``read_body``: at most ``max_bytes``, else ReplyTooLarge).

    ``what`` names the model in messages. Raises ProviderStop for what every request to the provider
    would meet alike (``provider_errors.provider_stop``: an exhausted quota, a refused key, an
    unknown model, a refused form of request; a redirect, never followed: ``redirected``),
    RateLimited (429, 529, and 503 with a Retry-After, with that wait, or the one
    ``retry_after_from_body`` reads from the error body when the header is absent), Transient (408,
    409, 425, other 5xx, timeouts, connection errors, a damaged compressed body; Unreachable when no
    connection could be opened at all) or Fatal (other 4xx, with what to check): ``error_for``.
    ``x-should-retry: false`` (the OpenAI and Anthropic SDKs' header) makes a retryable failure
    final for this run; ``true`` makes another 4xx retryable. Messages never include the request
    headers, and ``secrets`` (the API key the headers carry, ``secrets_in(headers)``, computed once
    per adapter) are redacted from every body returned or quoted.

    Sent by ``HTTPAdapter.transmit`` (an attempt's ``Progress`` in ``ATTEMPT``), a 2xx reply whose
    body began to arrive and was then cut is final for this run: ``began_whole``.
    """
    progress = ATTEMPT.get()
    try:
        async with client.request(
            method, url, data=body, headers=headers, allow_redirects=False
        ) as resp:
            status = resp.status
            try:
                payload = redact(
                    await read_body(resp, max_bytes if status < 300 else ERROR_BYTES, what), secrets
                )
            except ReplyTooLarge as exc:
                exc.prefix = redact_prefix(exc.prefix, secrets)
                if status < 300:
                    raise
                payload = exc.prefix  # an error body that large: its start says enough
            except BaseException:  # (also the cancellation of --max-reply-time)
                began_whole(progress, resp)
                raise
            if status < 300:
                return payload
            raise error_for(status, payload, resp.headers, what, retry_after_from_body, secrets)
    except aiohttp.ClientResponseError as exc:
        raise Transient(f"{what}: {transport_failure(exc, secrets)}", exc.status) from None
    except aiohttp.ClientSSLError as exc:  # a connection opened, refused by TLS: not an outage
        raise Transient(f"{what}: {transport_failure(exc, secrets)}") from None
    except (
        aiohttp.ClientConnectorError,
        aiohttp.ConnectionTimeoutError,
    ) as exc:  # the server was not reached
        raise Unreachable(f"{what}: {transport_failure(exc, secrets)}") from None
    except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, TimeoutError) as exc:
        if progress is not None and progress.began:
            raise cut_stream(what, progress, cut_failure(exc, secrets)) from None
        idle = isinstance(exc, aiohttp.SocketTimeoutError)
        raise (IdleTimeout if idle else Transient)(
            f"{what}: {transport_failure(exc, secrets)}"
        ) from None


ATTEMPT: contextvars.ContextVar[Progress | None] = contextvars.ContextVar("attempt", default=None)
"""The ``Progress`` of the attempt this task is sending, set by ``HTTPAdapter.transmit`` around
``send`` (whose signature carries none), so that ``post`` notes a reply that began to arrive; None
outside an attempt (the batch APIs' calls)."""


def began_whole(progress: Progress | None, resp: aiohttp.ClientResponse) -> None:
    """Note in ``progress`` whether a reply sent whole (not streamed) that failed while its body
    was read had begun: a 2xx whose body had at least one byte arrive (after its status line and
    headers; ``received`` the body bytes that arrived, as sent, before any decoding). Its model
    was generating, and the provider billing, it: a cut then (the connection drops, no byte for
    ``--timeout``, ``--max-reply-time`` passes) is final for this run, as a cut stream is
    (``cut_stream``). A body that arrived whole is judged by what it holds instead (damaged
    compression, not the wire format, an error inside a 200: retried)."""
    if progress is not None and resp.status < 300:
        progress.received = resp.content.total_bytes
        progress.began = progress.received > 0


def _decoder(resp: aiohttp.ClientResponse, what: str) -> Any:
    """A zlib decoder for ``resp``'s ``Content-Encoding`` (gzip or deflate), None for none;
    Transient for an encoding not asked for."""
    encoding = resp.headers.get("Content-Encoding", "").strip().lower()
    if encoding in ("", "identity"):
        return None
    if encoding in ("gzip", "x-gzip", "deflate"):
        return zlib.decompressobj(_WBITS)
    raise Transient(
        f"{what}: a reply in Content-Encoding {encoding!r}, which was not asked for", resp.status
    )


CUT = (
    "{what}: the {form} was cut after {size:,} bytes had arrived, {seconds:.1f} s after it was "
    "sent ({why}); its partial text is never scored. Not sent again in this run (the part that "
    "arrived was billed): the next run requests it again"
)


def cut_stream(what: str, progress: Progress, why: str) -> Transient:
    """The failure of a reply that ended (``why``) after part of it arrived (a streamed reply's
    first event; a reply sent whole: a byte of its body, ``began_whole``): Transient with
    ``should_retry`` False (stored as a transient failure; the next run sends the request again) and
    no status (no whole reply came: the cost bound charges the attempt its reservation,
    ``runner.sending.cost.Charge.settle``). Its words say how many bytes arrived, how long after
    the request was sent."""
    form = "streamed reply" if progress.streamed else "reply"
    seconds = max(0.0, time.perf_counter() - progress.started)
    error = Transient(
        CUT.format(what=what, form=form, size=progress.received, seconds=seconds, why=why)
    )
    error.should_retry = False
    return error


def cut_failure(exc: BaseException, secrets: tuple[bytes, ...] = ()) -> str:
    """Why a reply was cut, in words (``transport_failure``): after part of it arrived, the idle
    timeout is no further byte for that long."""
    if isinstance(exc, aiohttp.SocketTimeoutError):
        return "no further byte within the idle timeout (--timeout)"
    return transport_failure(exc, secrets)


async def post_stream(
    client: aiohttp.ClientSession,
    url: str | yarl.URL,
    body: bytes,
    headers: dict[str, str],
    what: str,
    assembler: Assembler,
    progress: Progress,
    retry_after_from_body: Callable[[bytes], float | None] | None = None,
    secrets: tuple[bytes, ...] = (),
    max_bytes: int = DEFAULT_MAX_REPLY_BYTES,
) -> bytes:
    """POST a streamed request and return its reply assembled from the server-sent events by
        ``assembler`` (``adapters.streaming``): the bytes a non-streamed request returns, redacted of
        ``secrets``. ``progress`` notes what arrived (``began``, ``first_token``, ``received``).

        A status other than 2xx raises as ``post`` does (``error_for``); a 2xx that is not
        ``text/event-stream`` (a server that answered whole) is read as ``post`` reads it (begun once
        a byte of its body arrived: ``began_whole``). The session's
        read timeout is an idle timeout: a reply that keeps arriving is read for as long as it takes.
        Once part of the reply arrived (its first event), a failure (no byte for the idle timeout, a
        broken connection, an error event, a stream that ends before its stop) is final for this run
        (``cut_stream``); before, it is retried as ``post``'s (IdleTimeout for no byte within the idle
    timeout). A stream past ``max_bytes`` raises
        ReplyTooLarge with its first bytes."""
    try:
        async with client.request(
            "POST", url, data=body, headers=headers, allow_redirects=False
        ) as resp:
            status = resp.status
            kind = resp.headers.get("Content-Type", "").lower()
            if status >= 300 or "text/event-stream" not in kind:  # an error, or a whole reply
                bound = max_bytes if status < 300 else ERROR_BYTES
                try:
                    payload = redact(await read_body(resp, bound, what), secrets)
                except ReplyTooLarge as exc:
                    exc.prefix = redact_prefix(exc.prefix, secrets)
                    if status < 300:
                        raise
                    payload = exc.prefix
                except BaseException:  # (also the cancellation of --max-reply-time)
                    began_whole(progress, resp)
                    raise
                if status < 300:
                    progress.received = len(payload)
                    return payload
                raise error_for(status, payload, resp.headers, what, retry_after_from_body, secrets)
            decoder, parser, prefix = _decoder(resp, what), SSEParser(), bytearray()
            size = 0
            try:
                async for chunk in resp.content.iter_any():
                    # at most what the bound leaves (+1): a small compressed chunk may expand
                    # enormously; fewer bytes mean the chunk was decoded whole
                    room = max_bytes + 1 - size
                    data = chunk if decoder is None else decoder.decompress(chunk, room)
                    size += len(data)
                    progress.received = size
                    if len(prefix) < PREFIX_BYTES:
                        prefix.extend(data[: PREFIX_BYTES - len(prefix)])
                    if size > max_bytes:
                        resp.close()
                        raise ReplyTooLarge(
                            f"reply larger than {max_bytes} bytes",
                            redact_prefix(bytes(prefix), secrets),
                            max_bytes,
                            status,
                        )
                    for event, text in parser.feed(data):
                        if assembler.feed(event, text) and progress.first_token is None:
                            progress.first_token = time.perf_counter()
                        progress.began = assembler.began
                        if assembler.ended:  # [DONE] or an error: nothing after it is read
                            break
                    if assembler.ended:
                        break
                for event, text in [] if assembler.ended else parser.close():
                    assembler.feed(event, text)
                    if assembler.ended:
                        break
            except MalformedReply as exc:  # its text is the raw event's: redacted
                exc.args = (_redacted(str(exc), secrets),)
                exc.raw = None if exc.raw is None else _redacted(exc.raw, secrets)
                if progress.began:
                    raise cut_stream(what, progress, f"an event that is not JSON: {exc}") from None
                raise
            except (
                aiohttp.ClientConnectionError,
                aiohttp.ClientPayloadError,
                TimeoutError,
                zlib.error,
            ) as exc:
                if progress.began:
                    raise cut_stream(what, progress, cut_failure(exc, secrets)) from None
                raise
            if assembler.error is not None:
                if progress.began:
                    # the event is the provider's raw words: an echoed key is redacted
                    why = _redacted(f"an error event: {body_error(assembler.error)}", secrets)
                    raise cut_stream(what, progress, why)
                # an error before any of the reply: decoded as an error inside a 200 (retried)
                return redact(assembler.body(), secrets)
            if not assembler.complete:
                if progress.began:
                    raise cut_stream(what, progress, "the stream ended before its stop")
                raise Transient(
                    f"{what}: the streamed reply ended before any event of the reply", status
                )
            return redact(assembler.body(), secrets)
    except aiohttp.ClientResponseError as exc:
        raise Transient(f"{what}: {transport_failure(exc, secrets)}", exc.status) from None
    except aiohttp.ClientSSLError as exc:
        raise Transient(f"{what}: {transport_failure(exc, secrets)}") from None
    except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
        raise Unreachable(f"{what}: {transport_failure(exc, secrets)}") from None
    except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, TimeoutError) as exc:
        if progress.began:  # a whole reply (the switch ignored) cut after its body began
            raise cut_stream(what, progress, cut_failure(exc, secrets)) from None
        idle = isinstance(exc, aiohttp.SocketTimeoutError)  # before any of the reply: as post's
        raise (IdleTimeout if idle else Transient)(
            f"{what}: {transport_failure(exc, secrets)}"
        ) from None


def transport_failure(exc: BaseException, secrets: tuple[bytes, ...] = ()) -> str:
    """A transport failure in words, ``secrets`` redacted (aiohttp quotes the bytes it could not
    parse: a status line, a header, a chunk size, which a server can make the key); a read that
    waited longer than the idle timeout says so."""
    if isinstance(exc, aiohttp.SocketTimeoutError):
        return IDLE
    text = exc.message if isinstance(exc, aiohttp.ClientResponseError) else exc
    return _redacted(f"{type(exc).__name__}: {text}".rstrip(": "), secrets)


async def _stop_if_failed(token: Awaitable[str]) -> str:
    """The token an ``api_key_command`` gives; its failure mid-run (``Fatal``) stops the provider,
    as a refused key does."""
    try:
        return await token
    except Fatal as exc:
        raise ProviderStop(str(exc), KEY) from None


def not_counts(
    block: Any, keys: Iterable[str], where: str, optional: Iterable[str] = ()
) -> list[str]:
    """The counts among ``keys`` that the usage block ``block`` (a JSON object; anything else
    states none) states but that are not a count of tokens (not ``as_count``: a string, a fraction,
    a boolean, null, Infinity, a number below 0), each as ``WHERE.KEY VALUE`` (the value as JSON,
    cut at 40 characters): what ``Reply.usage_problem`` names. A count left out is not named (a
    provider may leave one out: Gemini leaves out a count of 0); nor is a sub-count in ``optional``
    (cached, cache writes, reasoning or thoughts: a part of a main count) that is ``null``: the
    providers' SDKs type those as optional and gateways write ``"cached_tokens": null``, which
    states nothing, as the count left out does (read as 0). A main count (input, output) that is
    ``null`` is named: without it the reply's cost is unknown."""
    if not isinstance(block, Mapping):
        return []
    optional = frozenset(optional)
    return [
        f"{where}.{key} {json.dumps(block[key], default=str)[:40]}"
        for key in keys
        if key in block
        and as_count(block[key]) is None
        and not (block[key] is None and key in optional)
    ]


async def check_reachable(url: str, what: str, timeout_s: float = 10.0) -> None:
    """Open and close a TCP connection to ``url``'s host and port, sending nothing; raises
    ProviderStop (cause ``UNREACHABLE``) naming ``what`` and the URL when the host name does not
    resolve, the connection is refused, or it does not open within ``timeout_s`` seconds. A server
    down (or no network) at the start of a run stops its provider at once (``runner.sending.stops``;
    the others run), rather than every request retrying to the end of its budget."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        async with asyncio.timeout(timeout_s):
            _, writer = await asyncio.open_connection(parts.hostname, port)
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    except OSError as exc:  # also socket.gaierror and TimeoutError
        reason = (
            f"no connection within {timeout_s:g} s"
            if isinstance(exc, TimeoutError)
            else f"{type(exc).__name__}: {exc}"
        )
        raise ProviderStop(
            f"{what}: cannot reach {url} ({reason}); check the base URL, that the server is running, "
            "and the network",
            UNREACHABLE,
        ) from None


class HTTPAdapter(Adapter):
    """A model behind an HTTP API: ``POST {base_url}{path}`` with a JSON body.

    Subclasses set ``kind``, ``default_base_url``, ``path``, ``api_key_env`` (the environment
    variable the key is read from, or ``API_KEY_ENVS``, several tried in order; the option
    ``api_key_env`` names another; the option ``api_key_command`` gives a command that prints an
    expiring token instead, ``adapters.credentials``), ``auth_headers`` and ``encode``/``decode``.
    ``DEFAULT_PARAMS`` are merged under the user's sampling parameters; ``RESERVED`` are body fields
    the adapter sets itself, which parameters may not replace. The cache key's endpoint is the full
    URL, so one model name on two servers never shares cache rows; the key is only in headers.

    Raises ValueError (bad model string, unknown option, reserved parameter) from the constructor,
    Fatal from ``start`` when the key's environment variable is unset (except for a loopback base
    URL), and ProviderStop (cause ``UNREACHABLE``) when the server cannot be reached
    (``check_reachable``).
    """

    default_base_url = ""
    path = ""
    api_key_env = ""
    API_KEY_ENVS: tuple[
        str, ...
    ] = ()  # several variables, the first set wins (default: ``api_key_env``)
    takes_params = True
    own_timeout = True  # the session's read timeout is the idle timeout; transmit bounds the reply
    OPTIONS: frozenset[str] = frozenset({"api_key_env", "api_key_command"})
    DEFAULT_PARAMS: dict[str, Any] = {}
    RESERVED: frozenset[str] = frozenset({"model"})

    def __init__(self, spec: ModelSpec, limits: Limits | None = None):
        super().__init__(spec, limits)
        unknown = sorted(set(spec.options) - self.OPTIONS)
        if unknown:
            raise ValueError(
                f"{self.kind}: unknown option(s) {', '.join(unknown)}; known: {', '.join(sorted(self.OPTIONS))}"
            )
        clash = sorted(set(self.params) & self.RESERVED)
        if clash:
            raise ValueError(
                f"{self.kind}: the parameter(s) {', '.join(clash)} are set by the adapter itself"
            )
        params = self.apply_effort(self.params, spec.effort) if spec.effort else self.params
        self.params = canonical_params(self.default_params(spec.model or "", params) | params)
        self.base_url = (spec.base_url or self.default_base_url).rstrip("/")
        given = spec.options.get("api_key_env")
        self.key_envs: tuple[str, ...] = (
            (str(given),) if given else (self.API_KEY_ENVS or (self.api_key_env,))
        )
        command = spec.options.get("api_key_command")
        self.key_command = KeyCommand(command, self.label) if command else None
        self._session: aiohttp.ClientSession | None = None
        self._headers: dict[str, str] = {}
        self._secrets: tuple[bytes, ...] = ()
        self.check_model()

    def default_params(self, model: str, params: dict) -> dict:
        """The parameters merged under the user's ``params`` (which win): ``DEFAULT_PARAMS``; an
        adapter whose default output budget depends on the model and its effort overrides this
        (``adapters.budgets``)."""
        return dict(self.DEFAULT_PARAMS)

    def check_model(self) -> None:
        """Raise ValueError when the model string names no model."""
        if not self.model:
            raise ValueError(f"name the model: {self.kind}:MODEL[@BASE_URL], e.g. {self.kind}:NAME")

    @property
    def url(self) -> str:
        return self.base_url + self.path

    @property
    def endpoint(self) -> str:  # type: ignore[override]
        return self.url

    @property
    def limits_key(self) -> str:
        return f"{self.kind}@{self.base_url}"

    def auth_headers(self, key: str) -> dict[str, str]:
        """The headers that carry the API key (default: ``Authorization: Bearer``)."""
        return {"Authorization": f"Bearer {key}"}

    def extra_headers(self) -> dict[str, str]:
        """Headers every request carries besides the key."""
        return {}

    @property
    def key_env(self) -> str:
        """The environment variable the key is read from: the first of ``key_envs`` that is set
        (else the first)."""
        return next((e for e in self.key_envs if e and os.environ.get(e)), self.key_envs[0])

    def missing_setup(self) -> str | None:
        if (
            self.key_command is not None
            or (os.environ.get(self.key_env) if self.key_env else None)
            or is_loopback(self.base_url)
        ):
            return None
        main = self.api_key_env if self.api_key_env in self.key_envs else self.key_envs[0]
        others = [e for e in self.key_envs if e != main]
        names = main + (f" (or {' or '.join(others)})" if others else "")
        return (
            f"{self.label}: the environment variable {names} is not set; export the API key "
            f"for {self.base_url} as {main} (or name another variable with --option api_key_env=NAME, "
            "or give a command that prints a token: api_key_command)"
        )

    async def start(self) -> None:
        problem = self.missing_setup()
        if problem:
            raise Fatal(problem)
        await self.check_reachable()
        key = os.environ.get(self.key_env) if self.key_env else None
        if self.key_command is not None:
            key = (
                await self.key_command.token()
            )  # Fatal when the command fails: the run does not start
        self._headers = {
            "Content-Type": "application/json",
            **self.extra_headers(),
            **(self.auth_headers(key) if key else {}),
        }
        self._secrets = secrets_in(self._headers)
        self._session = session(self.limits.max_in_flight, self.limits.attempt_timeout_s)

    async def check_reachable(self) -> None:
        if self.base_url:  # (a local server's is known once started)
            await check_reachable(self.base_url, self.label)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def request(self, payload: Any, sample: int) -> Request:
        """The Request for a JSON ``payload`` (serialised as built: keys never sorted)."""
        return Request(
            self.kind, self.model, self.endpoint, orjson.dumps(payload), sample, self.params_key
        )

    def retry_after_from_body(self, body: bytes) -> float | None:
        """The wait a rate-limit error body asks for, when the provider puts it there (None: not
        given)."""
        return None

    async def post(self, body: bytes, url: str | None = None) -> bytes:
        """POST ``body`` to ``url`` (default ``self.url``) with this adapter's headers. With an
        ``api_key_command``, the current token is sent, and a 401 runs the command again and sends
        once more with the new token (a second 401 stops the provider as a refused key does); a
        command that fails then stops the provider (``ProviderStop``, the key refused)."""
        return await self._keyed(
            lambda headers, secrets: post(
                self._session,
                url or self.url,
                body,
                headers,
                self.label,
                self.retry_after_from_body,
                secrets,
                self.limits.max_reply_bytes,
            )
        )

    async def _keyed(
        self, call: Callable[[dict[str, str], tuple[bytes, ...]], Awaitable[bytes]]
    ) -> bytes:
        """``call(headers, secrets)`` with this adapter's headers and the secrets to redact, under
        the ``api_key_command`` rule of ``post``."""
        if self._session is None:
            raise RuntimeError(f"{type(self).__name__}.send() before start()")
        if self.key_command is None:
            return await call(self._headers, self._secrets)
        command = self.key_command
        token = await _stop_if_failed(command.token())
        for attempt in (1, 2):
            try:
                headers = {**self._headers, **self.auth_headers(token)}
                return await call(headers, self._secrets + command.secrets)
            except ProviderStop as exc:
                if exc.status != 401 or attempt == 2:
                    raise
            token = await _stop_if_failed(command.refresh(token))
        raise AssertionError("unreachable")

    async def send(self, request: Request) -> bytes:
        return await self.post(request.body)

    # ---- streaming (adapters.streaming) ----
    def assembler(self) -> Assembler | None:
        """A new assembler of this adapter's streamed replies; None when it has no streamed form
        (the default)."""
        return None

    def stream_body(self, body: bytes) -> bytes:
        """The body of the streamed form of a request whose canonical (non-streamed) body is
        ``body``."""
        return body

    @property
    def stream_url(self) -> str:
        """Where the streamed form of a request is sent (default ``url``)."""
        return self.url

    def streams(self, request: Request) -> bool:
        """Whether ``request`` is sent streamed: ``Limits.stream`` ``always``, or ``auto`` and
        ``long_reply``; never for an adapter without a streamed form. Raises ValueError for another
        mode."""
        mode = self.limits.stream
        if mode not in STREAM_MODES:
            raise ValueError(f"stream {mode!r} is not one of {', '.join(STREAM_MODES)}")
        if mode == "never" or self.assembler() is None:
            return False
        return mode == "always" or self.long_reply(request)

    async def transmit(self, request: Request, progress: Progress) -> bytes:
        """Send ``request``, streamed when ``streams`` says so (its reply assembled into the
        non-streamed form), within ``Limits.max_reply_time_s``: a reply not whole by then ends the
        attempt, final for this run when part of it had arrived (``cut_stream``), else a Transient
        retried as any. A streamed request refused for its streaming fields stops the model, saying
        to run it with ``--stream never`` (``provider_errors.streaming_refused``)."""
        progress.streamed = self.streams(request)
        bound = self.limits.max_reply_time_s
        try:
            async with asyncio.timeout(bound):
                if not progress.streamed:
                    attempt = ATTEMPT.set(progress)  # post notes a reply that began (began_whole)
                    try:
                        return await self.send(request)
                    except IdleTimeout as exc:
                        if self.assembler() is not None:  # it has a streamed form: say so
                            exc.args = (f"{exc}{WHOLE_REPLY}",)
                        raise
                    finally:
                        ATTEMPT.reset(attempt)
                body = self.stream_body(request.body)
                try:
                    return await self._keyed(
                        lambda headers, secrets: post_stream(
                            self._session,
                            self.stream_url,
                            body,
                            headers,
                            self.label,
                            self.assembler(),
                            progress,
                            self.retry_after_from_body,
                            secrets,
                            self.limits.max_reply_bytes,
                        )
                    )
                except IdleTimeout as exc:  # silent past --timeout before its first event
                    exc.args = (f"{exc}{FIRST_BYTE}",)
                    raise
        except (ProviderStop, Fatal) as exc:
            if (stop := streaming_refused(exc)) is not None:
                raise stop from None
            raise
        except TimeoutError:
            why = f"the reply took longer than --max-reply-time {bound:g} s"
            if progress.began:
                raise cut_stream(self.label, progress, why) from None
            raise Transient(f"{self.label}: {why}") from None
