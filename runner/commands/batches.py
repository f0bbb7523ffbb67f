"""``dxi batches list|collect|cancel|resume``: what the cache's batch ledger holds, collecting the
results of open batches without starting new work, cancelling a model's open batches, lifting the
stop a batch whose results matched none of its requests put on a model's batch mode
(``runner.open_batches``, docs/batch.md). Its options, and ``main``, which prints what the library
returns."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import (
    EXIT_CACHE_WRITE,
    EXIT_FAILED_REQUESTS,
    EXIT_INTERRUPTED,
    EXIT_SOFTWARE,
    EXIT_USAGE,
)
from ..planning import numbers, paths
from . import options

if TYPE_CHECKING:
    from rich.console import Console

    from dxi.cache.ledger import Entry


_SAY = {
    0: "done",
    EXIT_FAILED_REQUESTS: "cancel: a provider refused a cancel (the others were asked; run it "
    "again)",
    EXIT_USAGE: "bad input (flags, no cache folder, a cache without batches, no open batch or "
    "stopped\n       model matching --model or --entry), with a message",
    EXIT_CACHE_WRITE: "collect: the cache could not be written (disk full, permissions): make "
    "room and rerun",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C or kill -INT; 143: by SIGTERM): what was stored is "
    "kept; the batches\n       stay open at the provider, collected by the next "
    "run",
}


def _exit_codes(*codes: int) -> str:
    return options.exit_codes(*sorted({*codes, EXIT_SOFTWARE}), say=_SAY, drain=False)


EXIT_CODES = _exit_codes(0, EXIT_FAILED_REQUESTS, EXIT_USAGE, EXIT_CACHE_WRITE, EXIT_INTERRUPTED)


def _cache_dir(p: argparse.ArgumentParser) -> None:
    """The ``--cache-dir`` every ``dxi batches`` sub-command takes."""
    p.add_argument(
        "--cache-dir",
        type=Path,
        default=Path(".dxi-cache"),
        metavar="DIR",
        help="the cache (default .dxi-cache)",
    )


def add_parser(sub) -> None:
    """``dxi batches list|collect|cancel|resume``; collect takes the model and data options as
    ``dxi run`` has them."""
    b = sub.add_parser(
        "batches",
        help=options.HELP["batches"],
        description="The batches the cache's ledger holds (docs/batch.md).",
        epilog=EXIT_CODES,
        formatter_class=options.Formatter,
    )
    formatter = options.Formatter
    bsub = b.add_subparsers(
        dest="batches_command", required=True, metavar="list|collect|cancel|resume"
    )
    ls = bsub.add_parser(
        "list",
        help="every batch of the ledger and where it stands",
        epilog=_exit_codes(0, EXIT_USAGE),
        formatter_class=formatter,
    )
    _cache_dir(ls)
    ls.add_argument(
        "--all",
        action="store_true",
        help="also the batches collected or abandoned (default: open ones)",
    )
    ls.add_argument("--json", action="store_true", help="print the entries as JSON")
    co = bsub.add_parser(
        "collect",
        help="poll the open batches of the models named and store the results of those "
        "that ended (submits nothing)",
        epilog=_exit_codes(0, EXIT_USAGE, EXIT_CACHE_WRITE, EXIT_INTERRUPTED),
        formatter_class=formatter,
    )
    options.add_models(co.add_argument_group("models"), True, False)
    options.add_data(co.add_argument_group("data"))
    co.add_argument(
        "--cache-dir",
        type=Path,
        metavar="DIR",
        help="the cache (default .dxi-cache, or the run file's)",
    )
    co.add_argument(
        "--wait", action="store_true", help="wait until every open batch has ended and is collected"
    )
    co.add_argument(
        "--poll",
        type=numbers.POLL,
        default=options.POLL_S,
        metavar="SECONDS",
        help="with --wait: the first wait between two status reads",
    )
    options.add_price(co.add_argument_group("prices"))
    co.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        help="where its line goes in run-history.jsonl, beside the runs' (default: out, or the run "
        "file's)",
    )
    ca = bsub.add_parser(
        "cancel",
        help="cancel open batches (their results so far are collected by the next run)",
        epilog=_exit_codes(0, EXIT_FAILED_REQUESTS, EXIT_USAGE, EXIT_INTERRUPTED),
        formatter_class=formatter,
    )
    _cache_dir(ca)
    which = ca.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--model",
        metavar="NAME",
        help="every open batch of this model (its name in reports, or the "
        "model string given to dxi run)",
    )
    which.add_argument(
        "--entry", metavar="ID", help="one entry of the ledger (dxi-...) or batch id"
    )
    which.add_argument("--all", action="store_true", help="every open batch")
    rs = bsub.add_parser(
        "resume",
        help="let batch mode submit a model's requests again after a "
        "batch whose results carried none of its requests' ids "
        "stopped it",
        epilog=_exit_codes(0, EXIT_USAGE),
        formatter_class=formatter,
    )
    _cache_dir(rs)
    which = rs.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--model",
        metavar="NAME",
        help="this model (its name in reports, or the model string given to dxi run)",
    )
    which.add_argument(
        "--entry", metavar="ID", help="the entry (dxi-...) or batch id that stopped it"
    )
    which.add_argument("--all", action="store_true", help="every model stopped")


def _ago(t: float | None) -> str:
    if not t:
        return "-"
    s = int(time.time() - t)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def main(args: argparse.Namespace, console: Console) -> int:
    """``dxi batches list|collect|cancel|resume``: prints what ``runner.open_batches`` returns."""
    from rich.markup import escape

    from .. import open_batches

    def say(text: str) -> None:
        console.print(f"{time.strftime('%H:%M:%S')} {escape(text)}", highlight=False)

    if args.batches_command == "collect":
        return _collect(args, console, say)
    if args.batches_command == "cancel":
        paths.cache_to_read(args.cache_dir, required=True)
        done = open_batches.cancel(
            args.cache_dir,
            model=args.model,
            entry=args.entry,
            every=args.all,
            say=lambda text: console.print(escape(text), highlight=False),
        )
        if not done.submitted:
            console.print("no running batch to cancel (dxi batches list)")
            return 0
        console.print(
            f"cancel asked for {done.cancelled} of {done.submitted} running batch(es); they end at the provider's "
            "pace, and the results they produced are collected by the next `dxi run` or `dxi batches collect`."
        )
        return 0 if done.complete else 1
    if args.batches_command == "resume":
        paths.cache_to_read(args.cache_dir, required=True)
        done = open_batches.resume(
            args.cache_dir, model=args.model, entry=args.entry, every=args.all
        )
        for e in done:
            console.print(
                escape(
                    f"{e.label}: batch mode resumed (stopped by batch {e.batch_id}, "
                    f"entry {e.id}); the next `dxi run --batch` submits its requests "
                    "in a batch again"
                ),
                highlight=False,
            )
        if not done:
            console.print("no model's batch mode is stopped")
        return 0
    paths.cache_to_read(args.cache_dir, required=True)
    return _list(args, console, open_batches.listed(args.cache_dir, every=args.all))


def _collect(args: argparse.Namespace, console: Console, say) -> int:
    """``dxi batches collect``: the open batches of the models polled, the results of those that
    ended stored, and, when it collected something, its line in OUT/run-history.jsonl
    (``runner.outputs.history``, ``command`` ``COLLECT``): what it stored and what that cost, so
    that the lines' ``requests.*.cost_usd`` sum to what was spent. A stop (Ctrl-C, SIGTERM) or a
    cache that cannot be written records what was counted by then."""
    from rich.markup import escape

    from dxi.cache import CacheWriteError

    from .. import open_batches, signals
    from ..counts import Counts, requests_block
    from ..outputs import history
    from ..planning.selection import selection_of

    started = history.now()
    plan = options.plan_of(args, "dxi batches collect")
    where = options.named(args, "cache_dir", "--cache-dir")
    paths.cache_to_read(plan.cache_dir, where, required=True)
    if not open_batches.has_batches(plan.cache_dir):
        console.print(f"{plan.cache_dir} holds no batches: nothing to collect")
        return 0
    paths.cache_folder(plan.cache_dir, where)  # results go there
    paths.outside_cache(plan.out, plan.cache_dir, options.named(args, "out", "--out"))
    paths.output_folder(plan.out, options.named(args, "out", "--out"))  # and its line
    recorded = history.prices(plan.out, plan.cache_dir)  # lines about this cache
    for label, (price, when) in recorded.items():  # as the run priced it
        for m in plan.models:
            if m.label == label and not m.priced and m.price != price:
                m.price = price
                say(f"{label}: priced as its dxi run of {when} recorded it ({plan.out})")
    _ledger_prices(plan, [m for m in plan.models if not m.priced and m.label not in recorded], say)
    stats: dict = {}

    def record(code: int) -> None:
        """Its line, when it collected or stored something (a poll that found nothing ended
        writes none)."""
        if not any(s.collected or s.attempts for s in stats.values()):
            return
        line = history.line_of(
            selection_of(plan), started, code, Counts(requests_block(stats)), history.COLLECT
        )
        line["collected"] = sorted(set().union(*(s.collected_entries for s in stats.values())))
        history.append(plan.out, line)

    try:
        open_batches.collect(plan, wait=args.wait, poll_s=args.poll, say=say, stats=stats)
    except KeyboardInterrupt:
        record(signals.exit_code())
        raise
    except CacheWriteError as exc:
        record(EXIT_CACHE_WRITE)
        options.make_console(stderr=True).print(
            f"[red]Stopped: {escape(str(exc))}.[/] Every result stored before it is in "
            f"{escape(str(plan.cache_dir))}; make room (or fix the directory) and collect again."
        )
        return EXIT_CACHE_WRITE
    record(0)
    for label, s in stats.items():
        console.print(
            escape(
                f"{label}: {s.ok + s.invalid + s.failed:,} result(s) stored, {s.given_back:,} given "
                f"back (sent again by the next run), {len(s.running)} batch(es) still open"
            ),
            highlight=False,
        )
        if s.cost_usd is None and s.ok + s.invalid + s.failed:  # their cost unknown: say so
            options.make_console(stderr=True).print(
                "[yellow]warning:[/] "
                + escape(
                    f"{label}: no price for this model (none given, none recorded by its run or "
                    "its batches): what it collected has cost_usd null in run-history.jsonl; give "
                    "it with --price MODEL=IN/OUT (USD per million input / output tokens)"
                ),
                highlight=False,
            )
    return 0


def _ledger_prices(plan, models: list, say) -> None:
    """Price each of ``models`` (given no price, and none recorded in run-history.jsonl: a run
    killed before it wrote its line) as the newest ledger entry of its batches recorded it (its
    intent's ``price``, ``cache.ledger.Entry``; an older ledger has none)."""
    from .. import open_batches
    from ..outputs import history

    if not models:
        return
    entries = sorted(open_batches.listed(plan.cache_dir, every=True), key=lambda e: e.created)
    for m in models:
        found = [e for e in entries if e.label == m.label and history.is_price(e.price)]
        if found and tuple(found[-1].price) != m.price:
            m.price = tuple(found[-1].price)
            say(f"{m.label}: priced as its batch {found[-1].id} recorded it (the batch ledger)")


def _list(args: argparse.Namespace, console: Console, shown: list[Entry]) -> int:
    import orjson
    from rich.markup import escape
    from rich.table import Table

    from ..open_batches import rows

    if args.json:
        import sys

        sys.stdout.write(orjson.dumps(rows(shown), option=orjson.OPT_INDENT_2).decode() + "\n")
        return 0
    if not shown:  # one line, not an empty table
        console.print(
            escape(f"no {'' if args.all else 'open '}batches in {args.cache_dir}"), highlight=False
        )
        return 0
    table = Table(
        title=f"Batches in {escape(str(args.cache_dir))}" + ("" if args.all else " (open)")
    )
    for col in (
        "entry",
        "model",
        "batch",
        "phase",
        "requests",
        "created",
        "running",
        "stored",
        "given back",
        "price (in/out)",
    ):
        table.add_column(col, overflow="fold")
    for e in shown:
        table.add_row(
            e.id,
            escape(e.label),
            escape(e.batch_id or "-"),
            e.phase,
            f"{e.requests:,}",
            time.strftime("%Y-%m-%d %H:%M", time.localtime(e.created)),
            _ago(e.submitted_at or e.created) if not e.ended and e.batch_id else "-",
            f"{e.stored:,}",
            f"{len(e.returned):,}",
            f"{e.price[0]:g}/{e.price[1]:g}" if e.price else "-",  # USD per million tokens
        )
    console.print(table)
    return 0
