"""The adapter error tree. Adapters classify; the runner alone decides to retry (``runner/retry.py``).

    AdapterError
    ├── Retryable                  retried with backoff; if retries run out, stored as a transient
    │   │                          failure and requested again on the next run
    │   ├── RateLimited            HTTP 429 (and Anthropic 529): ``retry_after`` seconds when given
    │   └── Transient              5xx, 408, timeouts, connection errors
    │       └── MalformedReply     a body that is not the wire format (not JSON, no ``answers``)
    └── Fatal                      400/401/403/404/422 and other 4xx, unknown model, missing key:
                                   never retried; stored as a deterministic failure (kept on rerun)

Messages carry the status and at most 300 bytes of the response body, never request headers, so an
API key cannot leak into the cache, logs or reports.
"""
from __future__ import annotations


class AdapterError(Exception):
    """Base of every error an adapter raises. ``status`` is the HTTP status when there was one."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


class Retryable(AdapterError):
    """A failure worth retrying."""


class RateLimited(Retryable):
    """The provider asked us to slow down. ``retry_after`` (seconds) is the provider's own wait, if given
    (``Retry-After``, ``retry-after-ms`` or a rate-limit reset header); ``rpm`` / ``tpm`` are the
    provider's own requests / tokens per minute, when its headers state them (``x-ratelimit-limit-*``)."""

    def __init__(self, message: str, retry_after: float | None = None, status: int | None = 429,
                 rpm: float | None = None, tpm: float | None = None):
        super().__init__(message, status)
        self.retry_after = retry_after
        self.rpm, self.tpm = rpm, tpm


class Transient(Retryable):
    """A server error, timeout or broken connection."""


class MalformedReply(Transient):
    """The body is not the provider's wire format (e.g. not JSON). ``raw`` holds the text received."""

    def __init__(self, message: str, raw: str | None = None, status: int | None = None):
        super().__init__(message, status)
        self.raw = raw


class Fatal(AdapterError):
    """A deterministic failure (bad request, auth, unknown model): fails fast, never retried."""
