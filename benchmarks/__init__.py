"""Benchmarks: ``make bench`` (``python -m benchmarks``) runs every ``benchmarks/bench_*.py`` module
and every ``benchmarks/stats_*.py`` one (the statistics' seeded simulations).

Each module defines ``run() -> list[Result]``; figures are measured side by side in one run on this
machine (ratios against a baseline where the goal is a ratio), never asserted in unit tests.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Result:
    """One measured figure: ``value`` in ``unit``; ``goal`` as text (e.g. "≥ 0.8× bare loop");
    ``met`` whether the goal is reached (None when there is no goal); ``note`` what explains the
    figure (what a missed goal would need)."""

    benchmark: str
    figure: str
    value: float
    unit: str
    goal: str = ""
    met: bool | None = None
    note: str = ""

    def as_dict(self) -> dict:
        return asdict(self)
