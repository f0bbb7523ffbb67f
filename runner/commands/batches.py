"""``dxi batches list|collect|cancel``: what the cache's batch ledger holds (``cache.ledger``), collecting the
results of open batches without starting new work (``runner.dispatch.collect``), cancelling a model's open
batches (``runner.batch.cancel_entries``); docs/batch.md. Its options, and ``main``."""
from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import UsageError
from . import options

if TYPE_CHECKING:
    from rich.console import Console

    from dxi.cache.ledger import Entry


def add_parser(sub) -> None:
    """``dxi batches list|collect|cancel``; collect takes the model and data options as ``dxi run`` has them."""
    b = sub.add_parser("batches", help="the batches the cache's ledger holds: list, collect their results, cancel them",
                       description="The batches the cache's ledger holds (docs/batch.md).")
    bsub = b.add_subparsers(dest="batches_command", required=True, metavar="list|collect|cancel")
    ls = bsub.add_parser("list", help="every batch of the ledger and where it stands")
    ls.add_argument("--cache-dir", type=Path, default=Path(".dxi-cache"), metavar="DIR", help="the cache (default .dxi-cache)")
    ls.add_argument("--all", action="store_true", help="also the batches collected or abandoned (default: open ones)")
    ls.add_argument("--json", action="store_true", help="print the entries as JSON")
    co = bsub.add_parser("collect", help="poll the open batches of the models named and store the results of those "
                                         "that ended (submits nothing)")
    options.add_models(co.add_argument_group("models"), True, False)
    options.add_data(co.add_argument_group("data"))
    co.add_argument("--cache-dir", type=Path, metavar="DIR", help="the cache (default .dxi-cache, or the run file's)")
    co.add_argument("--wait", action="store_true", help="wait until every open batch has ended and is collected")
    co.add_argument("--poll", type=float, default=options.POLL_S, metavar="SECONDS", help="with --wait: the first wait between "
                                                                                  "two status reads")
    co.set_defaults(out=None)  # collects into the cache; writes no outputs
    ca = bsub.add_parser("cancel", help="cancel open batches (their results so far are collected by the next run)")
    ca.add_argument("--cache-dir", type=Path, default=Path(".dxi-cache"), metavar="DIR", help="the cache (default .dxi-cache)")
    which = ca.add_mutually_exclusive_group(required=True)
    which.add_argument("--model", metavar="NAME", help="every open batch of this model (its name in reports)")
    which.add_argument("--entry", metavar="ID", help="one entry of the ledger (dxi-...) or batch id")
    which.add_argument("--all", action="store_true", help="every open batch")


def _ago(t: float | None) -> str:
    if not t:
        return "-"
    s = int(time.time() - t)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def rows(entries: list[Entry]) -> list[dict]:
    """The ledger's entries as ``dxi batches list`` shows them."""
    out = []
    for e in entries:
        running = None if e.ended or e.batch_id is None else time.time() - (e.submitted_at or e.created)
        out.append(e.as_dict() | {"running_s": None if running is None else round(running, 1)})
    return out


def main(args: argparse.Namespace, console: Console) -> int:
    """``dxi batches list|collect|cancel``."""
    import orjson
    from rich.markup import escape
    from rich.table import Table

    from dxi.cache.ledger import Ledger

    if args.batches_command == "collect":
        return _collect(args, console)
    if not (args.cache_dir / "batches").is_dir() and args.batches_command == "cancel":
        raise UsageError(f"{args.cache_dir} holds no batches (no {args.cache_dir / 'batches'} folder)")
    ledger = Ledger(args.cache_dir)
    entries = sorted(ledger.entries().values(), key=lambda e: e.created)
    if args.batches_command == "list":
        shown = entries if args.all else [e for e in entries if not e.closed]
        if args.json:
            import sys
            sys.stdout.write(orjson.dumps(rows(shown), option=orjson.OPT_INDENT_2).decode() + "\n")
            return 0
        table = Table(title=f"Batches in {escape(str(args.cache_dir))}" + ("" if args.all else " (open)"))
        for col in ("entry", "model", "batch", "phase", "requests", "created", "running", "stored", "given back"):
            table.add_column(col, overflow="fold")
        for e in shown:
            table.add_row(e.id, escape(e.label), escape(e.batch_id or "-"), e.phase, f"{e.requests:,}",
                          time.strftime("%Y-%m-%d %H:%M", time.localtime(e.created)),
                          _ago(e.submitted_at or e.created) if not e.ended and e.batch_id else "-", f"{e.stored:,}",
                          f"{len(e.returned):,}")
        console.print(table)
        if not shown:
            console.print("no open batches" if not args.all else "no batches")
        return 0
    return _cancel(args, console, ledger, entries)


def _cancel(args: argparse.Namespace, console: Console, ledger, entries: list[Entry]) -> int:
    import uvloop
    from rich.markup import escape

    from dxi import adapters
    from dxi.adapters.batches import batch_api

    from ..batch import cancel_entries

    chosen = [e for e in entries if not e.closed and (args.all or (args.model and e.label == args.model)
                                                       or (args.entry and args.entry in (e.id, e.batch_id)))]
    if not chosen:
        raise UsageError("no open batch matches" + (f" the model {args.model!r}" if args.model else
                                                    f" {args.entry!r}" if args.entry else "") + " (dxi batches list)")

    async def go() -> int:
        made: dict[tuple, object] = {}

        async def api_of(entry: Entry):
            doc = _intent(ledger, entry.id)
            key = (entry.kind, entry.base_url, doc.get("model"), doc.get("api_key_env"))
            if key not in made:
                spec = adapters.ModelSpec(entry.kind, doc.get("model") or "model", entry.base_url or None, {},
                                          {"api_key_env": doc["api_key_env"]} if doc.get("api_key_env") else {})
                adapter = adapters.get(spec)
                try:
                    await adapter.start()
                except adapters.Fatal as exc:
                    console.print(f"[red]{escape(entry.label)}:[/] {escape(str(exc))}")
                    made[key] = None
                else:
                    made[key] = batch_api(adapter)
            return made[key]

        apis = {e.id: await api_of(e) for e in chosen}
        try:
            return await cancel_entries(ledger, chosen, lambda e: apis.get(e.id),
                                        lambda text: console.print(escape(text), highlight=False))
        finally:
            for api in {id(a): a for a in apis.values() if a is not None}.values():
                await api.adapter.close()

    done = uvloop.run(go())
    console.print(f"{done} batch(es) cancelled; the results they produced are collected by the next `dxi run` "
                  "or `dxi batches collect`.")
    return 0 if done == len([e for e in chosen if e.batch_id and not e.ended]) else 1


def _intent(ledger, entry_id: str) -> dict:
    """The intent event of an entry (its model's name and key variable), read from the ledger."""
    import orjson

    with open(ledger.path, "rb") as f:
        for line in f:
            if entry_id.encode() in line and b'"intent"' in line:
                try:
                    doc = orjson.loads(line)
                except orjson.JSONDecodeError:
                    continue
                if doc.get("entry") == entry_id and doc.get("event") == "intent":
                    return doc
    return {}


def _collect(args: argparse.Namespace, console: Console) -> int:
    """``dxi batches collect``: the open batches of the plan's models, polled (until they end, with --wait)
    and their results stored; nothing new is submitted."""
    import uvloop
    from rich.markup import escape

    from dxi.cache import Cache
    from dxi.cache.ledger import Ledger

    from ..batch import BatchOptions
    from ..dispatch import collect
    from ..session import start_adapters

    plan = options.plan_of(args)
    if args.poll <= 0:
        raise UsageError("--poll must be positive (seconds)")
    if not (plan.cache_dir / "batches").is_dir():
        console.print(f"{plan.cache_dir} holds no batches: nothing to collect")
        return 0
    opts = BatchOptions(poll_s=args.poll, max_poll_s=max(args.poll, 300.0), collect_only=True, wait=args.wait)
    with Cache(plan.cache_dir) as cache:
        ledger = Ledger(plan.cache_dir)

        async def go():
            models, unreachable = await start_adapters(plan.models)
            for m, stop in unreachable:  # its batches stay open: collected once it can be reached
                console.print(f"[yellow]{escape(m.label)}: not collected[/] ({escape(str(stop))})")
            try:
                return await collect(models, plan.suite, cache, ledger, opts, plan.batch_overrides,
                                     lambda text: console.print(f"{time.strftime('%H:%M:%S')} {escape(text)}", highlight=False))
            finally:
                for m in models:
                    await m.adapter.close()

        stats = uvloop.run(go())
    for label, s in stats.items():
        console.print(escape(f"{label}: {s.ok + s.invalid + s.failed:,} result(s) stored, {s.given_back:,} given back "
                             f"(sent again by the next run), {len(s.running)} batch(es) still open"), highlight=False)
    return 0
