"""The job queue: every task of every model through one asyncio queue, under per-provider limits.

Shape: one producer per model streams the suite's tasks, encodes each request (and each epoch), asks
the cache in batches which it already has, reserves an admission slot of the model's provider for each
missing one, then puts it on the one shared queue. Workers take requests off the queue, attempt them
(``runner.retry``, under ``runner.limits``) and append the outcome to the cache before taking the next.
Because a request only enters the queue holding a slot, a worker never waits on a busy provider while
another provider idles, and memory stays O(concurrency) however many tasks there are: nothing holds a
per-task object beyond the batch being checked and the requests in flight. An all-cached run goes
through the same loop and sends nothing.

Cancellation (Ctrl-C): workers stop where they are; every row appended is in the cache, and a reply
that was decoded just as the cancellation came is appended before the worker stops.
"""
from __future__ import annotations

import asyncio
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
    ``attempts``: HTTP attempts in all (``attempts - sent`` = retries); ``rate_limited``: 429s received.
    """

    total: int = 0
    sent: int = 0
    cache_hits: int = 0
    ok: int = 0
    invalid: int = 0
    failed: int = 0
    attempts: int = 0
    rate_limited: int = 0
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

    def requests(adapter: Adapter) -> Iterator[tuple[Task, Request]]:
        for task in suite.tasks():
            for sample in range(epochs):
                yield task, adapter.encode(task, sample)

    async def produce(adapter: Adapter) -> None:
        limiter, st = limiters[adapter.provider], stats[adapter.label]
        stream = requests(adapter)
        while batch := list(islice(stream, BATCH)):
            cached = cache.has_many([request.key for _, request in batch])
            for (task, request), hit in zip(batch, cached, strict=True):
                st.total += 1
                if hit or request.key in in_flight:
                    st.cache_hits += 1
                    progress(adapter.label)
                    continue
                await limiter.slots.acquire()
                in_flight.add(request.key)
                await queue.put(_Job(adapter, task, request, limiter))

    def record(job: _Job, outcome: Outcome) -> None:
        st = stats[job.adapter.label]
        row = make_row(job.task, job.request, outcome)
        cache.append(row)
        st.attempts += outcome.attempts
        st.rate_limited += outcome.rate_limited
        if row["status"] == OK:
            st.ok += 1
        elif row["status"] == INVALID:
            st.invalid += 1
        elif row["status"] == FAILED:
            st.failed += 1
            if len(st.errors) < 20:
                st.errors.append(f"{job.task.id}: {row['error']}")

    async def work() -> None:
        while (job := await queue.get()) is not None:
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
                job.limiter.slots.release()
            progress(job.adapter.label)

    async def feed() -> None:
        async with asyncio.TaskGroup() as producers:
            for a in adapters:
                producers.create_task(produce(a))
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
