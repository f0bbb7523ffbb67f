"""The commands of ``dxi``, one module each: its options (``add_parser(sub)``) and
``main(args, console)``, which turns them into library calls (``runner.session.run``,
``runner.rescore.rescore``, ...) and prints what they return, ending in an exit code
(``runner.errors``). The options several commands share are in ``options``. A command module imports
the library, never another command module; ``runner.cli`` builds the parser from them in
``COMMANDS``' order and dispatches.

This package's ``__init__`` declares what ``dxi --help`` shows without importing any command module:
each command's module (``COMMANDS``) and help line (``HELP``), the help's ``Formatter``, the exit
codes' text (``EXIT_CODES``, ``exit_codes``), the consoles (``make_console``) and the words of a
flag given to the wrong command (``misplaced``). It imports only argparse, re and ``runner.errors``:
``runner.cli`` imports a command's module only when that command is parsed or run (``dxi --help``
imports none; the start-up benchmark, ``benchmarks/bench_process.py``, holds it to 0.15 s and
tests/test_startup.py checks what it imports).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Sequence

from ..errors import (
    EXIT_CACHE_WRITE,
    EXIT_COST_BOUND,
    EXIT_FAILED_REQUESTS,
    EXIT_INTERRUPTED,
    EXIT_PROVIDER_STOPPED,
    EXIT_SOFTWARE,
    EXIT_TERMINATED,
    EXIT_UPLOAD,
    EXIT_USAGE,
)

# command -> its module under runner/commands/, in the order `dxi --help` lists them
COMMANDS = {
    "run": "run",
    "estimate": "estimate",
    "plan": "plan",
    "score": "score",
    "report": "report",
    "view": "view",
    "export": "export",
    "data": "data",
    "fetch-model": "fetch_model",
    "cache": "cache",
    "batches": "batches",
    "completion": "completion",
}
# command -> its one line in `dxi --help` (the command's module gives it to its parser:
# ``options.command``)
HELP = {
    "run": "send what is not cached, then score",
    "estimate": "a dry run: what is not cached, why, and its expected tokens and cost (sends nothing)",
    "plan": "what an adaptive run (--until) would take: questions, requests, tokens and dollars to "
    "reach a precision or to separate two models (sends nothing)",
    "score": "score from the cache only, without the network (default: every model in the cache)",
    "report": "score from the cache only and write OUT/report.html with CSV/Parquet tables",
    "view": "browse every answer in a local web app (read-only, from the cache only)",
    "export": "score from the cache only and export the answers (csv, parquet, jsonl) or the Every Eval Ever "
    "records (eee)",
    "data": "fetch the evaluation data from the Hugging Face hub, or check a data folder",
    "fetch-model": "fetch a local model file (GGUF) for the llamacpp adapters",
    "cache": "maintain the cache (dxi cache compact [--cache-dir DIR | --cache-remote URI])",
    "batches": "the batches the cache's ledger holds: list, collect their results, cancel them",
    "completion": "print the shell completion script for bash, zsh or fish",
}

_EXIT_LINES = {
    0: "0    done",
    EXIT_FAILED_REQUESTS: f"{EXIT_FAILED_REQUESTS}    done, but the result is provisional: answers failed (no valid reply "
    "after the retries) or are\n       missing from the cache: the figures are "
    "over the answered questions, marked (*) with their\n       bounds; "
    "rerun to request them, or accept them with --allow-failed (dxi run --shard K/N: the\n       "
    "failed answers of its own part only; the other shards' missing ones are not counted)",
    EXIT_USAGE: f"{EXIT_USAGE}    bad input (flags, run file, model string, data, an output path that cannot be written), "
    "with a\n       message; nothing was sent",
    EXIT_COST_BOUND: f"{EXIT_COST_BOUND}    stopped at the cost bound (everything that arrived is cached: rerun with a higher bound)",
    EXIT_CACHE_WRITE: f"{EXIT_CACHE_WRITE}    the cache could not be written (disk full, permissions): make room and rerun",
    EXIT_UPLOAD: f"{EXIT_UPLOAD}    done, but shards could not be uploaded to --cache-remote (all in the local cache; the next "
    "run uploads them)",
    EXIT_PROVIDER_STOPPED: f"{EXIT_PROVIDER_STOPPED}    a provider was stopped (exhausted quota, refused key, a stated wait "
    "over --max-stated-wait),\n       or a model alone (unknown model, refused request form); the "
    "others went on; the next run sends what was not sent (6, not 3, when the cost bound was reached "
    "too)",
    EXIT_SOFTWARE: f"{EXIT_SOFTWARE}   an unexpected error (a bug in dxi): one line says what failed and where, and the file "
    "holding\n       the full trace (secrets redacted) to report",
    EXIT_INTERRUPTED: f"{EXIT_INTERRUPTED}  interrupted (Ctrl-C or kill -INT; everything that arrived is cached: rerun "
    "the same command)",
    EXIT_TERMINATED: f"{EXIT_TERMINATED}  stopped by SIGTERM (kill, a scheduler's time limit), as for {EXIT_INTERRUPTED}",
}
_DRAIN = """  The first Ctrl-C or SIGTERM of a run lets the requests in flight finish and be stored (at most --grace
  seconds); a second stops at once.
"""


def exit_codes(*codes: int, say: dict[int, str] | None = None, drain: bool = True) -> str:
    """The help's "exit codes:" section for a command that returns ``codes`` (``runner.errors``), in
    that order, each with its line of ``say`` when given (what that code means for this command:
    wrapped lines indented by 7), else the line ``dxi run`` gives it; a command that sends requests
    (returns ``EXIT_INTERRUPTED``, ``drain``) also says how a stop drains."""
    say = say or {}
    lines = "".join(f"  {f'{c:<5}{say[c]}' if c in say else _EXIT_LINES[c]}\n" for c in codes)
    return "exit codes:\n" + lines + (_DRAIN if EXIT_INTERRUPTED in codes and drain else "")


STOPPED = f"interrupted (Ctrl-C or kill -INT; {EXIT_TERMINATED}: by SIGTERM)"
"""What ``EXIT_INTERRUPTED`` means for a command that sends no request: it stopped where it was."""


def tool_exit_codes(say: dict[int, str]) -> str:
    """The "exit codes:" section of a command that sends no request: 0, 2, 70 and 130 (``STOPPED``)
    and the codes of ``say``, in increasing order, each with its line of ``say`` when given."""
    codes = sorted({0, EXIT_USAGE, EXIT_SOFTWARE, EXIT_INTERRUPTED, *say})
    return exit_codes(*codes, say={EXIT_INTERRUPTED: STOPPED, **say}, drain=False)


EXIT_CODES = exit_codes(*_EXIT_LINES)
"""Every exit code of ``dxi`` (``dxi run`` returns them all)."""
SCORING_EXIT_CODES = exit_codes(0, EXIT_FAILED_REQUESTS, EXIT_USAGE, EXIT_SOFTWARE)
"""What ``dxi score`` and ``dxi report`` return: they read the cache and send nothing."""


def make_console(stderr: bool = False):
    """A Rich console of ``dxi`` (Rich imported here, when a command runs): of its results on
    standard output (180 columns when it is not a terminal: a log must not squeeze a table), or
    with ``stderr`` of its status and diagnostic lines on standard error (errors, warnings, an
    interruption: docs/cli.md). Markup on; no highlighting, no emoji codes (``openai:m`` must not
    become one), lines not wrapped. Every text it prints has its control characters but line breaks
    and tabs shown escaped (``dxi.shown``): whatever a message quotes from outside, no ESC sequence,
    carriage return, C1 control or bidirectional override reaches the terminal (Rich's own styles
    are added after)."""
    from rich.console import Console

    from dxi.shown import shown

    class Safe(Console):
        def render_str(self, text: str, **kwargs):
            return super().render_str(shown(text, keep="\n\t"), **kwargs)

    made = Safe(stderr=stderr, highlight=False, soft_wrap=True, emoji=False)
    if not stderr and not made.is_terminal:
        made = Safe(highlight=False, soft_wrap=True, emoji=False, width=180)
    return made


def log_handler(errors):
    """The handler of ``dxi``'s warnings on ``errors`` (``make_console(stderr=True)``): Rich on a
    terminal; in a log one plain line each ("WARNING cache: ..."), easy to grep. Each has every
    control character shown escaped, line breaks too (``dxi.shown``): a warning quoting a provider,
    a served model or the cache drives no terminal, forges no line."""
    import logging

    from rich.logging import RichHandler

    from dxi.shown import shown

    class Shown(logging.Formatter):
        def format(self, record: logging.LogRecord) -> str:
            return shown(super().format(record))

    terminal = errors.is_terminal
    handler = RichHandler(console=errors, show_path=False) if terminal else logging.StreamHandler()
    handler.setFormatter(Shown("%(message)s" if terminal else "%(levelname)s %(message)s"))
    return handler


_NUMBER = re.compile(r"-\d[\d_.,]*(e-?\d+)?")  # a negative number is a value, not a flag


def misplaced(
    command: argparse.ArgumentParser,
    argv: list[str],
    root: Callable[[], argparse.ArgumentParser],
) -> tuple[list[str], list[str], list[str]]:
    """The flags of ``argv`` (a command's words) that ``command`` does not take: the clauses naming
    those another command takes (``--max-cost is not an option of dxi batches collect (dxi run and
    dxi estimate take it)``), flags the same commands take in one, the flags no command takes, and
    the clause telling that TARGET is positional where one was given for it (``positional_target``).
    ``root`` builds the parser of every command (``runner.cli.parser``), called only when a flag is
    not ``command``'s."""
    flags = [o for a in command._actions for o in a.option_strings]
    stray: list[str] = []
    for word in argv[: argv.index("--") if "--" in argv else None]:
        flag = word.split("=", 1)[0]
        if (
            flag[:1] == "-"
            and flag != "-"
            and not _NUMBER.fullmatch(flag)
            and flag not in flags + stray
        ):
            stray.append(flag)
    leaves = _leaves(root()) if stray else []
    by_takers: dict[tuple[str, ...], list[str]] = {}  # the flags the same commands take
    for flag in stray:
        takers = tuple(p.prog for p in leaves if p.prog != command.prog and _takes(p, flag))
        by_takers.setdefault(takers, []).append(flag)
    rest = by_takers.pop((), [])
    said = [
        f"{_and(named)} {'is not an option' if len(named) == 1 else 'are not options'} of "
        f"{command.prog} ({_and(takers)} take{'s' * (len(takers) == 1)} "
        f"{'it' if len(named) == 1 else 'them'})"
        for takers, named in by_takers.items()
    ]
    return said, rest, positional_target(command, argv) if stray else []


# the flags a user gives for a positional TARGET (``dxi export``'s), told it is positional
TARGET_FLAGS = ("--output", "-o", "--out", "--target")


def positional_target(command: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """For a command whose TARGET is positional (``dxi export``) given it by a flag of ``argv``
    (``--output x.csv``, ``-o``, ``--out``, ``--target``; the command takes none of them): that
    TARGET is positional, with the command to give (its ``--format`` and the flag's value)."""
    if not any(a.dest == "target" and not a.option_strings for a in command._actions):
        return []
    for i, word in enumerate(argv):
        flag, eq, value = word.partition("=")
        if flag in TARGET_FLAGS:
            after = argv[i + 1] if i + 1 < len(argv) else "-"
            value = value if eq else after if not after.startswith("-") else "TARGET"
            given = [argv[j + 1] for j, w in enumerate(argv[:-1]) if w == "--format"]
            fmt = f" --format {given[-1] if given else 'FORMAT'}" * _takes(command, "--format")
            return [
                f"TARGET is positional (no flag): {command.prog} [RUN_FILE] [options]{fmt} {value}"
            ]
    return []


def _leaves(p: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """The parsers of every command and sub-command under ``p`` that has none of its own, in
    ``dxi --help``'s order."""
    subs = [
        sub
        for a in p._actions
        if isinstance(a, argparse._SubParsersAction)
        for sub in a.choices.values()
    ]
    return [leaf for sub in subs for leaf in _leaves(sub)] if subs else [p]


def _takes(p: argparse.ArgumentParser, flag: str) -> bool:
    return any(flag in a.option_strings for a in p._actions)


def _and(words: Sequence[str]) -> str:
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"


class Formatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions as written (paragraphs, examples); each option's default appended when it has a
    real one."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (
            action.option_strings
            and "default" not in text
            and action.default not in (None, False, [], argparse.SUPPRESS)
        ):
            text += " (default: %(default)s)"
        return text


class Version(argparse.Action):
    """``dxi --version``: prints ``dxi VERSION`` on standard output and exits 0, as argparse's own
    action does, but looks the version up only when asked (importlib.metadata costs ~30 ms of
    every start-up, ``dxi --help``'s included). "unknown (not installed)" outside a package."""

    def __init__(self, option_strings: list[str], dest: str, **_: object) -> None:
        super().__init__(
            option_strings,
            argparse.SUPPRESS,
            nargs=0,
            default=argparse.SUPPRESS,
            help="show the version and exit",
        )

    def __call__(self, parser, namespace, values, option_string=None) -> None:  # noqa: ANN001
        from importlib.metadata import PackageNotFoundError, version

        try:
            found = version("decision-index")
        except PackageNotFoundError:
            found = "unknown (not installed)"
        parser._print_message(f"{parser.prog} {found}\n", sys.stdout)
        parser.exit()
