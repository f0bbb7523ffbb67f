"""Batch mode (``dxi run --batch``, ``batch = true`` in a run file): a model's requests that are not
cached go through its provider's batch API (``adapters.batches``) instead of one call at a time, at
the batch price (docs/batch.md).

One ``ModelBatches`` per model, holding the model's claim (``cache.claims``), runs two tasks side by
side:

* **streaming**: the suite's requests (each epoch; those the shard owns), looked up in the cache; a
  request claimed by an open ledger entry (``cache.ledger``: submitted by an earlier run, or by this
  one) waits for that batch's results; any other uncached one goes into the batch being built: its
  line written to the entry's input file (``batches/<entry>.input.jsonl``), its worst-case cost
  reserved under ``--max-cost`` (``runner.sending.cost``, at the batch price) before it is added. A
  batch is submitted when it reaches the provider's request-count or byte limit (``BatchLimits``),
  the ``batch_max_requests`` of the run file or ``--batch-size``, or the end of the suite; with
  ``batch_enqueued_tokens`` (the provider's enqueued-token limit) no more than that many input
  tokens are in open batches at once.
* **polling**: each open entry is read every ``poll_s`` seconds at first, the wait growing by half
  each time up to ``max_poll_s`` (a few reads a minute at most, never a busy loop); an entry another
  live process polls (its ``collector`` lock) is only watched through the ledger. The requests
  given back are submitted again by a task of their own (``_submit_requeued``, once the streaming
  is done), so that their wait for room under the cost bound never stops the polling that makes it.

**Submitting** follows the ledger's rule (intent first, GUIDE §11): the entry's keys and ``intent``
event are written (fsync'd), then the input file is uploaded (``uploaded``), then the batch is
created tagged with the entry id where the provider allows (``submitted``, written the instant the
reply is read). A create whose reply was lost (a timeout, a broken connection) is looked for by its
tag before it is tried again.

**Reconciling** at start: an entry with an intent but no batch id is looked for at the provider
(``find``: by its tag; Anthropic, which has none, by size among the batches its listing gives as
created after the newest one it listed before the create): every batch found is
adopted (one entry each, sharing the keys), else the entry is abandoned (its requests go in a new
batch, its uploaded input file is deleted at the provider). An entry whose batch the provider no
longer knows (404) ends ``lost``, and one whose results it no longer has (404, past its retention)
is collected empty: their requests are given back. A ledger event or input file that cannot be
written raises ``LedgerError`` (a ``CacheWriteError``: exit code 4).

**Collecting** an ended batch: each result line, as read, goes through the adapter's ``decode`` and
the same row as a synchronous reply (``runner.sending.rows.make_row``, ``transport`` "batch" and the
batch id); the rows of each piece read from the network (up to 64 KiB of lines, ``BatchAPI.lines``)
are appended to the cache in one write before the next piece is read; a deterministic error
(400-class) is stored as a failure; a transient one (5xx, 429, a body that is not the wire format),
a request the batch did not run (it expired or was cancelled) and a request with no result line are
**given back**: into the next batch, up to ``Limits.max_attempts`` times, then stored as a transient
failure (sent again by the next run). A result whose key is already in the cache (a collection cut
by a kill, done again) is skipped. Then the ``collected`` event closes the entry.

**Deadline** (``--deadline``): at that time every open batch of this run is cancelled, its results
(what was done before the cancel) collected, and nothing more is submitted; with
``--deadline-fallback sync`` what is left is sent synchronously (``runner.dispatch``). Without a
deadline the run waits for its batches; Ctrl-C leaves them running and the next run collects them.

Test hooks: ``DXI_FAILPOINT=NAME`` kills the process (SIGKILL) at a named step: ``intent`` (after
the intent is recorded), ``upload_reply`` (after the provider's reply to the upload, before it is
recorded), ``uploaded``, ``created`` (after the provider's reply, before it is recorded: the window
no tag closes for Anthropic), ``submitted``, ``append:N`` (after the append that stored the N-th row
of this process's collections: a piece of results is appended at once).

**Where it is**: ``ModelBatches`` is one model's state machine over its ledger entries: streaming,
submitting, polling and collecting share the entries being built and watched, the cost reservations,
the requests given back and the claim. Its state is set (and each field described) in
``ModelBatches.__init__`` here, with the run, the streaming and the polling; its submitting and
reconciling are ``runner.batch.submit.Submitting``, its collecting
``runner.batch.collect.Collecting`` (mixins on the same state, each a module that reads in one
sitting); the settings, counts and shared helpers are ``runner.batch.options``. The command line's
flags are ``runner.commands.options`` and ``dxi batches`` is ``runner.open_batches``; the wire
formats are ``adapters.batches`` and its ``*_batch`` adapters, the ledger ``cache.ledger``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import time
from collections.abc import Callable, Iterator
from itertools import chain, islice

from dxi.adapters import AdapterError, Fatal, Request
from dxi.adapters.batches import FAILED as FAILED_BATCH
from dxi.adapters.batches import BatchAPI, BatchLost, BatchStatus
from dxi.cache import Cache, CacheWriteError
from dxi.cache.ledger import Ledger
from dxi.evals import Suite, Task

from ..planning.plan import ModelRun
from ..planning.shard import Shard
from ..planning.tokens import BYTES_PER_TOKEN
from ..sending.cost import Budget, Charge, CostBoundReached
from .collect import Collecting
from .options import LOOKUP, BatchOptions, BatchStats, with_retries
from .submit import Submitting, _Builder


class ModelBatches(Submitting, Collecting):
    """One model's batch mode (see the module docstring). ``stats`` is filled in as it goes;
    ``events`` gets a line for each batch state change (log mode prints it); ``on_progress`` is
    called after each result stored. ``run()`` returns the requests left unsent, ``(task, sample)``
    pairs (a deadline passed or the batch API refused): the caller sends them synchronously or
    leaves them to the next run."""

    def __init__(
        self,
        model: ModelRun,
        api: BatchAPI,
        suite: Suite,
        cache: Cache,
        ledger: Ledger,
        identity: str,
        *,
        budget: Budget,
        options: BatchOptions,
        batch_price: tuple[float | None, ...] | None,
        shard: Shard | None = None,
        stats: BatchStats | None = None,
        events: Callable[[str], None] | None = None,
        on_progress: Callable[[], None] | None = None,
        tasks: dict[str, Task] | None = None,
        collecting: asyncio.Lock | None = None,
    ):
        self.model, self.api, self.suite, self.cache, self.ledger = model, api, suite, cache, ledger
        self.adapter = model.adapter
        self.identity, self.budget, self.options, self.shard = identity, budget, options, shard
        self.charge = Charge(budget, batch_price)
        self.stats = (
            stats
            if stats is not None
            else BatchStats(cost_usd=None if batch_price is None else 0.0)
        )
        self.events = events or (lambda text: None)
        self.on_progress = on_progress or (lambda: None)
        limits = api.limits
        self.max_requests = min(limits.max_requests, options.max_requests or limits.max_requests)
        self.max_bytes = limits.max_bytes
        self.waiting: dict[
            str, tuple[Task, int]
        ] = {}  # key -> its task and epoch, while its result is awaited
        self.tasks = (
            tasks if tasks is not None else {}
        )  # task id -> one Task, shared by the models of a run
        # one collection at a time in a run (shared by its models): batches that end together are
        # stored one after the other, each result file's bodies and lines held once, not twenty
        # times (the work is CPU)
        self.collecting = collecting if collecting is not None else asyncio.Lock()
        self.keys_of: dict[
            str, set[str]
        ] = {}  # entry id -> the keys streamed that it claims (earlier runs' entries)
        self.fresh: set[str] = set()  # entries submitted by this run: collected as soon as they end
        self.reserved: dict[str, float] = {}  # key -> its reservation under the cost bound
        self.attempts: dict[str, int] = {}  # key -> batches it was in during this run
        self.counted: set[str] = set()  # keys counted ``sent``: submitted in a batch of this run
        # where the streaming stands, for a stop (``count_stopped``): the suite's requests not yet
        # streamed, the lookup being streamed and its item at hand, the key being added
        self.stream: Iterator[tuple[Task, int, Request]] | None = None  # None: not started
        self.chunk: list[tuple[Task, int, Request]] = []
        self.at = -1
        self.adding: str | None = None
        self.submitting: _Builder | None = None  # the batch being submitted (``_submit``)
        self.mine: dict[
            str, float
        ] = {}  # entry id -> next status read (monotonic), for entries this run polls
        self.locks: dict[str, contextlib.ExitStack] = {}  # entry id -> its collector lock, held
        self.watched: set[str] = set()  # entries another live process polls
        self.entry_tokens: dict[str, float] = {}
        self.requeue: list[str] = []  # keys given back, for the next batch
        # submitting them (``_submit_requeued``): a task of its own, as the streaming is, so that
        # its wait for room under the cost bound does not stop the polling that makes the room
        self.resubmitting: asyncio.Task | None = None
        self.left: list[tuple[Task, int]] = []
        self.refused: set[str] = set()  # keys in this run's batches the provider refused whole
        self.refused_left = 0  # how many of ``left`` they are (counted refused, not "not sent")
        self.wake = asyncio.Event()
        self.stopped: AdapterError | None = (
            None  # the batch API refused this model: nothing more is submitted
        )
        self.cancelled = False
        self.appended = 0
        self.failpoint = os.environ.get(
            "DXI_FAILPOINT"
        )  # the test hook, read once: a row's append looks it up
        self.params_key = (
            self.adapter.params_key
        )  # (each result's request is rebuilt with it: computed once)
        self.stats.in_batch = self.stats.in_batch or not options.collect_only

    # ---- helpers ------------------------------------------------------------------------------
    @property
    def label(self) -> str:
        return self.adapter.label

    def _say(self, text: str) -> None:
        self.events(f"{self.label}: {text}")

    def _resume_hint(self) -> str:
        """The command that lifts a stop of this model's batch mode kept in the ledger."""
        return (
            f"`dxi batches resume --model {shlex.quote(self.label)} "
            f"--cache-dir {shlex.quote(str(self.ledger.root))}`"
        )

    def _lock(self, entry_id: str) -> bool:
        """Take the collector lock of ``entry_id`` (kept until the entry is closed); False if
        another live process holds it."""
        if entry_id in self.locks:
            return True
        stack = contextlib.ExitStack()
        if stack.enter_context(self.ledger.collector(entry_id)):
            self.locks[entry_id] = stack
            return True
        stack.close()
        return False

    def _unlock(self, entry_id: str) -> None:
        stack = self.locks.pop(entry_id, None)
        if stack is not None:
            stack.close()

    def sent_already(self, keys: frozenset[str]) -> frozenset[str]:
        """Those of ``keys`` (requests left: ``run``'s return) counted ``sent`` already: in a batch
        of this run that gave them back (a cancel at the deadline, an expiry), not refused whole.
        The caller counts each request once: not again when it sends them synchronously, nor as
        ``not_sent`` when it leaves them or cannot send them (``unanswered``)."""
        return frozenset(keys.intersection(self.counted) - self.refused)

    def _requests(self) -> Iterator[tuple[Task, int, Request]]:
        return self.model.requests(self.suite, self.shard)

    # ---- the run ------------------------------------------------------------------------------
    async def run(self) -> list[tuple[Task, int]]:
        """Reconcile, stream and submit, poll and collect until every request of the model is
        answered, given up, or left (see the class docstring)."""
        try:
            await self._reconcile()
            streaming = asyncio.create_task(self._stream())
            try:
                await self._poll_until_done(streaming)
            finally:
                if not streaming.done():
                    streaming.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await streaming
            if streaming.done() and not streaming.cancelled() and streaming.exception() is not None:
                raise streaming.exception()
        except CacheWriteError:  # a full disk: what this run's open batches hold is committed
            self._count_cut()
            with contextlib.suppress(OSError):
                self._release(self.ledger.claimed(self.identity))
            raise
        finally:
            if self.resubmitting is not None and not self.resubmitting.done():
                self.resubmitting.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self.resubmitting
            for entry_id in list(self.locks):
                self._unlock(entry_id)
        still = self.ledger.claimed(
            self.identity
        )  # an open batch holds them: the next run collects them
        gone = [k for k in self.waiting if k not in still and not self.cache.has(k)]
        self.left += [self.waiting.pop(k) for k in gone]
        self.refused_left = len(self.refused.intersection(gone))
        self._release(still)
        return self.left

    def _release(self, claimed: dict[str, str]) -> None:
        """The run ends (or a stop cut it): every reservation still held is released, and those of
        the requests in this run's batches still open (``claimed``: key -> entry, the ledger's) are
        recorded as what the run committed (``BatchStats.open_*``: at most their cost; the run
        that collects them records what they cost, ``from_earlier_usd``; without ``--max-cost`` a
        model whose output has no cap reserves its input alone: ``open_unbounded``)."""
        for key in list(self.reserved):
            reserved = self.reserved.pop(key)
            self.budget.settle(reserved, 0.0)
            if key in claimed and key in self.waiting and not self.cache.has(key):
                self.stats.open_entries.add(claimed[key])
                self.stats.open_requests += 1
                self.stats.open_answers += len(self.waiting[key][0].questions)
                self.stats.open_reserved_usd += reserved
                if not self.charge.is_bound(self.adapter, self.waiting[key][0]):
                    self.stats.open_unbounded += 1  # its input alone: no bound of its cost

    # ---- streaming and submitting -------------------------------------------------------------
    async def _stream(self) -> None:
        """Every request of the model: cached, awaited from an open entry, or put in a new batch."""
        claimed = self.ledger.claimed(self.identity)
        builder: _Builder | None = None
        stream = self.stream = self._requests()
        bounded = False  # the cost bound left no room: the rest is counted, not sent
        try:
            while batch := list(islice(stream, LOOKUP)):
                self.chunk, self.at = batch, -1
                await self._after_collection()
                for at, ((task, sample, request), hit) in enumerate(
                    zip(batch, self.cache.has_many([r.key for _, _, r in batch]), strict=True)
                ):
                    key, self.at = request.key, at
                    # collecting only, the synchronous path beside counts the requests but those an
                    # open batch claims, which it leaves to this one
                    counted = not self.options.collect_only or key in claimed
                    self.stats.total += counted
                    if hit or key in self.waiting:
                        self.stats.cache_hits += counted
                        continue
                    task = self.tasks.setdefault(
                        task.id, task
                    )  # one copy of a task however many models await it
                    owner = claimed.get(key)
                    if owner is not None:
                        self.waiting[key] = (task, sample)
                        self.keys_of.setdefault(owner, set()).add(key)
                        if owner in self.watched:
                            self.stats.claimed += 1
                        continue
                    if self.options.collect_only:
                        continue  # not this path's: sent synchronously beside it
                    if self.stopped is not None or self._past_deadline():
                        self.left.append((task, sample))
                        continue
                    if bounded:
                        self.stats.not_sent += 1
                        continue
                    try:
                        self.adding = key
                        builder = await self._add(builder, task, sample, request)
                        self.adding = None
                    except CostBoundReached:
                        self.adding = None  # this one and every later one not cached: not sent
                        bounded = True
                        if (
                            self.stopped is not None
                        ):  # refused meanwhile: the stop's, not the bound's
                            self.left.append((task, sample))
                        else:
                            self.stats.not_sent += 1
                self.on_progress()
            self.chunk = []
            if builder is not None:  # (one ``_add`` submitted already is not submitted again)
                await self._submit(builder)
        finally:
            self.wake.set()

    def _count_cut(self):
        """The batch whose submission a stop (or a full disk) cut, taken off (None: none): its
        requests counted ``sent`` once its create went out (the batch may exist)."""
        cut, self.submitting = self.submitting, None
        if cut is not None and cut.creating:
            new = set(cut.keys) - self.counted
            self.counted |= new
            self.stats.sent += len(new)
        return cut

    async def count_stopped(self) -> None:
        """The run was stopped (the first Ctrl-C or SIGTERM: ``run`` cut) with this model's requests
        partly streamed: each one counted once. Not yet streamed: a cache hit, in an open batch (an
        earlier run's: neither, the next run collects it) or ``not_sent``; streamed and waiting in
        no open batch (or left after a refusal): ``not_sent`` when never submitted (in the batch
        being built, or waiting for room under the bound), ``unanswered`` when a batch of this run
        gave it back (counted ``sent``). Those in an open batch (counted ``sent`` when this run
        submitted it) are collected by the next run. A batch whose submission the stop cut (its
        intent in the ledger, not yet confirmed) counts its requests ``sent`` once its create went
        out (the batch may exist: the next run finds it by its tag and collects it, or abandons
        it), else as in no batch."""
        if self.options.collect_only:
            return
        st, claimed = self.stats, self.ledger.claimed(self.identity)
        self._release(claimed)  # what this run's open batches hold: committed, recorded apart
        cut = self._count_cut()
        unsent = cut.entry if cut is not None and not cut.creating else None  # never created
        held = [
            k for k in self.waiting if claimed.get(k, unsent) == unsent and not self.cache.has(k)
        ]
        if self.adding is not None and self.adding not in self.waiting:
            held.append(self.adding)  # cut while waiting for room: not in a batch
        left = frozenset(self.adapter.encode(task, sample).key for task, sample in self.left)
        sent = sum(k in self.counted for k in held) + len(self.sent_already(left))
        st.unanswered += sent
        st.not_sent += len(held) + len(left - self.refused) - sent
        self.left = []
        stream = self._requests() if self.stream is None else self.stream
        rest = chain(self.chunk[self.at + 1 :], stream)
        while part := list(islice(rest, LOOKUP)):
            for (_, _, request), hit in zip(
                part, self.cache.has_many([r.key for _, _, r in part]), strict=True
            ):
                st.total += 1
                st.cache_hits += hit
                st.not_sent += not hit and request.key not in claimed
            await asyncio.sleep(0)
        self.chunk, self.stream = [], iter(())

    async def _after_collection(self) -> None:
        """Let a collection under way (any model's) finish before more requests are encoded: answers
        already produced reach the cache first, and encoding is CPU on the same core."""
        if self.collecting.locked():
            async with self.collecting:
                return
        await asyncio.sleep(0)

    def _past_deadline(self) -> bool:
        return self.options.deadline is not None and time.time() >= self.options.deadline

    # ---- polling and collecting ---------------------------------------------------------------
    async def _poll_until_done(self, streaming: asyncio.Task) -> None:
        """Poll the open entries until each is collected (and what they gave back is submitted
        again), or, collecting only without waiting, once each. Earlier runs' entries are read once
        the stream has named their tasks; this run's as soon as they are due."""
        deadline_done = False
        once = self.options.collect_only and not self.options.wait
        while True:
            if (
                self._past_deadline()
            ):  # each loop: a batch whose create was on the wire at the deadline too
                if not deadline_done:
                    self._say(
                        "deadline reached: cancelling the open batches, keeping every result produced"
                    )
                deadline_done = True
                await self._cancel_all()
            resubmitting = self.resubmitting is not None and not self.resubmitting.done()
            if self.resubmitting is not None and self.resubmitting.done():
                done, self.resubmitting = self.resubmitting, None
                done.result()  # its error (a ledger that cannot be written) is the run's
            if (
                self.requeue
                and streaming.done()
                and not resubmitting
                and not self._past_deadline()
                and self.stopped is None
                and not self.options.collect_only
            ):
                self.resubmitting = asyncio.create_task(self._submit_requeued())
                resubmitting = True
            now = time.monotonic()
            for entry_id, due in list(self.mine.items()):
                if (due <= now or once) and (streaming.done() or entry_id in self.fresh):
                    await self._poll(entry_id)
                    if once:
                        self.mine.pop(entry_id, None)
            for entry_id in list(self.watched):
                self._watch(entry_id)
            # again: it may have ended while the polls awaited (its wake-up cleared below)
            resubmitting = self.resubmitting is not None and not self.resubmitting.done()
            if streaming.done() and (
                once
                or (
                    not self.mine and not self._watching() and not self.requeue and not resubmitting
                )
            ):
                return
            waits = [
                due - time.monotonic()
                for entry_id, due in self.mine.items()
                if streaming.done() or entry_id in self.fresh
            ]
            if self.watched:
                waits.append(min(self.options.poll_s, 5.0))
            if self.options.deadline is not None and not deadline_done:
                waits.append(self.options.deadline - time.time())
            if self.requeue and streaming.done() and not resubmitting:
                waits.append(0.0)
            timeout = max(0.0, min(waits)) if waits else None
            self.wake.clear()
            if streaming.done() and timeout is None and not resubmitting:
                timeout = 0.0  # (resubmitting: its end wakes this loop)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), timeout)

    def _watching(self) -> bool:
        return any(
            not self.ledger.entries()[e].closed for e in self.watched if e in self.ledger.entries()
        )

    def _watch(self, entry_id: str) -> None:
        """An entry another process polls: done when its ledger says so (its rows are then in the
        cache), or taken over when that process is gone (its collector lock is free)."""
        entry = self.ledger.entries().get(entry_id)
        if entry is None or entry.closed:
            self.watched.discard(entry_id)
            if entry is not None:
                self.cache.refresh()
                for key in self.keys_of.pop(entry_id, set()):
                    if key in self.waiting and key not in entry.returned:
                        self.waiting.pop(key)
                        self.stats.claimed = max(0, self.stats.claimed - 1)
                        self.stats.cache_hits += 1
                    elif key in self.waiting and not self.options.collect_only:
                        self.requeue.append(key)
            self.on_progress()
            return
        if self._lock(entry_id):  # its poller is gone: this run takes it over
            self.watched.discard(entry_id)
            self.mine[entry_id] = 0.0
            self.stats.running[entry_id] = entry.submitted_at or entry.created
            self.entry_tokens[entry_id] = entry.bytes / BYTES_PER_TOKEN
            self._say(
                f"took over batch {entry.batch_id or entry.id} from process {entry.pid} (gone)"
            )

    async def _poll(self, entry_id: str) -> None:
        entry = self.ledger.entries()[entry_id]
        if entry.batch_id is None:  # an intent this run could not reconcile: left to the next run
            self.mine.pop(entry_id, None)
            return
        try:
            status = await self.api.get(entry.batch_id)
        except BatchLost as exc:
            self.ledger.record(entry_id, "ended", outcome="lost", state="not found", output={})
            self._say(
                f"batch {entry.batch_id} is gone at the provider (404: {exc}); its requests are given back"
            )
            async with self.collecting:
                await self._collect(self.ledger.entries()[entry_id], None)
            return
        except AdapterError as exc:
            self._schedule(entry_id)
            self._say(f"could not read batch {entry.batch_id} ({exc}); trying again later")
            return
        if status.outcome is None:
            if status.state != entry.state:
                self.ledger.record(entry_id, "state", state=status.state, counts=status.counts)
                self._say(
                    f"batch {entry.batch_id} {entry.state} -> {status.state} {self._counts(status)}"
                )
            self._schedule(entry_id)
            return
        if not entry.ended:
            self.ledger.record(
                entry_id,
                "ended",
                outcome=status.outcome,
                state=status.state,
                counts=status.counts,
                output=status.output,
            )
            self._say(
                f"batch {entry.batch_id} {entry.state} -> {status.state} ({status.outcome}) {self._counts(status)}"
            )
        if (
            status.outcome == FAILED_BATCH
        ):  # the input refused whole: submitting it again would fail the same way
            errors = (
                status.output.get("errors") if isinstance(status.output.get("errors"), dict) else {}
            )
            first = next(iter(errors.get("data") or []), {})
            self.stopped = Fatal(
                f"{self.label}: batch {entry.batch_id} failed: {first.get('message') or status.state}"
            )
            self.stats.stopped = str(self.stopped)
            self.events(str(self.stopped))  # (it names the model already)
        async with self.collecting:
            await self._collect(self.ledger.entries()[entry_id], status)

    @staticmethod
    def _counts(status: BatchStatus) -> str:
        return ", ".join(f"{k} {v}" for k, v in status.counts.items() if isinstance(v, int)) or ""

    def _schedule(self, entry_id: str) -> None:
        """The next status read of an entry: half the batch's age so far, from ``poll_s`` to
        ``max_poll_s`` (a new batch's wait grows by half each time); once its cancel was asked (a
        deadline, ``dxi batches cancel``), every ``poll_s`` (at most 5 s): what it leaves is sent by
        the synchronous fallback as soon as it has ended."""
        running = time.time() - self.stats.running.get(entry_id, time.time())
        wait = min(self.options.max_poll_s, max(self.options.poll_s, running / 2))
        entry = self.ledger.entries().get(entry_id)
        if self.cancelled or (entry is not None and entry.cancel_at is not None):
            wait = min(self.options.poll_s, 5.0)
        self.mine[entry_id] = time.monotonic() + wait

    async def _cancel_all(self) -> None:
        """The deadline: cancel every open batch this run polls (once each); nothing more is
        submitted."""
        self.cancelled = True
        for entry_id in list(self.mine):
            entry = self.ledger.entries()[entry_id]
            if entry.batch_id is None or entry.ended or entry.cancel_at is not None:
                continue
            try:
                await with_retries(
                    lambda e=entry: self.api.cancel(e.batch_id), self.adapter, "cancel"
                )
                self.ledger.record(entry_id, "cancel", reason="deadline")
                self._say(f"batch {entry.batch_id} cancelled at the deadline")
            except AdapterError as exc:
                self.ledger.record(
                    entry_id, "cancel", reason=f"deadline (the cancel failed: {exc})"
                )
                self._say(f"could not cancel batch {entry.batch_id}: {exc}")
            self.mine[entry_id] = time.monotonic() + min(self.options.poll_s, 5.0)
