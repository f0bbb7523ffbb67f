"""The cost bound (``--max-cost USD``, a run file's ``max_cost``): spent plus in-flight cost never
passes it.

Per attempt (``runner.sending.retry``): before it is sent, an **upper bound** of its cost is
reserved — ``runner.planning.tokens.input_bound`` input tokens (the body's UTF-8 bytes, plus what
the provider adds unseen) and ``Adapter.output_tokens_bound`` output tokens (the request's
``max_tokens`` or the like), at the model's price (input tokens at the highest price one can cost: a
cache write's, when it is above the input price, ``scoring.cost.max_input_price``). When the attempt
ends the reservation is released and its actual cost added to what was spent:

* a reply that reports its usage: that usage at the model's price (``scoring.cost``: its input
  tokens read from or written to the provider's prompt cache at their own prices);
* a reply without usage, or no reply at all (a timeout, a connection dropped once it was open, a
  body that is not the wire format: the provider may have billed a reply that never arrived): the
  reservation, kept as spent (an upper bound, "at most"); without a bound, a model whose priced
  output has no cap reserves none of its output, so there the reservation is no bound at all and
  the attempt's cost is unknown (``Settled.bounded`` False: no figure says "at most" of it, as
  ``dxi estimate`` gives no "at most" for such a model);
* an HTTP error status (429, 5xx, 4xx): nothing (providers do not bill an error); an error inside a
  200 (``adapters.ErrorIn200``) was generated and is billed: the usage it states, as a reply's
  (the reservation when it states none, or none credible);
* no connection opened (``adapters.Unreachable``: refused, no route, a name that does not resolve,
  none within the connect timeout): nothing (the request never left).

When a reservation would make spent + reserved pass the bound, the attempt waits for attempts in
flight to settle (their actual cost is usually far below their reservation) and tries again; once
nothing is in flight and it still does not fit, ``CostBoundReached`` is raised and the budget is
``stopped``: the runner dispatches nothing more, lets the attempts in flight finish, and keeps
everything that arrived. So a run stops within one request's cost bound of the bound, never above
it. The bound is per invocation: what earlier runs spent (their replies are in the cache and are not
sent again) does not count against it.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections import Counter
from dataclasses import dataclass, replace
from typing import NamedTuple

from dxi.adapters import Adapter, AdapterError, ErrorIn200, Reply, Request, Unreachable
from dxi.evals import Task

from ..outputs import amounts
from ..planning.tokens import input_bound


class CostBoundReached(Exception):  # noqa: N818 (a stop, not an error)
    """The cost bound leaves no room for this attempt; it was not sent."""


class Budget:
    """What one invocation has spent and reserved (USD), under an optional bound ``max_usd``."""

    def __init__(self, max_usd: float | None = None):
        self.max_usd = max_usd
        self.spent = 0.0
        self.spent_at_reservation = (
            0.0  # the part of ``spent`` that is reservations kept (``keep``)
        )
        self.reserved = 0.0
        self.in_flight = 0  # attempts holding a reservation
        self.stopped = False
        # a bound shared by the processes of a run (``--coordinator``): what they all spent, as
        # Redis counted it when this one ended (None: not shared, or Redis could not say)
        self.spent_by_all_usd: float | None = None
        self._waiters: list[asyncio.Future[None]] = []

    def fits(self, usd: float) -> bool:
        return self.max_usd is None or self.spent + self.reserved + usd <= self.max_usd

    async def reserve(self, usd: float) -> float:
        """Reserve ``usd`` for an attempt about to be sent, waiting while attempts in flight may
        still free room; raises CostBoundReached (and stops the budget) when it cannot fit even with
        nothing in flight, or the budget has stopped already."""
        while not self.stopped and not self.fits(usd) and self.in_flight:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            await waiter
        if self.stopped or not self.fits(usd):
            self.stopped = True
            for w in self._waiters:  # the others stop too
                if not w.done():
                    w.set_result(None)
            raise CostBoundReached(
                f"the cost bound of {amounts.usd(self.max_usd)} leaves no room for another request"
            )
        self.reserved += usd
        self.in_flight += 1
        return usd

    def settle(self, reserved: float, actual: float) -> None:
        """An attempt ended: release its reservation, add its ``actual`` cost to what was spent."""
        self.in_flight -= 1
        self.reserved = max(0.0, self.reserved - reserved) if self.in_flight else 0.0
        self.spent += actual
        waiters, self._waiters = self._waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)

    def keep(self, reserved: float) -> None:
        """An attempt ended whose cost is unknown: its reservation kept as spent (``settle``), and
        counted in ``spent_at_reservation`` (what was spent is at most that)."""
        self.settle(reserved, reserved)
        self.spent_at_reservation += reserved


UNBOUNDED = (
    "the cost of {n} request(s) is unknown, with no upper bound: no usage came for them (a reply "
    "without usage, or none whole) and nothing caps their output tokens (max_completion_tokens, "
    "max_tokens, maxOutputTokens: give one, as --max-cost requires)"
)
"""The ``cost_reason`` of a model's ``requests`` cost when ``n`` attempts were settled at a
reservation that bounds nothing (``Settled.bounded`` False)."""

OPEN_UNBOUNDED = (
    "their output is not bounded (no --max-cost, no output cap: max_completion_tokens, "
    "max_tokens, maxOutputTokens)"
)
"""What a run's batches left open hold when some of their reservations leave out output nothing
caps (``Charge.is_bound`` False, allowed without ``--max-cost`` alone): those reservations hold
their input alone, so no figure says "at most" of what the batches cost."""


MAX_COUNT = 2**63 - 1  # the cache's token columns are 64-bit integers
MAX_REPLY_OUTPUT = 1_048_576
"""The most output tokens one reply is believed to hold when nothing in its request caps them
(``incredible``): 1,048,576, the largest context window the providers document for their models
(Gemini 2.5 Pro, GPT-4.1: 1,048,576 tokens), which holds a reply's input and output together, so no
reply of theirs can carry more output; 8 times the largest documented maximum output of a reply
(128,000: OpenAI's GPT-5 models, and every current Claude model, ``adapters.budgets``; Gemini's is
65,536), so a model that doubles it twice is still believed. Past it a count is a broken or hostile
server's, as past a request's own cap."""
_INPUTS = ("input_tokens", "cached_input_tokens", "cache_write_tokens", "cache_write_1h_tokens")
log = logging.getLogger("dxi.cost")


def incredible(reply: Reply, adapter: Adapter, task: Task, request: Request) -> str | None:
    """Why ``reply``'s usage cannot be what ``request`` cost, or None when it can: an input count
    (input, cached, cache writes) past ``input_bound`` of the request (its body's bytes plus what
    the provider adds unseen: a token is at least a byte), or output tokens past the request's own
    past ``MAX_REPLY_OUTPUT`` (more than any provider's model can write in one reply; past the
    request's own cap but not that is ``over_cap``, believed), or any count
    past a 64-bit integer (the cache's columns), or counts no reply can state
    (``Reply.usage_problem``: a count stated that is not one, a string, null, Infinity;
    ``scoring.cost.inconsistent``: below 0, input without output, more cached input than input)."""
    return _incredible(reply, adapter, _Bounds.of(adapter, task, request))


class _Bounds(NamedTuple):
    """What one request's usage is held to: ``body`` its body's bytes, ``limit`` its input tokens'
    ``input_bound``, ``cap`` its own output cap (``Adapter.output_tokens_bound``; None: none)."""

    body: int
    limit: int
    cap: int | None

    @classmethod
    def of(cls, adapter: Adapter, task: Task, request: Request) -> _Bounds:
        body = len(request.body)
        return cls(
            body, input_bound(body, adapter.HIDDEN_INPUT_TOKENS), adapter.output_tokens_bound(task)
        )


_scoring_cost = None  # dxi.scoring.cost once imported: not at start-up (it brings Polars)


def _incredible(reply: Reply, adapter: Adapter, bounds: _Bounds) -> str | None:
    """``incredible`` with the request's ``bounds`` computed once (``credible`` needs them
    again)."""
    global _scoring_cost
    if _scoring_cost is None:
        # the package first, then its module (``from dxi.scoring.cost import`` locks them the other
        # way round, a deadlock with a thread importing the package meanwhile: ``prepare_scoring``)
        from dxi.scoring import cost as scoring_cost

        _scoring_cost = scoring_cost
    if reply.usage_problem is not None:
        return f"not a count of tokens: {reply.usage_problem}"
    usage = {c: getattr(reply, c) for c in _scoring_cost.USAGE_COLUMNS}
    if (why := _scoring_cost.inconsistent(usage)) is not None:
        return why
    limit = bounds.limit
    for name in _INPUTS:
        count = usage[name]
        if count is not None and adapter.OWN_PROMPT and count > max(limit, MAX_REPLY_OUTPUT):
            return f"{name} {count} > {MAX_REPLY_OUTPUT:,}, more than any model's context holds"
        if count is not None and not adapter.OWN_PROMPT and count > limit:
            return f"{name} {count} > {limit}, the most its {bounds.body}-byte request can hold"
    out, cap = reply.output_tokens, bounds.cap
    if out is not None and out > max(cap or 0, MAX_REPLY_OUTPUT):
        capped = "nothing caps this request's output" if cap is None else f"its own cap is {cap}"
        return (
            f"output_tokens {out} > {MAX_REPLY_OUTPUT:,}, more than any provider's model writes in "
            f"one reply ({capped})"
        )
    if out is not None and out > MAX_COUNT:
        return f"output_tokens {out} > {MAX_COUNT}"
    return None


def over_cap(reply: Reply, cap: int | None) -> str | None:
    """Why ``reply``'s output tokens pass the request's own cap ``cap``
    (``Adapter.output_tokens_bound``; None: none), or None: a provider whose cap leaves out its
    reasoning (DeepSeek's reasoner: ``max_tokens`` caps the final answer, the reasoning billed on
    top) states more than the cap and is billed it."""
    out = reply.output_tokens
    if out is not None and cap is not None and out > cap:
        return f"output_tokens {out} > {cap}, the request's own cap"
    return None


def past_body(reply: Reply, adapter: Adapter, limit: int) -> bool:
    """Whether ``reply``'s input tokens pass ``limit``, its request's ``input_bound``, on a server
    that adds a prompt of its own (``Adapter.OWN_PROMPT``: a System One server's template), as it
    may: believed, without a warning, and charged at least the reservation (``Reply.over_cap``)."""
    return adapter.OWN_PROMPT and (reply.input_tokens or 0) > limit


_WARNED: weakref.WeakKeyDictionary[Adapter, Counter[str]] = weakref.WeakKeyDictionary()
"""How many replies of each model (its adapter: one a run) ``_warn`` was told of, per kind."""


def _warn(adapter: Adapter, kind: str, text: str) -> None:
    """Warn of a reply's usage (``text``) once per model and ``kind`` in a run, then again at its
    10th, 100th, 1000th ... such reply with that count: a model whose every reply says so writes a
    few lines, not one a reply."""
    seen = _WARNED.setdefault(adapter, Counter())
    seen[kind] += 1
    n = seen[kind]
    if n == 1:
        log.warning("%s", text)
    elif n == 10 ** (len(str(n)) - 1):
        log.warning("%s (the %s such reply of %s)", text, f"{n:,}th", adapter.label)


def credible(reply: Reply, adapter: Adapter, task: Task, request: Request) -> Reply:
    """``reply``, without its usage (every count None) when it is not credible (``incredible``:
    a broken or hostile server's usage): its cost is then unknown, charged and recorded as a reply
    without usage is (at most its reservation; ``Charge.settle``), with a warning, never as the
    absurd figure reported (nor a count the cache cannot hold). Output past the request's own cap
    but plausible (``over_cap``): the usage kept, marked ``over_cap`` (charged the larger of it and
    the reservation), with a warning."""
    bounds = _Bounds.of(adapter, task, request)
    why = _incredible(reply, adapter, bounds)
    if why is None and (past := over_cap(reply, bounds.cap)) is not None:
        _warn(
            adapter,
            "over_cap",
            f"{adapter.label}: a reply's output passes its request's own cap ({past}): its usage is "
            "kept, and charged at least its reservation",
        )
        return replace(reply, over_cap=True)
    if why is None:
        return replace(reply, over_cap=True) if past_body(reply, adapter, bounds.limit) else reply
    _warn(
        adapter,
        "incredible",
        f"{adapter.label}: a reply's usage is not credible ({why}): not kept, its cost is unknown",
    )
    return replace(reply, **dict.fromkeys(_scoring_cost.USAGE_COLUMNS))


class Settled(NamedTuple):
    """What ``Charge.settle`` charged an attempt: ``usd``, and ``at_reservation`` whether that is
    its reservation because its cost is unknown (no usage reported, 0 tokens at a price, or no
    reply): an upper bound of what it cost, not a cost known; unless ``bounded`` is False: the
    reservation left out output that nothing caps (``Charge.is_bound``), so it bounds nothing."""

    usd: float
    at_reservation: bool = False
    bounded: bool = True


@dataclass(frozen=True)
class Charge:
    """How one model's attempts are charged to the budget: ``price`` the price tuple of
    ``scoring.cost`` (USD per million input, output, ... tokens); None: the model has no price
    (allowed only without a bound; its cost is not tracked)."""

    budget: Budget
    price: tuple[float | None, ...] | None

    def bound(self, adapter: Adapter, task: Task, request: Request) -> float:
        """The most one attempt of ``request`` can cost at this price (USD; 0 without a price): what
        ``reserve`` reserves. ValueError for priced output without a cap under a bound."""
        if self.price is None:
            return 0.0
        from dxi.scoring import (
            cost_usd,  # imported for priced models only: start-up does without Polars
        )
        from dxi.scoring.cost import max_input_price

        out = self._output_bound(adapter, task)
        if out is None and self.budget.max_usd is None:
            # no bound to keep: nothing to reserve for the uncapped output (it is settled from the
            # usage)
            out = 0
        if out is None:
            raise ValueError(f"{adapter.label}: no cap on output tokens under a cost bound")
        return cost_usd(
            input_bound(len(request.body), adapter.HIDDEN_INPUT_TOKENS),
            out,
            max_input_price(self.price),
            self.price[1],
        )

    def _output_bound(self, adapter: Adapter, task: Task) -> int | None:
        """The output tokens ``bound`` reserves (priced ones only: 0 when output is free); None
        when nothing caps them."""
        return adapter.output_tokens_bound(task) if self.price and self.price[1] else 0

    def is_bound(self, adapter: Adapter, task: Task) -> bool:
        """Whether ``bound`` is an upper bound of an attempt's cost: False only for priced output
        without a cap, which ``bound`` leaves out (allowed without a cost bound alone)."""
        return self._output_bound(adapter, task) is not None

    async def reserve(self, adapter: Adapter, task: Task, request: Request) -> float:
        """Reserve the attempt's cost bound (``bound``; see the module docstring); returns it.
        Raises CostBoundReached. A model with output tokens priced but no cap on them cannot run
        under a bound (``runner.planning.plan`` refuses it before the run starts)."""
        return await self.budget.reserve(self.bound(adapter, task, request))

    def settle(
        self,
        reserved: float,
        reply: Reply | None,
        error: AdapterError | None,
        bounded: bool = True,
    ) -> Settled:
        """Settle an attempt that ended with ``reply`` or ``error``; returns what it was charged
        (``Settled``, USD): the usage the reply reports where its cost is known
        (``scoring.cost.known_cost``, the rule the summary and ``dxi view`` price a request by); its
        reservation when it is not (no usage reported, or 0 input tokens at a price: a server that
        counts no tokens, which settled at $0 would let such a priced model spend past the bound);
        nothing for an HTTP error status nor for an attempt that never connected (``Unreachable``);
        a reply whose output passes its cap (``Reply.over_cap``): the larger of its usage's cost
        and the reservation (the reservation ``at_reservation``).
        An error inside a 200 (``ErrorIn200``) was generated and is billed: ``reply`` is then the
        usage it states (credible), else None, and it is charged as a reply is.
        Only the reservation kept is ``at_reservation`` (the records say "at most" of it), and not
        ``bounded`` when ``bounded`` (``is_bound`` of the attempt) is False."""
        known = None
        if reply is not None and self.price is not None:
            from dxi.scoring.cost import USAGE_COLUMNS, known_cost

            known = known_cost({c: getattr(reply, c) for c in USAGE_COLUMNS}, self.price)
        if self.price is None:
            actual = 0.0
        elif known is not None and not (reply is not None and reply.over_cap and known < reserved):
            actual = known  # past its cap (``over_cap``): the larger of it and the reservation
        elif reply is None and (
            isinstance(error, Unreachable)
            or (
                error is not None and error.status is not None and not isinstance(error, ErrorIn200)
            )
        ):  # an HTTP error status, or the request never left
            actual = 0.0
        else:
            self.budget.keep(reserved)
            return Settled(reserved, True, bounded)
        self.budget.settle(reserved, actual)
        return Settled(actual)
