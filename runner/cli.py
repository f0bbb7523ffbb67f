"""``dxi``, the command line: the parser (grouped options, exit codes, "did you mean", completion),
built from the command modules (``runner.commands``, one per command: its options and the library
calls it makes), and ``main``, which parses, sets up the consoles and logging, and dispatches.
``main`` builds in full only the command it runs (``dxi --help`` lists the others from their
declarations, ``runner.commands.HELP``, and imports no command module); shell completion builds
every command, as completing may walk any. ``dxi --help`` and ``dxi COMMAND --help`` are its user
documentation; a run file's flags override it as ``runner.planning.plan`` describes.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import re
import sys
from collections.abc import Callable, Collection
from types import ModuleType

from dxi.lazy import LazyModule

from . import streams
from .commands import (
    COMMANDS,
    EXIT_CODES,
    HELP,
    Formatter,
    Version,
    log_handler,
    make_console,
    misplaced,
)
from .errors import EXIT_SOFTWARE, EXIT_USAGE, CommandError, cache_refusals

evals = LazyModule(
    "dxi.evals"
)  # DatasetError, read only when a command fails (it has imported the evals)

# What a command needs is imported when it runs, not here: parsing the command line and `dxi --help`
# need none of Polars, PyArrow, NumPy, the scoring, the cache, uvloop or Rich.


class _Parser(argparse.ArgumentParser):
    """argparse with a "did you mean" for a mistyped flag or command, reported by the subcommand it
    belongs to (argparse alone reports a subcommand's unknown flags with the top-level usage), and
    a usage error in two lines, the same for every command and sub-command (``error``). A flag is
    taken only whole (no ``allow_abbrev``): ``--run 3`` is not ``--runs 3``, and a script's
    abbreviation cannot change meaning, or break, when a later version adds a flag."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", Formatter)
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_args(self, args=None, namespace=None):  # argparse's signature
        argv = sys.argv[1:] if args is None else list(args)
        words = next((a for a in argv if not a.startswith("-")), None)
        commands = self._subcommands()
        if (
            commands
            and words is not None
            and words not in commands
            and not any(a in ("-h", "--help") for a in argv)
        ):
            self.error(f"unknown command {words!r}{_did_you_mean(words, commands)}")
        parsed, extras = self.parse_known_args(argv, namespace)
        target = getattr(parsed, "target", None)
        if (
            len(extras) == 1
            and not extras[0].startswith("-")
            and getattr(parsed, "run_file", 0) is None
            and target is not None
            and target.suffix == ".toml"
        ):
            # `dxi export RUN_FILE --format csv TARGET`: argparse gives the word before the flags to
            # TARGET (RUN_FILE being optional) and leaves the real TARGET over; it is the run file
            parsed.run_file, parsed.target, extras = target, type(target)(extras[0]), []
        if extras:
            target = self.chosen(parsed)
            target.error(target._unrecognized(extras))
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

    def chosen(self, parsed: argparse.Namespace) -> _Parser:
        """The parser of the command (and sub-command) ``parsed`` names: ``dxi batches list``'s."""
        for attr in ("command", "data_command", "cache_command", "batches_command"):
            sub = self._subcommands().get(getattr(parsed, attr, None) or "")
            if sub is not None:
                return sub.chosen(parsed)
        return self

    def error(self, message: str):
        """A usage error, exit 2, the same two lines for every command and sub-command (not
        argparse's usage block): ``PROG: error: MESSAGE`` (the flag and what it accepts, or what is
        not recognized and the closest flag or command) and ``run 'PROG --help' for the options``
        (for the commands, where PROG has some). A missing required flag also names a mistyped
        one."""
        choices = self._subcommands()
        bad = re.match(r"argument [^-]\S*: invalid choice: '(.*?)'", message)
        if choices and bad:  # `dxi batches lst`: argparse would name the metavar
            message = f"unknown command {bad[1]!r}{_did_you_mean(bad[1], choices)}; the commands: "
            message += ", ".join(choices)
        if "required" in message:
            unknown = [
                a
                for a in getattr(self, "_argv", [])
                if a.startswith("--") and a.split("=", 1)[0] not in self._flags()
            ]
            if unknown:
                message += f"; {self._unrecognized(unknown)}"
        what = "commands" if choices else "options"
        self.exit(
            EXIT_USAGE, f"{self.prog}: error: {message}\nrun '{self.prog} --help' for the {what}\n"
        )

    def _flags(self) -> list[str]:
        return [o for a in self._actions for o in a.option_strings]

    def _unrecognized(self, extras: list[str]) -> str:
        """What ``extras``, the words left over, are: a flag of another command, named with the
        commands that take it (``commands.misplaced``, which also tells a flag given for a
        positional TARGET), else the words and the flag closest to a mistyped one."""
        said, rest, target = misplaced(self, getattr(self, "_argv", []), parser)
        rest = rest if said else extras
        said += [f"unrecognized arguments: {' '.join(rest)}{self._hint(rest)}"] if rest else []
        return "; ".join(said + target)

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


def parser(commands: Collection[str] | None = None) -> argparse.ArgumentParser:
    """The parser of ``dxi`` and of every command (``runner.commands``); with ``commands``, only
    those in full, the others declared (their name and help line in ``dxi --help``,
    ``runner.commands.HELP``; their modules not imported, their words not parsed)."""
    p = _Parser(
        prog="dxi",
        description="The Decision Index evaluation runner: runs decision models and language models\n"
        "on the four evaluations, caches every reply, scores from the cache.",
        epilog="Run `dxi COMMAND --help` for a command's options.\n\n" + EXIT_CODES,
    )
    p.add_argument("--version", action=Version)
    sub = p.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=_Parser, title="commands"
    )
    for name in COMMANDS:
        if commands is None or name in commands:
            _module(name).add_parser(sub)
        else:
            sub.add_parser(name, help=HELP[name])
    return p


def _command(argv: list[str]) -> list[str]:
    """The command ``argv`` runs (its first word: ``dxi`` takes no option with a value), as a list:
    empty when it names none (``dxi --help``, a mistyped command)."""
    word = next((a for a in argv if not a.startswith("-")), None)
    return [word] if word in COMMANDS else []


def _module(command: str) -> ModuleType:
    """The module of ``command`` (``runner.commands``)."""
    return importlib.import_module(f"{__package__}.commands.{COMMANDS[command]}")


def main(argv: list[str] | None = None, decided: Callable[[int], None] | None = None) -> int:
    """``dxi``: parse ``argv`` (default: ``sys.argv[1:]``), run the command, return its exit code
    (``runner.errors``), given to ``decided`` first (``signals.exit_at_once``: a late signal changes
    nothing). Standard output and error are ``runner.streams.Guarded`` meanwhile: a reader that
    closes the pipe (``dxi run | head``) ends the output, never the command nor its exit code."""
    with streams.guarded():
        code = _main(argv)
        (decided or int)(code)
        return code


def _main(argv: list[str] | None) -> int:
    if (
        argv is None and "_ARGCOMPLETE" in os.environ
    ):  # completing a word (`dxi completion`'s script): answers, exits
        import argcomplete

        argcomplete.autocomplete(parser())
    p = parser(_command(sys.argv[1:] if argv is None else list(argv)))
    try:
        args = p.parse_args(argv)
    except (
        SystemExit
    ) as stop:  # --help, --version, a usage error (printed): its exit code, as a return value
        return stop.code if isinstance(stop.code, int) else EXIT_USAGE
    import logging

    from rich.markup import escape

    console, errors = make_console(), make_console(stderr=True)  # results; status and diagnostics
    logging.basicConfig(level=logging.WARNING, handlers=[log_handler(errors)])
    try:
        return _module(args.command).main(args, console)
    except (CommandError, evals.DatasetError, *cache_refusals()) as exc:
        # bad input (2; a shard a newer version wrote too), a cache folder that cannot be
        # written (4)
        errors.print(f"[red]{p.chosen(args).prog}: error:[/] {escape(str(exc))}")
        return getattr(exc, "exit_code", EXIT_USAGE)
    except Exception as exc:  # noqa: BLE001 (a bug: one line, the trace in a file, never exit 1)
        from .crash import report

        said = report(exc, ["dxi", *(sys.argv[1:] if argv is None else argv)])
        errors.print(f"[red]{p.chosen(args).prog}: error:[/] {escape(said)}")
        return EXIT_SOFTWARE


if __name__ == "__main__":
    from dxi.__main__ import command

    command()
