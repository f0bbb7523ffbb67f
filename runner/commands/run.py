"""``dxi run``: send what is not cached, then score. Its options, and ``main``: the plan from them,
then ``runner.session.run``, the run's line in OUT/run-history.jsonl (``runner.outputs.history``)
and the messages that follow it (failed requests, the cost bound, stopped providers, batches, a stop
by Ctrl-C or SIGTERM, a cache that could not be written)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from dxi.shown import shown

from .. import signals
from ..distributed import setup as distributed
from ..errors import EXIT_CACHE_WRITE, EXIT_COST_BOUND, EXIT_PROVIDER_STOPPED, UsageError
from ..outputs import amounts
from ..planning import numbers, paths
from . import options

if TYPE_CHECKING:
    from collections.abc import Iterable

    from rich.console import Console

    from ..counts import Counts
    from ..sending.scheduler import Stats
    from ..session import RunResult

DESCRIPTION = """\
Send every request that is not cached yet, then score. Each reply is in the cache before the next
request is taken: an interrupted run continues where it stopped when the same command is run again.

examples:
  dxi run --model embedded                              the whole index on the embedded decision model
  dxi run --model embedded --sample 20 --seed 1         20 tasks of each evaluation, stratified
  dxi run examples/run.toml --max-cost 5                every model of a run file, under a cost bound
  dxi run examples/run.toml --until separated           stop each model once its place is settled
  dxi run --model anthropic:claude-sonnet-5-5 --effort low --sample 20
                                                        a current hosted model at low effort (needs its key)
"""


def add_parser(sub) -> None:
    s = options.command(sub, "run", None, DESCRIPTION, options.EXIT_CODES)
    options.add_models(s.add_argument_group("models"), True, False)
    options.add_data(s.add_argument_group("data"))
    limits = s.add_argument_group(
        "limits, retries and cost",
        "A limit given here applies to every provider, over the run file's provider tables.",
    )
    options.add_limits(limits)
    limits.add_argument(
        "--grace",
        type=numbers.GRACE,
        default=signals.GRACE_S,
        metavar="SECONDS",
        help="on the first Ctrl-C or SIGTERM nothing new is sent and the requests in flight "
        "finish and are stored, for at most SECONDS (inside the 30 s Kubernetes and "
        "Slurm allow before SIGKILL); a second Ctrl-C stops at once",
    )
    c = s.add_argument_group("cache")
    options.add_cache(c)
    c.add_argument(
        "--fsync",
        action="store_true",
        help="fsync each reply (survives power loss, not just a killed process; slower)",
    )
    a = s.add_argument_group("adaptive run (docs/adaptive.md)")
    a.add_argument(
        "--until",
        type=_until,
        metavar="RULE",
        help="ask the questions in rounds down a seeded random order (--seed) and stop "
        "each model once settled: precision=P (its whole-set index known to +-P "
        "points, 95%% anytime-valid; precision=P:all: every metric too) or "
        "separated[=D] (its place among the others settled, ties within D points, "
        "default 1)",
    )
    options.add_batch_flags(s.add_argument_group("batch mode (docs/batch.md)"), run=True)
    options.add_output(s.add_argument_group("output"), scores=True)
    distributed.add_flags(
        s.add_argument_group("past one machine (shards, a remote cache, shared limits)"), "run"
    )


def _until(text: str) -> str:
    """``--until``'s type: the text, checked by ``scoring.sequential.Until.parse`` (an error exits 2
    with its message). The scoring is imported only when the flag is given."""
    from dxi.scoring.sequential import Until

    try:
        Until.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def main(args: argparse.Namespace, console: Console) -> int:
    from rich.markup import escape

    from dxi.cache import CacheWriteError

    from .. import session
    from ..outputs import history, staging
    from ..planning.selection import selection_of

    started = history.now()  # for the run's line in OUT/run-history.jsonl (runner.outputs.history)
    plan = options.plan_of(args)
    if (
        plan.batch
    ):  # before Polars and PyArrow are imported; batch mode only (runner.batch.memory says why)
        from ..batch.memory import tune

        tune()
    plan.check_models()  # a model none of its adapter's (a typo): bad input, as the file's others
    plan.check_cost_bound()
    given = args.until is not None  # else the run file's key, named as the file's
    if plan.until is not None and plan.until.rule == "separated" and len(plan.models) < 2:
        raise UsageError(
            ("--until separated" if given else f'until = "{plan.until}" ({args.run_file})')
            + " needs two or more models (it stops a model once its order against every other "
            f"is known); this run has {len(plan.models)}: give another "
            + ("--model, or use --until precision=P" if given else "model, or precision=P")
        )
    gaps = plan.suite.not_run(options.selection(args)) if plan.until is not None else {}
    if gaps:  # every rule reads the index, which needs every evaluation: it could never stop
        raise UsageError(
            (f"--until {plan.until}" if given else f'until = "{plan.until}" ({args.run_file})')
            + " stops on the Decision Index, which needs all four evaluations; "
            + "; ".join(f"{n}: {why}" for n, why in gaps.items())
            + (" (run them all, or drop --until)" if given else " (run them all, or remove until)")
        )
    plan.check_data()  # a selected evaluation without data: refused, nothing sent
    batch_options = options.batch_options(args)
    if batch_options.deadline is not None and not plan.batch:
        raise UsageError(
            "--deadline is for batch mode: give --batch too (or batch = true in the run file)"
        )
    paths.cache_folder(
        plan.cache_dir, options.named(args, "cache_dir", "--cache-dir")
    )  # before the first request
    paths.outside_cache(plan.out, plan.cache_dir, options.named(args, "out", "--out"))
    paths.output_folder(plan.out, options.named(args, "out", "--out"))
    options.repair(plan.out)  # a commit a kill cut short: settled before the run
    staging.writing(plan.out)  # a stop from here on says what OUT holds (left as it was, ...)
    report = staging.report_held(plan.out)  # an earlier report, which this scoring takes away
    if plan.until is not None and getattr(args, "shard", None):
        raise UsageError(
            "--until and --shard do not combine: each round is decided on every answer of a "
            "model, which one shard does not hold; run an adaptive run in one process"
        )
    dist = distributed.setup(
        args, plan, sending=True
    )  # a remote cache's mirror goes into the cache folder

    def record(code: int, result: RunResult | Counts | None = None) -> int:
        """Append the run's line to OUT/run-history.jsonl (``runner.outputs.history``); ``code``."""
        line = history.line_of(selection_of(plan, dist.shard), started, code, result)
        history.append(plan.out, line)
        return code

    try:
        result = session.run(
            plan,
            console=None if args.quiet else console,
            grace=args.grace,
            fsync=args.fsync,
            retry_invalid=args.retry_invalid,
            retry_failed=args.retry_failed,
            dist=dist,
            batch_options=batch_options,
            fallback_sync=args.deadline_fallback == "sync",
            on_summary=lambda summary: _print_summary(summary, console, plan.out, dist.shard),
        )
    except (KeyboardInterrupt, signals.Interrupted) as stop:
        head, rest = signals.resume_message(stop, plan.cache_dir, args.grace)
        # drained (or cut while scoring, every request sent), what each model sent, found cached
        # and left (None: cut short, or before the run)
        done = getattr(stop, "counts", None)
        if plan.batch:
            rest += f" Open batches{_held(done)} keep running at the provider: the next run collects them (dxi batches list)."
        rest += signals.written(stop, plan.out)  # its summary.json, partial, or why not
        code = record(signals.exit_code(stop), done)
        if done is not None:  # the providers it stopped, as a run that ends says them
            _tell_stopped(done.stopped, console)
        options.make_console(stderr=True).print(f"[yellow]{escape(head)}[/] {escape(rest)}")
        _removed(report, plan.out, console)
        return code
    except CacheWriteError as exc:
        done = getattr(exc, "counts", None)  # what it sent and spent by then (runner.session)
        code = record(EXIT_CACHE_WRITE, done)
        options.make_console(stderr=True).print(
            f"[red]Stopped: {escape(str(exc))}.[/] {escape(_spent(done))}Every reply stored before "
            f"it is in {escape(str(plan.cache_dir))}; make room (or fix the directory) and rerun the "
            f"same command: only what is missing is sent.{escape(signals.written(exc, plan.out))}"
        )
        return code
    code = record(result.exit_code, result)  # before the messages: a closed stdout costs no line
    _tell(result, plan.max_cost, console)
    if result.exit_code in (EXIT_COST_BOUND, EXIT_PROVIDER_STOPPED):  # stopped early: the outputs
        console.print(escape(_outputs(result, plan.out)), highlight=False)
    _removed(report, plan.out, console)
    return code


def _removed(report: list[str], out, console: Console) -> None:
    """The note of the report (``report``: what ``out`` held of it before the run) the run's scoring
    took away, as ``dxi score`` says it (``runner.outputs.staging.removed_note``)."""
    from rich.markup import escape

    from ..outputs import staging

    if (note := staging.removed_note(out, report)) is not None:
        console.print(f"[yellow]note:[/] {escape(note)}")


def _print_summary(summary, console: Console, out, shard=None) -> None:
    """``runner.outputs.terminal.print_summary``, imported when the summary is ready: the outputs
    module loads Polars and the scoring, which must not delay the first request
    (``tests/test_startup.py``; the run's survey imports them on a thread while the requests are on
    the wire). One ``shard`` of several says what is true of its part instead of the provisional
    notes (``scoring.provisional.shard_notes``)."""
    from ..outputs.terminal import print_summary

    part = str(shard) if shard is not None and shard.count > 1 else None
    print_summary(summary, console, out, shard=part)


def _outputs(result: RunResult, out) -> str:
    """The line that ends the messages of a run stopped early (the cost bound, a provider or a model
    stopped): what ``out`` holds (``runner.outputs.staging.holds``, as ``dxi score``'s and
    ``report``'s stops say it), and of a provisional summary the answers it lacks: ``out holds this
    scoring's outputs, whole (answers.parquet, summary.json): provisional, 12 answer(s) missing,
    left out of every figure (their bounds are in summary.json); the next run sends the missing
    ones.``"""
    from ..outputs import staging

    held = staging.holds(out) or f"{out} is left as it was."
    summary = result.summary
    if summary.complete:
        return held
    evals = [e for m in summary.models for e in m.evals.values()]
    missing, failed = (sum(e.get(k, 0) for e in evals) for k in ("missing", "failed"))
    lacks = " and ".join(
        [f"{missing:,} answer(s) missing"] * bool(missing) + [f"{failed:,} failed"] * bool(failed)
    )
    return (
        held.removesuffix(".")
        + f": provisional, {lacks or 'answers lacking'}, left out of every figure (their bounds "
        "are in summary.json); the next run sends the missing ones."
    )


def _left(stats: Iterable[Stats], remaining: int, cost: str, adaptive: bool) -> str:
    """The cost bound's line on what it left: this run's requests not sent, those sent that
    failed transiently and those sent in a batch that gave them back unanswered (each counted by
    the run, ``Stats``), then what the next run sends (``remaining``, counted in the cache after
    the run: the same requests, unless another process wrote to it meanwhile; ``cost``: their
    expected cost). What a stopped provider, model or batch API left (refused, not sent after its
    stop: ``stop_not_sent``, or unanswered by a model whose batch API refused) is its own line's,
    named here only in what the next run sends. An adaptive run's rest is what its rounds may still
    ask: the whole set's, at most."""
    stats = list(stats)
    unanswered = [(getattr(s, "unanswered", 0), bool(getattr(s, "stopped", None))) for s in stats]
    counts = (
        (sum(s.not_sent - s.stop_not_sent for s in stats), "request(s) not sent"),
        (sum(s.failed - s.failed_fatal for s in stats), "sent that failed (transient)"),
        (sum(n for n, stop in unanswered if not stop), "sent in a batch that gave them back"),
    )
    stopped = sum(s.refused + s.stop_not_sent for s in stats) + sum(
        n for n, stop in unanswered if stop
    )
    parts = [f"{n:,} {what}" for i, (n, what) in enumerate(counts) if n or i == 0]
    told = ", ".join(parts[:-1]) + (" and " if len(parts) > 1 else "") + parts[-1]
    if adaptive:
        return (
            f"{told}; at most {remaining:,} request(s) of the whole set left to send ({cost} for all "
            "of them; --until asks only what a model needs to settle)"
        )
    if sum(n for n, _ in counts) + stopped != remaining:
        return f"{told}; the next run sends {remaining:,} ({cost} expected)"
    if stopped:
        return (
            f"{told}: the next run sends these and the {stopped:,} left by the stop(s) below, "
            f"{remaining:,} in all ({cost} expected)"
        )
    if len(parts) == 1:
        return f"{told} ({cost} expected)"
    return f"{told}: the next run sends these {remaining:,} ({cost} expected)"


def _held(done: Counts | None) -> str:
    """What this run's batches still open hold (each model's ``batches.open``): `` of this run (16
    request(s), at most $3200.0000 reserved)``, or what they reserved for their input when that
    bounds nothing (``input_usd``); "" when none (or not counted)."""
    held = [
        b["batches"]["open"]
        for b in (done.requests.values() if done else ())
        if "open" in b.get("batches", {})
    ]
    if not held:
        return ""
    usd = [h["reserved_usd"] for h in held if h["reserved_usd"] is not None]
    most = f", at most ${sum(usd):.4f} reserved" if usd else ""
    if inputs := [h for h in held if "input_usd" in h]:  # no bound of their cost: say so
        usd += [h["input_usd"] for h in inputs]
        most = f", ${sum(usd):.4f} reserved for their input; {inputs[0]['cost_reason']}"
    return f" of this run ({sum(h['requests'] for h in held):,} request(s){most})"


def _spent(done: Counts | None) -> str:
    """What a run the cache stopped sent and spent (``done``: its counts; "" without them), with
    the replies paid for that could not be stored: ``"This run sent 91 request(s) and spent
    $0.0910; 16 of them ($0.0160) were paid for but could not be stored: the next run sends them
    again. "``."""
    if done is None:
        return ""
    blocks = done.requests.values()
    costs = [b["cost_usd"] for b in blocks if b["cost_usd"] is not None]
    most = "at most " if any(b.get("cost_at_reservation_usd") for b in blocks) else ""
    spent = f" and spent {most}${sum(costs):.4f}" if costs else ""
    text = f"This run sent {sum(b['sent'] for b in blocks):,} request(s){spent}"
    lost = [b["unstored"] for b in blocks if b.get("unstored")]
    if lost:
        usd = [u["cost_usd"] for u in lost if u["cost_usd"] is not None]
        cost = f" (${sum(usd):.4f})" if usd else ""
        text += (
            f"; {sum(u['requests'] for u in lost):,} of them{cost} were paid for but could not be "
            "stored: the next run sends them again"
        )
    if held := _held(done):
        text += (
            f"; its open batches{held.removeprefix(' of this run')} keep running at the provider"
        )
    return text + ". "


def _tell_stopped(blocks: list[dict], console: Console) -> None:
    """One line per provider (or model) stopped (summary.json's ``stopped_providers`` blocks): what
    stopped it, its counts and what to do (``runner.sending.stops.describe``); a run that ends
    and one a signal stopped say them alike."""
    from rich.markup import escape

    from ..sending.stops import describe

    for block in blocks:
        scope = "Model" if block.get("scope") == "model" else "Provider"
        console.print(f"[red]{scope} stopped:[/] {escape(describe(block))}")


def _tell(result: RunResult, max_cost: float | None, console: Console) -> None:
    """What the summary does not say: the failed requests and their first errors, the cost bound
    reached, the providers stopped, the batches refused, unanswered or still open."""
    from rich.markup import escape

    from dxi.scoring.adaptive import is_adaptive

    from ..batch.options import BatchStats

    for label, s in result.failed.items():
        transient = s.failed - s.failed_fatal
        parts = ([f"{transient} transient (sent again by the next run)"] if transient else []) + (
            [f"{s.failed_fatal} deterministic, 4xx-class (kept; --retry-failed sends them again)"]
            if s.failed_fatal
            else []
        )
        console.print(
            f"[red]{escape(label)}: {s.failed} request(s) failed[/], left out "
            f"(provisional): {'; '.join(parts)}. "
            "First errors:"
        )
        for e in s.errors[:5]:
            console.print(f"    {shown(e)}", highlight=False, markup=False)
    bound = result.cost_bound
    bounded = bound is not None and bound["stopped"]
    if bounded:
        left = (
            "unknown"
            if bound["remaining_cost_usd"] is None
            else f"about ${bound['remaining_cost_usd']:.4f}"
        )
        remaining = bound["remaining_requests"]  # what the next run sends: the cache's count
        # a reply of unknown cost is charged its reservation: what was spent is at most that
        most = "at most " if any(s.cost_at_reservation_usd for s in result.stats.values()) else ""
        spent = f"spent {most}${result.spent_usd:.6f} of {amounts.usd(max_cost)} in this run"
        if (by_all := bound.get("spent_by_all_usd")) is not None:  # the bound is the whole run's
            spent = (
                f"spent {most}${result.spent_usd:.6f} in this process, ${by_all:.6f} of {amounts.usd(max_cost)} "
                "by every process sharing the bound (--coordinator)"
            )
        console.print(
            f"[yellow]Stopped at the cost bound:[/] {spent}; "
            + _left(result.stats.values(), remaining, left, is_adaptive(result.summary))
            + ". Everything that arrived is in the cache: rerun with a higher --max-cost (or "
            "max_cost in the run file) to continue."
        )
    _tell_stopped(result.stopped, console)
    for label, s in result.stats.items():
        if not isinstance(s, BatchStats):
            continue
        if s.stopped:
            unsent = s.stop_not_sent if bounded else s.not_sent
            counts = f"{s.refused:,} request(s) refused, {unsent:,} not sent" if s.refused else ""
            counts = counts or f"{unsent:,} request(s) not sent"
            if s.unanswered:  # sent in a batch that answered none of them (counted sent)
                counts += f", {s.unanswered:,} sent without an answer"
            console.print(
                f"[red]Batch API refused:[/] {escape(label)}: "
                f"{escape(s.stopped.removeprefix(f'{label}: '))}; "
                f"{counts} (rerun without --batch to send them one call at a time)"
            )
        elif bounded:
            continue  # the cost bound's line counted them (and says what to do)
        elif s.not_sent or s.unanswered:
            how = (
                f" ({s.not_sent:,} not sent, {s.unanswered:,} sent in a batch that gave them back)"
                if s.unanswered
                else ""
            )
            console.print(
                f"[yellow]{escape(label)}: {s.not_sent + s.unanswered:,} request(s) not answered by "
                f"batch[/]{how} (the deadline, or the cost bound); the next run sends them, or use "
                "--deadline-fallback sync"
            )
        if s.running:
            console.print(
                escape(
                    f"{label}: {len(s.running)} batch(es) still open (dxi batches list); the next run "
                    "collects them"
                ),
                highlight=False,
            )
