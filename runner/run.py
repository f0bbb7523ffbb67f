"""The job queue: every task of every model through one asyncio queue, under per-provider limits.

Shape: each provider has a *feed* of the requests its models still need: the suite's tasks streamed,
each request (and epoch) encoded, looked up in the cache in batches, cached ones skipped; the provider's
models take turns. A feeder reserves an admission slot of the provider for each request it takes from
the feed and puts it on the one shared queue. Workers take requests off the queue, attempt them
(``runner.retry``, under ``runner.limits``) and append the outcome to the cache before taking the next;
a worker that finishes a request goes straight on to the next request of the same provider's feed,
keeping its slot, and takes from the queue again only when that feed is empty. (Going back through the
feeder would cost two event-loop turns between a reply and the next request, which under a burst of
replies is the time to handle the whole burst: measured, 2-8% of a latency-bound run's throughput.)

Because a request holds a slot of its provider from the moment it is queued until its row is in the
cache, a provider that is paused or slow never holds more workers than its ``max_in_flight``, so it
cannot starve another provider; and memory stays O(concurrency) however many tasks there are: nothing
holds a per-task object beyond the batch being looked up and the requests in flight. An all-cached run
goes through the same loop and sends nothing.

Cancellation (Ctrl-C): workers stop where they are; every row appended is in the cache, and a reply
that was decoded just as the cancellation came is appended before the worker stops.
"""
from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import islice

from adapters import Adapter, Request
from cache import FAILED, INVALID, OK, Cache
from evals import Suite, Task

from .limits import ProviderLimiter
from .retry import Outcome, attempt
from .rows import make_row

BATCH = 32  # requests encoded and looked up in the cache at a time, per model (~1 ms of work)


@dataclass
class Stats:
    """Counts for one model in one run.

    ``sent``: requests sent (each counted once, however many attempts); ``cache_hits``: requests not
    sent because the cache had them; ``ok`` / ``invalid`` / ``failed``: outcomes of the requests sent;
    ``attempts``: HTTP attempts in all (``attempts - sent`` = retries); ``rate_limited``: 429s received;
    ``repaired``: replies accepted from a Markdown code fence (language models, SPEC §6).
    """

    total: int = 0
    sent: int = 0
    cache_hits: int = 0
    ok: int = 0
    invalid: int = 0
    failed: int = 0
    attempts: int = 0
    rate_limited: int = 0
    repaired: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def done(self) -> int:
        return self.cache_hits + self.ok + self.invalid + self.failed


@dataclass(frozen=True, slots=True)
class _Job:
    adapter: Adapter
    task: Task
    request: Request
    limiter: ProviderLimiter


async def run(adapters: list[Adapter], suite: Suite, cache: Cache, *, epochs: int = 1,
              on_progress: Callable[[str, Stats], None] | None = None,
              limiters: dict[str, ProviderLimiter] | None = None) -> dict[str, Stats]:
    """Run every task of ``suite`` on every (started) adapter, ``epochs`` times each, and return the
    Stats per model label. Each outcome is in the cache before its worker takes the next request.
    ``limiters`` (provider key -> ProviderLimiter) is filled in when given, for reports. Raises what a
    task stream raises (``evals.DatasetError`` for a malformed row), after what arrived is in the cache."""
    limiters = {} if limiters is None else limiters
    for a in adapters:
        limiters.setdefault(a.provider, ProviderLimiter(a.limits))
    stats = {a.label: Stats() for a in adapters}
    n_workers = sum(limiters[p].limits.max_in_flight for p in {a.provider for a in adapters})
    queue: asyncio.Queue[_Job | None] = asyncio.Queue(maxsize=n_workers)
    in_flight: set[str] = set()

    def progress(label: str) -> None:
        if on_progress is not None:
            on_progress(label, stats[label])

    def uncached(adapter: Adapter) -> Iterator[_Job]:
        """The requests of one model that need sending, each marked in flight as it is handed out."""
        limiter, st = limiters[adapter.provider], stats[adapter.label]
        stream = ((task, adapter.encode(task, sample)) for task in suite.tasks() for sample in range(epochs))
        while batch := list(islice(stream, BATCH)):
            cached = cache.has_many([request.key for _, request in batch])
            for (task, request), hit in zip(batch, cached, strict=True):
                st.total += 1
                # looked up again as it is handed out: the same request may have been sent meanwhile
                # (two tasks with identical content)
                if hit or request.key in in_flight or cache.has(request.key):
                    st.cache_hits += 1
                    progress(adapter.label)
                    continue
                in_flight.add(request.key)
                yield _Job(adapter, task, request, limiter)

    feeds: dict[str, deque[Iterator[_Job]]] = {}
    for a in adapters:
        feeds.setdefault(a.provider, deque()).append(uncached(a))

    def next_job(provider: str) -> _Job | None:
        """The next request of ``provider``'s feed, its models taking turns; None once all are done."""
        streams = feeds[provider]
        while streams:
            stream = streams[0]
            streams.rotate(-1)
            job = next(stream, None)
            if job is not None:
                return job
            streams.remove(stream)
        return None

    def record(job: _Job, outcome: Outcome) -> None:
        st = stats[job.adapter.label]
        row = make_row(job.task, job.request, outcome)
        cache.append(row)
        st.attempts += outcome.attempts
        st.rate_limited += outcome.rate_limited
        st.repaired += bool(row["repaired"])
        if row["status"] == OK:
            st.ok += 1
        elif row["status"] == INVALID:
            st.invalid += 1
        elif row["status"] == FAILED:
            st.failed += 1
            if len(st.errors) < 20:
                st.errors.append(f"{job.task.id}: {row['error']}")

    async def send(job: _Job) -> None:
        stats[job.adapter.label].sent += 1
        outcome = Outcome()
        try:
            await attempt(job.adapter, job.task, job.request, job.limiter, outcome)
            record(job, outcome)
        except asyncio.CancelledError:
            if outcome.reply is not None and outcome.error is None:
                record(job, outcome)  # it arrived: keep it, then stop
            raise
        finally:
            in_flight.discard(job.request.key)
        progress(job.adapter.label)

    async def work() -> None:
        while (job := await queue.get()) is not None:
            slots = job.limiter.slots
            try:
                while job is not None:  # on to the provider's next request, keeping the slot
                    await send(job)
                    job = next_job(job.adapter.provider)
            finally:
                slots.release()

    async def fill(provider: str) -> None:
        slots = limiters[provider].slots
        while True:
            await slots.acquire()
            job = next_job(provider)
            if job is None:
                slots.release()
                return
            await queue.put(job)

    async def feed() -> None:
        async with asyncio.TaskGroup() as feeders:
            for provider in feeds:
                feeders.create_task(fill(provider))
        for _ in range(n_workers):
            await queue.put(None)

    try:
        async with asyncio.TaskGroup() as group:
            group.create_task(feed())
            for _ in range(n_workers):
                group.create_task(work())
    except ExceptionGroup as group_error:  # e.g. a malformed dataset row: raise it as itself
        first = group_error
        while isinstance(first, ExceptionGroup):
            first = first.exceptions[0]
        raise first from group_error
    return stats
