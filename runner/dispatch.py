"""What ``dxi run`` sends, and by which path: each model's requests synchronously
(``runner.sending.scheduler``) or through its provider's batch API (``runner.batch.driver``), under
the model's claim on the cache folder (``cache.claims``), so that two processes on one cache never
both send a request (issue 23).

For each model, before anything is sent:

1. **The claim.** The model's requests (those of the process's shard) are claimed in the cache
   folder. A claim held by another live process is waited for, with a message naming it (its process
   id, and host when another); the other models go on meanwhile. Once it is taken (at once or after
   a wait), the rows appended to the cache since its key index was read are read into it
   (``Cache.refresh``: only what is new), so that what another process stored counts as cached:
   total requests sent equals distinct requests. (The index may have been read long before: a run's
   start-up reads it to find the models whose every request is cached, then starts the others'
   adapters, which may take seconds; a run that found the claim free after another run had ended
   sent again what that run stored: issue 32.)
2. **The path.** A model in batch mode (``--batch``, or ``batch = true`` in the run file) whose
   provider has a batch API goes through ``runner.batch.driver``; one without (decision models, the
   embedded model, local servers, logprob decisions) is sent synchronously, and the run says so
   once. A model sent synchronously whose requests are in open batches of the ledger (an earlier
   ``--batch`` run stopped before collecting them) has those collected from their batches (never
   sent again) while the rest are sent synchronously.
3. **The deadline fallback** (``--deadline-fallback sync``): what a model's batches left unanswered
   at the deadline is sent synchronously, first what a batch of this run gave back (counted ``sent``
   already: one the fallback cannot send, the cost bound or a stop, stays ``sent``, ``unanswered``).

Stopping (the first Ctrl-C or SIGTERM, ``runner.sending.stops.RunStop``): only the waits are cut, a
model's wait for a claim (its requests then counted, as not sent or found in the cache, with nothing
sent) and its batches' polling (``_Sending.unless_stopping``); what is being sent
synchronously, on any path, drains as the direct models' does (the requests on the wire finish and
are stored, the rest is counted not sent).

Models that are claimed at once, have no open batches and are not in batch mode (the usual case) go
through one ``runner.sending.scheduler.run`` call together, exactly as without this module. ``send``
returns each model's Stats, merged over the paths it took (``BatchStats`` for a model that has
batches).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, fields, replace
from typing import TypeVar

from dxi.adapters.batches import BatchAPI, batch_api, supports
from dxi.cache import Cache, CacheWriteError
from dxi.cache import claims as claims_mod
from dxi.cache.ledger import Ledger
from dxi.evals import PROMPT_VERSION, Suite
from dxi.lazy import LazyModule

from .batch.driver import ModelBatches
from .batch.options import BatchOptions, BatchStats
from .planning.plan import ModelRun
from .planning.shard import Shard
from .sending.cost import Budget
from .sending.limits import ProviderLimiter
from .sending.scheduler import Stats, run
from .sending.stops import RunStop

scoring_cost = LazyModule(
    "dxi.scoring.cost"
)  # batch_price; Polars: imported once a batch is in play
T = TypeVar("T")


def identity(model: ModelRun) -> str:
    """The model configuration's digest (32 hex): adapter, model, endpoint, sampling parameters and
    prompt version, as in every cache key. Its claims and ledger entries go by it."""
    head = "\0".join((*model.identity.key, PROMPT_VERSION))
    return hashlib.sha256(head.encode()).hexdigest()[:32]


@dataclass(frozen=True, slots=True)
class KeyFilter:
    """A ``runner.planning.shard.Shard``-like filter for ``runner.sending.scheduler.run``: the keys
    of ``shard`` (all without one) that are in ``keys`` (``keep`` True) or not in them (``keep``
    False)."""

    keys: frozenset[str]
    shard: Shard | None = None
    keep: bool = True

    def owns(self, key: str) -> bool:
        return (self.shard is None or self.shard.owns(key)) and ((key in self.keys) == self.keep)


def merged(parts: Sequence[Stats]) -> Stats:
    """One Stats summing ``parts`` (a model's synchronous and batch Stats, or an adaptive run's
    rounds'); a BatchStats, with the batches' own counts (summed; the open batches joined;
    ``in_batch`` and ``stopped`` the last part's that has them), when one of them is."""
    batches = [p for p in parts if isinstance(p, BatchStats)]
    out: Stats = BatchStats() if batches else Stats()
    for f in fields(BatchStats) if batches else ():
        if any(f.name == g.name for g in fields(Stats)):
            continue
        values = [getattr(b, f.name) for b in batches]
        if f.name == "running":
            out.running = {k: v for b in batches for k, v in b.running.items()}
        elif f.name in ("open_entries", "earlier_entries", "collected_entries"):
            setattr(out, f.name, set().union(*values))
        elif f.name in ("in_batch", "stopped"):
            setattr(out, f.name, next((v for v in reversed(values) if v), values[-1]))
        else:
            setattr(out, f.name, sum(values))
    for f in fields(Stats):
        if f.name not in ("errors", "started", "cost_usd"):
            setattr(out, f.name, sum(getattr(p, f.name) for p in parts))
    out.errors = [e for p in parts for e in p.errors][:20]
    costs = [p.cost_usd for p in parts]
    out.cost_usd = None if any(c is None for c in costs) else sum(costs)
    starts = [p.started for p in parts if p.started is not None]
    out.started = min(starts) if starts else None
    return out


async def send(
    models: Sequence[ModelRun],
    suite: Suite,
    cache: Cache,
    *,
    budget: Budget,
    limiters: dict[str, ProviderLimiter],
    shard: Shard | None = None,
    on_progress: Callable[[str, Stats], None] | None = None,
    batch: frozenset[str] = frozenset(),
    batch_overrides: dict | None = None,
    limits_of: dict | None = None,
    options: BatchOptions | None = None,
    fallback_sync: bool = False,
    say: Callable[[str], None] | None = None,
    ledger: Ledger | None = None,
    stop: RunStop | None = None,
    told: set[str] | None = None,
) -> dict[str, Stats]:
    """Send what ``models`` need over ``suite`` (see the module docstring) and return each model's
    Stats. ``batch``: the labels in batch mode; ``batch_overrides``: label -> the run file's
    (batch_input, batch_output) prices (default: half the price, ``scoring.cost.batch_price``);
    ``limits_of``: label -> (requests per batch, enqueued tokens); ``options``: how batch mode runs;
    ``fallback_sync``: what batches left at the deadline is sent synchronously; ``say`` prints a
    line (waits, batch state changes, notes); ``stop``: the run's drain
    (``runner.sending.stops.RunStop``): once requested nothing new is sent synchronously (what is on
    the wire finishes and is stored, every model alike, also one sent after waiting for a claim or
    beside an earlier run's open batches), a wait for a claim ends (nothing taken, nothing sent: the
    model's requests counted not sent, or found in the cache) and batches stop being polled (they
    keep running at the provider: the ledger has them and the next run collects them); ``told``: the
    labels already said to have no batch API, added to as they are (an adaptive run's rounds, one
    ``send`` each, share one set: the note is printed once per run). Raises CacheWriteError when the
    claims cannot be written (a read-only cache), and what ``runner.sending.scheduler.run``
    raises."""
    sending = _Sending(
        models,
        suite,
        cache,
        budget=budget,
        limiters=limiters,
        shard=shard,
        on_progress=on_progress,
        batch=batch,
        batch_overrides=batch_overrides or {},
        limits_of=limits_of or {},
        options=options or BatchOptions(),
        fallback_sync=fallback_sync,
        say=say or (lambda text: None),
        ledger=ledger or Ledger(cache.root),
        stop=stop,
    )
    sending.note_models_without_batch_api(set() if told is None else told)
    try:
        direct, others = sending.claim_all()
        await sending.send_all(direct, others)
    finally:
        sending.release()
    return sending.stats()


class _Sending:
    """One ``send`` call, in named steps: ``note_models_without_batch_api``, ``claim_all`` (each
    model's claim taken: the plain models claimed at once go together, the others one by one),
    ``send_all``, ``release`` and ``stats``. Its state, set here only: the arguments of ``send``
    (``models``, ``suite``, ``cache``, ``budget``, ``limiters``, ``shard``, ``on_progress``,
    ``batch``, ``batch_overrides``, ``limits_of``, ``options``, ``fallback_sync``, ``say``,
    ``ledger``, ``stop``), ``part`` (the shard as the claims name it), ``parts`` (label -> the Stats
    of each path the model took), ``known_tasks`` (task id -> Task, shared by the models' batches: a
    task awaited by 20 models is held once), ``collecting`` (the models' batches are collected one
    at a time, ``runner.batch.driver.ModelBatches``) and ``held`` (the claims taken, released at the
    end)."""

    def __init__(
        self,
        models: Sequence[ModelRun],
        suite: Suite,
        cache: Cache,
        *,
        budget: Budget,
        limiters: dict[str, ProviderLimiter],
        shard: Shard | None,
        on_progress: Callable[[str, Stats], None] | None,
        batch: frozenset[str],
        batch_overrides: dict,
        limits_of: dict,
        options: BatchOptions,
        fallback_sync: bool,
        say: Callable[[str], None],
        ledger: Ledger,
        stop: RunStop | None,
    ):
        self.models, self.suite, self.cache, self.budget, self.limiters = (
            models,
            suite,
            cache,
            budget,
            limiters,
        )
        self.shard, self.on_progress, self.batch, self.stop = shard, on_progress, batch, stop
        self.batch_overrides, self.limits_of, self.options = batch_overrides, limits_of, options
        self.fallback_sync, self.say, self.ledger = fallback_sync, say, ledger
        self.part = None if shard is None else (shard.index, shard.count)
        self.parts: dict[str, list[Stats]] = {m.label: [] for m in models}
        self.known_tasks: dict = {}
        self.collecting = asyncio.Lock()
        self.held: list[claims_mod.Claim] = []

    def note_models_without_batch_api(self, told: set[str]) -> None:
        """Say once which models in batch mode have no batch API (they are sent synchronously),
        but not those in ``told`` (already said), which it adds them to."""
        notes = sorted(
            m.label
            for m in self.models
            if m.label in self.batch and not supports(m.adapter.kind) and m.label not in told
        )
        told.update(notes)
        if notes:
            self.say(
                f"--batch: {', '.join(notes)} ha{'s' if len(notes) == 1 else 've'} no batch API (decision "
                "models, the embedded model, local servers and logprob decisions are sent one call at a "
                "time): sent synchronously"
            )

    def claim_all(
        self,
    ) -> tuple[list[ModelRun], list[tuple[ModelRun, claims_mod.Claim | claims_mod.Holder]]]:
        """Each model's claim taken: ``(direct, others)``, the models claimed at once with no batch
        in play (sent together) and the others with their claim or its holder. Then what the claims'
        last holders stored since the index was read is read into it (it counts as cached)."""
        direct, others = [], []
        for m in self.models:
            got = self.take(m)
            if isinstance(got, claims_mod.Claim) and self.plain(m):
                self.held.append(got)
                direct.append(m)
            else:
                others.append((m, got))
        if direct or any(isinstance(got, claims_mod.Claim) for _, got in others):
            self.cache.refresh()
        return direct, others

    def plain(self, model: ModelRun) -> bool:
        """Whether ``model`` is sent synchronously only: not in batch mode (or no batch API) and no
        open batches."""
        in_batch = model.label in self.batch and supports(model.adapter.kind)
        return not in_batch and not self.ledger.open_entries(identity(model))

    def take(self, model: ModelRun) -> claims_mod.Claim | claims_mod.Holder:
        """``model``'s claim, or the live process holding it; CacheWriteError when it cannot be
        written."""
        try:
            return claims_mod.take(self.cache.root, identity(model), model.label, self.part)
        except OSError as exc:
            raise CacheWriteError(
                f"the cache cannot be written: cannot create a file in "
                f"{self.cache.root / claims_mod.CLAIMS_DIR} ({exc.strerror or exc}) to claim "
                f"{model.label}'s requests",
                exc.errno,
            ) from None

    async def send_all(
        self,
        direct: list[ModelRun],
        others: list[tuple[ModelRun, claims_mod.Claim | claims_mod.Holder]],
    ) -> None:
        """The direct models through one scheduler run, each other model on its own path, side by
        side; the first error raised as itself (as ``runner.sending.scheduler.run`` does)."""
        try:
            async with asyncio.TaskGroup() as tasks:
                if direct:
                    tasks.create_task(self.sync(direct, self.shard))
                for m, got in others:
                    tasks.create_task(self.one(m, got))
        except ExceptionGroup as group_error:
            first = group_error
            while isinstance(first, ExceptionGroup):
                first = first.exceptions[0]
            raise first from group_error

    async def one(self, model: ModelRun, got: claims_mod.Claim | claims_mod.Holder) -> None:
        """One model not sent with the direct ones: its claim waited for, then synchronously, or
        through its batches (``through_batches``)."""
        label, ident = model.label, identity(model)
        if isinstance(got, claims_mod.Holder):
            self.say(
                f"{label}: {got} is sending this model's requests to {self.cache.root}; waiting for it to "
                "end (what it stores is read from the cache, not sent again)"
            )
            got = await self.unless_stopping(
                claims_mod.wait(self.cache.root, ident, label, self.part)
            )
            if got is None:  # the run is stopping: nothing taken; its requests counted, none sent
                self.cache.refresh()  # what the other process stored counts as cached
                await self.sync(
                    [model], KeyFilter(frozenset(self.ledger.claimed(ident)), self.shard, False)
                )
                return
            self.held.append(got)
            self.cache.refresh()
            self.say(f"{label}: the other process is done; going on with what it left")
        else:
            self.held.append(got)
        in_batch = label in self.batch and supports(model.adapter.kind)
        api = batch_api(model.adapter) if in_batch or self.ledger.open_entries(ident) else None
        if api is None:
            await self.sync(
                [model], KeyFilter(frozenset(self.ledger.claimed(ident)), self.shard, keep=False)
            )
        else:
            await self.through_batches(model, api, in_batch)

    async def through_batches(self, model: ModelRun, api: BatchAPI, in_batch: bool) -> None:
        """``model``'s batches: in batch mode, its requests through them; otherwise an earlier batch
        run's open batches collected while the rest is sent synchronously. What they leave is sent
        synchronously (after a deadline with ``fallback_sync``, or when not in batch mode) or
        counted not sent."""
        label, ident = model.label, identity(model)
        price = scoring_cost.batch_price(
            model.price, *self.batch_overrides.get(label, (None, None))
        )
        stats = BatchStats(cost_usd=None if price is None else 0.0)
        self.parts[label].append(stats)
        if self.stop is not None:
            self.stop.track({label: stats})
        size, tokens = self.limits_of.get(label, (None, None))
        mine = replace(
            self.options,
            max_requests=size or self.options.max_requests,
            enqueued_tokens=tokens or self.options.enqueued_tokens,
        )
        batches = ModelBatches(
            model,
            api,
            self.suite,
            self.cache,
            self.ledger,
            ident,
            budget=self.budget,
            batch_price=price,
            shard=self.shard,
            options=mine if in_batch else replace(mine, collect_only=True, wait=True),
            stats=stats,
            events=self.say,
            on_progress=lambda: self.progress(label),
            tasks=self.known_tasks,
            collecting=self.collecting,
        )
        try:
            if in_batch:
                left = await self.unless_stopping(batches.run())
                if left is None:  # the run is stopping: the requests not in a batch not sent
                    await batches.count_stopped()
            else:
                claimed = frozenset(self.ledger.claimed(ident))
                left, _ = await asyncio.gather(
                    self.unless_stopping(batches.run()),
                    self.sync([model], KeyFilter(claimed, self.shard, keep=False)),
                )
        except asyncio.CancelledError:  # cut short: counted only as far as it got
            stats.uncounted = 1
            raise
        if left:
            await self.left_by_batches(model, batches, left, in_batch)

    async def left_by_batches(
        self, model: ModelRun, batches: ModelBatches, left: list, in_batch: bool
    ) -> None:
        """What ``model``'s batches left (``ModelBatches.run``'s return): sent synchronously (after
        a deadline with ``fallback_sync``, or when not in batch mode), first those a batch of this
        run gave back (counted sent already: one the fallback cannot send stays sent,
        ``unanswered``), or counted (module docstring, 3)."""
        label, stats = model.label, batches.stats
        keys = frozenset(model.adapter.encode(task, sample).key for task, sample in left)
        already = batches.sent_already(keys)  # each request is counted sent once
        if self.fallback_sync and batches.cancelled or not in_batch:
            self.say(f"{label}: sending the {len(keys):,} request(s) left synchronously")
            stats.refused -= batches.refused_left  # sent now, counted by the synchronous path
            stats.sent -= len(already)
            if already:  # first those a batch of this run gave back: sent, counted by this path
                again = (await self.sync([model], KeyFilter(already, self.shard)))[label]
                # one it could not send (the cost bound, a stop) stays sent, without an answer
                stats.sent += again.not_sent
                stats.unanswered += again.not_sent
                again.not_sent = again.stop_not_sent = 0
            await self.sync([model], KeyFilter(keys - already, self.shard))
        else:  # those of a batch refused whole are counted refused already (``_collect``), those
            # a batch of this run gave back sent (with no answer: the next run sends them)
            stats.unanswered += len(already)
            unsent = len(left) - batches.refused_left - len(already)
            stats.not_sent += unsent
            stats.stop_not_sent += unsent if stats.stopped else 0  # left by the refusal

    async def unless_stopping(self, waiting: Coroutine[object, object, T]) -> T | None:
        """``waiting`` (a wait: for another process's claim, or for a model's batches, polled)
        awaited, but cut when the run is asked to stop (the first Ctrl-C or SIGTERM; at once when it
        was already): then None. A batch cut so keeps running at the provider (the ledger has it and
        the next run collects it). Synchronous sending is never cut here: the scheduler drains it
        (``runner.sending.stops.RunStop``). This task being cancelled (a second signal) cancels
        ``waiting`` and is raised, as before."""
        if self.stop is None:
            return await waiting
        task = asyncio.ensure_future(waiting)
        self.stop.on_request(task.cancel)
        try:
            return await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if not task.cancelled() or (current is not None and current.cancelling()):
                raise
            return None

    async def sync(
        self, group: list[ModelRun], key_filter: KeyFilter | Shard | None
    ) -> dict[str, Stats]:
        """``group`` through one scheduler run (``runner.sending.scheduler.run``), its requests
        those ``key_filter`` owns; each model's Stats kept among its parts, and returned."""
        stats = await run(
            group,
            self.suite,
            self.cache,
            on_progress=self.sync_progress,
            budget=self.budget,
            limiters=self.limiters,
            shard=key_filter,
            stop=self.stop,
        )
        for label, s in stats.items():
            self.keep(label, s)
        return stats

    def sync_progress(self, label: str, stats: Stats) -> None:
        self.keep(label, stats)
        self.progress(label)

    def keep(self, label: str, stats: Stats) -> None:
        """``stats`` among the model's parts, once: by identity (two synchronous runs of one model,
        the deadline fallback's, may count the same)."""
        if not any(part is stats for part in self.parts[label]):
            self.parts[label].append(stats)

    def progress(self, label: str) -> None:
        """Hand ``on_progress`` the model's Stats so far, merged over its paths."""
        parts = self.parts[label]
        if self.on_progress is not None and parts:
            self.on_progress(label, merged(parts) if len(parts) > 1 else parts[0])

    def release(self) -> None:
        for claim in self.held:
            claim.release()

    def stats(self) -> dict[str, Stats]:
        """Each model's Stats, merged over the paths it took."""
        return {
            m.label: (
                merged(self.parts[m.label])
                if len(self.parts[m.label]) != 1
                else self.parts[m.label][0]
            )
            for m in self.models
        }


def so_far(stop: RunStop, models: Sequence[ModelRun]) -> dict[str, Stats]:
    """Each model's Stats of a run cut short (a second signal, the end of ``--grace``), merged over
    the paths ``stop`` tracked (``RunStop.track``) as ``send`` merges them; a model none of which
    had started counts nothing, ``uncounted``."""
    out = {}
    for m in models:
        parts = stop.parts.get(m.label, [])
        out[m.label] = merged(parts) if len(parts) != 1 else parts[0]
        if not parts:
            out[m.label].uncounted = 1
            out[m.label].cost_usd = None if m.price is None else 0.0
    return out


async def collect(
    models: Sequence[ModelRun],
    suite: Suite,
    cache: Cache,
    ledger: Ledger,
    options: BatchOptions,
    batch_overrides: dict | None = None,
    say: Callable[[str], None] | None = None,
    out: dict[str, BatchStats] | None = None,
) -> dict[str, BatchStats]:
    """``dxi batches collect``: for each of ``models`` (started) with open ledger entries, poll them
    (once, or until they end with ``options.wait``) and store the results of those that ended;
    nothing new is submitted. Returns each such model's BatchStats (``given_back``: requests the
    next run sends), in ``out`` when given, each one put there before its model is collected (a
    stop meanwhile leaves what was counted: its line in OUT/run-history.jsonl)."""
    out = {} if out is None else out
    for model in models:
        ident = identity(model)
        if not ledger.open_entries(ident):
            continue
        api = batch_api(model.adapter)
        if api is None:
            continue
        price = scoring_cost.batch_price(
            model.price, *(batch_overrides or {}).get(model.label, (None, None))
        )
        stats = out[model.label] = BatchStats(cost_usd=None if price is None else 0.0)
        await ModelBatches(
            model,
            api,
            suite,
            cache,
            ledger,
            ident,
            budget=Budget(),
            batch_price=price,
            options=replace(options, collect_only=True),
            stats=stats,
            events=say,
        ).run()
    return out


def settle_cached(models: Sequence[ModelRun], cache: Cache, ledger: Ledger | None = None) -> int:
    """Close, without the network, the open ledger entries of ``models`` whose every request is in
    the cache (a run killed after the last row of a collection and before its ``collected`` record):
    their models need nothing more, so no run would collect them otherwise. Returns how many were
    closed."""
    ledger = ledger or Ledger(cache.root)
    if not ledger.folder.is_dir():
        return 0
    closed = 0
    for model in models:
        for entry in ledger.open_entries(identity(model)):
            keys = ledger.keys(entry.id)
            if entry.batch_id is not None and keys and all(cache.has_many(keys)):
                with ledger.collector(entry.id) as mine:
                    if mine:
                        ledger.record(
                            entry.id,
                            "collected",
                            stored=0,
                            returned=[],
                            unmatched=0,
                            note="every request of the batch was in the cache",
                        )
                        ledger.forget_keys(entry.id)
                        closed += 1
    return closed
