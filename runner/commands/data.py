"""``dxi data fetch|check``: fetch the evaluation data from the Hugging Face hub (``evals.fetch``),
or check a data folder. Its options, and ``main``: a table of what each file holds."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from dxi.evals import EVALS

from .. import completion
from ..errors import EXIT_FAILED_REQUESTS, EXIT_USAGE, UsageError
from ..planning import paths
from ..planning.datadir import DATA_DIR_ENV, DEFAULT_DATA_DIRS_TEXT, default_data_dir
from . import options

if TYPE_CHECKING:
    from rich.console import Console


EXIT_CODES = options.tool_exit_codes(
    {
        0: "done: every evaluation's files fetched (or checked) and sound",
        EXIT_FAILED_REQUESTS: "an evaluation's files could not be fetched, or failed the check "
        "(the table says which and\n       why); the others were kept",
        EXIT_USAGE: "bad input (flags, no data folder, a --data-dir that cannot be written), "
        "with a message",
    }
)


def add_parser(sub) -> None:
    d = options.command(sub, "data", None, None, EXIT_CODES)
    dsub = d.add_subparsers(
        dest="data_command", required=True, metavar="fetch|check", parser_class=type(d)
    )
    f = options.command(
        dsub,
        "fetch",
        "download HLE, When2Call and WildGuardTest (HF_TOKEN for gated sets), then check them",
        None,
        EXIT_CODES,
    )
    f.add_argument(
        "--data-dir",
        type=Path,
        required=True,
        metavar="DIR",
        help="where the files go (the layout --data-dir reads)",
    )
    f.add_argument(
        "--mirror",
        type=Path,
        metavar="DIR",
        help="a local folder laid out like the hub (OWNER/NAME/PATH), instead of the network",
    )
    f.add_argument(
        "--evals",
        metavar="LIST",
        help=f"comma-separated subset of {', '.join(EVALS)} (default: all)",
    ).completer = completion.evals
    f.add_argument(
        "--force", action="store_true", help="download again files that are already there"
    )
    f.add_argument(
        "--revision",
        action="append",
        default=[],
        metavar="[EVAL=]REV",
        help="the dataset revision to fetch (a branch, tag or commit), repeatable: EVAL=REV for one "
        "evaluation, REV for every one (default: each repository's default branch); the commit it "
        "resolves to is recorded beside the file and in summary.json's data block",
    )
    c = options.command(
        dsub,
        "check",
        "load every evaluation file in a data folder and report rows, tasks and problems",
        None,
        EXIT_CODES,
    )
    c.add_argument(
        "--data-dir",
        type=Path,
        metavar="DIR",
        help=f"the data folder to check (default: ${DATA_DIR_ENV}, else {DEFAULT_DATA_DIRS_TEXT}, as for "
        "every other command)",
    )


def main(args: argparse.Namespace, console: Console) -> int:
    from rich.markup import escape
    from rich.table import Table

    from dxi.evals import fetch

    from ..planning.plan import selected_evals

    selected = selected_evals(args.evals) if getattr(args, "evals", None) else None
    if args.data_command == "fetch":
        try:
            revisions = fetch.revisions(args.revision, selected or list(EVALS))
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        paths.output_folder(args.data_dir, "--data-dir")  # before the first download
        source = fetch.Mirror(args.mirror) if args.mirror else fetch.Hub()
        outcomes = fetch.fetch(
            args.data_dir, source, selected, force=args.force, revisions=revisions
        )
    else:
        if args.data_dir is None:
            args.data_dir = default_data_dir()
        if args.data_dir is None:
            raise UsageError(
                f"no data folder: give --data-dir DIR (default: ${DATA_DIR_ENV}, else "
                f"{DEFAULT_DATA_DIRS_TEXT})"
            )
        outcomes = fetch.check(args.data_dir)
    table = Table(title=f"Evaluation data in {escape(str(args.data_dir))}")
    for col in ("evaluation", "status", "file", "rows", "tasks", "published", "note"):
        table.add_column(col, overflow="fold")
    for o in outcomes:
        table.add_row(
            EVALS[o.eval].title,
            o.status,
            escape(str(o.file.path)) if o.file else "",
            str(o.file.rows) if o.file else "",
            "" if o.tasks is None else str(o.tasks),
            o.published(),
            escape(o.message),
        )
    console.print(table)
    return 1 if any(o.status == "failed" for o in outcomes) else 0
