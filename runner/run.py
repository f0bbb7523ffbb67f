"""The job queue: every task of every model through one asyncio queue, under per-provider limits.

Shape: one producer per model streams the suite's tasks, encodes each request (and each epoch), skips
what the cache already has, reserves an in-flight slot of the model's provider, then puts the request on
the one shared queue. Workers take requests off the queue, attempt them (``runner.retry``) and append
the outcome to the cache before taking the next. Because a request only enters the queue holding a
slot, a worker never waits on a busy provider while another provider idles, and memory stays
O(concurrency) however many tasks there are. An all-cached run goes through the same loop and sends
nothing.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from adapters import Adapter, Request
from cache import FAILED, INVALID, OK, Cache
from evals import Suite, Task

from .limits import ProviderLimiter
from .retry import attempt
from .rows import make_row


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
              on_progress: Callable[[str, Stats], None] | None = None) -> dict[str, Stats]:
    """Run every task of ``suite`` on every (started) adapter, ``epochs`` times each, and return the
    Stats per model label. Each outcome is in the cache before its worker takes the next request."""
    limiters: dict[str, ProviderLimiter] = {}
    for a in adapters:
        limiters.setdefault(a.provider, ProviderLimiter(a.limits))
    stats = {a.label: Stats() for a in adapters}
    n_workers = sum(lim.limits.max_in_flight for lim in limiters.values())
    queue: asyncio.Queue[_Job | None] = asyncio.Queue(maxsize=n_workers)
    in_flight: set[str] = set()

    def progress(label: str) -> None:
        if on_progress is not None:
            on_progress(label, stats[label])

    async def produce(adapter: Adapter) -> None:
        limiter, st = limiters[adapter.provider], stats[adapter.label]
        for task in suite.tasks():
            for sample in range(epochs):
                st.total += 1
                request = adapter.encode(task, sample)
                key = request.key
                if cache.has(key) or key in in_flight:
                    st.cache_hits += 1
                    progress(adapter.label)
                    continue
                await limiter.slots.acquire()
                in_flight.add(key)
                await queue.put(_Job(adapter, task, request, limiter))

    async def work() -> None:
        while (job := await queue.get()) is not None:
            st = stats[job.adapter.label]
            try:
                st.sent += 1
                outcome = await attempt(job.adapter, job.task, job.request, job.limiter)
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

    async with asyncio.TaskGroup() as group:
        group.create_task(feed())
        for _ in range(n_workers):
            group.create_task(work())
    return stats
