"""Shared by the tests of an adaptive run's outputs (test_adaptive_outputs, test_adaptive_pairs):
the three models, the tasks per evaluation, and the terminal's tables of a summary as text."""

from __future__ import annotations

import io
from pathlib import Path

THREE = ("m00", "m50", "m100")
SMALL = 40


def printed(out: Path) -> str:
    """The terminal's tables of ``out/summary.json`` (300 columns wide), whitespace collapsed."""
    from rich.console import Console

    from dxi.runner.outputs.terminal import print_summary
    from dxi.scoring import records

    console = Console(file=io.StringIO(), width=300, record=True)
    print_summary(records.decode((out / "summary.json").read_bytes()), console)
    return " ".join(console.export_text().split())
