"""HTTP plumbing shared by the network adapters: one POST that maps statuses to the error tree."""
from __future__ import annotations

import contextlib
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

import aiohttp

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


def session(max_in_flight: int, attempt_timeout_s: float) -> aiohttp.ClientSession:
    """A client session whose connection pool matches the provider's in-flight limit, with a per-read
    timeout and no total timeout (a long run is never cut off by aiohttp's 5-minute default)."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=max(1, max_in_flight)),
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=attempt_timeout_s),
    )


def _snippet(payload: bytes) -> str:
    return payload[:300].decode("utf-8", "replace")


async def post(client: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str],
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
                raise RateLimited(f"{what}: HTTP {status} rate limited: {_snippet(payload)}",
                                  parse_retry_after(resp.headers.get("Retry-After")), status)
            if status in RETRYABLE_STATUSES or status >= 500:
                raise Transient(f"{what}: HTTP {status}: {_snippet(payload)}", status)
            hint = {401: "check the API key's environment variable", 403: "check the key's permissions",
                    404: "check the base URL and the model name"}.get(status, "check the request and model")
            raise Fatal(f"{what}: HTTP {status} ({hint}): {_snippet(payload)}", status)
    except aiohttp.ClientResponseError as exc:
        raise Transient(f"{what}: {type(exc).__name__}: {exc.message}", exc.status) from None
    except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, TimeoutError) as exc:
        raise Transient(f"{what}: {type(exc).__name__}: {exc}".rstrip(": ")) from None
