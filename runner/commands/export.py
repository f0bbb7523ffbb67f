"""``dxi export``: score from the cache only (``runner.rescore``) and write the answers (csv,
parquet, jsonl) or the Every Eval Ever records (eee) with ``runner.export``. Its options, and
``main``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from ..distributed import setup as distributed
from ..errors import EXIT_FAILED_REQUESTS, EXIT_USAGE, UsageError
from ..planning import paths
from . import options

if TYPE_CHECKING:
    from rich.console import Console


EXIT_CODES = options.tool_exit_codes(
    {
        0: "written: every answer the selection holds (with --include-missing, the missing ones "
        "too)",
        EXIT_FAILED_REQUESTS: "written, but answers missing from the cache were left out (counted; "
        "--include-missing\n       writes them)",
        EXIT_USAGE: "bad input (flags, run file, data, a TARGET that cannot be written), with a "
        "message",
    }
)


def add_parser(sub) -> None:
    x = options.command(sub, "export", None, None, EXIT_CODES)
    options.add_models(x.add_argument_group("models"), True, True)
    options.add_data(x.add_argument_group("data"))
    options.add_cache(x.add_argument_group("cache"))
    options.add_price(x.add_argument_group("prices"))
    distributed.add_flags(x.add_argument_group("past one machine (a remote cache)"), "export")
    o = x.add_argument_group("output")
    o.add_argument(
        "--format",
        required=True,
        choices=("eee", "csv", "parquet", "jsonl"),
        help="eee: Every Eval Ever aggregate and instance records under the folder TARGET; csv, parquet, "
        "jsonl: the per-answer table (the columns of answers.parquet) as the file TARGET",
    )
    o.add_argument(
        "--include-missing",
        action="store_true",
        help="also write the answers missing from the cache (status missing; eee: no record either way) "
        f"and exit 0; without it they are left out, counted, and the exit code is {EXIT_FAILED_REQUESTS}",
    )
    o.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="print nothing but errors and the count of missing answers",
    )
    x.add_argument(
        "target",
        type=Path,
        metavar="TARGET",
        help="the file (csv, parquet, jsonl) or folder (eee) to write",
    )
    x.set_defaults(out=None)  # export writes TARGET only


def main(args: argparse.Namespace, console: Console) -> int:
    from rich.markup import escape

    from ..export import ExportError, export
    from ..rescore import select

    # before scoring: the folder (or file) written must be writable; made only when written, so
    # that a refused export (no data, no cache) leaves nothing behind
    if args.format == "eee":
        paths.output_folder(args.target, "TARGET", create=False)
    else:
        paths.output_file(args.target, "TARGET", create=False)
    selection = select(args)
    paths.outside_cache(args.target, selection.cache_dir, "TARGET")
    try:
        done = export(selection, args.format, args.target, include_missing=args.include_missing)
    except ExportError as exc:
        raise UsageError(str(exc)) from None
    options.warn_differs(selection)
    for note in done.notes if not args.quiet else []:
        console.print(f"[yellow]note:[/] {escape(note)}")
    if not args.quiet:
        console.print(
            escape(f"Exported {len(done.written)} file(s) ({args.format}) to {args.target}")
        )
    if done.missing.total:
        console.print(
            f"[{'yellow' if args.include_missing else 'red'}]{escape(done.missing.message(args.include_missing))}[/]"
        )
    return done.exit_code
