"""HTTP plumbing shared by the network adapters: one POST that maps statuses to the error tree, and
reading a 429's headers (how long to wait; the provider's own limits)."""
from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

import aiohttp
import yarl

from .errors import Fatal, RateLimited, Transient

RETRYABLE_STATUSES = frozenset({408, 409, 425, 429, 500, 502, 503, 504, 529})


def parse_retry_after(value: str | None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header: delta-seconds ("7", "1.5") or an HTTP date.
    Returns None when absent or unparseable; never negative."""
    if value is None:
        return None
    with contextlib.suppress(TypeError, ValueError):
        return max(0.0, float(value))
    with contextlib.suppress(TypeError, ValueError, IndexError):
        when = parsedate_to_datetime(value)
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        return max(0.0, (when - datetime.now(UTC)).total_seconds())
    return None


_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ms|h|m|s)")
_EPOCH = 1e9  # a bare number above this is a Unix time, not a number of seconds


def parse_reset(value: str | None) -> float | None:
    """Seconds until a rate-limit window resets, from a reset header: a duration as OpenAI sends it
    (``"20ms"``, ``"1s"``, ``"6m0s"``, ``"1h2m3.5s"``), a bare number of seconds, a Unix time, or an
    RFC 3339 / HTTP date (Anthropic's ``anthropic-ratelimit-*-reset``). None when absent or unreadable;
    never negative."""
    if value is None:
        return None
    text = value.strip()
    with contextlib.suppress(ValueError):
        number = float(text)
        return max(0.0, number - time.time() if number > _EPOCH else number)
    parts = _DURATION.findall(text)
    if parts and "".join(n + u for n, u in parts) == text:
        scale = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
        return sum(float(n) * scale[u] for n, u in parts)
    with contextlib.suppress(ValueError):
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        return max(0.0, (when - datetime.now(UTC)).total_seconds())
    return parse_retry_after(text)


# (reset header, the matching "remaining" header): OpenAI-compatible servers, then Anthropic
_RESETS = (("x-ratelimit-reset-requests", "x-ratelimit-remaining-requests"),
           ("x-ratelimit-reset-tokens", "x-ratelimit-remaining-tokens"),
           ("anthropic-ratelimit-requests-reset", "anthropic-ratelimit-requests-remaining"),
           ("anthropic-ratelimit-tokens-reset", "anthropic-ratelimit-tokens-remaining"),
           ("anthropic-ratelimit-input-tokens-reset", "anthropic-ratelimit-input-tokens-remaining"),
           ("anthropic-ratelimit-output-tokens-reset", "anthropic-ratelimit-output-tokens-remaining"))


def rate_limit_wait(headers: Mapping[str, str]) -> float | None:
    """Seconds a 429's headers ask us to wait, in order of precedence: ``retry-after-ms``
    (milliseconds), ``Retry-After`` (seconds or an HTTP date), then the reset headers
    (``x-ratelimit-reset-requests`` / ``-tokens``, ``anthropic-ratelimit-*-reset``): of those whose
    ``remaining`` is 0 the longest, else the longest of all. None when no header says."""
    h = {k.lower(): v for k, v in headers.items()}
    with contextlib.suppress(KeyError, ValueError):
        return max(0.0, float(h["retry-after-ms"]) / 1000)
    if (wait := parse_retry_after(h.get("retry-after"))) is not None:
        return wait
    resets = [(parse_reset(h.get(reset)), h.get(remaining, "").strip() == "0") for reset, remaining in _RESETS]
    exhausted = [w for w, empty in resets if w is not None and empty]
    known = exhausted or [w for w, _ in resets if w is not None]
    return max(known) if known else None


def rate_limit_quota(headers: Mapping[str, str]) -> tuple[float | None, float | None]:
    """The provider's own (requests per minute, tokens per minute) from ``x-ratelimit-limit-requests``
    / ``-tokens`` or ``anthropic-ratelimit-requests-limit`` / ``-tokens-limit``; None where not stated.
    (Some providers state a per-day request limit here: the runner treats these figures as ceilings only,
    and still slows down on every 429.)"""
    h = {k.lower(): v for k, v in headers.items()}

    def number(*names: str) -> float | None:
        for name in names:
            with contextlib.suppress(KeyError, ValueError):
                value = float(h[name])
                if value > 0:
                    return value
        return None

    return (number("x-ratelimit-limit-requests", "anthropic-ratelimit-requests-limit"),
            number("x-ratelimit-limit-tokens", "anthropic-ratelimit-tokens-limit"))


def rate_limited(message: str, headers: Mapping[str, str], status: int = 429) -> RateLimited:
    """The RateLimited error for a 429 (or 529) response with these headers."""
    rpm, tpm = rate_limit_quota(headers)
    return RateLimited(message, rate_limit_wait(headers), status, rpm=rpm, tpm=tpm)


def session(max_in_flight: int, attempt_timeout_s: float) -> aiohttp.ClientSession:
    """A client session whose connection pool matches the provider's in-flight limit, with a per-read
    timeout and no total timeout (a long run is never cut off by aiohttp's 5-minute default)."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=max(1, max_in_flight)),
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=attempt_timeout_s),
    )


def _snippet(payload: bytes) -> str:
    return payload[:300].decode("utf-8", "replace")


async def post(client: aiohttp.ClientSession, url: str | yarl.URL, body: bytes, headers: dict[str, str],
               what: str) -> bytes:
    """POST ``body`` to ``url`` and return the response body of a 2xx.

    ``what`` names the model in messages. Raises RateLimited (429, 529, with Retry-After), Transient
    (408, 409, 425, 5xx, timeouts, connection errors) or Fatal (other 4xx, with what to check). Messages
    never include the request headers.
    """
    try:
        async with client.post(url, data=body, headers=headers) as resp:
            payload = await resp.read()
            status = resp.status
            if status < 300:
                return payload
            if status in (429, 529):
                raise rate_limited(f"{what}: HTTP {status} rate limited: {_snippet(payload)}", resp.headers, status)
            if status in RETRYABLE_STATUSES or status >= 500:
                raise Transient(f"{what}: HTTP {status}: {_snippet(payload)}", status)
            hint = {401: "check the API key's environment variable", 403: "check the key's permissions",
                    404: "check the base URL and the model name"}.get(status, "check the request and model")
            raise Fatal(f"{what}: HTTP {status} ({hint}): {_snippet(payload)}", status)
    except aiohttp.ClientResponseError as exc:
        raise Transient(f"{what}: {type(exc).__name__}: {exc.message}", exc.status) from None
    except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, TimeoutError) as exc:
        raise Transient(f"{what}: {type(exc).__name__}: {exc}".rstrip(": ")) from None
