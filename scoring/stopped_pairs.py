"""The paired comparisons of an adaptive run's models (``dxi run --until``; docs/adaptive.md, "The
headline intervals are the ones valid after stopping"): a pair with a model whose figures are
estimates (``scoring.adaptive.estimated``) claims a difference only where BOTH halves hold. The
anytime-valid paired interval of the index difference that ``--until separated`` decides on
(``scoring.sequential.pair_intervals``: the same sequences, the same sharing of α) leaving 0 out
orders the pair on the whole set, valid after stopping (``settled``); the fixed-sample test over the
asked part separating it is the claim beyond the set that ``significant`` makes for every other
pair (and in a complete run), kept as ``fixed_sample_significant``. So such a pair's index
comparison is ``significant`` only where both do; its metrics' comparisons, which have no anytime
interval, are never claimed (``settled`` false, as for a provisional figure, ``scoring.bounds``).
Each comparison records the rule that applied (``claim``); ``said`` words which half failed, for
the terminal, the report and ``dxi view``. Pure: reads a ``Summary``, a ``Scored`` and the
intervals."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

import polars as pl

from .adaptive import estimated, is_adaptive
from .records import UNSET, Summary
from .scored import Scored
from .summary import p_text, signed

# ``claim``: which rule a comparison's ``significant`` follows
FIXED_SAMPLE = "fixed sample"  # both figures exact: the comparison's own procedure
ANYTIME = "anytime-valid"  # the index of a pair with an estimate: its anytime paired interval
NOT_VALID = "not valid after stopping"  # a pair with an estimate without one: never claimed
# what the terminal, the report and ``dxi view`` say of a pair not claimed (``said``)
NOT_CLAIMED = "not claimed: not valid after stopping"
WHOLE_SET_ONLY = "ordered on the whole set (anytime-valid {ci}), not claimed beyond it"
HOLDS_ZERO = "not claimed: its anytime-valid interval {ci} holds 0"
NEITHER = "not claimed: its anytime-valid interval {ci} holds 0, nor beyond the set"


def said(c: Mapping, turned: bool = False) -> str | None:
    """ "p_adj 0.509; ordered on the whole set (anytime-valid [+0.2, +1.5]), not claimed beyond
    it": what the terminal's "adjacent" line, the report's matrix and ``dxi view``'s compare page
    say of a comparison ``c`` of an adaptive run that ``claim`` did not claim (summary.json's entry
    or a row of ``tables/comparisons``: its ``claim``, ``significant``, ``settled``,
    ``fixed_sample_significant``, ``p_adjusted`` and ``anytime_ci`` or ``anytime_low``/``_high``;
    ``turned``: said of b − a), the adjusted p-value then the half that failed: ``WHOLE_SET_ONLY``
    (its anytime-valid interval leaves 0 out, ``settled``, but the fixed-sample test does not
    separate the pair), ``HOLDS_ZERO`` (the fixed-sample test does), ``NEITHER``, or
    ``NOT_CLAIMED`` (a metric, or an index without an anytime interval). None for a comparison
    claimed (``significant``) or under another rule (``FIXED_SAMPLE``: its own marks, such as a
    provisional figure's "bounds overlap")."""
    if c.get("significant") or c.get("claim") not in (ANYTIME, NOT_VALID):
        return None
    p = c.get("p_adjusted")
    shown = p_text(p)
    anytime = c.get("anytime_ci") or (c.get("anytime_low"), c.get("anytime_high"))
    if c["claim"] == NOT_VALID or None in anytime:
        return f"p_adj {shown}; {NOT_CLAIMED}"
    low, high = (0.0 - anytime[1], 0.0 - anytime[0]) if turned else anytime
    ci = f"[{signed(low)}, {signed(high)}]"
    if c.get("settled"):
        why = WHOLE_SET_ONLY
    else:
        why = HOLDS_ZERO if c.get("fixed_sample_significant") else NEITHER
    return f"p_adj {shown}; {why.format(ci=ci)}"


def order_of(parts: Mapping[str, Mapping[str, Sequence[str]]]) -> dict[str, tuple[str, ...]]:
    """Evaluation -> the run's order as far as ``parts`` (label -> evaluation -> its prefix of the
    order, ``scoring.adaptive.asked_part``'s) know it: the longest prefix (every other is a prefix
    of it)."""
    out: dict[str, tuple[str, ...]] = {}
    for by_eval in parts.values():
        for name, prefix in by_eval.items():
            if len(prefix) > len(out.get(name, ())):
                out[name] = tuple(prefix)
    return out


def estimates(summary: Summary) -> list[str]:
    """The models of ``summary`` whose figures are estimates (``scoring.adaptive.estimated``)."""
    if not is_adaptive(summary):
        return []
    return [m.model for m in summary.models if estimated(summary, m)]


def claim(
    summary: Summary,
    scored: Scored,
    intervals: Mapping[tuple[str, str], tuple[float, float] | None],
) -> tuple[Summary, Scored]:
    """``summary``'s ``comparisons`` and ``scored.comparisons`` with every pair that has a model
    whose figures are estimates claimed only where a test valid after stopping also holds:
    ``intervals`` ((a, b) -> the anytime paired interval of index(a) − index(b), points, or None;
    ``scoring.sequential.pair_intervals``). Such a pair's ``claim`` is ``ANYTIME`` for its index
    (``anytime_ci``, in the comparison's a − b orientation; ``settled`` whether it leaves 0 out) and
    ``NOT_VALID`` for its metrics, or an index without an interval (``settled`` false); the other
    pairs' ``claim`` is ``FIXED_SAMPLE`` and they are unchanged. ``significant`` is kept only where
    ``settled`` (the fixed-sample test AND the anytime interval; the test's own verdict stays in
    ``fixed_sample_significant`` for an ``ANYTIME`` pair). Unchanged when no model's figures are
    estimates (the entries changed in place)."""
    of = set(estimates(summary))
    table = scored.comparisons
    if not of or table.is_empty():
        return summary, scored
    rules, lows, highs, settled, significant, fixed = [], [], [], [], [], []
    for r in table.iter_rows(named=True):
        was = r.get("settled")
        was = True if was is None else bool(was)
        rule, low, high = FIXED_SAMPLE, None, None
        if r["a"] in of or r["b"] in of:
            rule, was = NOT_VALID, False
            iv = intervals.get((r["a"], r["b"]))
            if iv is None and (r["b"], r["a"]) in intervals:
                turned = intervals[(r["b"], r["a"])]
                iv = None if turned is None else (-turned[1], -turned[0])
            if r["metric"] == "decision_index" and r["eval"] is None and iv is not None:
                rule, low, high = ANYTIME, round(iv[0], 6), round(iv[1], 6)
                was = bool(r.get("settled", True) is not False and (low > 0 or high < 0))
        rules.append(rule)
        lows.append(low)
        highs.append(high)
        settled.append(was)
        # the claim beyond the set, as every other pair's (docs/adaptive.md): kept, and ANDed
        fixed.append(bool(r["significant"]) if rule == ANYTIME else None)
        significant.append(bool(r["significant"]) and was)
    scored = replace(
        scored,
        comparisons=table.with_columns(
            pl.Series("significant", significant, dtype=pl.Boolean),
            pl.Series("settled", settled, dtype=pl.Boolean),
            pl.Series("claim", rules, dtype=pl.String),
            pl.Series("anytime_low", lows, dtype=pl.Float64),
            pl.Series("anytime_high", highs, dtype=pl.Float64),
            pl.Series("fixed_sample_significant", fixed, dtype=pl.Boolean),
        ),
    )
    rows = {
        (r["a"], r["b"], r["eval"], r["metric"]): r
        for r in scored.comparisons.iter_rows(named=True)
    }
    for c in summary.comparisons if summary.comparisons is not UNSET else []:
        key = (c.a, c.b, c.eval, c.metric)
        r = rows.get(key)
        turned = r is None
        if turned:
            r = rows.get((c.b, c.a, c.eval, c.metric))
        if r is None:
            continue
        c.claim = r["claim"]
        if r["claim"] == FIXED_SAMPLE:
            continue
        c.significant, c.settled = bool(r["significant"]), bool(r["settled"])
        if r["claim"] == ANYTIME:
            low, high = r["anytime_low"], r["anytime_high"]
            c.anytime_ci = [0.0 - high, 0.0 - low] if turned else [low, high]
            c.fixed_sample_significant = bool(r["fixed_sample_significant"])
    return summary, scored
