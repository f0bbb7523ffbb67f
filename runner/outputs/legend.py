"""The line under the terminal's index table that says what its abbreviations and its interval
are (``runner.outputs.terminal.print_summary``): the interval's method read from the summary
(summary.json's ``intervals.methods``), so the line says what computed the figures printed."""

from __future__ import annotations

from dxi.scoring import adaptive
from dxi.scoring.records import Summary, unset

ABBREVIATIONS = (
    "Omni = AA-Omniscience-Decision; acc = accuracy; non-halluc (non-hall.) = non-hallucination "
    'rate: of the answers not correct, the share that said "I don\'t know" rather than pick a '
    "wrong answer; WildGuard F1 = mean F1 of WildGuardTest's three questions."
)


def index_legend(summary: Summary) -> str:
    """The line: "95% CI = the index's 95% interval: METHOD; " (``intervals.methods``' method of
    the index, at ``intervals.confidence``; for an adaptive run's estimates, marked
    ``adaptive.MARK``, their anytime-valid intervals: ``scoring.adaptive.headline``; left out when
    the summary has no intervals), then ``ABBREVIATIONS``."""
    intervals = unset(summary.intervals) or {}
    method = (intervals.get("methods") or {}).get("decision_index")
    if not method:
        return ABBREVIATIONS
    level = f"{intervals.get('confidence', 0.95) * 100:g}%"
    if any(adaptive.estimated(summary, m) for m in summary.models):
        method += f" ({adaptive.MARK}: an adaptive run's estimate, its anytime-valid interval)"
    return f"{level} CI = the index's {level} interval: {method}; {ABBREVIATIONS}"
