"""The adapter error tree. Adapters classify; the runner alone decides to retry
(``runner/sending/retry.py``).

    AdapterError
    ├── Retryable                  retried with backoff; if retries run out, stored as a transient
    │   │                          failure and requested again on the next run; not retried in this run
    │   │                          when the provider says ``x-should-retry: false``
    │   ├── RateLimited            HTTP 429 and 529 (Anthropic's "overloaded"), and a 503 that states a
    │   │                          wait: ``retry_after`` seconds when given
    │   └── Transient              408, 409, 425 and every other 5xx (``TRANSIENT_STATUSES``), any other
    │       │                      status with ``x-should-retry: true``; timeouts, connection
    │       │                      errors; a reply cut after it began, streamed or whole (not
    │       │                      retried in this run: part of it arrived, billed;
    │       │                      ``http.cut_stream``)
    │       ├── ErrorIn200         an error inside a 200 (charged the usage it states, when credible)
    │       ├── MalformedReply     a body that is not the wire format (not JSON, no ``answers``), a
    │       │                      compressed body cut before its trailer
    │       └── Unreachable        no connection could be opened (refused, no route, a name that does not
    │                              resolve, none within the connect timeout): the server was not reached;
    │                              when every attempt meets it the runner pauses the provider and probes it
    ├── Fatal                      400/422 and every other 4xx for this request alone: never retried;
    │                              stored as a deterministic failure (kept on rerun)
    ├── ProviderStop               a failure every request to this provider would meet alike: quota or
    │                              spend limit exhausted, key refused (401/403), a stated wait longer than
    │                              the run accepts, a server that cannot be reached (at start, or for longer
    │                              than the run waits), a System One server that serves another model than
    │                              the one asked for (at start, or in a reply), a redirect (3xx: never
    │                              followed, so no request and no key goes to another address); or
    │                              to this model alone (``scope`` "model"): unknown
    │                              model (404), a 400 for a schema or parameter it does not support. The
    │                              runner stops sending to that provider or model (``runner.sending.stops``); the
    │                              request is not stored, so the next run sends it
    └── ReplyTooLarge              the reply passed ``Limits.max_reply_bytes``: read no further, stored
                                   ``invalid`` with a bounded prefix

A status is classified in one place: ``provider_errors.provider_stop`` first (what the reply's
status and words say about the provider or model: a ProviderStop), then ``status_kind`` (the table
above), both through ``http.error_for``, which every HTTP adapter and batch call uses. The statuses
retried are those the official OpenAI and Anthropic SDKs retry (408, 409, 429, 5xx; their
``_should_retry``), plus 425 Too Early (RFC 8470 §5.2: the request may be retried) and 529.

The runner re-classifies two errors after an attempt, for what only it knows
(``runner.sending.retry.reclassify``): a RateLimited whose stated wait is longer than
``Limits.max_stated_wait_s`` becomes a ProviderStop (cause ``WAIT``: the run does not wait that
long), and a ProviderStop of cause ``REQUEST`` (a form of request the model refuses) becomes Fatal
once that model has answered other requests in this run (the refusal is this request's own, so it is
stored and kept rather than stopping the model), unless it refuses the streamed form
(``provider_errors.streaming_refused``: answered when sent whole, so never stored).

Messages carry the status and at most 300 bytes of the response body, never request headers, so an
API key cannot leak into the cache, logs or reports.
"""

from __future__ import annotations

from typing import Any

from dxi.shown import shown


class AdapterError(Exception):
    """Base of every error an adapter raises. ``status`` is the HTTP status when there was one.
    Its message quotes the provider (its words, a body's start, a served model's name, a header):
    every control character is shown escaped (``dxi.shown``), so that no reply can drive the
    terminal or forge a line wherever the message goes (the terminal, the log, the cache, the
    outputs)."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(shown(message))
        self.status = status


class Retryable(AdapterError):
    """A failure worth retrying. ``should_retry`` False (the provider said
    ``x-should-retry: false``): not retried in this run, stored as a transient failure (sent again
    by the next run)."""

    should_retry: bool = True


class RateLimited(Retryable):
    """The provider asked us to slow down. ``retry_after`` (seconds) is the provider's own wait, if
    given (``Retry-After``, ``retry-after-ms`` or a rate-limit reset header); ``rpm`` / ``tpm`` are
    the provider's own requests / tokens per minute, when its headers state them
    (``x-ratelimit-limit-*``)."""

    def __init__(
        self,
        message: str,
        retry_after: float | None = None,
        status: int | None = 429,
        rpm: float | None = None,
        tpm: float | None = None,
    ):
        super().__init__(message, status)
        self.retry_after = retry_after
        self.rpm, self.tpm = rpm, tpm


class Transient(Retryable):
    """A server error, timeout or broken connection."""


class ErrorIn200(Transient):
    """An error inside a 200 reply (``provider_errors.body_error``: an ``error`` body, an ``error``
    beside ``choices``, a choice with ``finish_reason: "error"``): retried, never stored as an
    answer; but a 200 was generated, and is billed: ``usage`` is a ``Reply`` without answers
    holding the usage the reply states (None: it states none), which ``runner.sending.cost``
    charges when credible, else the attempt's reservation (never $0, as an HTTP error status)."""

    def __init__(self, error: str, usage: Any = None):
        super().__init__(f"an error inside a 200 reply: {error}", 200)
        self.usage = usage


class MalformedReply(Transient):
    """The body is not the provider's wire format (e.g. not JSON). ``raw`` holds the text
    received."""

    def __init__(self, message: str, raw: str | None = None, status: int | None = None):
        super().__init__(message, status)
        self.raw = raw


class Unreachable(Transient):
    """No connection to the server could be opened (refused, no route, a host name that does not
    resolve, none within the connect timeout): the request never reached it, so nothing was billed.
    When every attempt to a provider meets it, the runner pauses the provider and probes it
    (``runner.sending.outage``)."""


class IdleTimeout(Transient):
    """No byte of the reply arrived within the idle timeout (``--timeout``, ``attempt_timeout_s``);
    a reply sent whole, and a streamed one before its first event, then say what to do
    (``http.Adapter.transmit``: ``http.WHOLE_REPLY``, ``http.FIRST_BYTE``)."""


class Fatal(AdapterError):
    """A deterministic failure of this request (bad request): fails fast, never retried."""


RATE_LIMIT_STATUSES = frozenset({429, 529})  # 529: Anthropic's "overloaded"
TRANSIENT_STATUSES = frozenset(
    {408, 409, 425}
)  # and every 5xx: timeout, conflict, too early (RFC 8470)


def status_kind(
    status: int, stated_wait: bool = False, should_retry: str = ""
) -> type[RateLimited | Transient | Fatal]:
    """The error class of a non-2xx HTTP ``status`` that is no ProviderStop (``provider_errors``
    decides that first): RateLimited for 429 and 529, and for a 503 whose headers state a wait
    (``stated_wait``); Transient for ``TRANSIENT_STATUSES``, every other 5xx and, whatever the
    status, ``should_retry`` "true" (the ``x-should-retry`` header, lower-cased); Fatal for every
    other status."""
    if status in RATE_LIMIT_STATUSES or (status == 503 and stated_wait):
        return RateLimited
    if status in TRANSIENT_STATUSES or status >= 500 or should_retry == "true":
        return Transient
    return Fatal


QUOTA, KEY, MODEL, REQUEST, WAIT = (
    "quota exhausted",
    "API key refused",
    "unknown model",
    "request refused",
    "wait too long",
)
UNREACHABLE = "server unreachable"
REDIRECT = "redirected"  # a 3xx: never followed (the key would go to another address)
SERVED = "serves another model"  # a System One server whose model is not the one asked for
SCOPE_PROVIDER, SCOPE_MODEL = "provider", "model"
MODEL_CAUSES = frozenset(
    {MODEL, REQUEST}
)  # what one model meets alone: the other models on its base URL go on


class ProviderStop(AdapterError):
    """A failure that every request to this provider (or to this model on it) would meet alike:
    nothing more is sent to it.

    ``cause`` is one of ``QUOTA``, ``KEY``, ``MODEL``, ``REQUEST``, ``WAIT``, ``UNREACHABLE``,
    ``SERVED`` (a System One server that serves another model than the one asked for),
    ``REDIRECT`` (a 3xx reply: ``http.redirected``); the
    message carries the provider's own words (at most 300 bytes, the key redacted). ``resets_in_s``
    is the seconds until the provider says access resumes (measured against the reply's ``Date``
    header), when it says so. ``scope`` is ``SCOPE_MODEL`` for what names one model (an unknown
    model, a form of request that model refuses: its parameters, its schema, its effort level),
    which stops that model alone, and ``SCOPE_PROVIDER`` otherwise (quota, key, a stated wait: the
    account's), which stops every model on the provider (``runner.sending.stops``). ``field`` is the
    request field the provider names as refused (OpenAI's ``error.param``), when it names one."""

    def __init__(
        self,
        message: str,
        cause: str,
        status: int | None = None,
        resets_in_s: float | None = None,
        scope: str | None = None,
        field: str | None = None,
    ):
        super().__init__(message, status)
        self.cause = cause
        self.resets_in_s = resets_in_s
        self.scope = scope or (SCOPE_MODEL if cause in MODEL_CAUSES else SCOPE_PROVIDER)
        self.field = field


class ReplyTooLarge(AdapterError):
    """The reply body passed ``limit`` bytes (decoded); ``prefix`` holds its first bytes (at most
    2000)."""

    def __init__(self, message: str, prefix: bytes, limit: int, status: int | None = None):
        super().__init__(message, status)
        self.prefix = prefix
        self.limit = limit
