"""How an adaptive run's summary is read (``dxi run --until``; docs/adaptive.md): the one note every
presentation shows (the terminal, ``report.html``, ``dxi view``) and the rows of its table, from
summary.json's ``adaptive`` blocks (``Summary.adaptive``, ``ModelEntry.adaptive``; written by
``runner.adaptive``). Pure: reads a ``Summary`` only.

In an adaptive run each model was asked a seeded random part of each evaluation, so its figures are
estimates of the whole set: the index and metrics over the part it was asked (the questions not
asked count as missing answers, left out), and beside them, the whole-set estimate with its
anytime-valid 95% interval at stopping (``scoring.sequential``).
"""

from __future__ import annotations

from .records import UNSET, Summary

HEADERS = ("model", "asked", "whole-set index", "anytime 95% interval", "stopped by", "round")


def is_adaptive(summary: Summary) -> bool:
    """Whether ``summary`` is an adaptive run's (it has the top-level ``adaptive`` block)."""
    return summary.adaptive is not UNSET and summary.adaptive is not None


def note(summary: Summary) -> str | None:
    """The sentence that marks an adaptive run's figures as estimates of the whole set (None: not
    one), e.g. "Adaptive run (--until precision=5, order seed 0, 4 rounds): each model was asked a
    random part of each evaluation; its figures are estimates of the whole set (...)"."""
    if not is_adaptive(summary):
        return None
    block = summary.adaptive
    rounds = block.get("rounds", 0)
    return (
        f"Adaptive run (--until {block.get('until')}, order seed {block.get('seed')}, "
        f"{rounds} round{'' if rounds == 1 else 's'}): each model was asked a random part of each "
        "evaluation, so its figures are estimates of the whole set; the questions not asked count as "
        "missing answers (a run without --until asks them). Each model's whole-set index with its "
        "anytime-valid 95% interval:"
    )


def _number(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f}"


def rows(summary: Summary) -> list[tuple[str, ...]]:
    """One row per model (``HEADERS``): its label, the questions asked ("132 of 200 (66%)"), the
    whole-set index estimate and its interval "[low, high]" (0-100, 1 decimal; "—" where unknown),
    the rule that stopped it ("running" when none did) and the round after which it stopped ("—").
    """
    populations = summary.adaptive.get("populations", {}) if is_adaptive(summary) else {}
    total = sum(populations.values())
    out = []
    for m in summary.models:
        block = m.adaptive if m.adaptive is not UNSET else None
        if not block:
            continue
        asked = sum(block.get("asked", {}).values())
        share = f" ({100 * asked / total:.0f}%)" if total else ""
        index = block.get("index") or {}
        interval = (
            "—"
            if index.get("low") is None
            else f"[{_number(index['low'])}, {_number(index['high'])}]"
        )
        out.append(
            (
                m.model,
                f"{asked:,} of {total:,}{share}",
                _number(index.get("point")),
                interval,
                block.get("rule") or "running",
                "—" if block.get("round") is None else str(block["round"]),
            )
        )
    return out


def sentences(summary: Summary) -> list[str]:
    """The note and one sentence per model (``rows`` in words), for the report's banner and ``dxi
    view``'s overview; empty for a summary that is not an adaptive run's."""
    text = note(summary)
    if text is None:
        return []
    out = [text]
    for model, asked, point, interval, rule, round_ in rows(summary):
        stop = (
            "still running when the run ended"
            if rule == "running"
            else ("asked the whole set" if rule == "exhausted" else f"stopped by {rule}")
            + ("" if round_ == "—" else f" after round {round_}")
        )
        out.append(f"{model}: asked {asked}; whole-set index {point} {interval}; {stop}.")
    return out
