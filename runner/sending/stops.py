"""Stopping a provider, or one model on it: what every request would meet alike ends that part of
the run.

A ``ProviderStop`` (``adapters.errors``; read from the providers' documented error bodies by
``adapters.provider_errors``) is an exhausted quota or spend limit, a refused key (401/403), a
stated wait longer than ``Limits.max_stated_wait_s`` (``too_long``), or a server that cannot be
reached (at the start of the run, or down for longer than ``max_stated_wait_s``:
``runner.sending.outage``), or a System One server that serves another model than the one asked
for (at start, or a reply that names another: ``Adapter.check_served``; no such reply is stored):
the provider's, every model on it stops; or, when it names one model
(``ProviderStop.scope`` "model"), an unknown model (404) or a 400 refusing the form of its requests
(an unsupported schema, parameter or effort level): that model alone stops, and the other models on
the same base URL go on. When one arrives (``runner.sending.retry``):

* the provider's limiter is halted (``ProviderLimiter.halt``), or the model stopped on it
  (``ProviderLimiter.halt_model``): attempts waiting for a turn, a pause or a retry's backoff end
  without being sent; requests already on the wire finish and are recorded;
* the request that met the stop, and every request of the provider (or model) not yet sent, gets no
  cache row: they are counted ``not_sent`` and the next run sends them;
* the rest of the run goes on; it ends with exit code 6 (``runner.session.exit_code``), and the
  terminal and summary.json (``stopped_providers``, each block with its ``scope``) say which
  provider or model stopped, why (the provider's own message, redacted), when, and when access
  resumes or when to rerun where the provider states it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime

from dxi.adapters import ProviderStop, RateLimited
from dxi.adapters.errors import (
    QUOTA,
    REDIRECT,
    SCOPE_MODEL,
    SCOPE_PROVIDER,
    SERVED,
    UNREACHABLE,
    WAIT,
)

from .limits import ProviderLimiter


class RunStopping(Exception):  # noqa: N818 (a stop, not an error)
    """The run is stopping (``RunStop``): this attempt was not sent."""


class RunStop:
    """The whole run asked to stop from outside: the first Ctrl-C or SIGTERM
    (``runner.signals.Graceful``).

    Once ``request`` is called, ``runner.sending.scheduler.run`` hands out nothing more and every
    provider's limiter is closed (``ProviderLimiter.close``): attempts waiting for their turn, a
    pause or a retry's backoff end without being sent (``RunStopping``; counted ``not_sent``, no
    row; a request whose earlier attempt had failed is stored as that transient failure), the
    requests not handed out yet are counted ``not_sent`` too (the scheduler's ``drain``, as after
    the cost bound), while the attempts on the wire finish and are stored; then ``run`` returns.
    ``signum``: the signal (None until asked); ``in_flight``: the requests ``run`` has handed to its
    workers and not yet finished (``started`` / ``finished``); ``on_change``: called when asked, and
    each time ``in_flight`` falls while stopping (the progress counts them down); ``abandoned``: the
    requests still in flight when the stop was cut short (``abandon``: a second signal);
    ``parts``: model label -> the Stats of each path that sends it (``track``), what a run cut short
    is counted from (``runner.dispatch.so_far``)."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.in_flight = 0
        self.abandoned = 0
        self.asked = asyncio.Event()  # set when the stop is asked (a feeder waiting for a slot)
        self.parts: dict[str, list] = {}
        self.on_change: Callable[[], None] | None = None
        self._limiters: list[ProviderLimiter] = []
        self._hooks: list[Callable[[], None]] = []

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def attach(self, limiters: Iterable[ProviderLimiter]) -> None:
        """The run's limiters, closed when the stop is asked (at once, if it was asked already)."""
        self._limiters = list(limiters)
        if self.requested:
            for limiter in self._limiters:
                limiter.close()

    def track(self, stats: Mapping[str, object]) -> None:
        """Keep the Stats of a path as it starts (label -> its ``runner.sending.scheduler.Stats``,
        counted as they go), each once: a run cut short has no return value to count from."""
        for label, part in stats.items():
            kept = self.parts.setdefault(label, [])
            if not any(p is part for p in kept):
                kept.append(part)

    def on_request(self, hook: Callable[[], None]) -> None:
        """Call ``hook`` when the stop is asked (at once, if it was asked already): what waits on
        something other than a limiter (a batch being polled, ``runner.dispatch``) ends then."""
        if self.requested:
            hook()
        else:
            self._hooks.append(hook)

    def request(self, signum: int) -> None:
        """Stop the run (once; later calls change nothing)."""
        if self.requested:
            return
        self.signum = signum
        self.asked.set()
        for limiter in self._limiters:
            limiter.close()
        for hook in self._hooks:
            hook()
        self._changed()

    def abandon(self) -> None:
        """The stop is cut short: the requests in flight now are abandoned (counted in
        ``abandoned``)."""
        self.abandoned = self.in_flight
        self.on_change = None

    def started(self) -> None:
        self.in_flight += 1

    def finished(self) -> None:
        self.in_flight -= 1
        if self.requested:
            self._changed()

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()


def too_long(error: RateLimited, bound_s: float) -> ProviderStop:
    """The stop for a rate limit whose stated wait (``error.retry_after`` seconds) passes
    ``bound_s``."""
    return ProviderStop(
        f"{error} (the provider asks to wait {error.retry_after:.0f} s, longer than the "
        f"{bound_s:g} s the run waits: --max-stated-wait)",
        WAIT,
        error.status,
        error.retry_after,
    )


def too_slow(error: RateLimited, bound_s: float, tokens: float = 1.0) -> ProviderStop | None:
    """The stop for a rate limit that states its provider's own limit (``error.rpm`` requests or
    ``error.tpm`` tokens per minute) so low that pacing one request (of ``tokens`` tokens, the
    estimate of the request) to it would wait longer than ``bound_s``
    (``x-ratelimit-limit-requests: 0.001``: one request every 60,000 s, which the pacing would
    honour, the run hanging for hours); None when it is not."""
    for limit, unit, each in ((error.rpm, "requests", 1.0), (error.tpm, "tokens", tokens)):
        if limit and 60 * each / limit > bound_s:
            return ProviderStop(
                f"{error} (the provider states a limit of {limit:g} {unit} per minute: one request "
                f"every {60 * each / limit:.0f} s, longer than the {bound_s:g} s the run waits: "
                "--max-stated-wait)",
                WAIT,
                error.status,
            )
    return None


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def stopped_providers(
    limiters: Mapping[str, ProviderLimiter],
    models: Mapping[str, Sequence[str]],
    not_sent: Mapping[str, int],
    refused: Mapping[str, int],
) -> list[dict]:
    """summary.json's ``stopped_providers``: one block per stopped provider (key of ``limiters``;
    ``scope`` "provider") and per model stopped alone (``scope`` "model"), with ``models`` (the
    labels it stopped: a provider's, but for those stopped alone before it), ``cause``, ``message``
    (the provider's own words, the key redacted), ``http_status``, ``stopped_at`` (ISO 8601 UTC),
    ``resets_at`` (when the provider says access resumes, or the stated wait ends; null when it does
    not say), ``refused`` (its models' requests sent that met the stop) and ``not_sent`` (those
    never sent), from the per-label counts given."""
    out = []

    def block(key: str, scope: str, labels: list[str], error: ProviderStop, at: float) -> dict:
        resets = None
        if error.resets_in_s is not None:
            with contextlib.suppress(OverflowError, ValueError, OSError):  # past any date (a
                resets = _iso(at + error.resets_in_s)  # hostile Retry-After: 1e30 s): none
        return {
            "provider": key,
            "scope": scope,
            "models": labels,
            "cause": error.cause,
            "message": str(error),
            "http_status": error.status,
            "stopped_at": _iso(at),
            "resets_at": resets,
            "refused": sum(refused.get(label, 0) for label in labels),
            "not_sent": sum(not_sent.get(label, 0) for label in labels),
        }

    for key, limiter in limiters.items():
        alone = getattr(limiter, "stopped_models", {})
        for label, (error, at) in alone.items():
            out.append(block(key, SCOPE_MODEL, [label], error, at))
        if limiter.halted is not None:
            labels = [label for label in models.get(key, ()) if label not in alone]
            out.append(
                block(key, SCOPE_PROVIDER, labels, limiter.halted, limiter.halted_at or time.time())
            )
    return out


def describe(block: dict) -> str:
    """The terminal's account of one stopped provider (a ``stopped_providers`` block), ending with
    what to do next."""
    when = block["stopped_at"].replace("T", " ").removesuffix("Z") + " UTC"
    if block.get("scope") == SCOPE_MODEL:
        text = (
            f"{block['models'][0]} (on {block['provider']}) stopped alone at {when}: {block['cause']}; the "
            f"provider's other models went on. {block['refused']} request(s) refused, {block['not_sent']} not "
            "sent; the next run sends them."
        )
    else:
        text = (
            f"{block['provider']} stopped at {when}: {block['cause']}. {block['refused']} request(s) refused, "
            f"{block['not_sent']} not sent ({', '.join(block['models'])}); the next run sends them."
        )
    resets = block["resets_at"]
    if resets:
        resets = resets.replace("T", " ").removesuffix("Z") + " UTC"
        text += (
            f" The provider says to wait until {resets}: rerun after that."
            if block["cause"] == WAIT
            else f" Access resumes at {resets} (as the provider states): rerun after that."
        )
    elif block["cause"] == QUOTA:
        text += " Add credit or raise the limit, then rerun."
    elif block["cause"] == UNREACHABLE:
        text += " Start the server (or check its address and the network), then rerun."
    elif block["cause"] == REDIRECT:
        text += (
            " Nothing was sent to the address it redirects to: if that is the API's, name it as "
            "the base URL, then rerun."
        )
    elif block["cause"] == SERVED:
        text += (
            " Serve the model asked for there (or name the model the server serves), then rerun; "
            "nothing it answered as another model was stored."
        )
    else:
        text += " Fix the cause, then rerun."
    return text + f" Provider's message: {block['message']}"
