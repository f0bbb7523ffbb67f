"""What a run did, in the blocks summary.json and its line in OUT/run-history.jsonl
(``runner.outputs.history``) record: each model's ``requests`` block (``requests_block``), the
``cost_bound`` block (``bound_block``) and the ``stopped_providers`` blocks
(``runner.sending.stops.stopped_providers``), together a run's ``Counts`` (``counts``), and whether
batches were refused or left requests unanswered (``batch_outcome``). A run that ends scores them
into summary.json (``runner.session.run``); one that a signal stopped once its requests in flight
were stored has them too (``runner.signals.Interrupted.counts``): its line records them, and its
summary.json of what arrived (marked ``interrupted``) when the grace period leaves the time. One
whose stop was cut short (a second signal, the end of ``--grace``) records what was counted by
then (``runner.dispatch.so_far``): the requests abandoned on the wire among those sent, charged
their reservations, and the counts it could not finish named ``incomplete``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dxi.lazy import LazyModule

from .batch.options import BatchStats
from .sending.cost import OPEN_UNBOUNDED, UNBOUNDED
from .sending.stops import stopped_providers

_estimate = LazyModule("dxi.runner.planning.estimate")

if TYPE_CHECKING:
    from .planning.estimate import Estimate
    from .planning.plan import ModelRun
    from .sending.cost import Budget
    from .sending.limits import ProviderLimiter
    from .sending.scheduler import Stats


@dataclass(frozen=True)
class Counts:
    """A run's counts: ``requests`` (model label -> its ``requests`` block), ``cost_bound`` (None
    without ``--max-cost``) and ``stopped`` (the ``stopped_providers`` blocks; [] when none
    stopped)."""

    requests: dict[str, dict]
    cost_bound: dict | None = None
    stopped: list[dict] = field(default_factory=list)

    def extra(self) -> dict:
        """summary.json's blocks beside the models: ``cost_bound`` (with a bound) and
        ``stopped_providers`` (when one stopped)."""
        return ({} if self.cost_bound is None else {"cost_bound": self.cost_bound}) | (
            {"stopped_providers": self.stopped} if self.stopped else {}
        )

    @property
    def abandoned(self) -> tuple[int, float | None, bool]:
        """What a run cut short left on the wire (each model's ``abandoned`` block): the requests,
        what they were charged at most (USD, the priced models'; None: none priced) and whether
        some of that bounds nothing (a model's ``cost_reason`` ``UNBOUNDED``)."""
        gone = [b for b in self.requests.values() if b.get("abandoned")]
        costs = [b["abandoned"]["cost_at_reservation_usd"] for b in gone]
        usd = None if all(c is None for c in costs) else sum(c for c in costs if c is not None)
        unbounded = any("cost_reason" in b for b in gone)  # only ever UNBOUNDED here
        return sum(b["abandoned"]["requests"] for b in gone), usd, unbounded

    @property
    def incomplete(self) -> bool:
        """Whether some model's counts were cut before its rest was counted (``incomplete``)."""
        return any("incomplete" in block for block in self.requests.values())

    @property
    def not_sent(self) -> int:
        """The requests of every model not sent (the next run sends them)."""
        return sum(block["not_sent"] for block in self.requests.values())


def counts(
    stats: Mapping[str, Stats],
    models: list[ModelRun],
    budget: Budget,
    max_cost: float | None,
    limiters: Mapping[str, ProviderLimiter],
    remaining: list[Estimate] | None = None,
) -> Counts:
    """The ``Counts`` of a run of ``models`` from its Stats (label -> Stats), its ``budget`` (the
    ``cost_bound`` block when ``max_cost`` is not None; ``remaining``: what the cost bound left,
    ``runner.planning.estimate``) and its ``limiters`` (limits key -> ProviderLimiter: which
    providers stopped)."""
    on_provider: dict[str, list[str]] = {}
    for m in models:
        on_provider.setdefault(m.limits_key, []).append(m.label)
    stopped = stopped_providers(
        limiters,
        on_provider,
        {label: s.stop_not_sent for label, s in stats.items()},
        {label: s.refused for label, s in stats.items()},
    )
    earlier = sum(getattr(s, "from_earlier_usd", 0.0) for s in stats.values())
    # under a bound every reservation bounds its request (the plan refuses output without a cap)
    held = sum(getattr(s, "open_reserved_usd", 0.0) for s in stats.values())
    bound = None if max_cost is None else bound_block(budget, remaining, earlier, held)
    return Counts(requests_block(stats), bound, stopped)


INCOMPLETE = ("cache_hits", "not_sent")
"""The counts of a model's ``requests`` block that only count what was met when a run cut short
(a second signal, the end of ``--grace``) had not counted its rest: ``sent`` (the abandoned among
it), the outcomes, tokens and cost are whole; ``sent + cache_hits + not_sent + refused`` is then
less than its requests."""


def requests_block(stats: Mapping[str, Stats]) -> dict[str, dict]:
    """summary.json's per-model ``requests`` blocks (label -> counts) from a run's Stats: sent,
    cache hits, outcomes, attempts, retry waits (seconds, 3 decimals), 429s, repairs, tokens, cost
    (USD, 6 decimals; None without a price), not sent and refused; ``cost_at_reservation_usd`` (the
    part of ``cost_usd`` charged at reservation because the cost is unknown: ``cost_usd`` is then an
    upper bound of what was spent) only when it is not 0; ``cost_usd`` null with a ``cost_reason``
    (``UNBOUNDED``) when a reservation kept bounds nothing (``Stats.cost_unbounded``); with batches,
    their ``batches`` block too. A run cut short (a second signal, the end of ``--grace``) adds
    ``abandoned`` ({``requests``, ``cost_at_reservation_usd``}: the requests sent it left on the
    wire, counted in ``sent``, and their part of ``cost_usd``, null where that is) when there are
    some, and ``incomplete`` (``INCOMPLETE``) when the model's rest was not all counted. A run the
    cache stopped (it could not be written) adds ``unstored`` ({``requests``, ``cost_usd``}: replies
    paid for that could not be stored, counted in ``sent`` and ``cost_usd``) when there are some."""
    blocks = {}
    for label, s in stats.items():
        block = {
            "sent": s.sent,
            "cache_hits": s.cache_hits,
            "failed": s.failed,
            "invalid": s.invalid,
            "attempts": s.attempts,
            "retry_wait_s": round(s.retry_wait_s, 3),
            "rate_limited": s.rate_limited,
            "repaired": s.repaired,
            "input_tokens": s.input_tokens,
            "output_tokens": s.output_tokens,
            "cost_usd": None if s.cost_usd is None else round(s.cost_usd, 6),
        }
        at_reservation = round(s.cost_at_reservation_usd, 6)
        if s.cost_usd is not None and s.cost_unbounded:  # no figure bounds what was spent
            block["cost_usd"] = None
            block["cost_reason"] = UNBOUNDED.format(n=s.cost_unbounded)
        elif s.cost_usd is not None and at_reservation:
            block["cost_at_reservation_usd"] = at_reservation
        block |= {"not_sent": s.not_sent, "refused": s.refused}
        if s.abandoned:
            usd = None if block["cost_usd"] is None else round(s.abandoned_usd, 6)
            block["abandoned"] = {"requests": s.abandoned, "cost_at_reservation_usd": usd}
        if s.unstored:  # paid for, but the cache could not store them (a full disk)
            usd = None if block["cost_usd"] is None else round(s.unstored_usd, 6)
            block["unstored"] = {"requests": s.unstored, "cost_usd": usd}
        if s.uncounted:
            block["incomplete"] = list(INCOMPLETE)
        if isinstance(s, BatchStats):
            block["batches"] = {
                "submitted": s.submitted,
                "collected": s.collected,
                "running": len(s.running),
                "given_back": s.given_back,
                "from_earlier_runs": s.from_earlier,
                "from_earlier_runs_usd": (
                    None if s.cost_usd is None else round(s.from_earlier_usd, 6)
                ),
                "unknown_results": s.unknown_results,
                "duplicate_results": s.duplicate_results,
                "unanswered": s.unanswered,
            }
            if s.earlier_entries:  # whose batches: their runs' lines list them under ``open``
                block["batches"]["from_earlier_entries"] = sorted(s.earlier_entries)
            if s.open_requests:  # committed under this run's bound; collected by a later run
                usd = None if s.cost_usd is None else round(s.open_reserved_usd, 6)
                block["batches"]["open"] = {
                    "entries": sorted(s.open_entries),
                    "requests": s.open_requests,
                    "answers": s.open_answers,
                    "reserved_usd": usd,
                }
                if usd is not None and s.open_unbounded:  # their input alone: no bound
                    block["batches"]["open"] |= {
                        "reserved_usd": None,
                        "input_usd": usd,
                        "cost_reason": OPEN_UNBOUNDED,
                    }
        blocks[label] = block
    return blocks


def batch_outcome(stats: Mapping[str, Stats]) -> tuple[bool, bool]:
    """(a batch API refused some model's batches, batches left some model's requests unanswered: the
    deadline without ``--deadline-fallback sync``, or the cost bound)."""
    batched = [s for s in stats.values() if isinstance(s, BatchStats)]
    return any(s.stopped for s in batched), any(
        not s.stopped and (s.not_sent or s.unanswered) for s in batched
    )


def bound_block(
    budget: Budget, remaining: list[Estimate] | None, earlier: float = 0.0, held: float = 0.0
) -> dict:
    """summary.json's ``cost_bound``: the bound, what this run spent (``cost_at_reservation_usd``:
    the part of it charged at reservation because the cost is unknown, ``Budget.keep``, only when
    not 0, as in a model's ``requests`` block), whether it stopped, ``spent_by_all_usd`` for a
    bound shared through ``--coordinator``, what remains; ``earlier_batches_usd`` when this run
    collected batches an earlier run submitted (``earlier``: what their answers cost, paid under
    that run's bound, not this one's); ``open_batches_usd`` when this run left batches open (a
    stop: ``held``, what their reservations held under this bound, at most their cost; not in
    ``spent_usd``: the run that collects them records what they cost in its
    ``earlier_batches_usd``)."""
    block: dict = {"max_cost_usd": budget.max_usd, "spent_usd": round(budget.spent, 6)}
    at_reservation = round(budget.spent_at_reservation, 6)
    if at_reservation:
        block["cost_at_reservation_usd"] = at_reservation
    block["stopped"] = budget.stopped
    if budget.spent_by_all_usd is not None:  # a bound shared through --coordinator
        block["spent_by_all_usd"] = round(budget.spent_by_all_usd, 6)
    if earlier:
        block["earlier_batches_usd"] = round(earlier, 6)
    if held:
        block["open_batches_usd"] = round(held, 6)
    if remaining is not None:
        total = _estimate.totals(remaining)
        block |= {
            "remaining_requests": total["new"],
            "remaining_cost_usd": total["cost_usd"],
            "remaining_bound_usd": total["bound_usd"],
        }
    return block
