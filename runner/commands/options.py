"""The options several commands share, in one place: the models (``add_models``), the data
(``add_data``), the limits (``add_limits``), the cache (``add_cache``), the outputs
(``add_output``), batch mode (``add_batch_flags``, ``batch_options``), and ``plan_of`` (a run's plan
from them); the help's formatter, exit codes and each command's help line are declared in
``runner.commands`` (light: ``dxi --help`` reads them without importing a command) and read here by
the commands. Light at import: a command's parser loads none of Polars, aiohttp, the scoring or the
cache.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from dxi import adapters
from dxi.adapters import EFFORTS
from dxi.evals import EVALS
from dxi.evals.wildguardtest import SUBSETS

from .. import completion
from ..distributed import setup as distributed
from ..errors import (
    EXIT_COST_BOUND,
    EXIT_FAILED_REQUESTS,
    EXIT_PROVIDER_STOPPED,
    UsageError,
)
from ..planning import numbers
from ..planning.datadir import DATA_DIR_ENV, DEFAULT_DATA_DIRS_TEXT
from . import (  # noqa: F401 (the commands read them here)
    EXIT_CODES,
    HELP,
    SCORING_EXIT_CODES,
    STOPPED,
    Formatter,
    exit_codes,
    make_console,
    tool_exit_codes,
)

if TYPE_CHECKING:
    from dxi.cache import Cache

    from ..batch.options import BatchOptions
    from ..planning.plan import Plan

POLL_S = 30.0  # batch mode's first wait between two status reads of a batch (seconds)


class KeyValues(argparse.Action):
    """``--param KEY=VALUE [KEY=VALUE ...]``: the values up to the next flag. A value that is not
    KEY=VALUE but names a run file (``*.toml``, or an existing file) is the run file, not swallowed:
    ``dxi score --param max_tokens=2000 runs/tonight.toml`` reads the run file; anything else is an
    error."""

    def __call__(self, parser, namespace, values, option_string=None):
        items = list(getattr(namespace, self.dest) or [])
        for v in values:
            if "=" in v:
                items.append(v)
            elif hasattr(namespace, "run_file") and (v.endswith(".toml") or Path(v).is_file()):
                if getattr(namespace, "_run_file_after_flag", None) is not None:
                    parser.error(f"two run files: {namespace._run_file_after_flag} and {v}")
                namespace._run_file_after_flag = Path(v)
            else:
                parser.error(
                    f"{option_string} {v!r}: expected KEY=VALUE (a run file ends in .toml)"
                )
        setattr(namespace, self.dest, items)


def add_models(
    g: argparse._ArgumentGroup, run_file: bool, for_scoring: bool, sending: bool = True
) -> None:
    """The models: RUN_FILE (with ``run_file``), ``--model``, ``--effort``, ``--param``,
    ``--epochs``, and ``--option`` (adapter settings for sending: not for ``dxi plan``, ``sending``
    False); with ``for_scoring`` the help says they find what ``dxi run`` sent."""
    if run_file:
        g.add_argument(
            "run_file",
            nargs="?",
            type=Path,
            metavar="RUN_FILE",
            help="a run file (TOML, see examples/run.toml): models, providers, prices, evaluations, "
            "locations; the flags below override it",
        )
    g.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="MODEL",  # completed: runner.completion
        help="ADAPTER:MODEL[@BASE_URL], repeatable; e.g. embedded, embedded:sparrow-nano-general-v1.1, "
        "openai:gpt-6-luna, gemini-decisions:gemini-decision-1, systemone:http://127.0.0.1:8000"
        + (
            "; as `dxi run` was given it (default: every model in the cache, or the run file's)"
            if for_scoring
            else ""
        ),
    ).completer = completion.models
    g.add_argument(
        "--effort",
        choices=EFFORTS,
        metavar="LEVEL",
        help=f"reasoning effort of every language model ({'|'.join(EFFORTS)}), written to the provider's "
        "own field (OpenAI reasoning_effort, Anthropic output_config.effort, Gemini "
        "thinkingConfig.thinkingLevel); part of the cache key"
        + (", as `dxi run` was given it" if for_scoring else ""),
    )
    g.add_argument(
        "--param",
        action=KeyValues,
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="sampling parameters for every language model, in the provider's own names, e.g. "
        "max_completion_tokens=16000 (Anthropic: max_tokens; Gemini: maxOutputTokens); VALUE is JSON "
        "or text; part of the cache key",
    )
    if sending:
        _add_option(g)
    g.add_argument(
        "--epochs",
        type=numbers.EPOCHS,
        metavar="N",
        help="requests per task, each its own cache key (default: 1, or the "
        "run file's; given: every model's)",
    )


def _add_option(g: argparse._ArgumentGroup) -> None:
    g.add_argument(
        "--option",
        action=KeyValues,
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="adapter settings outside the cache key, for the models that know them: api_key_env=NAME "
        "(read the API key from the variable NAME), api_key_command=CMD (a command printing an expiring "
        "token, run again before it expires); llamacpp: ctx_size, parallel, threads",
    )


def add_data(g: argparse._ArgumentGroup) -> None:
    g.add_argument(
        "--data-dir",
        type=Path,
        metavar="DIR",
        help=f"folder holding the evaluation files (default: ${DATA_DIR_ENV}, else {DEFAULT_DATA_DIRS_TEXT})",
    )
    for name, spec in EVALS.items():
        g.add_argument(
            f"--{spec.flag}",
            type=Path,
            metavar="FILE",
            dest=f"file_{name}",
            help=f"the {spec.title} file (instead of the one found under --data-dir)",
        )
    g.add_argument(
        "--evals",
        metavar="LIST",
        help=f"comma-separated subset of {', '.join(EVALS)} (default: all four)",
    ).completer = completion.evals
    g.add_argument(
        "--limit", type=numbers.TASKS, metavar="N", help="the first N tasks of each evaluation"
    )
    g.add_argument(
        "--sample",
        type=numbers.TASKS,
        metavar="N",
        help="a seeded sample of N tasks of each evaluation, stratified by its gold classes (When2Call "
        "reply type, WildGuardTest labels, HLE category, Omniscience domain)",
    )
    g.add_argument(
        "--seed",
        type=numbers.SEED,
        metavar="S",
        help="the seed of --sample, and of --until's order (default: 0)",
    )
    g.add_argument(
        "--all-tasks",
        action="store_true",
        help="every task of each evaluation (the default of run and estimate; score, report, export and "
        "view otherwise score the tasks the runs recorded in the cache selected)",
    )
    g.add_argument(
        "--exclude",
        action="append",
        default=[],
        metavar="[EVAL=]FILE",
        help="an exclusion list, repeatable: one task id (or task_id:question_id) per line; EVAL= lets "
        "the list use bare ids",
    )
    g.add_argument(
        "--wildguard-subset",
        choices=SUBSETS,
        help="WildGuardTest rows: agreed = all three annotator-agreement fields are 3 (default); "
        "all = every labelled row",
    )


# The limits' defaults as --help states them: those of the HTTP providers (``adapters.Limits``), and
# the local adapters' own (``default_limits`` of ``adapters.embedded`` and ``adapters.llamacpp``,
# kept in step by tests/test_price_flag.py; not imported here: they load aiohttp). A given flag
# applies to every provider, over a run file's provider tables.
_HTTP = adapters.Limits()


def add_limits(g: argparse._ArgumentGroup) -> None:
    g.add_argument(
        "--max-in-flight",
        type=numbers.MAX_IN_FLIGHT,
        metavar="N",
        help=f"concurrent requests per provider (default: {_HTTP.max_in_flight}; embedded: 2 per CPU core; "
        "llamacpp: its parallel slots)",
    )
    g.add_argument(
        "--rpm", type=numbers.RPM, help="requests per minute per provider (default: no limit)"
    )
    g.add_argument(
        "--tpm",
        type=numbers.TPM,
        help="tokens per minute per provider, input + output (default: no limit)",
    )
    g.add_argument(
        "--timeout",
        type=numbers.TIMEOUT,
        metavar="SECONDS",
        help="idle timeout: seconds without a byte of the reply that end an attempt; "
        "a reply still arriving is never cut (default: "
        f"{_HTTP.attempt_timeout_s:g}; embedded 60, llamacpp 600)",
    )
    g.add_argument(
        "--max-reply-time",
        type=numbers.MAX_REPLY_TIME,
        metavar="SECONDS",
        help=f"the longest one reply may take in all (default: {_HTTP.max_reply_time_s:g})",
    )
    g.add_argument(
        "--stream",
        choices=("auto", "always", "never"),
        metavar="MODE",
        help="stream the language models' replies: auto (where a reply can be long: "
        "thinking on, a large output budget, what the provider's SDK streams), "
        "always, never (default: auto); not in the cache key",
    )
    g.add_argument(
        "--max-attempts",
        type=numbers.MAX_ATTEMPTS,
        metavar="N",
        help=f"attempts per request; 1 = no retry (default: {_HTTP.max_attempts}; embedded 1, llamacpp 2)",
    )
    g.add_argument(
        "--backoff",
        type=numbers.BACKOFF,
        metavar="SECONDS",
        help=f"the first wait before a retry, doubling each time, with jitter, at most "
        f"{_HTTP.max_wait_s:g} (default: {_HTTP.backoff_s:g})",
    )
    g.add_argument(
        "--max-stated-wait",
        type=numbers.MAX_STATED_WAIT,
        metavar="SECONDS",
        help="the longest the run waits on a provider (default: "
        f"{_HTTP.max_stated_wait_s:g}): a wait it asks for (Retry-After, a reset header, Gemini's "
        "RetryInfo) is honoured exactly up to it, a longer one stops that provider, saying when to rerun; "
        "a provider that cannot be reached is paused and probed one request at a time, and stopped once "
        f"down that long (exit code {EXIT_PROVIDER_STOPPED})",
    )
    g.add_argument(
        "--max-reply-bytes",
        type=numbers.MAX_REPLY_BYTES,
        metavar="BYTES",
        help=f"the largest reply read (decoded; default: {_HTTP.max_reply_bytes} = "
        f"{_HTTP.max_reply_bytes >> 20} MiB); a larger one is read no further and stored invalid "
        "('reply larger than N bytes') with its first 2000 bytes",
    )
    g.add_argument(
        "--retry-failed",
        action="store_true",
        help="also send again requests that failed with a 4xx-class error (kept otherwise)",
    )
    g.add_argument(
        "--retry-invalid",
        action="store_true",
        help="also send again requests whose answers were invalid",
    )
    g.add_argument(
        "--max-cost",
        type=numbers.MAX_COST,
        metavar="USD",
        help="stop sending before spent + in-flight cost would pass USD in this invocation (prices from "
        f"--price or the run file; local models are free); exit code {EXIT_COST_BOUND}",
    )
    add_price(g)


def add_price(g: argparse._ArgumentGroup) -> None:
    """``--price``: of the commands that send (in ``add_limits``), of ``dxi plan``, which prices
    a run and takes none of the sending limits, and of those that score (``score``, ``report``,
    ``export``, ``view``: ``runner.rescore``)."""
    g.add_argument(
        "--price",
        action="append",
        default=[],
        metavar="MODEL=IN/OUT[/CACHED]",
        help="a model's price in USD per million input / output [/ cached input] tokens, repeatable; MODEL "
        "as --model gives it, or its name in reports (ADAPTER:MODEL, or the run file's name), e.g. "
        "openai:gpt-6-luna=0.1/0.5/0.01 (over the run file's)",
    ).completer = completion.prices


def add_cache(g: argparse._ArgumentGroup) -> None:
    g.add_argument(
        "--cache-dir",
        type=Path,
        metavar="DIR",
        help="the response cache (default: .dxi-cache, or the run file's)",
    )


def allow_failed(text: str) -> dict:
    """``--allow-failed``'s value (``config.allow_failed``), or argparse's usage error."""
    from ..planning.config import allow_failed

    try:
        return allow_failed(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_output(g: argparse._ArgumentGroup, out: bool = True, scores: bool = False) -> None:
    if out:
        g.add_argument(
            "--out",
            type=Path,
            metavar="DIR",
            help="where summary.json and answers.parquet go (default: out, or the run file's)",
        )
        g.add_argument("-q", "--quiet", action="store_true", help="no progress output")
    else:  # dxi view: it has no progress; its notes on the selection are what is left to leave out
        g.add_argument(
            "-q",
            "--quiet",
            action="store_true",
            help="no notes on the selection (the address served and warnings are still printed)",
        )
    if scores:
        g.add_argument(
            "--allow-failed",
            type=allow_failed,
            metavar="N|FRACTION",
            help="accept up to N failed or missing answers per model and evaluation (or a fraction of "
            "its answers: 0.01, 1%%): the figures stay marked provisional, but the exit code is 0 "
            f"(otherwise {EXIT_FAILED_REQUESTS}); recorded in summary.json (default: none, or the "
            "run file's allow_failed)",
        )


def command(
    sub,
    name: str,
    help: str | None = None,
    description: str | None = None,
    epilog: str | None = None,
) -> argparse.ArgumentParser:
    """A command's parser under ``sub``: its one-line ``help`` (in ``dxi --help``; None: the line
    ``runner.commands.HELP`` declares for ``name``), its ``description`` (by default that line,
    capitalised, with a full stop) and ``epilog`` (the exit codes, usually)."""
    help = HELP[name] if help is None else help
    return sub.add_parser(
        name,
        help=help,
        description=description or help[:1].upper() + help[1:] + ".",
        epilog=epilog,
        formatter_class=Formatter,
    )


def add_batch_flags(g: argparse._ArgumentGroup, run: bool) -> None:
    """``--batch`` (run and estimate) and, for run, ``--deadline``, ``--deadline-fallback``,
    ``--poll``, ``--batch-size``."""
    g.add_argument(
        "--batch",
        action="store_true",
        help="send what is not cached through each provider's batch API (OpenAI, Anthropic, Gemini) at the "
        "batch price, half the synchronous one" + ("" if run else ": price what is new so"),
    )
    if not run:
        return
    g.add_argument(
        "--deadline",
        metavar="TIME",
        help="with --batch: at TIME (HH:MM, the next such time, or an ISO time) cancel the open batches, keeping "
        "every result produced",
    )
    g.add_argument(
        "--deadline-fallback",
        choices=("none", "sync"),
        default="none",
        help="what is left at the deadline: none (left to the next run), sync (sent one call at a time, so "
        "the index is complete)",
    )
    g.add_argument(
        "--poll",
        type=numbers.POLL,
        metavar="SECONDS",
        default=POLL_S,
        help="the shortest wait between two status reads of a batch: each wait is half the "
        "batch's age, from this up to 300 s",
    )
    g.add_argument(
        "--batch-size",
        type=numbers.BATCH_SIZE,
        metavar="N",
        help="at most N requests per batch (default: the provider's "
        "limit, 50,000 for OpenAI, 100,000 for Anthropic)",
    )


def batch_options(args: argparse.Namespace) -> BatchOptions:
    """The BatchOptions of ``dxi run``'s flags; UsageError for a bad value."""
    from ..batch.options import BatchOptions
    from ..planning.deadline import parse_deadline

    deadline = None
    if getattr(args, "deadline", None):
        try:
            deadline = parse_deadline(args.deadline)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    poll = getattr(args, "poll", None)
    poll = POLL_S if poll is None else poll
    if poll <= 0:
        raise UsageError("--poll must be positive (seconds)")
    if getattr(args, "batch_size", None) is not None and args.batch_size < 1:
        raise UsageError("--batch-size must be at least 1")
    return BatchOptions(deadline=deadline, poll_s=poll, max_poll_s=max(poll, 300.0))


def named(args: argparse.Namespace, dest: str, flag: str) -> str:
    """How the user gave the path ``dest`` (``out``, ``cache_dir``), for messages: ``flag``
    (``--out``) when given on the command line or by default, else ``the run file's out``."""
    if getattr(args, dest, None) is None and getattr(args, "run_file", None) is not None:
        return f"{dest} of {args.run_file}"
    return flag


def selection(args: argparse.Namespace) -> str:
    """What chose the evaluations of a command's run, for a message: "--evals", else "the [evals]
    select of RUN_FILE"."""
    return "--evals" if getattr(args, "evals", None) else f"the [evals] select of {args.run_file}"


def plan_of(args: argparse.Namespace, command: str = "dxi run") -> Plan:
    """The plan of ``dxi run``, ``estimate``, ``plan`` and ``batches collect``
    (``runner.planning.plan.from_args``); UsageError when neither a run file nor ``--model`` names
    the models, showing a run file given to ``command`` (``dxi plan run.toml`` for ``dxi plan``)."""
    from ..planning.plan import from_args

    if args.run_file is None and not args.model:
        raise UsageError(
            f"name the models: a run file ({command} run.toml) or --model ADAPTER:MODEL"
        )
    return from_args(args)


def name_by_servers(plan: Plan, cache: Cache | None = None) -> None:
    """Name each model given without a name (``systemone:URL``, a run file's System One provider
    without ``model``) as its server names it (GET /health; no request is sent), as ``dxi run`` does
    when it starts it; one that cannot be reached is named from ``cache`` when it holds one model
    of that server (``runner.rescore.name_from_cache``), else stays unnamed (``dxi estimate`` warns
    of it)."""
    unnamed = [m for m in plan.models if not m.adapter.model]
    if not unnamed:
        return
    import uvloop

    from ..session import start_adapters

    async def learn_names() -> None:
        started, _ = await start_adapters(unnamed, cache)
        for m in started:
            await m.adapter.close()

    uvloop.run(learn_names())


def add_scoring(s: argparse.ArgumentParser, name: str) -> None:
    """The options of ``dxi score`` and ``dxi report`` (``name``): the models as ``dxi run`` was
    given them, the data, the cache, the outputs with ``--allow-failed``, and a remote cache."""
    add_models(s.add_argument_group("models"), True, True)
    add_data(s.add_argument_group("data"))
    add_cache(s.add_argument_group("cache"))
    add_output(s.add_argument_group("output"), scores=True)
    add_price(s.add_argument_group("prices"))
    distributed.add_flags(
        s.add_argument_group("past one machine (shards, a remote cache, shared limits)"), name
    )


def warn_differs(selection) -> None:
    """Say on standard error, once scored, that ``selection`` (``runner.rescore.Selection``) scored
    other tasks than the last ``dxi run`` into its output folder asked (``selection.differs``), with
    the flags that score what it asked; nothing when they are the same."""
    if selection.differs is not None:
        from rich.markup import escape

        make_console(stderr=True).print(f"[yellow]warning:[/] {escape(selection.differs.line())}")


def repair(out) -> None:
    """Settle what a ``dxi`` killed while it put its outputs in place left in the output folder
    ``out`` (``runner.outputs.staging.recover``), first thing: say each repair on standard error."""
    from rich.markup import escape

    from ..outputs.staging import recover

    for line in recover(out):
        make_console(stderr=True).print(f"[yellow]note:[/] {escape(line)}")
