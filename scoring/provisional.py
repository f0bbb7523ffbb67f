"""Provisional figures: an evaluation with failed or missing answers, and the tolerance a user
accepts.

SPEC §6: a failed answer (no valid reply after its retries) and a missing one (never sent: the run
stopped, a provider was stopped, a smaller selection was run) are not answers, and every figure they
touch is *provisional*. A provisional figure is computed over the answered questions only
(``scoring.metrics``) and carries its bounds: the lowest and highest value it could take whatever
the failed and missing answers turn out to be (``scoring.bounds``), so a failure never raises a
figure. A comparison or rank involving a provisional figure claims a difference only where no
outcome of those answers could overturn it (``scoring.bounds.settle``).

summary.json says ``complete: false`` (per evaluation block, per model and at the top) with the
counts and the bounds beside each provisional figure; the terminal table, the report and ``dxi
view`` mark it (``MARK``) and give its bounds; ``dxi run`` / ``dxi score`` exit non-zero, unless the
user accepted a tolerance (``--allow-failed N|FRACTION``, or ``allow_failed`` in a run file): each
model's evaluation may then have up to N failed or missing answers, or up to that fraction of its
answers. The tolerance accepts the figures over the answered questions as they are (with the count
of failed and missing answers beside them); they stay marked provisional, with their bounds, either
way: it only decides whether the result is *accepted* (the exit code), and it is recorded in
summary.json (``allow_failed``).

Invalid answers are the model's reply (SPEC §6): they never make a figure provisional.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dxi.evals import EVALS

from .adaptive import UNFINISHED, continued_by
from .records import unset

if TYPE_CHECKING:
    from .records import ModelEntry, Summary


@dataclass(frozen=True, slots=True)
class Tolerance:
    """How many failed or missing answers a model's evaluation may have and still be accepted:
    ``answers`` (a count, ≥ 0) or ``fraction`` (of the evaluation's answers, in [0, 1]); exactly one
    is set. Built from the user's value by ``runner.planning.config.allow_failed`` (which validates
    it): ``Tolerance(**d)``."""

    answers: int | None = None
    fraction: float | None = None

    def allows(self, not_answered: int, answers: int) -> bool:
        """Whether ``not_answered`` failed or missing answers out of ``answers`` are within the
        tolerance."""
        if self.answers is not None:
            return not_answered <= self.answers
        return not_answered <= self.fraction * answers

    def describe(self) -> dict:
        """summary.json's ``allow_failed``: ``{"answers": N}`` or ``{"fraction": x}``, per model and
        evaluation."""
        return (
            {"answers": self.answers} if self.answers is not None else {"fraction": self.fraction}
        )


def not_answered(block: dict) -> int:
    """An evaluation block's failed plus missing answers."""
    return block.get("failed", 0) + block.get("missing", 0)


def judge(
    evals: dict[str, dict], answers: dict[str, int], tolerance: Tolerance | None
) -> tuple[bool, bool]:
    """``(complete, accepted)`` of one model from its evaluation blocks (each with ``complete``,
    where it has answers): complete when every block is; accepted when complete or when every
    incomplete block is within ``tolerance`` (None: none accepted). ``answers`` maps evaluation ->
    the answers expected there (questions × epochs), for a fractional tolerance."""
    incomplete = [name for name, block in evals.items() if block.get("complete") is False]
    accepted = tolerance is not None and all(
        tolerance.allows(not_answered(evals[name]), answers.get(name, 0)) for name in incomplete
    )
    return not incomplete, not incomplete or accepted


MARK = "*"
"""The mark after a provisional figure in the terminal table, the report and ``dxi view``."""


def notes(summary: Summary) -> list[str]:
    """What a reader is told about the provisional figures of a summary (plain text, one sentence
    each): per model with failed or missing answers, how many, in which evaluations, that its
    figures are over the answered questions, each provisional figure's bounds (``bounds``) and how
    many answers the next ``dxi run`` requests again (or, where an adaptive run did not finish, that
    rerunning it continues its sequence: how many it asks, its rounds decide); then, when the result
    is not accepted, what to do. Empty when every figure is complete. The terminal prints them under
    the table, the report's banner and ``dxi view``'s overview show them."""
    lines = []
    tolerance = summary.allow_failed
    for m in summary.models:
        if m.complete:
            continue
        blocks = {name: b for name, b in m.evals.items() if b.get("complete") is False}
        failed, missing = (
            sum(b["failed"] for b in blocks.values()),
            sum(b["missing"] for b in blocks.values()),
        )
        rerun = sum(b.get("rerun", 0) for b in blocks.values())
        aside = sum(b.get("set_aside", 0) for b in blocks.values())  # the cache found damaged
        counts = " and ".join(
            t
            for t in (f"{failed} failed" if failed else "", f"{missing} missing" if missing else "")
            if t
        )
        spans = bounds(m)
        # missing because an adaptive run did not finish: its rerun asks what its rounds need
        again = next((c for b in blocks.values() if (c := continued_by(b.get("reason")))), None)
        within = f"; whatever those answers turn out to be, they lie within: {'; '.join(spans)}"
        text = (
            f"{m.model}: provisional ({MARK}): {counts} answer(s) in "
            f"{', '.join(_title(n) for n in blocks)}, left out"
            + (f" ({aside} of the missing set aside as damaged by the cache)" if aside else "")
            + ": its figures are over the answered "
            f"questions{within if spans else ''}; "
            + (
                _rerun(rerun, m)
                if again is None
                else f"{UNFINISHED} ({again}) continues its sequence (how many of them it "
                "asks, its rounds decide)"
            )
        )
        kept = failed + missing - rerun
        if kept:
            text += f" ({kept} deterministic failure(s) are kept: --retry-failed requests them too)"
        if m.within_tolerance is True:
            text += (
                f"; accepted as they are (the figures over the answered questions, {counts} "
                f"answer(s) beside them): within --allow-failed {_tolerance(tolerance)}"
            )
        lines.append(text + ".")
    if lines and not summary.accepted:
        lines.append(
            "The result is provisional: rerun to complete it, or accept the failed and missing answers "
            "explicitly with --allow-failed N (answers per model and evaluation) or a fraction of them."
        )
    return lines


def _rerun(rerun: int, m: ModelEntry) -> str:
    """What the next ``dxi run`` does of a model's ``rerun`` answers: asks for them again, but for
    those in batches still open at the provider, which it (or ``dxi batches collect``) collects
    and does not ask for: a run's own (its ``requests.batches.open``, a run stopped after
    submitting them) or, scoring the cache alone, those the cache's ledger holds
    (``requests.in_open_batches``: their ``answers``, with a model list or without one; or only
    how many ``batches`` a model has open, for a model of the cache that cannot be rebuilt to tell
    which of its answers they hold: ``runner.open_batches.of_cache``)."""
    requests = unset(m.requests) or {}
    held = (requests.get("batches") or {}).get("open") or requests.get("in_open_batches") or {}
    collected = min(rerun, held.get("answers", 0))
    if held.get("batches"):
        return (
            f"the next `dxi run` with these options asks for {rerun} of them again, but for those "
            f"that its {held['batches']} open batch(es) at the provider hold, which `dxi batches "
            "collect` or the next `dxi run` collects (dxi batches list)"
        )
    if not collected:
        return f"the next `dxi run` with these options asks for {rerun} of them again"
    told = (
        f"{collected} of them are in batches still open at the provider, which `dxi batches "
        "collect` or the next `dxi run` collects (it does not ask for them again)"
    )
    return told + (
        f"; it asks for the other {rerun - collected} again" if rerun > collected else ""
    )


def shard_notes(summary: Summary, shard: str) -> list[str]:
    """``notes`` for one shard ("1/3") of a ``dxi run --shard``, whose summary scores every task but
    holds only its own part's answers: per model, whether the requests the shard owns (its
    ``requests`` block: cache hits, sent, not sent, refused) are all answered, or how many are not
    (failed, not sent, refused: a rerun of the shard sends them); the other missing answers are the
    other shards' part, which this shard never sends (``dxi run``'s exit code is 0 when its own
    part is complete)."""
    lines = []
    for m in summary.models:
        r = m.requests or {}
        owned = sum(r.get(k) or 0 for k in ("cache_hits", "sent", "not_sent", "refused"))
        left = {k: r.get(k) or 0 for k in ("failed", "not_sent", "refused")}
        missing = sum(b.get("missing", 0) for b in m.evals.values())
        if not any(left.values()):
            text = f"this shard's part is complete: its {owned} request(s) are answered"
        else:
            counts = ", ".join(f"{n} {k.replace('_', ' ')}" for k, n in left.items() if n)
            text = (
                f"{sum(left.values())} of this shard's {owned} request(s) are not answered "
                f"({counts}): a rerun of this shard sends again those not sent and those that "
                "failed transiently (--retry-failed: the deterministic failures too)"
            )
        if missing:
            text += (
                f"; the other answers missing above ({missing} in all) are the other shards' part, "
                "which this shard never sends: its figures are over its own answers only"
            )
        lines.append(f"shard {shard}: {m.model}: {text}.")
    return lines


def bounds(entry: ModelEntry) -> list[str]:
    """The bounds of a model's provisional figures as text (``summary.json``'s names):
    "decision_index [31.2, 47.9]", then "<evaluation title> <metric> [low, high]" per provisional
    figure, one decimal (low rounded down, high up, so the text never narrows them)."""
    out = []
    if unset(entry.decision_index_bounds) is not None:
        out.append(f"decision_index {span(entry.decision_index_bounds)}")
    for name, block in entry.evals.items():
        for key, value in block.items():
            if key.endswith("_bounds") and value is not None:
                out.append(f"{_title(name)} {key[: -len('_bounds')]} {span(value)}")
    return out


def span(bounds: list[float], digits: int = 1) -> str:
    """Bounds [lowest, highest] as text with ``digits`` decimals, the lowest rounded down and the
    highest up, so the text never narrows them (and a figure shown rounded to the nearest stays
    inside)."""
    scale = 10**digits
    low, high = (round(b * scale, 6) for b in bounds)  # 33.3 * 10 is 332.99999999999994
    return f"[{math.floor(low) / scale:.{digits}f}, {math.ceil(high) / scale:.{digits}f}]"


def _tolerance(tolerance: dict | None) -> str:
    if not tolerance:
        return ""
    return (
        str(tolerance["answers"])
        if tolerance.get("answers") is not None
        else f"{tolerance['fraction']:g}"
    )


def _title(name: str) -> str:
    return EVALS[name].title if name in EVALS else name
