"""``dxi estimate``: a dry run (``runner.planning.estimate``): what is not cached, why, and its
expected tokens and cost; nothing is sent. Its options, and ``main``: the estimate printed as a
table, or as JSON."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from ..distributed import setup as distributed
from ..errors import EXIT_CACHE_WRITE, EXIT_SOFTWARE, EXIT_USAGE
from ..planning import paths
from . import options

if TYPE_CHECKING:
    from rich.console import Console

    from ..planning.plan import Plan


def add_parser(sub) -> None:
    s = options.command(
        sub,
        "estimate",
        None,
        None,
        options.exit_codes(0, EXIT_USAGE, EXIT_CACHE_WRITE, EXIT_SOFTWARE),
    )
    options.add_models(s.add_argument_group("models"), True, False)
    options.add_data(s.add_argument_group("data"))
    options.add_limits(
        s.add_argument_group(
            "limits, retries and cost",
            "A limit given here applies to every provider, over the run file's provider tables.",
        )
    )
    options.add_cache(s.add_argument_group("cache"))
    options.add_batch_flags(s.add_argument_group("batch mode (docs/batch.md)"), run=False)
    o = s.add_argument_group("output")
    options.add_output(o)
    o.add_argument("--json", action="store_true", help="print the estimate as JSON")
    distributed.add_flags(
        s.add_argument_group("past one machine (shards, a remote cache, shared limits)"), "estimate"
    )


def main(args: argparse.Namespace, console: Console) -> int:
    import orjson
    import uvloop

    from dxi.adapters.errors import SERVED
    from dxi.cache import Cache

    from .. import open_batches
    from ..outputs.terminal import print_estimate
    from ..planning.estimate import batch_priced, estimate, totals, unreachable

    plan = options.plan_of(args)
    plan.check_models()  # a model none of its adapter's (a typo): `dxi run` refuses it, exit 2
    plan.check_data()  # what `dxi run` would refuse, refused here too
    where = options.named(args, "cache_dir", "--cache-dir")
    paths.cache_to_read(plan.cache_dir, where)
    if not plan.cache_dir.is_dir():  # opening the cache creates it
        paths.cache_folder(plan.cache_dir, where)
    dist = distributed.setup(args, plan, sending=False)
    with Cache(
        plan.cache_dir,
        retry_invalid=args.retry_invalid,
        retry_failed=args.retry_failed,
        remote=dist.remote,
    ) as cache:
        # one that cannot be reached is named from the cache when it holds one model of that
        # server (and warned about below when it has requests to send)
        options.name_by_servers(plan, cache)
        plan.check_labels()
        plan.check_cost_bound()  # what `dxi run` would refuse under --max-cost, refused here too
        # --batch, or batch = true in the run file: those models priced at the batch rate; the
        # requests open batches hold (an earlier batch run killed) counted apart, not priced
        held = open_batches.held(cache.root, plan.models)
        estimates = estimate(batch_priced(plan), plan.suite, cache, dist.shard, held=held)
    total = totals(estimates)
    doc = {
        "models": [e.as_dict() for e in estimates],
        "total": total,
        "max_cost_usd": plan.max_cost,
        "problems": {m.adapter.label: p for m in plan.models if (p := m.adapter.missing_setup())},
    }
    stops = uvloop.run(
        unreachable(
            [m for m, e in zip(plan.models, estimates, strict=True) if e.new or e.in_open_batches]
        )
    )
    doc["unreachable"] = {k: str(v) for k, v in stops.items() if v.cause != SERVED}
    doc["serves_another_model"] = {k: str(v) for k, v in stops.items() if v.cause == SERVED}
    if plan.batch:
        doc["batch"] = batch_note(plan)
    if args.json:
        sys.stdout.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n")
        return 0
    print_estimate(doc, console)
    return 0


def batch_note(plan: Plan) -> dict:
    """The ``batch`` block: which models go by batch (priced at the batch rate) and which stay
    synchronous (no batch API, or not in batch mode: ``batch = false`` in the run file)."""
    from dxi.adapters.batches import supports

    batched = [m.label for m in plan.models if m.label in plan.batch and supports(m.adapter.kind)]
    return {
        "models": batched,
        "synchronous": [m.label for m in plan.models if m.label not in batched],
        "note": "new requests priced at the batch rate (half the price unless the run file gives batch_input / "
        "batch_output); models without a batch API at their own price",
    }
