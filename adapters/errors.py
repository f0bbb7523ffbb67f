"""The adapter error tree. Adapters classify; the runner alone decides to retry (``runner/retry.py``).

    AdapterError
    ├── Retryable                  retried with backoff; if retries run out, stored as a transient
    │   │                          failure and requested again on the next run
    │   ├── RateLimited            HTTP 429 (and Anthropic 529): ``retry_after`` seconds when given
    │   └── Transient              5xx, 408, timeouts, connection errors
    │       ├── MalformedReply     a body that is not the wire format (not JSON, no ``answers``), an
    │       │                      error inside a 200, a compressed body cut before its trailer
    │       └── Unreachable        no connection could be opened (refused, no route, a name that does not
    │                              resolve, none within the connect timeout): the server was not reached;
    │                              when every attempt meets it the runner pauses the provider and probes it
    ├── Fatal                      400/422 and other 4xx for this request alone: never retried; stored as a
    │                              deterministic failure (kept on rerun)
    ├── ProviderStop               a failure every request to this provider would meet alike: quota or
    │                              spend limit exhausted, key refused (401/403), a stated wait longer than
    │                              the run accepts, a server that cannot be reached (at start, or for longer
    │                              than the run waits); or to this model alone (``scope`` "model"): unknown
    │                              model (404), a 400 for a schema or parameter it does not support. The
    │                              runner stops sending to that provider or model (``runner.stops``); the
    │                              request is not stored, so the next run sends it
    └── ReplyTooLarge              the reply passed ``Limits.max_reply_bytes``: read no further, stored
                                   ``invalid`` with a bounded prefix

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
    """A failure worth retrying. ``should_retry`` False (the provider said ``x-should-retry: false``): not
    retried in this run, stored as a transient failure (sent again by the next run)."""

    should_retry: bool = True


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


class Unreachable(Transient):
    """No connection to the server could be opened (refused, no route, a host name that does not resolve,
    none within the connect timeout): the request never reached it, so nothing was billed. When every
    attempt to a provider meets it, the runner pauses the provider and probes it (``runner.outage``)."""


class Fatal(AdapterError):
    """A deterministic failure of this request (bad request): fails fast, never retried."""


QUOTA, KEY, MODEL, REQUEST, WAIT = "quota exhausted", "API key refused", "unknown model", "request refused", "wait too long"
UNREACHABLE = "server unreachable"
SCOPE_PROVIDER, SCOPE_MODEL = "provider", "model"
MODEL_CAUSES = frozenset({MODEL, REQUEST})  # what one model meets alone: the other models on its base URL go on


class ProviderStop(AdapterError):
    """A failure that every request to this provider (or to this model on it) would meet alike: nothing more
    is sent to it.

    ``cause`` is one of ``QUOTA``, ``KEY``, ``MODEL``, ``REQUEST``, ``WAIT``, ``UNREACHABLE``; the message carries the
    provider's own words (at most 300 bytes, the key redacted). ``resets_in_s`` is the seconds until the
    provider says access resumes (measured against the reply's ``Date`` header), when it says so. ``scope``
    is ``SCOPE_MODEL`` for what names one model (an unknown model, a form of request that model refuses: its
    parameters, its schema, its effort level), which stops that model alone, and ``SCOPE_PROVIDER`` otherwise
    (quota, key, a stated wait: the account's), which stops every model on the provider (``runner.stops``).
    ``field`` is the request field the provider names as refused (OpenAI's ``error.param``), when it names one."""

    def __init__(self, message: str, cause: str, status: int | None = None, resets_in_s: float | None = None,
                 scope: str | None = None, field: str | None = None):
        super().__init__(message, status)
        self.cause = cause
        self.resets_in_s = resets_in_s
        self.scope = scope or (SCOPE_MODEL if cause in MODEL_CAUSES else SCOPE_PROVIDER)
        self.field = field


class ReplyTooLarge(AdapterError):
    """The reply body passed ``limit`` bytes (decoded); ``prefix`` holds its first bytes (at most 2000)."""

    def __init__(self, message: str, prefix: bytes, limit: int, status: int | None = None):
        super().__init__(message, status)
        self.prefix = prefix
        self.limit = limit
