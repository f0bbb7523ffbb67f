"""The job queue: every task of every model through one asyncio queue, under per-provider limits.

Shape: each provider has a *feed* of the requests its models still need: the suite's tasks streamed,
each request (and epoch) encoded, looked up in the cache in batches, cached ones skipped; the
provider's models take turns. A feeder reserves an admission slot of the provider for each request
it takes from the feed and puts it on the one shared queue. Workers take requests off the queue,
attempt them (``runner.sending.retry``, under ``runner.sending.limits``) and append the outcome to
the cache before taking the next; a worker that finishes a request goes straight on to the next
request of the same provider's feed, keeping its slot, and takes from the queue again only when that
feed is empty. (Going back through the feeder would cost two event-loop turns between a reply and
the next request, which under a burst of replies is the time to handle the whole burst: measured,
2-8% of a latency-bound run's throughput.)

Because a request holds a slot of its provider from the moment it is queued until its row is in the
cache, a provider that is paused or slow never holds more workers than its ``max_in_flight``, so it
cannot starve another provider; and memory stays O(concurrency) however many tasks there are:
nothing holds a per-task object beyond the batch being looked up and the requests in flight. An
all-cached run goes through the same loop and sends nothing.

Stopping from outside (``runner.sending.stops.RunStop``: the first Ctrl-C or SIGTERM): nothing more
is handed out or sent, the attempts on the wire finish and are stored, the rest is counted not sent
(below), then ``run`` returns.
Cancellation (a second Ctrl-C): workers stop where they are; every row appended is in the cache, and
a reply that was decoded just as the cancellation came is appended before the worker stops. An error
that stops the run (a task stream's, the cache's) is not a cancellation: nothing more is handed out,
the requests in flight finish and are stored, then it is raised. Before anything is sent the suite's
files are checked whole (``Suite.validate``), and before the first request the cache is checked
writable.

Models: each is a ``ModelRun`` (or a bare Adapter: its defaults): its own number of epochs, the key
of the limits it shares (a run file's provider table; default ``Adapter.limits_key``) and its price.
The cost bound (``runner.sending.cost``): each attempt reserves its cost bound before it is sent,
waiting for attempts in flight to settle when it does not fit; once it cannot fit with nothing in
flight, the feeders hand out nothing more and count what each model has left (``drain``: not sent,
or a cache hit for one the cache has), requests already handed out are not sent (their attempts
cannot reserve either), the attempts in flight finish and are recorded, and ``run`` returns
(``Budget.stopped``). A provider stops the same way, alone, on a failure every request to it would
meet, and a model on a failure that names it alone (``runner.sending.stops``). Either way each
model's ``sent + refused + cache_hits + not_sent`` is its ``total``; so too when the run stops from
outside (the first Ctrl-C or SIGTERM): its feeders count the rest as they do after the cost bound
(``drain``) while the requests in flight finish.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import islice

from dxi.adapters import Adapter, ProviderStop, Request, Transient
from dxi.cache import FAILED, FATAL, INVALID, OK, Cache
from dxi.evals import Suite, Task

from ..planning.plan import ModelRun
from ..planning.shard import Shard
from .cost import Budget, Charge, CostBoundReached
from .limits import ProviderLimiter
from .retry import Outcome, attempt
from .rows import keys_of, make_row
from .stops import RunStop, RunStopping

BATCH = 32  # requests encoded and looked up in the cache at a time, per model (~1 ms of work)
# a stopped provider's requests counted not sent per event-loop turn (a few ms of work)
DRAIN_BATCH = 256


@dataclass
class Stats:
    """Counts for one model in one run.

    ``sent``: requests sent (each counted once, however many attempts); ``cache_hits``: requests not
    sent because the cache had them; ``ok`` / ``invalid`` / ``failed``: outcomes of the requests
    sent; ``attempts``: HTTP attempts in all (a batch's: each result, or its absence, of a request);
    ``retries``: the attempts that sent a request again after an attempt of it failed (each
    request's attempts after its first, a refused one's included; a batch's: a request given back,
    in a new batch once it is submitted, not one the batch API refused whole), never a request not
    sent or refused at its first attempt; ``retry_wait_s``: the seconds the requests stored waited
    before their retries (the sum of their rows' ``retry_waits_s``); ``rate_limited``: 429s
    received; ``repaired``: replies accepted from a Markdown code fence (language models, SPEC §6);
    ``input_tokens`` / ``output_tokens``: the usage the replies of this run reported; ``cost_usd``:
    what this run's attempts cost (``runner.sending.cost``; None for a model without a price),
    ``cost_at_reservation_usd`` the part of it charged at reservation because the cost is unknown
    (``Charge.settle``'s ``Settled.at_reservation``: the attempts cost at most that), and
    ``cost_unbounded`` the attempts among them whose reservation bounds nothing (priced output
    without a cap, no cost bound: ``Settled.bounded``): then what the run spent is unknown;
    ``not_sent``: requests not sent because the cost bound was reached, the run was stopped or the
    provider stopped (``runner.sending.stops``), ``stop_not_sent`` those of them the provider's (or
    model's) stop left (its rest after the stop, counted with it even when the bound is reached
    too); ``refused``: requests sent that met the provider's stop (no row either): the next run
    sends both; ``failed_fatal``: the failures among ``failed`` that are deterministic (4xx-class:
    kept, not sent again unless asked); the others are transient and sent again by the next run.
    ``invalid`` counts requests (replies with at least one invalid answer), not answers. A stop cut
    short (a second signal, the end of ``--grace``): ``abandoned``, the requests sent it left on the
    wire (in ``sent``, no row), ``abandoned_usd`` their charge (in ``cost_usd``: reservations kept);
    ``uncounted``, the paths it cut before their rest was counted (``runner.counts.INCOMPLETE``).
    ``unstored``: replies paid for that the cache could not store (in ``sent``), ``unstored_usd``.
    """

    total: int = 0
    sent: int = 0
    cache_hits: int = 0
    ok: int = 0
    invalid: int = 0
    failed: int = 0
    attempts: int = 0
    retries: int = 0
    retry_wait_s: float = 0.0
    rate_limited: int = 0
    repaired: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float | None = 0.0
    cost_at_reservation_usd: float = 0.0
    cost_unbounded: int = 0
    abandoned: int = 0
    abandoned_usd: float = 0.0
    unstored: int = 0
    unstored_usd: float = 0.0
    uncounted: int = 0
    not_sent: int = 0
    stop_not_sent: int = 0
    refused: int = 0
    failed_fatal: int = 0
    in_flight: int = 0  # taken up by a worker, not yet stored (limits, the wire, a retry's wait)
    started: float | None = None  # monotonic seconds of the first request sent (for rates)
    errors: list[str] = field(default_factory=list)

    @property
    def done(self) -> int:
        return self.cache_hits + self.ok + self.invalid + self.failed

    def add(self, row: dict, task_id: str) -> None:
        """Count one row stored (``cache.schema`` columns) for the task ``task_id``: its status,
        tokens, repair, and a failure's error (the first 20)."""
        self.repaired += bool(row["repaired"])
        self.input_tokens += row["input_tokens"] or 0
        self.output_tokens += row["output_tokens"] or 0
        if row["status"] == OK:
            self.ok += 1
        elif row["status"] == INVALID:
            self.invalid += 1
        elif row["status"] == FAILED:
            self.failed += 1
            self.failed_fatal += row["error_kind"] == FATAL
            if len(self.errors) < 20:
                self.errors.append(f"{task_id}: {row['error']}")


@dataclass(frozen=True, slots=True)
class _Job:
    adapter: Adapter
    task: Task
    request: Request
    limiter: ProviderLimiter
    charge: Charge


async def run(
    models: Sequence[Adapter | ModelRun],
    suite: Suite,
    cache: Cache,
    *,
    epochs: int = 1,
    on_progress: Callable[[str, Stats], None] | None = None,
    limiters: dict[str, ProviderLimiter] | None = None,
    budget: Budget | None = None,
    shard: Shard | None = None,
    stop: RunStop | None = None,
) -> dict[str, Stats]:
    """Run every task of ``suite`` on every model (a ``ModelRun``, or a started Adapter run
    ``epochs`` times with its own limits) and return the Stats per model label. Each outcome is in
    the cache before its worker takes the next request. ``limiters`` (limits key -> ProviderLimiter)
    is filled in when given, for reports. ``budget`` tracks the cost and holds the cost bound
    (``budget.stopped`` once reached). Before anything is sent, every selected file is checked whole
    (``Suite.validate``: a malformed row or a repeated task id raises ``evals.DatasetError``), and
    before the first request is handed out the cache must be writable (``CacheWriteError``; a run
    with nothing to send needs no writing). An error that stops the run later (a task stream's, the
    cache's) stops handing out requests; the requests in flight finish and are stored, then it is
    raised. ``shard`` (``runner.planning.shard``): only the requests whose cache key it owns are
    counted and sent. ``stop``: once requested (the first Ctrl-C or SIGTERM), the run drains and
    returns (``runner.sending.stops.RunStop``)."""
    suite.validate()
    runs = [m if isinstance(m, ModelRun) else ModelRun(m, epochs) for m in models]
    limiters = {} if limiters is None else limiters
    for r in runs:
        limiters.setdefault(r.limits_key, ProviderLimiter(r.adapter.limits))
    scheduler = Scheduler(
        runs,
        suite,
        cache,
        limiters,
        budget if budget is not None else Budget(),
        stop if stop is not None else RunStop(),
        shard,
        on_progress,
    )
    return await scheduler.run()


class Scheduler:
    """One run's scheduler: the state ``run`` shares between its feeders and workers, named.

    Set at the start: ``runs`` (the models), ``suite``, ``cache``, ``limiters`` (one per limits key,
    every model's present), ``budget`` (the cost bound), ``stop`` (the run stopping from outside),
    ``shard`` (None: every request), ``on_progress`` (called with a model's label and Stats as they
    change); ``stats`` (per model label), ``provider_of`` (model label -> limits key), ``run_of``
    (model label -> its ModelRun), ``n_workers`` (the sum of the providers' ``max_in_flight``) and
    ``queue`` (the requests handed out, at most ``n_workers``; None tells a worker to end). Changing
    as the run goes: ``feeds`` (per limits key, its models' request streams, taking turns),
    ``unsent`` (a stopped provider's or model's streams, for its feeder to count not sent),
    ``stored_cached`` (per model label: the requests stored that the cache counts as cached, for
    ``unencoded``), ``in_flight`` (cache keys handed out and not yet stored -> model label),
    ``fed`` (the providers whose feed was handed out and counted whole), ``waiting`` (the slots
    feeders wait for: ``slot``), ``stopped_by`` (the error that stops the run: nothing more is
    handed out; the first is raised at the end) and ``writable`` (the cache was found writable).

    The parts: what to send (``uncached``, ``next_job``, ``drain``, ``unencoded``), sending and
    storing one request (``send``, ``record``), and the tasks that run them (``work``, ``fill``,
    ``feed``, ``run``)."""

    def __init__(
        self,
        runs: list[ModelRun],
        suite: Suite,
        cache: Cache,
        limiters: dict[str, ProviderLimiter],
        budget: Budget,
        stop: RunStop,
        shard: Shard | None,
        on_progress: Callable[[str, Stats], None] | None,
    ):
        self.runs, self.suite, self.cache, self.limiters = runs, suite, cache, limiters
        self.budget, self.stop, self.shard, self.on_progress = budget, stop, shard, on_progress
        stop.attach(limiters.values())
        self.stats = {r.label: Stats(cost_usd=None if r.price is None else 0.0) for r in runs}
        self.n_workers = sum(limiters[p].limits.max_in_flight for p in {r.limits_key for r in runs})
        self.queue: asyncio.Queue[_Job | None] = asyncio.Queue(maxsize=self.n_workers)
        self.in_flight: dict[str, str] = {}  # cache key -> model label
        self.fed: set[str] = set()
        self.waiting: set[asyncio.Semaphore] = set()
        stop.track(self.stats)  # a run cut short counts what these hold (runner.session)
        self.stopped_by: list[Exception] = []
        self.writable = False
        self.feeds: dict[
            str, deque[tuple[str, Iterator[_Job]]]
        ] = {}  # per provider: (model label, its requests)
        self.unsent: dict[str, list[tuple[str, Iterator[_Job], bool]]] = {}
        # per model label: the requests this run stored that the cache counts as cached (``record``)
        self.stored_cached = {r.label: 0 for r in runs}
        for r in runs:
            self.feeds.setdefault(r.limits_key, deque()).append((r.label, self.uncached(r)))
        self.provider_of = {r.label: r.limits_key for r in runs}
        self.run_of = {r.label: r for r in runs}

    def progress(self, label: str) -> None:
        if self.on_progress is not None:
            self.on_progress(label, self.stats[label])

    # what to send

    def uncached(self, model: ModelRun) -> Iterator[_Job]:
        """The requests of one model that need sending, each marked in flight as it is handed
        out."""
        adapter, cache, in_flight = model.adapter, self.cache, self.in_flight
        limiter, st, charge = (
            self.limiters[model.limits_key],
            self.stats[model.label],
            Charge(self.budget, model.price),
        )
        stream = ((task, request) for task, _, request in model.requests(self.suite, self.shard))
        while batch := list(islice(stream, BATCH)):
            cached = cache.has_many([request.key for _, request in batch])
            for (task, request), hit in zip(batch, cached, strict=True):
                st.total += 1
                # looked up again as it is handed out: the same request may have been sent meanwhile
                # (two tasks with identical content)
                if hit or request.key in in_flight or cache.has(request.key):
                    st.cache_hits += 1
                    self.progress(adapter.label)
                    continue
                if not self.writable:
                    # CacheWriteError before the first request, not at its reply
                    cache.check_writable()
                    self.writable = True
                in_flight[request.key] = model.label
                yield _Job(adapter, task, request, limiter, charge)

    def next_job(self, provider: str) -> _Job | None:
        """The next request of ``provider``'s feed, its models taking turns; None once all are done,
        or once the cost bound is reached or the provider stopped (its models' rest is then left in
        ``unsent`` for its feeder to count), or the run is stopping (the first Ctrl-C or SIGTERM:
        the same), or an error stops the run (a malformed row: recorded in ``stopped_by``)."""
        if self.stopped_by:
            return None
        streams = self.feeds[provider]
        limiter = self.limiters[provider]
        if (
            self.budget.stopped or limiter.halted is not None or self.stop.requested
        ):  # the cost bound was reached, the provider stopped (runner.sending.stops) or the run is
            # stopping: count the rest not sent
            if streams:
                # by its feeder (``fill``), beside the requests still in flight (a big suite's rest
                # takes seconds); the provider's stop, when it stopped, is what left them
                by_stop = limiter.halted is not None
                self.unsent.setdefault(provider, []).extend((lb, s, by_stop) for lb, s in streams)
                streams.clear()
            return None
        while streams:
            label, stream = entry = streams[0]
            streams.rotate(-1)
            # this model stopped alone: its rest is counted not sent at the end
            if label in limiter.stopped_models:
                streams.remove(entry)
                self.unsent.setdefault(provider, []).append((label, stream, True))
                continue
            try:
                job = next(stream, None)
            # the requests in flight finish and are stored, then it is raised
            except Exception as exc:
                self.stopped_by.append(exc)
                return None
            if job is not None:
                return job
            streams.remove(entry)
        return None

    async def drain(self, streams: list[tuple[str, Iterator[_Job], bool]]) -> None:
        """Count the requests left in ``streams`` (model label, its stream, and True when a
        provider's or model's stop left it: counted in ``stop_not_sent`` too; a stopped provider's
        or model's, or every provider's once the cost bound is reached or the run is stopping) as
        not sent. When none of a stream's rest can be a cache hit (``unencoded``) they are counted
        at once; otherwise ``DRAIN_BATCH`` per event-loop turn, each encoded and looked up in the
        cache (a cached one counts as a cache hit, as it would have). An error of a task stream
        stops the run as it does when met by ``next_job``."""
        labels: set[str] = set()
        n = 0
        try:
            for label, stream, by_stop in streams:
                left = await self.unencoded(label)
                if left is not None:  # none of them is a cache hit: counted without encoding
                    stream.close()
                    st = self.stats[label]
                    st.total += left
                    st.not_sent += left
                    st.stop_not_sent += left if by_stop else 0
                    labels.add(label)
                    continue
                for job in stream:
                    st = self.stats[job.adapter.label]
                    st.not_sent += 1
                    st.stop_not_sent += by_stop
                    self.in_flight.pop(job.request.key, None)
                    labels.add(job.adapter.label)
                    n += 1
                    if n % DRAIN_BATCH == 0:
                        await asyncio.sleep(0)
        # a malformed row: the run stops, the requests in flight finish first
        except Exception as exc:
            self.stopped_by.append(exc)
        for label in labels:
            self.progress(label)

    async def unencoded(self, label: str) -> int | None:
        """How many requests ``label``'s stream has left, counted without encoding each (~15 µs a
        request), else None. Only when none can be a cache hit: no task renders to another's
        request (``Suite.distinct_tasks``), and every key of the model's rows in the cache
        (``rows.keys_of``) that the cache counts as cached is one the stream met (a cache hit, or
        stored: ``stored_cached``). Then the rest is tasks × epochs less ``Stats.total``. Not with a
        shard, nor when the model's rows changed while read; a read error falls back to encoding."""
        run = self.run_of[label]
        if self.shard is not None:
            return None
        tasks = await asyncio.to_thread(self.suite.distinct_tasks)
        if tasks is None:
            return None
        stored = self.stored_cached[label]
        try:
            keys = await asyncio.to_thread(keys_of, self.cache, run, self.suite)
        except Exception:  # noqa: BLE001 (the count by encoding does without)
            return None
        st = self.stats[label]
        if self.stored_cached[label] != stored or sum(self.cache.has_many(keys)) != (
            st.cache_hits + stored
        ):
            return None
        return tasks * run.epochs - st.total

    # sending and storing one request

    def record(self, job: _Job, outcome: Outcome) -> None:
        """Append ``outcome``'s row to the cache and count it in its model's Stats."""
        st = self.stats[job.adapter.label]
        row = make_row(job.task, job.request, outcome)
        try:
            self.cache.append(row)
        except Exception:  # paid for, not stored (a full disk): in sent, its charge in the cost
            st.unstored, st.unstored_usd = st.unstored + 1, st.unstored_usd + outcome.cost_usd
            raise
        self.stored_cached[job.adapter.label] += self.cache.has(row["key"])
        st.attempts += outcome.attempts
        st.retries += max(0, outcome.attempts - 1)  # its attempts after the first
        st.retry_wait_s += sum(row["retry_waits_s"])
        st.rate_limited += outcome.rate_limited
        st.add(row, job.task.id)

    async def send(self, job: _Job) -> None:
        """``_send`` ``job``, counted ``in_flight`` meanwhile, its model's progress handed on as it
        is taken up (so a log shows it from the first interval, whatever a reply takes) and once it
        is counted (not when an error stops the run)."""
        st = self.stats[job.adapter.label]
        st.in_flight += 1
        self.progress(job.adapter.label)
        try:
            await self._send(job)
        finally:
            st.in_flight -= 1
        self.progress(job.adapter.label)

    async def _send(self, job: _Job) -> None:
        """Attempt ``job`` (``runner.sending.retry.attempt``) and store its outcome; a request not
        sent (the cost bound, the run stopping) or refused by a stopped provider is counted and
        leaves no row."""
        st = self.stats[job.adapter.label]
        outcome = Outcome()
        self.stop.started()
        try:
            try:
                await attempt(job.adapter, job.task, job.request, job.limiter, outcome, job.charge)
            except (CostBoundReached, RunStopping) as stopping:
                if not outcome.attempts:  # not sent: no row, the next run sends it
                    st.not_sent += 1
                    return
                # sent, failed, and its retry not sent: its row is a transient failure (sent again
                # next run)
                why = (
                    "the cost bound was reached"
                    if isinstance(stopping, CostBoundReached)
                    else "the run was stopped"
                )
                outcome.error = Transient(
                    f"{job.adapter.label}: {why} before a retry could be sent (after "
                    f"{outcome.attempts} attempt(s))"
                )
            finally:
                if st.cost_usd is not None:
                    st.cost_usd += outcome.cost_usd
                    st.cost_at_reservation_usd += outcome.cost_at_reservation_usd
                    st.cost_unbounded += outcome.cost_unbounded
                if outcome.attempts and not isinstance(outcome.error, ProviderStop):
                    st.sent += 1
                    if st.started is None:
                        st.started = time.monotonic()
            # the provider stopped: no row, the next run sends it
            if isinstance(outcome.error, ProviderStop):
                if outcome.attempts:
                    st.refused += 1
                else:
                    st.not_sent += 1
                    st.stop_not_sent += 1
                st.attempts += outcome.attempts
                st.retries += max(0, outcome.attempts - 1)
                st.rate_limited += outcome.rate_limited
                return
            self.record(job, outcome)
        except asyncio.CancelledError:
            if outcome.reply is not None and outcome.error is None:
                self.record(job, outcome)  # it arrived: keep it, then stop
            else:
                self.abandon(job, outcome)
            raise
        finally:
            self.in_flight.pop(job.request.key, None)
            self.stop.finished()

    def abandon(self, job: _Job, outcome: Outcome) -> None:
        """Count ``job``, cancelled before its reply came: not sent when no attempt left, else
        ``abandoned`` (in ``sent`` with its charge already: its reservation kept), with no row."""
        st = self.stats[job.adapter.label]
        if not outcome.attempts:
            st.not_sent += 1
            return
        st.abandoned += 1
        st.abandoned_usd += outcome.cost_usd
        st.attempts += outcome.attempts
        st.retries += max(0, outcome.attempts - 1)
        st.rate_limited += outcome.rate_limited

    def cut_short(self) -> None:
        """The run was cancelled (a second signal, the end of ``--grace``) once every worker and
        feeder ended: the requests handed out and never attempted are not sent; the models whose
        feed was not counted whole are ``uncounted``."""
        for label in self.in_flight.values():
            self.stats[label].not_sent += 1
        self.in_flight.clear()
        for r in self.runs:
            self.stats[r.label].uncounted = int(r.limits_key not in self.fed)

    # the tasks

    async def work(self) -> None:
        """A worker: takes a request off the queue, then its provider's next ones while it has
        them."""
        while (job := await self.queue.get()) is not None:
            slots = job.limiter.slots
            try:
                # on to the provider's next request, keeping the slot
                while job is not None and not self.stopped_by:
                    try:
                        await self.send(job)
                    # e.g. the cache cannot be written: the others finish theirs
                    except Exception as exc:
                        self.stopped_by.append(exc)
                        break
                    job = self.next_job(self.provider_of[job.adapter.label])
            finally:
                slots.release()

    async def fill(self, provider: str) -> None:
        """``provider``'s feeder: a slot of the provider for each request it puts on the queue."""
        slots = self.limiters[provider].slots
        while True:
            held = await self.slot(slots)
            job = self.next_job(provider)  # (none without a slot: the run is stopping)
            if job is None:
                if held:
                    slots.release()
                if provider in self.unsent:
                    await self.drain(self.unsent.pop(provider))
                self.fed.add(provider)
                return
            await self.queue.put(job)

    async def slot(self, slots: asyncio.Semaphore) -> bool:
        """One of ``slots`` (True), or none once the run is stopping (False); a wait when the stop
        is asked ends at once (``wake``), not when a request slower than ``--grace`` ends."""
        if self.stop.requested:
            return False
        self.waiting.add(slots)
        try:
            await slots.acquire()
        finally:
            self.waiting.discard(slots)
        return True

    async def wake(self) -> None:
        """Once the stop is asked, a slot more for each feeder waiting (``slot``), which it gives
        back: ``next_job`` hands out nothing then. One task a run, no race on every request."""
        await self.stop.asked.wait()
        for slots in tuple(self.waiting):
            slots.release()

    async def feed(self) -> None:
        """Every provider's feeder, then one end-marker per worker."""
        waking = asyncio.ensure_future(self.wake())
        try:
            async with asyncio.TaskGroup() as feeders:
                for provider in self.feeds:
                    feeders.create_task(self.fill(provider))
        finally:
            waking.cancel()
        for _ in range(self.n_workers):
            await self.queue.put(None)

    async def run(self) -> dict[str, Stats]:
        """The feeders and the workers until every request is stored (or the run stops); the Stats
        per model label. Raises the first error that stopped the run, as itself."""
        try:
            async with asyncio.TaskGroup() as tasks:
                tasks.create_task(self.feed())
                for _ in range(self.n_workers):
                    tasks.create_task(self.work())
        except asyncio.CancelledError:
            self.cut_short()
            raise
        except ExceptionGroup as group_error:  # e.g. a malformed dataset row: raise it as itself
            first = group_error
            while isinstance(first, ExceptionGroup):
                first = first.exceptions[0]
            raise first from group_error
        if self.stopped_by:
            raise self.stopped_by[0]
        return self.stats
