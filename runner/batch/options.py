"""What batch mode's parts share (``runner.batch.driver``): its settings (``BatchOptions``), a
model's counts (``BatchStats``), the retries of the batch API's own calls (``with_retries``) and the
kill test hook (``failpoint``)."""

from __future__ import annotations

import asyncio
import os
import random
import signal
from collections.abc import Callable
from dataclasses import dataclass, field

from dxi.adapters import Adapter, RateLimited, Retryable

from ..sending.scheduler import Stats

LOOKUP = 256  # requests encoded and looked up in the cache at a time
BATCH = "batch"


def failpoint(name: str) -> None:
    """Kill this process with SIGKILL when ``DXI_FAILPOINT`` names ``name`` (tests of kill -9 at
    each step)."""
    if os.environ.get("DXI_FAILPOINT") == name:
        os.kill(os.getpid(), signal.SIGKILL)


@dataclass(frozen=True)
class BatchOptions:
    """How batch mode runs: ``deadline`` (Unix seconds; None: none), ``poll_s`` / ``max_poll_s``
    (the first and the longest wait between two status reads of a batch, seconds), ``max_requests``
    (a cap per batch below the provider's), ``enqueued_tokens`` (input tokens in open batches at
    once, per model: the provider's enqueued-token limit), ``collect_only`` (``dxi batches
    collect``: submit nothing, collect what has ended), ``wait`` (collect_only: wait for the open
    batches to end)."""

    deadline: float | None = None
    poll_s: float = 30.0
    max_poll_s: float = 300.0
    max_requests: int | None = None
    enqueued_tokens: int | None = None
    collect_only: bool = False
    wait: bool = True


@dataclass
class BatchStats(Stats):
    """A model's Stats plus its batches: ``submitted`` (batches created by this run, adopted ones
    included), ``running`` (open now: entry id -> when submitted, Unix seconds), ``collected``
    (batches collected), ``given_back`` (requests given back, to be sent again), ``claimed``
    (requests in another live process's open batch: it collects them), ``from_earlier`` (requests
    answered by a batch an earlier run submitted, stored by this one: neither sent by this run nor
    found in the cache; ``from_earlier_usd``: what they cost, paid by the run that submitted them:
    in the model's ``cost_usd``, not in this run's spend under its cost bound), ``unknown_results``
    (result lines whose id is none of their batch's requests', or that carry none: dropped, with a
    warning), ``duplicate_results`` (result lines repeating an id read already in their batch: the
    first one kept), ``unanswered`` (requests a batch of this run gave back unanswered, left at the
    deadline without the fallback: counted ``sent``, once; the next run sends them), ``in_batch``
    (the model is in batch mode, not only collecting an earlier run's batches). ``open_entries``,
    ``open_requests``, ``open_answers``, ``open_reserved_usd``: this run's batches still open when
    it ended (a stop): their ledger entries, requests, answers and what their reservations held
    under this run's bound (at most their cost: not in ``cost_usd``, the run that collects them
    records what they cost), ``open_unbounded`` how many of those requests' reservations leave out
    output nothing caps (``Charge.is_bound`` False: their input alone, no bound of their cost);
    ``earlier_entries``: the ledger entries of the earlier runs' batches
    this one collected (``from_earlier``); ``collected_entries``: every entry it collected."""

    submitted: int = 0
    running: dict[str, float] = field(default_factory=dict)
    collected: int = 0
    given_back: int = 0
    claimed: int = 0
    from_earlier: int = 0
    from_earlier_usd: float = 0.0
    unknown_results: int = 0
    duplicate_results: int = 0
    unanswered: int = 0
    in_batch: bool = False
    stopped: str | None = None
    open_entries: set[str] = field(default_factory=set)
    open_requests: int = 0
    open_answers: int = 0
    open_reserved_usd: float = 0.0
    open_unbounded: int = 0
    earlier_entries: set[str] = field(default_factory=set)
    collected_entries: set[str] = field(default_factory=set)


async def with_retries(call: Callable, adapter: Adapter, what: str):
    """``await call()``, again after a retryable error (up to ``Limits.max_attempts``, the waits
    doubling from ``backoff_s`` up to ``max_wait_s``, a stated wait honoured): the batch API's own
    calls."""
    limits = adapter.limits
    attempt = 0
    while True:
        attempt += 1
        try:
            return await call()
        except Retryable as exc:
            if attempt >= max(1, limits.max_attempts) or not exc.should_retry:
                raise
            wait = min(limits.max_wait_s, limits.backoff_s * 2 ** (attempt - 1))
            if isinstance(exc, RateLimited) and exc.retry_after is not None:
                wait = min(exc.retry_after, limits.max_stated_wait_s)
            await asyncio.sleep(wait + random.uniform(0, min(0.5, limits.backoff_s)))
