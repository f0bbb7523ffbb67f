"""What ``dxi run`` sends, and by which path: each model's requests synchronously (``runner.run``) or through
its provider's batch API (``runner.batch``), under the model's claim on the cache folder (``cache.claims``),
so that two processes on one cache never both send a request (issue 23).

For each model, before anything is sent:

1. **The claim.** The model's requests (those of the process's shard) are claimed in the cache folder. A
   claim held by another live process is waited for, with a message naming it (its process id, and host
   when another); the other models go on meanwhile. Once it is taken (at once or after a wait), the rows
   appended to the cache since its key index was read are read into it (``Cache.refresh``: only what is
   new), so that what another process stored counts as cached: total requests sent equals distinct
   requests. (The index may have been read long before: a run's start-up reads it to find the models
   whose every request is cached, then starts the others' adapters, which may take seconds; a run that
   found the claim free after another run had ended sent again what that run stored: issue 32.)
2. **The path.** A model in batch mode (``--batch``, or ``batch = true`` in the run file) whose provider has
   a batch API goes through ``runner.batch``; one without (decision models, the embedded model, local
   servers, logprob decisions) is sent synchronously, and the run says so once. A model sent
   synchronously whose requests are in open batches of the ledger (an earlier ``--batch`` run stopped
   before collecting them) has those collected from their batches (never sent again) while the rest are
   sent synchronously.
3. **The deadline fallback** (``--deadline-fallback sync``): what a model's batches left unanswered at the
   deadline is sent synchronously.

Models that are claimed at once, have no open batches and are not in batch mode (the usual case) go through
one ``runner.run.run`` call together, exactly as without this module. ``send`` returns each model's Stats,
merged over the paths it took (``BatchStats`` for a model that has batches).
"""
from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace

from dxi.adapters.batches import batch_api, supports
from dxi.cache import Cache, CacheWriteError
from dxi.cache import claims as claims_mod
from dxi.cache.ledger import Ledger
from dxi.evals import PROMPT_VERSION, Suite

from .batch import BatchOptions, BatchStats, ModelBatches
from .cost import Budget
from .limits import ProviderLimiter
from .run import ModelRun, Stats, run
from .shard import Shard
from .stops import RunStop


def identity(model: ModelRun) -> str:
    """The model configuration's digest (32 hex): adapter, model, endpoint, sampling parameters and prompt
    version, as in every cache key. Its claims and ledger entries go by it."""
    head = "\0".join((*model.identity.key, PROMPT_VERSION))
    return hashlib.sha256(head.encode()).hexdigest()[:32]


@dataclass(frozen=True, slots=True)
class KeyFilter:
    """A ``runner.shard.Shard``-like filter for ``runner.run.run``: the keys of ``shard`` (all without one)
    that are in ``keys`` (``keep`` True) or not in them (``keep`` False)."""

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


async def send(models: Sequence[ModelRun], suite: Suite, cache: Cache, *, budget: Budget,
               limiters: dict[str, ProviderLimiter], shard: Shard | None = None,
               on_progress: Callable[[str, Stats], None] | None = None, batch: frozenset[str] = frozenset(),
               batch_overrides: dict | None = None, limits_of: dict | None = None,
               options: BatchOptions | None = None,
               fallback_sync: bool = False, say: Callable[[str], None] | None = None,
               ledger: Ledger | None = None, stop: RunStop | None = None) -> dict[str, Stats]:
    """Send what ``models`` need over ``suite`` (see the module docstring) and return each model's Stats.
    ``batch``: the labels in batch mode; ``batch_overrides``: label -> the run file's (batch_input,
    batch_output) prices (default: half the price, ``scoring.cost.batch_price``); ``limits_of``: label ->
    (requests per batch, enqueued tokens); ``options``: how batch mode runs; ``fallback_sync``: what batches
    left at the deadline is sent synchronously; ``say`` prints a line (waits, batch state changes, notes);
    ``stop``: the run's drain (``runner.stops.RunStop``): once requested nothing new is sent synchronously,
    and the models waiting for a claim or going through batches end at once (their open batches keep
    running at the provider: the ledger has them and the next run collects them).
    Raises CacheWriteError when the claims cannot be written (a read-only cache), and what
    ``runner.run.run`` raises."""
    options = options or BatchOptions()
    say = say or (lambda text: None)
    ledger = ledger or Ledger(cache.root)
    parts: dict[str, list[Stats]] = {m.label: [] for m in models}
    known_tasks: dict = {}  # task id -> Task, shared by the models' batches (a task awaited by 20 models is held once)
    collecting = asyncio.Lock()  # the models' batches are collected one at a time (runner.batch.ModelBatches)
    held: list[claims_mod.Claim] = []
    part = None if shard is None else (shard.index, shard.count)

    def progress(label: str) -> None:
        if on_progress is not None and parts[label]:
            on_progress(label, merged(parts[label]) if len(parts[label]) > 1 else parts[label][0])

    def sync_progress(label: str, stats: Stats) -> None:
        if stats not in parts[label]:
            parts[label].append(stats)
        progress(label)

    async def sync(group: list[ModelRun], key_filter: KeyFilter | Shard | None) -> None:
        stats = await run(group, suite, cache, on_progress=sync_progress, budget=budget, limiters=limiters,
                          shard=key_filter, stop=stop)
        for label, s in stats.items():
            if s not in parts[label]:
                parts[label].append(s)

    def take(model: ModelRun) -> claims_mod.Claim | claims_mod.Holder:
        try:
            return claims_mod.take(cache.root, identity(model), model.label, part)
        except OSError as exc:
            raise CacheWriteError(f"the cache cannot be written: cannot create a file in {cache.root / claims_mod.CLAIMS_DIR} "
                                  f"({exc.strerror or exc}) to claim {model.label}'s requests", exc.errno) from None

    async def one(model: ModelRun, got: claims_mod.Claim | claims_mod.Holder) -> None:
        label, ident = model.label, identity(model)
        if isinstance(got, claims_mod.Holder):
            say(f"{label}: {got} is sending this model's requests to {cache.root}; waiting for it to end (what it "
                "stores is read from the cache, not sent again)")
            got = await claims_mod.wait(cache.root, ident, label, part)
            held.append(got)
            cache.refresh()
            say(f"{label}: the other process is done; going on with what it left")
        else:
            held.append(got)
        in_batch = label in batch and supports(model.adapter.kind)
        api = batch_api(model.adapter) if in_batch or ledger.open_entries(ident) else None
        if api is None:
            await sync([model], KeyFilter(frozenset(ledger.claimed(ident)), shard, keep=False))
            return
        from dxi.scoring.cost import batch_price  # (Polars: imported once a batch is in play)

        price = batch_price(model.price, *(batch_overrides or {}).get(label, (None, None)))
        stats = BatchStats(cost_usd=None if price is None else 0.0)
        parts[label].append(stats)
        size, tokens = (limits_of or {}).get(label, (None, None))
        mine = replace(options, max_requests=size or options.max_requests, enqueued_tokens=tokens or options.enqueued_tokens)
        batches = ModelBatches(model, api, suite, cache, ledger, ident, budget=budget, batch_price=price, shard=shard,
                               options=mine if in_batch else replace(mine, collect_only=True, wait=True),
                               stats=stats, events=say, on_progress=lambda: progress(label), tasks=known_tasks,
                               collecting=collecting)
        if in_batch:
            left = await batches.run()
        else:  # an earlier batch run's open batches are collected while the rest is sent synchronously
            claimed = frozenset(ledger.claimed(ident))
            left, _ = await asyncio.gather(batches.run(), sync([model], KeyFilter(claimed, shard, keep=False)))
        if left and (fallback_sync and batches.cancelled or not in_batch):
            keys = frozenset(model.adapter.encode(task, sample).key for task, sample in left)
            say(f"{label}: sending the {len(keys):,} request(s) left synchronously")
            await sync([model], KeyFilter(keys, shard, keep=True))
        elif left:
            stats.not_sent += len(left)

    notes = sorted(m.label for m in models if m.label in batch and not supports(m.adapter.kind))
    if notes:
        say(f"--batch: {', '.join(notes)} ha{'s' if len(notes) == 1 else 've'} no batch API (decision models, the embedded "
            "model, local servers and logprob decisions are sent one call at a time): sent synchronously")
    direct, others = [], []
    try:
        for m in models:
            got = take(m)
            plain = not (m.label in batch and supports(m.adapter.kind)) and not ledger.open_entries(identity(m))
            if isinstance(got, claims_mod.Claim) and plain:
                held.append(got)
                direct.append(m)
            else:
                others.append((m, got))
        if direct or any(isinstance(got, claims_mod.Claim) for _, got in others):
            cache.refresh()  # what the claims' last holders stored since the index was read counts as cached
        try:
            async with asyncio.TaskGroup() as tasks:
                if direct:
                    tasks.create_task(sync(direct, shard))
                batched = [tasks.create_task(one(m, got)) for m, got in others]
                if stop is not None and batched:  # stopping: a batch being polled is left to the next run
                    stop.on_request(lambda: [t.cancel() for t in batched])
        except ExceptionGroup as group_error:  # raise the first error as itself, as runner.run.run does
            first = group_error
            while isinstance(first, ExceptionGroup):
                first = first.exceptions[0]
            raise first from group_error
    finally:
        for claim in held:
            claim.release()
    return {m.label: (merged(parts[m.label]) if len(parts[m.label]) != 1 else parts[m.label][0]) for m in models}


async def collect(models: Sequence[ModelRun], suite: Suite, cache: Cache, ledger: Ledger, options: BatchOptions,
                  batch_overrides: dict | None = None, say: Callable[[str], None] | None = None) -> dict[str, BatchStats]:
    """``dxi batches collect``: for each of ``models`` (started) with open ledger entries, poll them (once, or
    until they end with ``options.wait``) and store the results of those that ended; nothing new is
    submitted. Returns each such model's BatchStats (``given_back``: requests the next run sends)."""
    from dxi.scoring.cost import batch_price

    out = {}
    for model in models:
        ident = identity(model)
        if not ledger.open_entries(ident):
            continue
        api = batch_api(model.adapter)
        if api is None:
            continue
        price = batch_price(model.price, *(batch_overrides or {}).get(model.label, (None, None)))
        stats = BatchStats(cost_usd=None if price is None else 0.0)
        await ModelBatches(model, api, suite, cache, ledger, ident, budget=Budget(), batch_price=price,
                           options=replace(options, collect_only=True), stats=stats, events=say).run()
        out[model.label] = stats
    return out


def settle_cached(models: Sequence[ModelRun], cache: Cache, ledger: Ledger | None = None) -> int:
    """Close, without the network, the open ledger entries of ``models`` whose every request is in the cache
    (a run killed after the last row of a collection and before its ``collected`` record): their models
    need nothing more, so no run would collect them otherwise. Returns how many were closed."""
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
                        ledger.record(entry.id, "collected", stored=0, returned=[], unmatched=0,
                                      note="every request of the batch was in the cache")
                        ledger.forget_keys(entry.id)
                        closed += 1
    return closed
