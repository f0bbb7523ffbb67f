"""The line under the terminal's index table that says what its abbreviations and its interval
are (``runner.outputs.terminal.print_summary``): the interval's method read from the summary
(summary.json's ``intervals.methods``), so the line says what computed the figures printed; and the
ranking line's pairs adjacent in rank (``adjacent``)."""

from __future__ import annotations

from dxi.scoring import adaptive, records, stopped_pairs
from dxi.scoring.records import Summary, unset
from dxi.scoring.summary import p_text, signed

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


def adjacent(summary: Summary, ranked: list[str], key_of: dict[str, str]) -> str:
    """ "; adjacent: A − B +3.2 (p_adj < 0.001), …": for each pair adjacent in rank order
    (``ranked``), the index's difference and its adjusted p-value from the summary's comparisons
    (``scoring.compare``; † where significant; where an adaptive run's pair is not claimed, which
    half failed: ``scoring.stopped_pairs.said``); "" without comparisons."""
    found = {}
    for c in unset(summary.comparisons) or []:
        if c.metric == "decision_index" and c.difference is not None:
            entry = records.to_builtins(c)
            note, turned = stopped_pairs.said(entry), stopped_pairs.said(entry, turned=True)
            found[(c.a, c.b)] = (c.difference, c.p_adjusted, c.significant, note)
            found[(c.b, c.a)] = (-c.difference, c.p_adjusted, c.significant, turned)
    parts = []
    for a, b in zip(ranked, ranked[1:], strict=False):
        if (a, b) not in found:
            continue
        d, p, sig, note = found[(a, b)]
        shown = p_text(p)
        said = note or f"p_adj {shown}{' †' if sig else ''}"
        parts.append(f"{key_of[a]} − {key_of[b]} {signed(d)} ({said})")
    return "; adjacent: " + ", ".join(parts) if parts else ""
