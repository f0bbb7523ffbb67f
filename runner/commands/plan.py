"""``dxi plan``: what an adaptive run (``dxi run --until``) would take, before it is paid for: the
questions, epochs, requests, tokens and dollars (synchronous and batch) to know each model's
whole-set index to ±P points (``--precision P``), or to tell two models apart at a true difference
of D points with 80% power (``--separate A B --difference D``), and the saving against the whole
index (``scoring.planner``: a simulation of the run itself with answers like the model's, from the
cache, or the stated prior for a model never run). Tokens per request come from the cache's usage
and ``dxi estimate``'s figures (``runner.estimate``); prices from the run file or ``--price``.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from ..errors import UsageError
from ..planning import numbers
from . import options

if TYPE_CHECKING:
    from rich.console import Console

POWER = 0.8  # a separation plan's runs: the questions by which 80% of them told the two apart
DEFAULT_TOLERANCE = 1.0  # --separate's --tolerance: --until separated's own default


def add_parser(sub) -> None:
    s = options.command(sub, "plan", None, None, options.tool_exit_codes({}))
    options.add_models(s.add_argument_group("models"), True, False, sending=False)
    options.add_data(s.add_argument_group("data"))
    options.add_price(s.add_argument_group("prices"))  # of the limits, plan uses only the prices
    options.add_cache(s.add_argument_group("cache"))
    g = s.add_argument_group("what to plan for (one of)")
    g.add_argument(
        "--precision",
        type=precision,
        metavar="P[:all]",
        help="know each model's whole-set Decision Index to ±P points (95%%); P:all: the index "
        "and every metric (--until precision=P:all)",
    )
    g.add_argument(
        "--separate",
        nargs=2,
        metavar=("A", "B"),
        help="tell model A from model B, each named as --price names a model: its label "
        "(ADAPTER:MODEL, or the run file's name) or the model string --model gave "
        "(embedded for embedded:sparrow-nano-general-v1.1)",
    )
    g.add_argument(
        "--difference",
        type=numbers.POINTS,
        metavar="D",
        help="with --separate: the true difference of their indices to plan for (points)",
    )
    g.add_argument(
        "--tolerance",
        type=numbers.TOLERANCE,
        default=None,  # 1 with --separate; refused with --precision
        metavar="Δ",
        help="with --separate: a difference within ±Δ points settles them too "
        "(--until separated=Δ; default 1)",
    )
    o = s.add_argument_group("simulation and output")
    o.add_argument(
        "--runs",
        type=numbers.RUNS,
        default=10,
        metavar="N",
        help="simulated runs per plan (default 10; more: steadier, slower)",
    )
    o.add_argument(
        "--simulation-seed",
        type=numbers.SEED,
        default=0,
        metavar="N",
        help="the simulation's seed (default 0)",
    )
    o.add_argument("--json", action="store_true", help="print the plan as JSON")


def precision(text: str):
    """``--precision``'s ``P`` or ``P:all`` -> the ``--until precision=P[:all]`` rule (``Until``)
    the plan simulates; P as ``numbers.POINTS`` takes it (above 0, at most 100)."""
    from dxi.scoring.sequential import Until

    every = text.strip().endswith(":all")
    try:
        points = numbers.POINTS(text.strip().removesuffix(":all") if every else text)
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(
            f"{exc}{f' (in {text!r})' if every else ''}; P or P:all (the index and every metric)"
        ) from None
    return Until("precision", points, every)


def _until(args: argparse.Namespace):
    """The rule the plan simulates, and the quantile of its runs; UsageError on bad input."""
    from dxi.scoring.sequential import Until

    if (args.precision is None) == (args.separate is None):
        raise UsageError("give one of --precision P or --separate A B --difference D")
    if args.runs < 1:
        raise UsageError(f"--runs {args.runs}: at least 1 simulated run")
    if args.precision is not None:
        for flag in ("difference", "tolerance"):
            if getattr(args, flag) is not None:
                raise UsageError(f"--{flag} goes with --separate, not with --precision")
        if not 0 < args.precision.points <= 100:
            raise UsageError(
                f"--precision {args.precision.points:g}: P must be above 0 and at most 100 "
                "(index points)"
            )
        return args.precision, None
    if args.difference is None or not 0 < args.difference <= 100:
        raise UsageError(
            "--separate A B needs --difference D, the true difference to plan for, "
            "above 0 and at most 100 index points"
        )
    # Δ from 0 to 100 (numbers.TOLERANCE), any D: at D ≤ Δ the pair settles by its order or by
    # lying within ±Δ, whichever is known first (planner.plan and Profile.shifted take any D)
    tolerance = DEFAULT_TOLERANCE if args.tolerance is None else args.tolerance
    return Until("separated", tolerance), POWER


def main(args: argparse.Namespace, console: Console) -> int:
    import dataclasses

    import orjson
    import polars as pl

    from dxi import scoring
    from dxi.cache import Cache
    from dxi.scoring import planner
    from dxi.scoring.cost import batch_price

    from .. import open_batches
    from ..adaptive.order import DEFAULT_SEED, order_of
    from ..planning.estimate import estimate
    from ..planning.plan import model_named

    until, quantile = _until(args)
    # built as `dxi run --until RULE` builds it (its --seed: the order's seed)
    plan = options.plan_of(argparse.Namespace(**vars(args), until=str(until)), "dxi plan")
    options.name_by_servers(plan)  # as `dxi estimate` and `dxi run` name them
    plan.check_labels()
    if args.separate:  # each named as --price names a model: label, ADAPTER:MODEL, --model's text
        texts = dict(enumerate(args.model)) if args.run_file is None else {}
        a, b = (model_named(plan.models, x, "--separate", texts).label for x in args.separate)
        if a == b:
            raise UsageError(
                f"--separate {' '.join(args.separate)}: both name {a}; give two different models"
            )
    index = sorted({e for e, _ in scoring.WEIGHTS})
    left_out = plan.suite.left_out()  # by --evals, else the run file's [evals] select
    gold, categories = plan.suite.gold_frames()
    populations = {
        e: n
        for e, n in gold.group_by("eval").agg(pl.col("task_id").n_unique()).sort("eval").iter_rows()
    }
    missing = plan.suite.no_data()  # as `dxi run` refuses it (Plan.check_data); or no task left
    no_data = [e for e in index if e in missing or (e not in populations and e not in left_out)]
    if left_out:
        raise UsageError(
            f"{options.selection(args)} leaves out {', '.join(left_out)}: a plan is of the whole "
            "index, which needs all four"
            + (
                f"; no data for {', '.join(no_data)} either (see `dxi data check`)"
                if no_data
                else ""
            )
        )
    if no_data:
        raise UsageError(
            f"dxi plan needs every evaluation of the index; no data for "
            f"{', '.join(no_data)} (see `dxi data check`)"
        )
    positives = {
        q: float(v)
        for q, v in gold.filter(pl.col("kind") == "yes_no")
        .group_by("question_id")
        .agg((pl.col("gold") == "yes").mean())
        .iter_rows()
    }
    frame = plan.models_frame()
    with Cache(plan.cache_dir) as cache:
        answers = scoring.answers(cache.scan(), frame, gold, categories, plan.epochs)
        used = scoring.usage(cache.scan(), frame, gold, plan.epochs)
        # each model's requests estimated once: those the cache does not hold, and apart those it
        # holds, as if new (``cached_evals``)
        # (the requests an earlier batch run's open batches hold, as `dxi estimate` counts them:
        # not new where the provider accepted the batch, ``open_batches.held``)
        held = open_batches.held(cache.root, plan.models)
        dry = {
            e.model: e for e in estimate(plan.models, plan.suite, cache, cached_too=True, held=held)
        }
        # a model's evaluation whose requests are all cached, and none of their replies counted its
        # tokens (0 or none reported: scoring.cost.COUNTED): estimated as `dxi estimate` would if
        # new
        unmeasured = {
            (m.label, e)
            for m in plan.models
            for e in populations
            if e not in dry[m.label].evals
            and not used.filter((pl.col("label") == m.label) & (pl.col("eval") == e))[
                "counted"
            ].sum()
        }
    # the run's order (as `dxi run --until` would record it, not written here): the cached
    # requests among the first k tasks of each evaluation's, which the run asks and does not pay
    seed = DEFAULT_SEED if plan.seed is None else plan.seed
    order = order_of(plan.suite, seed, plan.cache_dir, write=False)
    profiles, usage, bases = {}, {}, {}
    for m in plan.models:
        try:
            profiles[m.label] = planner.profile_of(answers, m.label)
        except ValueError:
            profiles[m.label] = dataclasses.replace(planner.PRIOR, label=m.label)
        tokens = {}
        for e in populations:
            mine = used.filter((pl.col("label") == m.label) & (pl.col("eval") == e))
            d = dry[m.label]
            new = (d.cached_evals if (m.label, e) in unmeasured else d.evals).get(e, {})
            n = int(mine["counted"].sum()) + int(new.get("new", 0))
            tin = float(mine["input_tokens"].sum()) + float(new.get("input_tokens", 0))
            tout = float(mine["output_tokens"].sum()) + float(new.get("output_tokens", 0))
            tokens[e] = (tin / n, tout / n) if n else (0.0, 0.0)
        d = dry[m.label]
        usage[m.label] = planner.Usage(
            tokens,
            m.price,
            batch_price(m.price),
            cached=cumulative(order.evals, d.not_new),
            new_tokens={
                e: (tin / d.evals[e]["new"], tout / d.evals[e]["new"])
                for e, (tin, tout) in d.new_tokens.items()
            },
        )
        bases[m.label] = tokens_basis(
            used.filter(pl.col("label") == m.label),
            dry[m.label],
            {  # (none where an open batch holds its every request: neither cached nor new)
                e: dry[m.label].cached_eval_basis.get(e, {})
                for label, e in unmeasured
                if label == m.label
            },
        )
    if args.separate:
        chosen = [profiles[a], profiles[a].shifted(args.difference, b)]
    else:
        chosen = list(profiles.values())
    doc = planner.plan(
        chosen,
        populations,
        until,
        usage,
        epochs=plan.epochs,
        runs=args.runs,
        seed=args.simulation_seed,
        quantile=quantile,
        positives=positives,
    )
    for entry in doc["models"]:
        entry["tokens_basis"] = bases.get(entry["model"], {})
        if entry["model"] in dry and dry[entry["model"]].in_open_batches:
            entry["in_open_batches"] = dry[entry["model"]].in_open_batches
    doc["power"] = quantile
    if args.separate:
        doc["difference"] = args.difference
    doc = rounded(doc)
    if args.json:
        sys.stdout.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n")
        return 0
    _print(doc, console)
    return 0


def cumulative(order, not_new) -> dict[str, list[int]]:
    """Per evaluation, the requests not new (``Estimate.not_new``: cached, or held by an open batch)
    among the first k tasks of its ``order`` (task ids), k = 0..N: ``planner.Usage.cached``."""
    out = {}
    for e, ids in order.items():
        held, total, cum = not_new.get(e, {}), 0, [0]
        for t in ids:
            total += held.get(t, 0)
            cum.append(total)
        out[e] = cum
    return out


# a reply in the cache that counted no tokens (none reported, or 0: the embedded model and
# `sparrow-decider serve` report 0, scoring.cost.COUNTED): left out of the mean per request; an
# evaluation with nothing else has its cached requests estimated as new instead (`unmeasured`)
NO_USAGE = "cached replies without token usage (left out of the mean)"
# the requests the cache holds: the tokens their replies recorded, as they are (the requests it does
# not hold are estimated as `dxi estimate` does: "estimated from this model's cached usage", ...)
CACHED_USAGE = "recorded by its cached replies"


def tokens_basis(used, dry, fresh: dict[str, dict[str, int]] | None = None) -> dict[str, int]:
    """Where a model's tokens per request come from: basis -> requests. ``used``: its rows of
    ``scoring.usage`` (``counted``: the cached replies that counted their tokens, counted as
    ``CACHED_USAGE``; ``replies``: all); ``dry``: its ``runner.planning.estimate.Estimate``
    (``basis``: how the requests the cache does not hold were estimated, as `dxi estimate` says
    it: "estimated from this model's cached usage" scales the usage of its cached replies to each
    new request; "bytes / 4 (no usage in the cache yet)" is the size of the prompts, not a bill);
    ``fresh``: evaluation -> basis of the evaluations whose cached requests were estimated as new
    (none of their replies counted tokens), whose replies are not ``NO_USAGE`` then."""
    import polars as pl

    counted, replies = int(used["counted"].sum()), int(used["replies"].sum())
    basis = {CACHED_USAGE: counted, NO_USAGE: replies - counted} | dict(dry.basis)
    for e, estimated in (fresh or {}).items():
        basis[NO_USAGE] -= int(used.filter(pl.col("eval") == e)["replies"].sum())
        for b, n in estimated.items():
            basis[b] = basis.get(b, 0) + n
    return {k: n for k, n in basis.items() if n}


def rounded(doc: dict) -> dict:
    """``scoring.planner.plan``'s ``doc`` with each model's figures rounded for print and JSON, each
    key of one type: ``questions`` and ``requests`` to 0.1 (floats: means over the simulated
    runs), tokens to whole tokens (ints), dollars to 6 decimals (floats, None without a price),
    ``saving``, ``exhausted_share`` and ``holds`` (shares, 0-1) to 4 decimals; as ``dxi estimate
    --json`` rounds its tokens and dollars."""

    def spent(d: dict) -> dict:
        return d | {
            "requests": round(float(d["requests"]), 1),
            "cached_requests": round(float(d["cached_requests"]), 1),
            "new_requests": round(float(d["new_requests"]), 1),
            "input_tokens": round(d["input_tokens"]),
            "output_tokens": round(d["output_tokens"]),
            "new_input_tokens": round(d["new_input_tokens"]),
            "new_output_tokens": round(d["new_output_tokens"]),
            "cost_usd": None if d["cost_usd"] is None else round(float(d["cost_usd"]), 6),
            "batch_cost_usd": (
                None if d["batch_cost_usd"] is None else round(float(d["batch_cost_usd"]), 6)
            ),
        }

    models = [
        m
        | {
            "questions": {e: round(float(q), 1) for e, q in m["questions"].items()},
            "adaptive": spent(m["adaptive"]),
            "expected": spent(m["expected"]),
            "whole": spent(m["whole"]),
            "saving": round(float(m["saving"]), 4),
            "exhausted_share": round(float(m["exhausted_share"]), 4),
        }
        for m in doc["models"]
    ]
    holds = doc.get("holds")
    return doc | {"models": models, "holds": None if holds is None else round(float(holds), 4)}


def _usd(v: float | None) -> str:
    return "—" if v is None else f"${v:,.2f}"


def _points(v: float) -> str:
    """Index points: "1 point", "2.5 points"."""
    return f"{v:g} point" if v == 1 else f"{v:g} points"


def _count(n: float, noun: str) -> str:
    """``n`` (to a whole number) and ``noun``, plural unless it reads 1: "1 simulated run"."""
    text = f"{n:,.0f}"
    return f"{text} {noun}" if text == "1" else f"{text} {noun}s"


def _print(doc: dict, console: Console) -> None:
    """The plan as a table: per model the questions, requests, tokens and dollars of the adaptive
    run beside the whole index's, and the saving."""
    from rich.markup import escape
    from rich.table import Table

    what = (
        f"±{_points(float(doc['until'].split('=')[1].removesuffix(':all')))}"
        + (", the index and every metric" if doc["until"].endswith(":all") else "")
        if doc["until"].startswith("precision")
        else f"separating at a true difference of {_points(doc['difference'])} "
        f"({doc['power']:.0%} power)"
    )
    t = Table(title=f"Plan: {what}, {_count(doc['runs'], 'simulated run')} (nothing was sent)")
    for col in (
        "model",
        "questions",
        "epochs",
        "requests",
        "cached",
        "new",
        "input tokens",
        "output tokens",
        "cost",
        "batch cost",
        "whole index",
        "whole cost",
        "saving",
    ):
        t.add_column(col, justify="left" if col == "model" else "right")
    for m in doc["models"]:
        a, w = m["adaptive"], m["whole"]
        t.add_row(
            escape(m["model"]),
            f"{sum(m['questions'].values()):,.0f}",
            str(m["epochs"]),
            f"{a['requests']:,.0f}",
            f"{a['cached_requests']:,.0f}",
            f"{a['new_requests']:,.0f}",
            f"{a['input_tokens']:,.0f}",
            f"{a['output_tokens']:,.0f}",
            _usd(a["cost_usd"]),
            _usd(a["batch_cost_usd"]),
            f"{w['requests']:,.0f}",
            _usd(w["cost_usd"]),
            f"{m['saving']:.0%}",
        )
    console.print(t)
    for m in doc["models"]:
        per = ", ".join(f"{e} {q:,.0f}" for e, q in m["questions"].items())
        console.print(
            escape(f"  {m['model']}: questions per evaluation: {per}; answers like: {m['profile']}")
        )
        basis = "; ".join(
            f"{b} ({_count(n, 'request')})" for b, n in m.get("tokens_basis", {}).items()
        )
        if basis:
            console.print(escape(f"  {m['model']}: tokens: {basis}"))
        if m.get("in_open_batches"):
            console.print(
                escape(
                    f"  {m['model']}: in open batches {m['in_open_batches']:,} (of its requests, "
                    "held by an earlier `dxi run --batch`'s batches: collected by the next run, "
                    "paid when their batch ends; counted cached, not new, not in the cost)"
                )
            )
        if m.get("exhausted_share"):  # runs that asked everything without settling the model
            console.print(escape(f"  {m['model']}: {exhausted(m['exhausted_share'])}"))
    if doc.get("holds") is not None:
        from dxi.scoring import planner

        k = planner.order_statistic(doc["power"], doc["runs"])
        which = (
            "the one simulated run"
            if doc["runs"] == 1
            else f"run {k} of the {doc['runs']} simulated runs sorted by the questions they asked"
        )
        line = (
            f"A separation plan takes {which}: a fresh run needs no more with probability "
            f"{k}/{doc['runs'] + 1} = {doc['holds']:.2f}"
        )
        if doc["holds"] < doc["power"]:
            need = planner.runs_for(doc["power"])
            line += f", less than the {doc['power']:.0%} power asked: " + (
                f"--runs {need} or more for it" if need else "no number of runs gives 100%"
            )
        console.print(escape(line + "."))
        for m in doc["models"]:  # what to budget for on average, beside the power's run
            e = m["expected"]
            console.print(
                escape(
                    f"  {m['model']}: expected {_count(e['requests'], 'request')} "
                    f"({_usd(e['cost_usd'])}, batch {_usd(e['batch_cost_usd'])}), the mean of "
                    f"the {_count(doc['runs'], 'simulated run')}; planned above: "
                    f"{m['adaptive']['requests']:,.0f}"
                )
            )
    console.print(escape(footer(doc)))


def exhausted(share: float) -> str:
    """What a model's ``exhausted_share`` (0-1, above 0) of simulated runs that asked the whole set
    without settling it says: that the data cannot settle it only when every run did."""
    if share >= 1:
        return (
            "100% of the simulated runs asked the whole set without settling it: the data cannot "
            "settle it at this setting"
        )
    percent = f"{share:.0%}"
    return (
        f"{'over 99%' if percent == '100%' else percent} of the simulated runs asked the whole set "
        "without settling it (the model can need every question)"
    )


def footer(doc: dict) -> str:
    """The note under a plan: what its questions are (a precision plan's: the means over the runs;
    a separation plan's: the run at its power, beside the expected means), requests, tokens, and
    the cost without a price when some model has none."""
    if doc["power"] is None:
        questions = (
            "Questions are those of the one simulated run"
            if doc["runs"] == 1
            else f"Questions are the means over the {doc['runs']:,} simulated runs"
        )
    else:
        questions = (
            f"Questions are those of the run at {doc['power']:.0%} power (above); the expected "
            "line is the mean"
        )
    parts = [
        questions,
        "requests = questions × epochs",
        "cached: those the cache (or an open batch the provider accepted) holds among the tasks "
        "the run asks first (its order, seeded: --seed), not sent again; new: the rest, whose "
        "tokens and dollars are the cost, as `dxi estimate` prices them (the whole cost is "
        "`dxi estimate`'s)",
        "tokens are the model's mean per request (what its cached replies recorded, and for the "
        "requests the cache does not hold `dxi estimate`'s estimates; each model's sources above: "
        '"bytes / 4" is the size of its prompts, not usage a run records; a reply of 0 tokens, '
        "from a server that counts none (the embedded model), is not counted)",
    ]
    if any(
        m[k]["cost_usd"] is None or m[k]["batch_cost_usd"] is None
        for m in doc["models"]
        for k in ("adaptive", "whole")
    ):
        parts.append("a cost is — without a price (--price MODEL=IN/OUT)")
    return "; ".join(parts) + "."
