"""One run of a plan, end to end, as a library call: ``run(plan, ...)`` starts the adapters, sends
what is not cached (``runner.dispatch``, under ``runner.signals.Graceful``), counts the tasks and
prepares the scoring while the requests are on the wire, scores (``runner.outputs.files``), uploads
(``runner.distributed.setup``) and decides the exit code; it returns a ``RunResult``. ``dxi run``
(``runner.commands.run``) is this call plus its messages.

The pieces are public for the other callers: ``start_adapters`` (``dxi estimate`` learns a server's
model name, ``dxi batches collect`` starts the models it polls) and ``all_cached``; a run's counts
(summary.json's ``requests`` blocks and the others) are ``runner.counts``'s.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from itertools import islice
from typing import TYPE_CHECKING

from dxi import adapters
from dxi.cache import Cache, CacheWriteError
from dxi.cache.store import prepare_compaction
from dxi.evals import EVALS
from dxi.lazy import LazyModule

from .counts import batch_outcome, counts
from .distributed import setup as distributed
from .errors import EXIT_COST_BOUND, EXIT_FAILED_REQUESTS, EXIT_PROVIDER_STOPPED, UsageError
from .outputs.provenance import provenance
from .planning.selection import annotate, remember
from .sending.limits import ProviderLimiter
from .sending.scheduler import Stats
from .sending.stops import RunStop
from .signals import GRACE_S, Graceful, Interrupted, describe, within

# Imported on first use (``dxi.lazy``): each loads Polars, the scoring, Rich or aiohttp, which
# ``dxi run`` needs only once its first requests are out (tests/test_startup.py);
# ``prepare_scoring`` imports the outputs' modules during the run
uvloop = LazyModule("uvloop")
_scoring = LazyModule("dxi.scoring")
_files = LazyModule("dxi.runner.outputs.files")
_terminal = LazyModule("dxi.runner.outputs.terminal")
_estimate = LazyModule("dxi.runner.planning.estimate")
_progress = LazyModule("dxi.runner.sending.progress")
_dispatch = LazyModule("dxi.runner.dispatch")
_rounds = LazyModule("dxi.runner.adaptive.rounds")
_rescore = LazyModule("dxi.runner.rescore")

if TYPE_CHECKING:
    from rich.console import Console

    from dxi.scoring.records import Summary

    from .adaptive.rounds import Rounds
    from .batch.options import BatchOptions
    from .counts import Counts
    from .planning.estimate import Estimate
    from .planning.plan import ModelRun, Plan
    from .sending.cost import Budget

SURVEY_WAIT_S = (
    0.5  # the longest the survey waits for the run's first outcome before starting anyway
)


@dataclass(frozen=True)
class RunResult:
    """What ``run`` did: ``stats`` (model label -> its ``runner.sending.scheduler.Stats``, or
    ``runner.batch.driver.BatchStats``), ``summary`` (summary.json's document, as written to
    ``plan.out``), ``stopped`` (summary.json's ``stopped_providers`` blocks,
    ``runner.sending.stops``), ``cost_bound`` (its ``cost_bound`` block; None without
    ``--max-cost``), ``spent_usd`` (what this run's requests cost, USD), ``refused`` /
    ``unanswered`` (a batch API refused a model's batches / batches left requests unanswered:
    ``runner.batch.driver``), ``upload_failed`` (``runner.errors.EXIT_UPLOAD`` when shards could not
    be uploaded to the remote cache, else None) and ``exit_code`` (``dxi run``'s, from
    ``exit_code``)."""

    stats: dict[str, Stats]
    summary: Summary
    stopped: list[dict]
    cost_bound: dict | None
    spent_usd: float
    refused: bool
    unanswered: bool
    upload_failed: int | None
    exit_code: int

    @property
    def requests(self) -> dict[str, dict]:
        """Each model's ``requests`` block, as summary.json has it: label -> counts."""
        return {entry.model: entry.requests for entry in self.summary.models}

    @property
    def failed(self) -> dict[str, Stats]:
        """The models with failed requests (no valid reply after the retries): label -> Stats."""
        return {label: s for label, s in self.stats.items() if s.failed}


def run(
    plan: Plan,
    *,
    console: Console | None = None,
    grace: float = GRACE_S,
    fsync: bool = False,
    retry_invalid: bool = False,
    retry_failed: bool = False,
    dist: distributed.Distributed | None = None,
    batch_options: BatchOptions | None = None,
    fallback_sync: bool = False,
    on_summary: Callable[[Summary], None] | None = None,
) -> RunResult:
    """Run ``plan``: send what is not cached into its cache folder, score into ``plan.out``
    (summary.json, answers.parquet), upload (with a remote tier) and decide the exit code.

    ``console``: where the start line and the progress go (None: nothing is printed); ``grace``:
    seconds the requests in flight get to finish after the first Ctrl-C or SIGTERM; ``fsync``,
    ``retry_invalid``, ``retry_failed``: as ``cache.Cache`` takes them; ``dist``: the shard, remote
    tier and coordinator (``distributed.setup``; None: the plan's own remote tier and coordinator,
    ``plan.cache_remote`` and ``plan.coordinator``, and no shard); ``batch_options``: batch mode's
    (``runner.batch.driver``); ``fallback_sync``: what batches leave at the deadline is sent one
    call at a time; ``on_summary``: called with summary.json's document once it is written, before
    the uploads finish.

    Raises ``UsageError`` (an adapter that cannot start, two models with one name),
    ``signals.Interrupted`` or ``KeyboardInterrupt`` (stopped by a signal: everything that arrived
    is cached; once drained, what arrived is scored into ``plan.out`` as well, marked
    ``interrupted``, if the grace period leaves the time: ``Interrupted.summary``; stopped while
    scoring, once every request was sent: a ``KeyboardInterrupt`` whose ``counts`` are the run's)
    and ``cache.CacheWriteError`` (the cache could not be written; its ``counts``, when it stopped
    the sending: what was sent and spent by then, ``runner.counts``)."""
    dist = dist if dist is not None else distributed.setup(None, plan, sending=True)
    budget = dist.budget(plan.max_cost)
    rounds = None
    if plan.until is not None:  # an adaptive run (``runner.adaptive``): rounds down the order
        rounds = _rounds.Rounds(plan)
    limiters: dict = {}
    with Cache(
        plan.cache_dir,
        fsync=fsync,
        retry_invalid=retry_invalid,
        retry_failed=retry_failed,
        remote=dist.remote,
        roll_s=dist.roll_s,
    ) as cache:
        try:
            stats, remaining = uvloop.run(
                _graceful(
                    plan,
                    cache,
                    console,
                    budget,
                    grace,
                    dist,
                    limiters,
                    batch_options,
                    fallback_sync,
                    rounds,
                )
            )
        except Interrupted as stop:
            if stop.counts is None or stop.deadline is None:  # cut short: nothing is scored
                raise
            # drained: what arrived scored as partial results, in what the grace period leaves
            # (at its end, or at a second signal, the outputs there stay whole); an adaptive run
            # over every task, as `dxi score` scores a run that did not finish (nothing recorded)
            done, marks = stop.counts, {"interrupted": stop.block()}
            stop.summary, stop.unwritten = within(
                stop.deadline, lambda: _scored(plan, cache, done, None, marks)
            )
            if stop.summary is not None and on_summary is not None:
                on_summary(stop.summary)
            raise
        counted_ = counts(stats, plan.models, budget, plan.max_cost, limiters, remaining)
        with _keeping(counted_):
            summary = _scored(plan, cache, counted_, rounds)
    with _keeping(counted_):  # printing the summary, the uploads
        if on_summary is not None:
            on_summary(summary)
        upload_failed = dist.finish()  # the run ends when its uploads are done
    stopped = counted_.stopped
    extra = counted_.extra()
    dist.shard_note()
    refused, unanswered = batch_outcome(stats)
    sharded = dist.shard is not None and dist.shard.count > 1
    code = exit_code(
        summary.accepted,
        stats,
        budget_stopped=budget.stopped,
        stopped=bool(stopped),
        refused=refused,
        unanswered=unanswered,
        sharded=sharded,
        upload_failed=upload_failed,
    )
    return RunResult(
        stats,
        summary,
        stopped,
        extra.get("cost_bound"),
        budget.spent,
        refused,
        unanswered,
        upload_failed,
        code,
    )


@contextlib.contextmanager
def _keeping(counted_: Counts):
    """A stop once the sending is over (Ctrl-C or SIGTERM while scoring, printing or uploading;
    a cache that cannot be written) carries the run's counts (``counts``) for its line."""
    try:
        yield
    except (KeyboardInterrupt, CacheWriteError) as stop:
        stop.counts = counted_  # type: ignore[attr-defined]
        raise


def _scored(
    plan: Plan, cache: Cache, counted_: Counts, rounds: Rounds | None, marks: dict | None = None
) -> Summary:
    """Score the run into ``plan.out`` (summary.json and answers.parquet, ``runner.outputs.files``)
    with its counts (``counted_``: the ``requests`` blocks, ``cost_bound``, ``stopped_providers``),
    an adaptive run's blocks (its outcome also recorded for ``dxi score``) and ``marks`` (summary
    fields: a stopped run's ``interrupted``); the summary."""
    extra = counted_.extra() | (marks or {})
    adaptive = rounds is not None and rounds.order is not None
    if adaptive:
        extra["adaptive"] = rounds.block()
    # the last log parsed once, before scoring (which reads its rows from memory instead of parsing
    # the log twice) and written as a shard on the compactor thread while scoring runs
    cache.close(wait=False)
    models = plan.models_frame()
    annotate(
        plan.suite, models=models, cache_dir=plan.cache_dir
    )  # models whose runs selected others
    summary = _files.score(
        cache,
        plan.suite,
        models,
        plan.out,
        counted_.requests,
        plan.epochs,
        plan.prices(),
        extra,
        batch_prices=plan.batch_prices(),
        tolerance=plan.tolerance(),
        entries=None if rounds is None else rounds.entries(),
        parts=None if rounds is None else rounds.parts(),
    )
    if adaptive:  # for `dxi score`, `report` and `view`
        rounds.remember(models, summary)
    return summary


def exit_code(
    accepted: bool,
    stats: dict[str, Stats],
    *,
    budget_stopped: bool,
    stopped: bool,
    refused: bool,
    unanswered: bool,
    sharded: bool,
    upload_failed: int | None,
) -> int:
    """``dxi run``'s exit code (``dxi --help`` lists them): a stopped provider or refused batch (6)
    first (a higher bound would not undo it), then the cost bound (3), then batches' unanswered (1);
    else the uploads' failure (5) or, without it, 0 when the summary is ``accepted``
    (``Summary.accepted``) and 1 when it is provisional. One shard of several scores only its part
    (the others' answers are missing by design): it is provisional only for failed requests."""
    if stopped or refused:
        return EXIT_PROVIDER_STOPPED
    if budget_stopped:
        return EXIT_COST_BOUND
    if unanswered:
        return EXIT_FAILED_REQUESTS
    if sharded:
        failed = any(s.failed for s in stats.values())
        return upload_failed or (EXIT_FAILED_REQUESTS if failed and not accepted else 0)
    return upload_failed or (0 if accepted else EXIT_FAILED_REQUESTS)


async def start_adapters(
    models: list[ModelRun], cache: Cache | None = None
) -> tuple[list[ModelRun], list[tuple[ModelRun, adapters.ProviderStop]]]:
    """Start every adapter (closing those started if one fails); UsageError for one that cannot
    start. A model whose server cannot be reached, or serves another model than the one named (a
    ProviderStop), is not started: it is returned beside the started ones with its stop, for its
    provider to be stopped alone (``runner.sending.stops``); with a ``cache``, one of them that has
    no model name is named from it (``runner.rescore.name_from_cache``)."""
    started, unreachable = [], []
    try:
        for m in models:
            try:
                await m.adapter.start()
            except adapters.ProviderStop as stop:
                unreachable.append((m, stop))
                continue
            started.append(m)
    except adapters.Fatal as exc:
        for m in started:
            await m.adapter.close()
        raise UsageError(str(exc)) from None
    if cache is not None:
        _rescore.name_from_cache(cache, [m for m, _ in unreachable])
    return started, unreachable


def all_cached(model: ModelRun, plan: Plan, cache: Cache, shard=None) -> int | None:
    """The number of requests of ``model`` (with a ``shard``: of those it owns) when every one is in
    the cache (it needs no server, no key), else None; None too for a model that must be started to
    know its name (a System One server that names its model)."""
    if not model.adapter.model:
        return None
    n = 0
    keys_ = (request.key for _, _, request in model.requests(plan.suite, shard))
    while keys := list(islice(keys_, 256)):
        if not all(cache.has_many(keys)):
            return None
        n += len(keys)
    return n


def counted(
    plan: Plan, models: list[ModelRun], idle: set[str], budget: Budget, shard=None
) -> tuple[str, dict[str, int]]:
    """The start line (what is running) and each model's number of requests (with a ``shard``: the
    requests it owns), from the suite's survey."""
    suite = plan.suite
    tasks = {EVALS[name].title: n for name, n in suite.survey().tasks.items()}
    n_tasks = sum(tasks.values())
    totals_ = (
        {m.label: n_tasks * m.epochs for m in models}
        if shard is None
        else {m.label: sum(1 for _ in m.requests(suite, shard)) for m in models}
    )
    epochs = {m.label: m.epochs for m in models}
    where = (plan.cache_dir, plan.out)
    return _progress.start_line(totals_, tasks, epochs, idle, *where, budget, plan.until), totals_


async def _survey(
    plan: Plan,
    progress,
    models: list[ModelRun],
    idle: set[str],
    budget: Budget,
    console,
    first: asyncio.Event,
    shard=None,
    release=lambda: None,
) -> None:
    """Once the run's first outcome is in (``first``: the first requests are on the wire; at most
    ``SURVEY_WAIT_S``), ``suite.survey()`` a few hundred tasks per event-loop turn, then the start
    line and the progress totals (on a thread: with a shard, counting what it owns encodes every
    request), then ``release()`` (the lines said before it follow it); then, on a thread while the
    requests are on the wire, what scoring needs (``prepare_scoring``)."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(first.wait(), SURVEY_WAIT_S)
    for _ in plan.suite.surveying():
        await asyncio.sleep(0)
    if (
        progress is not None
    ):  # on a thread: with a shard, its requests are encoded to count those it owns
        line, totals_ = await asyncio.to_thread(counted, plan, models, idle, budget, shard)
        console.print(line, highlight=False, markup=False)
        progress.set_totals(totals_)
    release()
    await asyncio.to_thread(prepare_scoring, plan.suite)


def prepare_scoring(suite) -> None:
    """What the scoring after the run needs and can have before it: its imports, the gold frames and
    the bootstrap's resample counts for each evaluation's number of tasks (the draws are most of the
    scoring's time for large evaluations: 10⁸ for 100,000 tasks; kept as float32 by
    ``Bootstrap.prepare``); what closing the cache needs to compact its last log
    (``cache.store.prepare_compaction``); and the summary's provenance
    (``runner.outputs.provenance``: git is asked here, never before the first request)."""
    _files.score, _terminal.print_summary  # noqa: B018 (the outputs' modules imported now, not after the run)
    prepare_compaction()
    provenance()  # git, the version and the platform, asked now rather than after the last reply
    suite.gold_frames()
    boot = _scoring.Bootstrap()  # as outputs.score_all scores
    for name, n_tasks in suite.survey().tasks.items():
        boot.prepare(name, n_tasks)


async def _graceful(
    plan: Plan,
    cache: Cache,
    console: Console | None,
    budget: Budget,
    grace: float,
    dist: distributed.Distributed,
    limiters: dict,
    batch_options,
    fallback_sync: bool,
    rounds: Rounds | None = None,
) -> tuple[dict[str, Stats], list[Estimate] | None]:
    """Run the plan (``_send``) under ``runner.signals.Graceful``: the first Ctrl-C or SIGTERM
    drains it (``runner.sending.stops.RunStop``), a second one or the end of ``grace`` cuts it
    short; either way it raises ``signals.Interrupted`` once stopped, with the run's counts
    (``Interrupted.counts``: each model's rest counted not sent, ``runner.counts``; cut short, what
    was counted by then, the requests abandoned on the wire among those sent)."""
    stop = RunStop()
    with Graceful(stop.request, grace, stop.abandon) as graceful:
        try:
            result = await _send(
                plan,
                cache,
                console,
                budget,
                grace,
                dist,
                limiters,
                stop,
                batch_options,
                fallback_sync,
                rounds,
            )
            await graceful.settle()  # a Ctrl-C that came while nothing waited is not lost
        except asyncio.CancelledError:
            if graceful.aborted is None:
                raise
            # cut short: what was counted so far, the requests abandoned on the wire counted sent
            cut = _dispatch.so_far(stop, plan.models)
            cut_counts = counts(cut, plan.models, budget, plan.max_cost, limiters)
            raise graceful.interrupted(stop.abandoned, cut_counts) from None
        except CacheWriteError as exc:  # what was sent and spent, paid replies not stored among it
            cut = _dispatch.so_far(stop, plan.models)
            for part in cut.values():  # the rest of each model was not counted (``incomplete``)
                part.uncounted = 1
            exc.counts = counts(cut, plan.models, budget, plan.max_cost, limiters)
            raise
    if graceful.signum is not None:  # drained: what each model sent, found cached and left
        done = counts(result[0], plan.models, budget, plan.max_cost, limiters)
        raise graceful.interrupted(stop.abandoned, done)
    return result


async def _send(
    plan: Plan,
    cache: Cache,
    console: Console | None,
    budget: Budget,
    grace: float,
    dist: distributed.Distributed,
    limiters: dict,
    stop: RunStop,
    batch_options,
    fallback_sync: bool,
    rounds: Rounds | None = None,
) -> tuple[dict[str, Stats], list[Estimate] | None]:
    """Run the plan; returns the stats and, when the cost bound stopped it, the estimate of what
    remains. ``limiters`` (provider key -> ProviderLimiter) is filled in (which providers stopped,
    ``runner.sending.stops``). A model whose requests are all cached is not started (one its server
    names is asked its name first): a server that is down, or a key not set, does not stop a run
    that needs neither. Each model is sent under its claim on the cache, synchronously or through
    its batch API (``runner.dispatch``; ``batch_options``: ``runner.batch.driver.BatchOptions``).
    Once ``stop`` is requested nothing more is sent and it returns once the requests in flight are
    stored (open batches run on at the provider: the next run collects them). ``rounds`` (an
    adaptive run) sends the models in rounds down the order, one ``send`` each (runner.adaptive)."""
    cached = {
        m.label: n for m in plan.models if (n := all_cached(m, plan, cache, dist.shard)) is not None
    }
    # a batch whose rows are all in: closed
    _dispatch.settle_cached([m for m in plan.models if m.label in cached], cache)
    waiting = [m for m in plan.models if m.label not in cached]
    unnamed = [m for m in waiting if not m.adapter.model]  # its server, or the cache, names it
    started, stopped = await start_adapters(waiting, cache)
    cached |= {m.label: n for m in unnamed if (n := all_cached(m, plan, cache, dist.shard))}
    idle, models = set(cached), plan.models
    roller = asyncio.get_running_loop().create_task(dist.rolling(cache))
    try:
        plan.check_labels()
        # what this run selects, for `dxi score` without one (runner.planning.selection)
        remember(plan)
        limiters.update(dist.limiters(models))
        for m, problem in stopped:  # its provider stops alone (runner.sending.stops)
            if m.label not in idle:
                limiters.setdefault(m.limits_key, ProviderLimiter(m.adapter.limits)).halt(problem)
        shard = dist.shard
        if len(idle) == len(models) and rounds is None:  # nothing to send (the counts are known)
            stats = {
                m.label: Stats(
                    total=cached[m.label],
                    cache_hits=cached[m.label],
                    cost_usd=None if m.price is None else 0.0,
                )
                for m in models
            }
            if console is not None:
                console.print(
                    counted(plan, models, idle, budget, shard)[0], highlight=False, markup=False
                )
                console.print(
                    f"Every request is in the cache ({sum(cached.values()):,}): nothing to send.",
                    highlight=False,
                    markup=False,
                )
            return stats, None
        free = frozenset(m.label for m in models if m.price == (0.0, 0.0))
        progress = (
            None
            if console is None
            else _progress.RunProgress(console, {}, budget=budget, free=free)
        )
        if progress is not None:
            stop.on_change = lambda: progress.stopping(describe(stop.signum), stop.in_flight, grace)
        # The tasks are counted (start line, progress totals) and their gold rows kept (scoring) in
        # one pass interleaved with the run, not before the first request nor after the last reply.
        first = asyncio.Event()

        def on_progress(label: str, stats: Stats) -> None:
            first.set()
            if progress is not None:
                progress.update(label, stats if rounds is None else rounds.bars.total(label, stats))

        say = _progress.Said(console)  # held until the start line is out (``_survey``)

        told: set[str] = set()  # the models said to have no batch API: once per run, not round

        def sending(group=models, suite=plan.suite):
            if rounds is not None and suite is plan.suite:  # each round: its part, through here
                deadline = None if batch_options is None else batch_options.deadline
                return rounds.run(
                    models,
                    cache,
                    sending,
                    stop=stop,
                    budget=budget,
                    limiters=limiters,
                    deadline=deadline,
                    say=say,
                    progress=progress,
                )
            return _dispatch.send(
                group,
                suite,
                cache,
                on_progress=on_progress,
                budget=budget,
                limiters=limiters,
                shard=shard,
                batch=plan.batch,
                batch_overrides=plan.batch_overrides,
                limits_of=plan.batch_limits,
                options=batch_options,
                fallback_sync=fallback_sync,
                say=say,
                stop=stop,
                told=told,
            )

        survey = asyncio.create_task(
            _survey(plan, progress, models, idle, budget, console, first, shard, say.release)
        )

        def drop_survey() -> None:
            survey.cancel()
            say.release()
            if survey.done() and not survey.cancelled():
                survey.exception()  # retrieved: the run's own error (or its stop) is what counts

        try:
            if progress is None:
                stats = await sending()
            else:
                with progress:
                    stats = await sending()
                    if not stop.requested:  # (stopped: nothing more to count or score)
                        await survey  # the totals, before the bars close
            if stop.requested:
                drop_survey()
                return stats, None
            await survey  # a malformed row raises here if the run did not meet it first
        except BaseException:
            drop_survey()
            raise
        remaining = None
        if budget.stopped:
            remaining = _estimate.estimate(_estimate.batch_priced(plan), plan.suite, cache, shard)
        return stats, remaining
    finally:
        roller.cancel()
        await dist.close()
        for m in started:
            await m.adapter.close()
