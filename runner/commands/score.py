"""``dxi score``: score from the cache only, without the network (``runner.rescore``). Its options,
and ``main``: the summary printed, with the notes on what was selected."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from ..planning import paths
from . import options

if TYPE_CHECKING:
    from rich.console import Console


def add_parser(sub) -> None:
    s = options.command(sub, "score", None, None, options.SCORING_EXIT_CODES)
    options.add_scoring(s, "score")


def main(args: argparse.Namespace, console: Console) -> int:
    from rich.markup import escape

    from ..outputs.terminal import print_summary
    from ..rescore import rescore, select

    selection = select(args)
    paths.outside_cache(selection.out, selection.cache_dir, options.named(args, "out", "--out"))
    # before scoring; made only as the outputs are written (a refusal leaves none behind)
    paths.output_folder(selection.out, options.named(args, "out", "--out"), create=False)
    options.repair(selection.out)  # a commit a kill cut short: settled before it is read
    done = rescore(selection)
    print_summary(done.summary, console, done.out, done.ranked)
    options.warn_differs(selection)
    for note in done.notes:
        console.print(f"[yellow]note:[/] {escape(note)}")
    return done.exit_code
