"""Batch mode (``dxi run --batch``, ``batch = true`` in a run file): a model's requests that are not cached go
through its provider's batch API (``adapters.batches``) instead of one call at a time, at the batch price
(docs/batch.md).

One ``ModelBatches`` per model, holding the model's claim (``cache.claims``), runs two tasks side by side:

* **streaming**: the suite's requests (each epoch; those the shard owns), looked up in the cache; a request
  claimed by an open ledger entry (``cache.ledger``: submitted by an earlier run, or by this one) waits for
  that batch's results; any other uncached one goes into the batch being built: its line written to the
  entry's input file (``batches/<entry>.input.jsonl``), its worst-case cost reserved under ``--max-cost``
  (``runner.cost``, at the batch price) before it is added. A batch is submitted when it reaches the
  provider's request-count or byte limit (``BatchLimits``), the ``batch_max_requests`` of the run file or
  ``--batch-size``, or the end of the suite; with ``batch_enqueued_tokens`` (the provider's enqueued-token
  limit) no more than that many input tokens are in open batches at once.
* **polling**: each open entry is read every ``poll_s`` seconds at first, the wait growing by half each
  time up to ``max_poll_s`` (a few reads a minute at most, never a busy loop); an entry another live
  process polls (its ``collector`` lock) is only watched through the ledger.

**Submitting** follows the ledger's rule (intent first, GUIDE §11): the entry's keys and ``intent`` event
are written (fsync'd), then the input file is uploaded (``uploaded``), then the batch is created tagged with
the entry id where the provider allows (``submitted``, written the instant the reply is read). A create
whose reply was lost (a timeout, a broken connection) is looked for by its tag before it is tried again.

**Reconciling** at start: an entry with an intent but no batch id is looked for at the provider
(``find``: by its tag; Anthropic, which has none, by size among the batches its listing gives as
created after the newest one it listed before the create): every batch found is
adopted (one entry each, sharing the keys), else the entry is abandoned (its requests go in a new
batch, its uploaded input file is deleted at the provider). An entry whose batch the provider no
longer knows (404) ends ``lost``, and one whose results it no longer has (404, past its retention)
is collected empty: their requests are given back. A ledger event or input file that cannot be
written raises ``LedgerError`` (a ``CacheWriteError``: exit code 4).

**Collecting** an ended batch: each result line, as read, goes through the adapter's ``decode`` and the same
row as a synchronous reply (``runner.rows.make_row``, ``transport`` "batch" and the batch id); the rows of
each piece read from the network (up to 64 KiB of lines, ``BatchAPI.lines``) are appended to the cache in one
write before the next piece is read; a deterministic error (400-class) is stored as a failure; a transient one
(5xx, 429, a body that is not the wire format), a request the batch did not run (it expired or was
cancelled) and a request with no result line are **given back**: into the next batch, up to
``Limits.max_attempts`` times, then stored as a transient failure (sent again by the next run). A result
whose key is already in the cache (a collection cut by a kill, done again) is skipped. Then the
``collected`` event closes the entry.

**Deadline** (``--deadline``): at that time every open batch of this run is cancelled, its results (what
was done before the cancel) collected, and nothing more is submitted; with ``--deadline-fallback sync`` what
is left is sent synchronously (``runner.dispatch``). Without a deadline the run waits for its batches;
Ctrl-C leaves them running and the next run collects them.

Test hooks: ``DXI_FAILPOINT=NAME`` kills the process (SIGKILL) at a named step: ``intent`` (after the
intent is recorded), ``upload_reply`` (after the provider's reply to the upload, before it is recorded),
``uploaded``, ``created`` (after the provider's reply, before it is recorded: the
window no tag closes for Anthropic), ``submitted``, ``append:N`` (after the append that stored the N-th row
of this process's collections: a piece of results is appended at once).

**Why one module** over the ~400 lines modules keep to: ``ModelBatches`` (most of it) is one model's state
machine over its ledger entries: streaming, submitting, polling and collecting share the entries being
built and watched, the cost reservations, the requests given back and the claim, and follow the ledger's
intent-first order across all four. Split by phase, each part would reach into the others' state and the
order would no longer be read in one place. What is not that machine lives elsewhere: the flags and ``dxi
batches`` in ``runner.batch_commands``, the wire formats in ``adapters.batches`` and its ``*_batch``
adapters, the ledger in ``cache.ledger``.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shlex
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path

from dxi.adapters import Adapter, AdapterError, Answer, Fatal, ProviderStop, RateLimited, Reply, Request, Retryable
from dxi.adapters.batches import COMPLETED as COMPLETED_BATCH
from dxi.adapters.batches import FAILED as FAILED_BATCH
from dxi.adapters.batches import WIDE_S, BatchAPI, BatchLost, BatchStatus, ResultLine
from dxi.adapters.errors import REQUEST
from dxi.cache import Cache
from dxi.cache.ledger import Entry, Ledger, LedgerError, new_id
from dxi.evals import Suite, Task

from .cost import Budget, Charge, CostBoundReached
from .deadline import parse_deadline  # noqa: F401 (where --deadline was parsed before: runner.deadline)
from .retry import Outcome
from .rows import make_row
from .run import ModelRun, Stats
from .shard import Shard
from .tokens import BYTES_PER_TOKEN

LOOKUP = 256  # requests encoded and looked up in the cache at a time
BATCH = "batch"


def failpoint(name: str) -> None:
    """Kill this process with SIGKILL when ``DXI_FAILPOINT`` names ``name`` (tests of kill -9 at each step)."""
    if os.environ.get("DXI_FAILPOINT") == name:
        os.kill(os.getpid(), signal.SIGKILL)


@dataclass(frozen=True)
class BatchOptions:
    """How batch mode runs: ``deadline`` (Unix seconds; None: none), ``poll_s`` / ``max_poll_s`` (the first
    and the longest wait between two status reads of a batch, seconds), ``max_requests`` (a cap per batch
    below the provider's), ``enqueued_tokens`` (input tokens in open batches at once, per model: the
    provider's enqueued-token limit), ``collect_only`` (``dxi batches collect``: submit nothing, collect
    what has ended), ``wait`` (collect_only: wait for the open batches to end)."""

    deadline: float | None = None
    poll_s: float = 30.0
    max_poll_s: float = 300.0
    max_requests: int | None = None
    enqueued_tokens: int | None = None
    collect_only: bool = False
    wait: bool = True


@dataclass
class BatchStats(Stats):
    """A model's Stats plus its batches: ``submitted`` (batches created by this run, adopted ones included),
    ``running`` (open now: entry id -> when submitted, Unix seconds), ``collected`` (batches collected),
    ``given_back`` (requests given back, to be sent again), ``claimed`` (requests in another live process's
    open batch: it collects them), ``from_earlier`` (requests answered by a batch an earlier run submitted,
    stored by this one: neither sent by this run nor found in the cache), ``unknown_results``
    (result lines whose id is none of their batch's requests', or that carry none: dropped, with a
    warning), ``duplicate_results`` (result lines repeating an id read already in their batch: the
    first one kept), ``in_batch`` (the model is in batch mode, not only collecting an earlier run's
    batches)."""

    submitted: int = 0
    running: dict[str, float] = field(default_factory=dict)
    collected: int = 0
    given_back: int = 0
    claimed: int = 0
    from_earlier: int = 0
    unknown_results: int = 0
    duplicate_results: int = 0
    in_batch: bool = False
    stopped: str | None = None


@dataclass
class _Builder:
    """The batch being built: its entry id, input file, keys, bytes, estimated input tokens and the
    reservation of each request (key -> USD)."""

    entry: str
    path: Path
    fd: object
    keys: list[str] = field(default_factory=list)
    bytes: int = 0
    tokens: float = 0.0
    reserved: dict[str, float] = field(default_factory=dict)


async def with_retries(call: Callable, adapter: Adapter, what: str):
    """``await call()``, again after a retryable error (up to ``Limits.max_attempts``, the waits doubling
    from ``backoff_s`` up to ``max_wait_s``, a stated wait honoured): the batch API's own calls."""
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


class ModelBatches:
    """One model's batch mode (see the module docstring). ``stats`` is filled in as it goes; ``events``
    gets a line for each batch state change (log mode prints it); ``on_progress`` is called after each
    result stored. ``run()`` returns the requests left unsent, ``(task, sample)`` pairs (a deadline passed
    or the batch API refused): the caller sends them synchronously or leaves them to the next run."""

    def __init__(self, model: ModelRun, api: BatchAPI, suite: Suite, cache: Cache, ledger: Ledger, identity: str, *,
                 budget: Budget, options: BatchOptions, batch_price: tuple[float | None, ...] | None,
                 shard: Shard | None = None, stats: BatchStats | None = None,
                 events: Callable[[str], None] | None = None, on_progress: Callable[[], None] | None = None,
                 tasks: dict[str, Task] | None = None, collecting: asyncio.Lock | None = None):
        self.model, self.api, self.suite, self.cache, self.ledger = model, api, suite, cache, ledger
        self.adapter = model.adapter
        self.identity, self.budget, self.options, self.shard = identity, budget, options, shard
        self.charge = Charge(budget, batch_price)
        self.stats = stats if stats is not None else BatchStats(cost_usd=None if batch_price is None else 0.0)
        self.events = events or (lambda text: None)
        self.on_progress = on_progress or (lambda: None)
        limits = api.limits
        self.max_requests = min(limits.max_requests, options.max_requests or limits.max_requests)
        self.max_bytes = limits.max_bytes
        self.waiting: dict[str, tuple[Task, int]] = {}  # key -> its task and epoch, while its result is awaited
        self.tasks = tasks if tasks is not None else {}  # task id -> one Task, shared by the models of a run
        # one collection at a time in a run (shared by its models): batches that end together are stored one
        # after the other, each result file's bodies and lines held once, not twenty times (the work is CPU)
        self.collecting = collecting if collecting is not None else asyncio.Lock()
        self.keys_of: dict[str, set[str]] = {}  # entry id -> the keys streamed that it claims (earlier runs' entries)
        self.fresh: set[str] = set()  # entries submitted by this run: collected as soon as they end
        self.reserved: dict[str, float] = {}  # key -> its reservation under the cost bound
        self.attempts: dict[str, int] = {}  # key -> batches it was in during this run
        self.mine: dict[str, float] = {}  # entry id -> next status read (monotonic), for entries this run polls
        self.locks: dict[str, contextlib.ExitStack] = {}  # entry id -> its collector lock, held
        self.watched: set[str] = set()  # entries another live process polls
        self.entry_tokens: dict[str, float] = {}
        self.requeue: list[str] = []  # keys given back, for the next batch
        self.left: list[tuple[Task, int]] = []
        self.wake = asyncio.Event()
        self.stopped: AdapterError | None = None  # the batch API refused this model: nothing more is submitted
        self.cancelled = False
        self.appended = 0
        self.failpoint = os.environ.get("DXI_FAILPOINT")  # the test hook, read once: a row's append looks it up
        self.params_key = self.adapter.params_key  # (each result's request is rebuilt with it: computed once)
        self.stats.in_batch = self.stats.in_batch or not options.collect_only

    # ---- helpers ------------------------------------------------------------------------------
    @property
    def label(self) -> str:
        return self.adapter.label

    def _say(self, text: str) -> None:
        self.events(f"{self.label}: {text}")

    def _resume_hint(self) -> str:
        """The command that lifts a stop of this model's batch mode kept in the ledger."""
        return (f"`dxi batches resume --model {shlex.quote(self.label)} "
                f"--cache-dir {shlex.quote(str(self.ledger.root))}`")

    def _lock(self, entry_id: str) -> bool:
        """Take the collector lock of ``entry_id`` (kept until the entry is closed); False if another live
        process holds it."""
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

    def _requests(self) -> Iterator[tuple[Task, int, Request]]:
        stream = ((task, sample, self.adapter.encode(task, sample)) for task in self.suite.tasks()
                  for sample in range(self.model.epochs))
        if self.shard is not None:
            stream = (item for item in stream if self.shard.owns(item[2].key))
        return stream

    # ---- the run ------------------------------------------------------------------------------
    async def run(self) -> list[tuple[Task, int]]:
        """Reconcile, stream and submit, poll and collect until every request of the model is answered, given
        up, or left (see the class docstring)."""
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
        finally:
            for entry_id in list(self.locks):
                self._unlock(entry_id)
        still = self.ledger.claimed(self.identity)  # an open batch holds them: the next run collects them
        self.left += [self.waiting.pop(k) for k in list(self.waiting) if k not in still and not self.cache.has(k)]
        for key in list(self.reserved):
            self.budget.settle(self.reserved.pop(key), 0.0)
        return self.left

    async def _reconcile(self) -> None:
        """Entries of this model left open by earlier runs: those cut before their batch id was recorded
        looked for at the provider (adopted, or abandoned); the others polled from now on."""
        known = {e.batch_id for e in self.ledger.entries().values() if e.batch_id}
        stops = self.ledger.stops(self.identity) if not self.options.collect_only else []
        if stops:  # a collection of an earlier run stopped this model's batch mode
            first = stops[0]
            self.stopped = Fatal(
                f"{self.label}: batch mode stays stopped for this model: batch {first.batch_id} "
                f"(entry {first.id}) succeeded but none of its results carried one of its "
                "requests' ids; its requests are not submitted in a batch (run without --batch "
                f"to send them one call at a time, or {self._resume_hint()} once the cause is "
                "fixed)")
            self.stats.stopped = str(self.stopped)
            self._say(str(self.stopped))
        if self.ledger.folder.is_dir():
            self.ledger.sweep_inputs({e.id for e in self.ledger.open_entries()})
        for entry in list(self.ledger.entries().values()):  # a run killed before cleaning
            mine = entry.identity == self.identity
            if mine and entry.closed and not entry.abandoned and not entry.cleaned:
                await self._clean(entry)
        for entry in self.ledger.open_entries(self.identity):
            if not self._lock(entry.id):
                self.watched.add(entry.id)  # another live process polls it
                continue
            adopted = [entry.id]
            if entry.batch_id is None:
                adopted = await self._find(entry, known)
                entry = self.ledger.entries()[entry.id]
                if entry.closed:
                    self._unlock(entry.id)
                    continue
            for entry_id in adopted:
                one = self.ledger.entries()[entry_id]
                self.mine[entry_id] = 0.0
                self.stats.running[entry_id] = one.submitted_at or one.created
                self.entry_tokens[entry_id] = one.bytes / BYTES_PER_TOKEN

    async def _find(self, entry: Entry, known: set[str]) -> list[str]:
        """An entry whose create may have reached the provider without its reply being recorded:
        every batch that may be it is adopted (the entry takes the first; each other one gets an
        entry of its own, with the same keys): results are matched by custom id, so a batch that was
        not ours stores nothing, and a request is given back only once no open entry claims it
        (``_collect``). Returns the entry ids adopted (to poll); [] when none was found (the entry
        is abandoned, its input file deleted at the provider) or the provider could not be asked
        (left open for the next run)."""
        try:
            found = await with_retries(
                lambda: self.api.find(entry.id, entry.created, entry.requests, known, entry.ref),
                self.adapter, "find")
        except AdapterError as exc:
            self._say(f"could not look for batch {entry.id} at the provider ({exc}); left open for the next run")
            return []
        guessed = not self.api.taggable
        how = "by its tag" if not guessed else "by its size and creation (the provider has no tag)"
        if found:
            adopted = []
            for i, status in enumerate(found):
                entry_id = entry.id
                if i:  # another candidate: an entry of its own, claiming the same keys
                    entry_id = new_id()
                    self._lock(entry_id)
                    a = self.adapter
                    self.ledger.intent(entry_id, self.ledger.keys(entry.id), identity=self.identity,
                                       label=self.label, kind=a.kind, base_url=getattr(a, "base_url", ""),
                                       model=a.spec.model, api_key_env=getattr(a, "key_env", None),
                                       requests=entry.requests, bytes=entry.bytes, reserved_usd=None,
                                       candidate_of=entry.id)
                self.ledger.record(entry_id, "submitted", batch_id=status.batch_id, state=status.state,
                                   adopted=True, guessed=guessed)
                known.add(status.batch_id)
                adopted.append(entry_id)
            if len(found) == 1:
                self._say(f"found batch {found[0].batch_id} of {entry.id} again {how}; its results will "
                          "be collected")
            else:
                self._say(f"{len(found)} batches may be entry {entry.id}, found {how} "
                          f"({', '.join(s.batch_id for s in found)}): each is adopted and collected; the "
                          "results carrying its requests' ids are kept, the others' left out, and a request "
                          "none of them answers is sent again")
            return adopted
        api = self.api
        if api.listed_all:
            what = ("carries the entry's tag" if api.taggable else
                    f"has its {entry.requests:,} requests (of those created after the newest "
                    "batch it listed before the create, by its own clock)")
            reason = (f"not found at the provider (none of the {api.listed:,} batches it lists "
                      f"{what}): it was never created; its requests are submitted in a new batch")
        elif api.taggable or entry.ref is not None:
            reason = (f"not found among the {api.listed:,} batches of the provider's listing read "
                      "(it lists more: not proof that it was never created); its requests are "
                      "submitted in a new batch")
        else:
            since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(entry.created - WIDE_S))
            reason = (f"no batch of {entry.requests:,} requests created since {since} "
                      "(this machine's clock, a day before the intent: the entry was recorded "
                      "without the provider's listing to go by) that no other entry knows is "
                      "listed by the provider, which tags nothing: taken as not created, its "
                      "requests are submitted in a new batch (were this machine's clock more "
                      "than a day ahead of the provider's, such a batch would exist, unknown to "
                      "dxi: see the provider's console)")
        self.ledger.record(entry.id, "abandoned", reason=reason)
        self._unlock(entry.id)
        self.ledger.forget_keys(entry.id)
        self._say(f"entry {entry.id} {reason}")
        await self._delete_input(entry)
        return []

    async def _clean(self, entry: Entry) -> None:
        """Delete at the provider the files of a batch that ran and was collected (its input file,
        its result files: ``BatchAPI.files_of``), best effort: the ``cleaned`` event records what
        was deleted, or why not, and the deletion is never tried again (``_reconcile`` tries it
        once for an entry closed by a run killed before it)."""
        if entry.cleaned or entry.batch_id is None:
            return
        files = self.api.files_of(entry.file_id, entry.output)
        if not files:
            return
        try:
            deleted = await with_retries(lambda: self.api.delete_files(files), self.adapter,
                                         "delete")
        except AdapterError as exc:
            self.ledger.record(entry.id, "cleaned", files=files, failed=str(exc))
            self._say(f"could not delete the files of batch {entry.batch_id} at the provider "
                      f"({exc}); left there (not tried again)")
            return
        self.ledger.record(entry.id, "cleaned", files=files, deleted=deleted)

    async def _delete_input(self, entry: Entry) -> None:
        """Delete at the provider the input file of an entry that never became a batch (uploaded just
        before a kill, or before a create that failed): by the file id the ledger recorded, else by the
        name dxi gave it (``BatchAPI.delete_input``: only a file named after this ledger's entry)."""
        try:
            deleted = await with_retries(lambda: self.api.delete_input(entry.id, entry.file_id),
                                         self.adapter, "delete")
        except AdapterError as exc:
            self._say(f"could not delete the input file of entry {entry.id} at the provider ({exc})")
            return
        if deleted:
            self._say(f"deleted the input file of entry {entry.id} at the provider (it never became a "
                      "batch)")

    # ---- streaming and submitting -------------------------------------------------------------
    async def _stream(self) -> None:
        """Every request of the model: cached, awaited from an open entry, or put in a new batch."""
        claimed = self.ledger.claimed(self.identity)
        builder: _Builder | None = None
        stream = self._requests()
        try:
            while batch := list(islice(stream, LOOKUP)):
                await self._after_collection()
                for (task, sample, request), hit in zip(batch, self.cache.has_many([r.key for _, _, r in batch]),
                                                        strict=True):
                    key = request.key
                    # collecting only, the synchronous path beside counts the requests but those an open batch
                    # claims, which it leaves to this one
                    counted = not self.options.collect_only or key in claimed
                    self.stats.total += counted
                    if hit or key in self.waiting:
                        self.stats.cache_hits += counted
                        continue
                    task = self.tasks.setdefault(task.id, task)  # one copy of a task however many models await it
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
                    builder = await self._add(builder, task, sample, request)
                self.on_progress()
            if builder is not None:
                await self._submit(builder)
        except CostBoundReached:
            self.stats.not_sent += 1  # the request whose reservation did not fit
            for _ in stream:
                self.stats.not_sent += 1
            if builder is not None and builder.keys:
                await self._submit(builder)
        finally:
            self.wake.set()

    async def _after_collection(self) -> None:
        """Let a collection under way (any model's) finish before more requests are encoded: answers already
        produced reach the cache first, and encoding is CPU on the same core."""
        if self.collecting.locked():
            async with self.collecting:
                return
        await asyncio.sleep(0)

    def _past_deadline(self) -> bool:
        return self.options.deadline is not None and time.time() >= self.options.deadline

    async def _add(self, builder: _Builder | None, task: Task, sample: int, request: Request) -> _Builder | None:
        """Put one request in the batch being built (submitting it first when full); reserve its worst
        case first (CostBoundReached when the bound leaves no room)."""
        line = self.api.line(request) + b"\n"
        tokens = len(request.body) / BYTES_PER_TOKEN
        if builder is not None and (len(builder.keys) >= self.max_requests or builder.bytes + len(line) > self.max_bytes
                                    or self._over_tokens(builder.tokens + tokens)):
            await self._submit(builder)
            builder = None
        while self.options.enqueued_tokens and self.entry_tokens and self._over_tokens(tokens):
            self.wake.set()
            await self._settled()  # the enqueued-token limit: wait for an open batch to end
        if not self.budget.fits(self.charge.bound(self.adapter, task, request)) and builder is not None and builder.keys:
            await self._submit(builder)  # what is built goes first: its results may free room under the bound
            builder = None
        reserved = await self.charge.reserve(self.adapter, task, request)
        try:
            if builder is None:
                builder = self._new_builder()
            builder.fd.write(line)
        except OSError as exc:  # a full or read-only disk: stopped as a cache write is (exit code 4)
            self.budget.settle(reserved, 0.0)
            where = builder.path if builder is not None else self.ledger.folder
            raise LedgerError(f"cannot write the batch input file in {where}: {exc.strerror or exc}",
                              exc.errno) from None
        builder.keys.append(request.key)
        builder.bytes += len(line)
        builder.tokens += tokens
        builder.reserved[request.key] = reserved
        self.waiting[request.key] = (task, sample)
        return builder

    def _over_tokens(self, tokens: float) -> bool:
        limit = self.options.enqueued_tokens
        return bool(limit) and sum(self.entry_tokens.values()) + tokens > limit

    async def _settled(self) -> None:
        """Wait until an open entry of this run closes."""
        before = self.stats.collected
        while self.stats.collected == before and self.entry_tokens:
            await asyncio.sleep(min(1.0, self.options.poll_s))

    def _new_builder(self) -> _Builder:
        """A new batch: its entry id, its collector lock (held from now: ``Ledger.sweep_inputs`` leaves its
        input file alone) and its input file."""
        entry_id = new_id()
        self.ledger.folder.mkdir(parents=True, exist_ok=True)
        self._lock(entry_id)
        path = self.ledger.folder / f"{entry_id}.input.jsonl"
        return _Builder(entry_id, path, open(path, "wb"))  # noqa: SIM115 (closed by _submit)

    async def _submit(self, builder: _Builder) -> None:
        """Record the intent, upload, create, record the batch id (see the module docstring)."""
        try:
            builder.fd.close()
        except OSError as exc:
            raise LedgerError(f"cannot write the batch input file {builder.path}: {exc.strerror or exc}",
                              exc.errno) from None
        entry_id, n = builder.entry, len(builder.keys)
        if not n or self._past_deadline():  # past the deadline nothing more is submitted: left for the fallback
            builder.path.unlink(missing_ok=True)
            self._unlock(entry_id)
            for key in builder.keys:
                self.budget.settle(builder.reserved.get(key, 0.0), 0.0)
                self.left.append(self.waiting.pop(key))
            return
        spec = self.adapter.spec
        reserved = sum(builder.reserved.values())
        ref = await self._reference()
        self.ledger.intent(entry_id, builder.keys, identity=self.identity, label=self.label, kind=self.adapter.kind,
                           base_url=getattr(self.adapter, "base_url", ""), model=spec.model,
                           api_key_env=getattr(self.adapter, "key_env", None), requests=n, bytes=builder.bytes,
                           reserved_usd=(round(reserved, 6) if self.budget.max_usd is not None
                                         else None),
                           **({"ref": ref} if ref is not None else {}))
        self.reserved.update(builder.reserved)
        for key in builder.keys:
            self.attempts[key] = self.attempts.get(key, 0) + 1
        failpoint("intent")
        try:
            file_id = await with_retries(lambda: self.api.upload(entry_id, builder.path, n, builder.bytes),
                                          self.adapter, "upload")
            failpoint("upload_reply")
            if file_id is not None:
                self.ledger.record(entry_id, "uploaded", file_id=file_id)
            failpoint("uploaded")
            status = await self._create(entry_id, builder, file_id, n, ref)
        except AdapterError as exc:
            self.ledger.record(entry_id, "abandoned", reason=f"the batch could not be submitted: {exc}")
            self._unlock(entry_id)
            self.ledger.forget_keys(entry_id)
            self._refused(exc, builder.keys)
            entry = self.ledger.entries().get(entry_id)
            if entry is not None and entry.file_id is not None:  # uploaded, never a batch
                await self._delete_input(entry)
            return
        failpoint("created")
        self.ledger.record(entry_id, "submitted", batch_id=status.batch_id, state=status.state)
        failpoint("submitted")
        self.stats.submitted += 1
        self.stats.sent += n
        if self.stats.started is None:
            self.stats.started = time.monotonic()
        self.stats.running[entry_id] = time.time()
        self.entry_tokens[entry_id] = builder.tokens
        self.mine[entry_id] = time.monotonic() + self.options.poll_s
        self.fresh.add(entry_id)
        self._say(f"batch {status.batch_id} submitted ({n:,} requests, entry {entry_id})")
        self.wake.set()
        self.on_progress()

    async def _reference(self) -> dict | None:
        """Where the provider's batch listing stands before a create (``BatchAPI.reference``), to
        find the batch by if the create's reply is lost; None when the provider tags batches or
        the listing cannot be read (then a lost create is looked for by this machine's clock,
        said as such)."""
        try:
            return await with_retries(self.api.reference, self.adapter, "reference")
        except BatchLost:  # no batch API here: the create says so
            return None
        except AdapterError as exc:
            self._say(f"could not read the provider's batch listing before a create ({exc}); "
                      "were its reply lost, its batch would be looked for by this machine's clock")
            return None

    async def _create(self, entry_id: str, builder: _Builder, file_id: str | None, n: int,
                      ref: dict | None = None) -> BatchStatus:
        """Create the batch; after a create whose reply was lost, look for it (by tag; Anthropic: by time and
        size) before trying again, so that one entry never becomes two batches."""
        created_after = time.time() - 5
        attempt = 0
        while True:
            attempt += 1
            try:
                return await self.api.create(entry_id, builder.path, file_id, n, builder.bytes)
            except Retryable as exc:
                if attempt >= max(1, self.adapter.limits.max_attempts) or not exc.should_retry:
                    raise
                if not isinstance(exc, RateLimited):  # the create may have been made: look before creating again
                    known = {e.batch_id for e in self.ledger.entries().values() if e.batch_id}
                    found = await with_retries(
                        lambda known=known: self.api.find(entry_id, created_after, n, known, ref),
                        self.adapter, "find")
                    if len(found) == 1:
                        return found[0]
                wait = exc.retry_after if isinstance(exc, RateLimited) and exc.retry_after is not None else \
                    min(self.adapter.limits.max_wait_s, self.adapter.limits.backoff_s * 2 ** (attempt - 1))
                await asyncio.sleep(wait)

    def _refused(self, error: AdapterError, keys: list[str]) -> None:
        """The batch API refused a batch (a 4xx, a stop, retries spent): its requests are left unsent, and
        after a stop (a refused key, an exhausted quota, no batch API at this URL) nothing more is submitted."""
        self._say(f"a batch could not be submitted: {error}")
        if self.stats.errors is not None and len(self.stats.errors) < 20:
            self.stats.errors.append(f"batch submission: {error}")
        if isinstance(error, (ProviderStop, Fatal)):
            self.stopped = error
            self.stats.stopped = str(error)
        for key in keys:
            self.budget.settle(self.reserved.pop(key, 0.0), 0.0)
            item = self.waiting.pop(key, None)
            if item is not None:  # (counted as not sent once, with the rest left: runner.dispatch)
                self.left.append(item)

    # ---- polling and collecting ---------------------------------------------------------------
    async def _poll_until_done(self, streaming: asyncio.Task) -> None:
        """Poll the open entries until each is collected (and what they gave back is submitted again), or,
        collecting only without waiting, once each. Earlier runs' entries are read once the stream has
        named their tasks; this run's as soon as they are due."""
        deadline_done = False
        once = self.options.collect_only and not self.options.wait
        while True:
            if self._past_deadline():  # each loop: a batch whose create was on the wire at the deadline too
                if not deadline_done:
                    self._say("deadline reached: cancelling the open batches, keeping every result produced")
                deadline_done = True
                await self._cancel_all()
            if self.requeue and streaming.done() and not self._past_deadline() and self.stopped is None \
                    and not self.options.collect_only:
                await self._submit_requeued()
            now = time.monotonic()
            for entry_id, due in list(self.mine.items()):
                if (due <= now or once) and (streaming.done() or entry_id in self.fresh):
                    await self._poll(entry_id)
                    if once:
                        self.mine.pop(entry_id, None)
            for entry_id in list(self.watched):
                self._watch(entry_id)
            if streaming.done() and (once or (not self.mine and not self._watching() and not self.requeue)):
                return
            waits = [due - time.monotonic() for entry_id, due in self.mine.items()
                     if streaming.done() or entry_id in self.fresh]
            if self.watched:
                waits.append(min(self.options.poll_s, 5.0))
            if self.options.deadline is not None and not deadline_done:
                waits.append(self.options.deadline - time.time())
            if self.requeue and streaming.done():
                waits.append(0.0)
            timeout = max(0.0, min(waits)) if waits else None
            self.wake.clear()
            if streaming.done() and timeout is None:
                timeout = 0.0
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), timeout)

    def _watching(self) -> bool:
        return any(not self.ledger.entries()[e].closed for e in self.watched if e in self.ledger.entries())

    def _watch(self, entry_id: str) -> None:
        """An entry another process polls: done when its ledger says so (its rows are then in the cache), or
        taken over when that process is gone (its collector lock is free)."""
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
            self._say(f"took over batch {entry.batch_id or entry.id} from process {entry.pid} (gone)")

    async def _poll(self, entry_id: str) -> None:
        entry = self.ledger.entries()[entry_id]
        if entry.batch_id is None:  # an intent this run could not reconcile: left to the next run
            self.mine.pop(entry_id, None)
            return
        try:
            status = await self.api.get(entry.batch_id)
        except BatchLost as exc:
            self.ledger.record(entry_id, "ended", outcome="lost", state="not found", output={})
            self._say(f"batch {entry.batch_id} is gone at the provider (404: {exc}); its requests are given back")
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
                self._say(f"batch {entry.batch_id} {entry.state} -> {status.state} {self._counts(status)}")
            self._schedule(entry_id)
            return
        if not entry.ended:
            self.ledger.record(entry_id, "ended", outcome=status.outcome, state=status.state, counts=status.counts,
                               output=status.output)
            self._say(f"batch {entry.batch_id} {entry.state} -> {status.state} ({status.outcome}) {self._counts(status)}")
        if status.outcome == FAILED_BATCH:  # the input refused whole: submitting it again would fail the same way
            errors = status.output.get("errors") if isinstance(status.output.get("errors"), dict) else {}
            first = next(iter(errors.get("data") or []), {})
            self.stopped = Fatal(f"{self.label}: batch {entry.batch_id} failed: {first.get('message') or status.state}")
            self.stats.stopped = str(self.stopped)
            self._say(str(self.stopped))
        async with self.collecting:
            await self._collect(self.ledger.entries()[entry_id], status)

    @staticmethod
    def _counts(status: BatchStatus) -> str:
        return ", ".join(f"{k} {v}" for k, v in status.counts.items() if isinstance(v, int)) or ""

    def _schedule(self, entry_id: str) -> None:
        """The next status read of an entry: the wait grows by half each time, from ``poll_s`` to
        ``max_poll_s``; once its cancel was asked (a deadline, ``dxi batches cancel``), every ``poll_s``
        (at most 5 s): what it leaves is sent by the synchronous fallback as soon as it has ended."""
        running = time.time() - self.stats.running.get(entry_id, time.time())
        wait = min(self.options.max_poll_s, max(self.options.poll_s, running / 2))
        entry = self.ledger.entries().get(entry_id)
        if self.cancelled or (entry is not None and entry.cancel_at is not None):
            wait = min(self.options.poll_s, 5.0)
        self.mine[entry_id] = time.monotonic() + wait

    async def _cancel_all(self) -> None:
        """The deadline: cancel every open batch this run polls (once each); nothing more is submitted."""
        self.cancelled = True
        for entry_id in list(self.mine):
            entry = self.ledger.entries()[entry_id]
            if entry.batch_id is None or entry.ended or entry.cancel_at is not None:
                continue
            try:
                await with_retries(lambda e=entry: self.api.cancel(e.batch_id), self.adapter, "cancel")
                self.ledger.record(entry_id, "cancel", reason="deadline")
                self._say(f"batch {entry.batch_id} cancelled at the deadline")
            except AdapterError as exc:
                self.ledger.record(entry_id, "cancel", reason=f"deadline (the cancel failed: {exc})")
                self._say(f"could not cancel batch {entry.batch_id}: {exc}")
            self.mine[entry_id] = time.monotonic() + min(self.options.poll_s, 5.0)

    def _bodies(self, entry_id: str) -> dict[str, bytes]:
        """The request bodies of an entry, from its input file (kept until it is collected): each result's
        request is rebuilt from them rather than encoded again. {} when the file is gone (a run that died
        before: the requests are encoded again)."""
        split = self.api.split
        try:
            with open(self.ledger.folder / f"{entry_id}.input.jsonl", "rb") as f:
                return dict(split(raw[:-1] if raw[-1:] == b"\n" else raw) for raw in f if not raw.isspace())
        except (OSError, ValueError):
            return {}

    def _request(self, key: str, task: Task, sample: int, body: bytes | None) -> Request:
        """The request of ``key``: from its body as sent (``_bodies``), else encoded again."""
        if body is not None:
            a = self.adapter
            request = Request(a.kind, a.model, a.endpoint, body, sample, self.params_key)
            if request.key == key:
                return request
        return self.adapter.encode(task, sample)

    async def _collect(self, entry: Entry, status: BatchStatus | None) -> None:
        """Store an ended batch's results as they are read; give back what has none (module docstring).

        A result whose id is none of the batch's requests' (or that has none) and one repeating an
        id read already (the first is kept) are counted (``BatchStats.unknown_results``,
        ``duplicate_results``) and said. A batch the provider says succeeded none of whose results
        carries one of its requests' ids stops the model's batch mode (its requests are not
        submitted again: they would be lost the same way), unless it was adopted by size
        (``Entry.guessed``: then it was another client's). Results the provider no longer has (404:
        past its retention) give the batch's requests back, once."""
        keys = set(self.ledger.keys(entry.id))
        bodies = self._bodies(entry.id)
        seen: set[str] = set()
        given: list[str] = []
        stored = unmatched = unknown = duplicate = 0
        actual = 0.0
        gone: BatchLost | None = None
        if status is not None:
            try:
                async for results in self.api.results(status):  # a piece of the results at a time
                    rows: list[tuple[str, Task, dict, float]] = []
                    for result in results:
                        key = result.key
                        if key not in keys:
                            unknown += 1
                            continue
                        if key in seen:
                            duplicate += 1
                            continue
                        seen.add(key)
                        item = self.waiting.get(key)
                        if self.cache.has(key):
                            self.waiting.pop(key, None)
                            continue
                        if item is None:
                            unmatched += 1
                            continue
                        row, cost = self._row(entry, key, item, result, bodies.get(key))
                        if row is None:
                            given.append(key)
                        else:
                            rows.append((key, item[0], row, cost))
                    if rows:  # stored before the next piece is read
                        self._store(rows)
                        stored += len(rows)
                        if entry.id not in self.fresh:
                            self.stats.from_earlier += len(rows)
                        actual += sum(cost for *_, cost in rows)
            except BatchLost as exc:  # past the provider's retention: its requests are given back
                gone = exc
            except AdapterError as exc:
                self._say(f"could not read all results of batch {entry.batch_id} ({exc}); trying again later")
                self._schedule(entry.id)
                return
        foreign = entry.guessed and not seen  # adopted by size, none of ours: another client's batch
        if unknown and not foreign:
            self.stats.unknown_results += unknown
            self._say(f"batch {entry.batch_id}: {unknown:,} result(s) whose id is none of its requests' "
                      "(or that carry none) left out")
        if duplicate:
            self.stats.duplicate_results += duplicate
            self._say(f"batch {entry.batch_id}: {duplicate:,} result(s) repeating an id read already left "
                      "out (the first result of each id is kept)")
        mismatch = (status is not None and status.outcome == COMPLETED_BATCH and gone is None and keys
                    and not seen and not entry.guessed)
        if mismatch:  # submitting them again would lose them the same way, and pay again
            self.stopped = Fatal(
                f"{self.label}: batch {entry.batch_id} succeeded but none of its {unknown:,} "
                f"result(s) carries one of its {len(keys):,} requests' ids: nothing could be "
                "stored; batch mode stopped for this model, in this run and the next ones (its "
                "requests are not submitted in a batch again: run without --batch to send them one "
                f"call at a time; once the cause is fixed, {self._resume_hint()} lets batch mode "
                "submit them again)")
            self.stats.stopped = str(self.stopped)
            self._say(str(self.stopped))
        elif gone is not None:
            self._say(f"the results of batch {entry.batch_id} are gone at the provider ({gone}: "
                      f"{self.api.RETENTION}): its {len(keys - seen):,} request(s) not stored are given "
                      "back and sent again")
        others: set[str] | None = None  # keys other open entries claim (candidates of one lost create)
        for key in keys - seen:
            if key in self.waiting and not self.cache.has(key):
                if others is None:
                    others = {k for e in self.ledger.open_entries(self.identity) if e.id != entry.id
                              for k in self.ledger.keys(e.id) if k not in e.returned}
                if key in others:  # another candidate may still answer it: given back once none can
                    continue
                given.append(key)
                self.stats.attempts += 1
        returned = sorted(set(given))
        extra = {"results_gone": str(gone)} if gone is not None else {}
        if mismatch:  # the stop outlives this run: every run reads it (``_reconcile``)
            extra["mismatch"] = True
            extra["stop"] = str(self.stopped)
        self.ledger.record(entry.id, "collected", stored=stored, returned=returned, unmatched=unmatched,
                           cost_usd=round(actual, 9) if self.charge.price is not None else None,
                           unknown=unknown, duplicate=duplicate, **extra)
        self._unlock(entry.id)
        if self.ledger.entries()[entry.id].closed:
            self.ledger.forget_keys(entry.id)
            await self._clean(self.ledger.entries()[entry.id])
        self.mine.pop(entry.id, None)
        self.stats.running.pop(entry.id, None)
        self.entry_tokens.pop(entry.id, None)
        self.stats.collected += 1
        if foreign:
            self._say(f"batch {entry.batch_id} (adopted by its size and time) was not this run's: none of "
                      "its results carries one of the entry's ids; nothing stored from it")
        for key in returned:
            if mismatch:  # stopped: left for the next run (or a synchronous one), never submitted here
                continue
            self._give_back(key)
        _trim()
        if returned:
            self._say(f"batch {entry.batch_id} collected: {stored:,} stored, {len(returned):,} given back")
        else:
            self._say(f"batch {entry.batch_id} collected: {stored:,} stored")
        self.wake.set()
        self.on_progress()

    def _row(self, entry: Entry, key: str, item: tuple[Task, int], result: ResultLine,
             sent: bytes | None = None) -> tuple[dict | None, float]:
        """Decode one result as the synchronous path would (``sent``: the request's body as it was sent, when
        known); returns (its cache row, its cost in USD), or (None, 0.0) when it is given back."""
        task, sample = item
        body, error = result.body, result.error
        outcome = Outcome(attempts=1)
        st = self.stats
        st.attempts += 1
        reserved = self.reserved.pop(key, None)
        if body is not None and error is None:
            outcome.body = body
            try:
                if len(body) > self.adapter.limits.max_reply_bytes:
                    outcome.body = body[:2000]
                    outcome.reply = Reply(tuple(Answer.invalid(q.id, f"reply larger than {self.adapter.limits.max_reply_bytes} "
                                                                     "bytes") for q in task.questions))
                else:
                    outcome.reply = self.adapter.decode_parsed(task, body, result.doc)
            except AdapterError as exc:
                error = exc
        if isinstance(error, ProviderStop) and error.cause == REQUEST:  # the batch ran the others of this form:
            error = Fatal(str(error), error.status)                      # this one's own refusal (as runner.retry)
        elif isinstance(error, ProviderStop):  # a quota or key stop inside a batch: no new batch is submitted
            self.stopped = self.stopped or error
            st.stopped = st.stopped or str(error)
        if outcome.reply is None and not isinstance(error, Fatal):  # transient, rate limited, stop, not run
            if reserved is not None:
                self.budget.settle(reserved, 0.0)
            if isinstance(error, RateLimited):
                st.rate_limited += 1
            return None, 0.0
        outcome.error = None if outcome.reply is not None else error
        cost = 0.0
        if reserved is not None:
            cost = self.charge.settle(reserved, outcome.reply, outcome.error)
        elif outcome.reply is not None and self.charge.price is not None:  # an earlier run's batch: not reserved here
            from dxi.scoring.cost import USAGE_COLUMNS, request_cost
            cost = request_cost({c: getattr(outcome.reply, c) for c in USAGE_COLUMNS}, self.charge.price)
            self.budget.spent += cost
        return make_row(task, self._request(key, task, sample, sent), outcome, transport=BATCH,
                        batch_id=entry.batch_id), cost

    def _store(self, rows: list[tuple[str, Task, dict, float]]) -> None:
        """Append the rows of a piece of results, ``(key, task, row, cost)`` each, in one write (``Cache.append_many``),
        then count them."""
        before = self.appended
        self.cache.append_many([row for _, _, row, _ in rows])
        self.appended += len(rows)
        if self.failpoint is not None:  # ``append:N``: killed after the append that stored the N-th row
            for n in range(before + 1, self.appended + 1):
                failpoint(f"append:{n}")
        st = self.stats
        for key, task, row, cost in rows:
            self.waiting.pop(key, None)
            if st.cost_usd is not None:
                st.cost_usd += cost
            st.add(row, task.id)
        self.on_progress()

    def _give_back(self, key: str) -> None:
        """A request without a usable result: into the next batch, or (its attempts spent) stored as a
        transient failure; with a deadline passed or submission stopped, left for the synchronous fallback."""
        item = self.waiting.get(key)
        if item is None:
            return
        self.stats.given_back += 1
        if self.reserved.get(key) is not None:
            self.budget.settle(self.reserved.pop(key), 0.0)
        if self.attempts.get(key, 0) >= max(1, self.adapter.limits.max_attempts):
            task, sample = self.waiting.pop(key)
            outcome = Outcome(attempts=self.attempts[key],
                              error=_GivenUp(f"{self.label}: no result after {self.attempts[key]} batch(es) (expired, "
                                             "cancelled or a transient error each time)"))
            self.cache.append(make_row(task, self.adapter.encode(task, sample), outcome, transport=BATCH))
            self.stats.failed += 1
            return
        if self._past_deadline() or self.stopped is not None or self.options.collect_only:
            return  # left in ``waiting``: ``run`` hands it to the fallback (or the next run)
        self.requeue.append(key)

    async def _submit_requeued(self) -> None:
        """The requests given back, in new batches (each reserved again under the bound)."""
        keys, self.requeue = self.requeue, []
        builder: _Builder | None = None
        try:
            for key in keys:
                item = self.waiting.pop(key, None)
                if item is None or self.cache.has(key):
                    continue
                task, sample = item
                builder = await self._add(builder, task, sample, self.adapter.encode(task, sample))
        except CostBoundReached:
            self.stats.not_sent += 1
        if builder is not None:
            await self._submit(builder)


def _trim() -> None:
    """Give the heap's free pages back to the system after a collection (glibc ``malloc_trim``): reading a
    result file frees thousands of reply-sized blocks, which glibc otherwise keeps, so that batches collected
    one after another would grow the process by what each one read. A no-op elsewhere."""
    global _LIBC
    if _LIBC is None:
        try:
            import ctypes

            _LIBC = ctypes.CDLL("libc.so.6")
            _LIBC.malloc_trim  # noqa: B018 (glibc only)
        except (OSError, AttributeError):
            _LIBC = False
    if _LIBC:
        _LIBC.malloc_trim(0)


_LIBC = None


class _GivenUp(Retryable):
    """A request given back by every batch it was in: stored as a transient failure (sent again next run)."""
