"""The processes' side of ``--coordinator``: a limiter and a cost budget whose state is in Redis
(``runner.distributed.coordinator``: the connection, the calls, the shares and the fallback; its
module docstring says what is shared and how).

``SharedLimiter`` is a ``runner.sending.limits.ProviderLimiter`` whose pacing, pause, narrowed rates
and in-flight slots go through the coordinator; ``SharedBudget`` a ``runner.sending.cost.Budget``
whose bound holds for every process of the run. Both take the local path of their base class while
the coordinator is down. They are made by ``limiters`` and ``budget`` here, which register them with
their ``Coordinator`` (this module imports the coordinator; the coordinator never imports this
module).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from dxi.adapters import AdapterError, Limits, RateLimited, Request

from ..outputs import amounts
from ..planning.shard import divide
from ..sending.cost import Budget, CostBoundReached
from ..sending.limits import BACKOFF, RECOVERY_S, ProviderLimiter, Ticket
from . import coordinator as hub
from .coordinator import POLL_S, Coordinator, _Down


@dataclass(slots=True)
class SharedTicket(Ticket):
    """A Ticket booked in Redis: its slot's lease ``member``, ``booked_at`` on Redis's clock,
    ``token_rate`` the shared rate it used."""

    member: str = ""
    booked_at: float = 0.0
    token_rate: float = 0.0


class SharedLimiter(ProviderLimiter):
    """A ProviderLimiter whose pacing, pause, narrowed rates and in-flight slots are shared through
    the coordinator (see the module docstring): each attempt takes a slot in Redis and gives it back
    when it ends. Its admission ``slots`` stay this process's own (``max_in_flight``: they bound its
    queue, not what is sent). While the coordinator is down it is a local ProviderLimiter with 1/N
    of the limits (``fallback``)."""

    def __init__(self, limits: Limits, coordinator: Coordinator, limits_key: str):
        super().__init__(limits)
        self.c, self.limits_key = coordinator, limits_key
        self.hash = coordinator.key("provider", limits_key)
        self.slots_key = coordinator.key("slots", limits_key)
        self.fallback = ProviderLimiter(divide(limits, coordinator.shares))
        self.size = max(1, limits.max_in_flight)
        self._ceilings = (
            limits.rpm / 60 if limits.rpm else 0.0,
            limits.tpm / 60 if limits.tpm else 0.0,
        )

    def _args(self, member: str) -> list:
        return [self.limits_key, self.size, member, self.c.lease_s, *self._ceilings]

    def pause(self, seconds: float) -> None:
        super().pause(seconds)
        self.fallback.pause(seconds)
        self.c.later("pause", [self.limits_key, seconds])

    def paused_by_other(self, seconds: float) -> None:
        """Another process paused the provider (a 429's stated wait): hold this one's attempts
        too."""
        ProviderLimiter.pause(self, seconds)

    def halt(self, error) -> None:
        """Stop this provider (``ProviderLimiter.halt``), the fallback used while Redis is down
        included."""
        super().halt(error)
        self.fallback.halt(error)

    def close(self) -> None:
        """The run is stopping (``ProviderLimiter.close``), the fallback used while Redis is down
        included."""
        super().close()
        self.fallback.close()

    def give_back(self, member: str) -> None:
        """A slot handed to a waiter that gave up: back to Redis (and on to the next waiter)."""
        self.c.later("release", [*self._args(member), RECOVERY_S])

    async def acquire(self, request: Request) -> Ticket:
        while True:
            if await self.c.mode() == "local":
                return await self.fallback.acquire(request)
            try:
                return await self._shared(request)
            except _Down:
                continue

    async def _shared(self, request: Request) -> SharedTicket:
        await self._unpaused()
        await self.window.acquire()
        size = len(request.body)
        try:
            while True:
                cost = self.estimate(
                    size
                )  # booked only where there is a token rate (configured or stated)
                wait, booked_at, rate, member = await self._slot(cost)
                if wait > 0:
                    await self.sleep(
                        wait
                    )  # ends at once when the provider is stopped (halt) or the run stops
                if (
                    not self.ending and self._paused_until > time.monotonic()
                ):  # a 429 came in meanwhile:
                    self.give_back(member)  # book again after it
                    self.c.drop(self.slots_key, member)
                    await self._unpaused()
                    continue
                return SharedTicket(time.monotonic(), size, cost, member, booked_at, rate)
        except BaseException:
            self.window.release()
            raise

    async def _slot(self, cost: float) -> tuple[float, float, float, str]:
        """Take a slot in Redis (waiting in its queue for one to be handed over): (seconds to wait
        for its booked turn, Redis's time of the booking, the token rate used, the slot's member).
        Raises _Down when Redis fails meanwhile."""
        member = f"{self.c.member}/{uuid.uuid4().hex[:8]}"
        fut = self.c.expect(member, self.limits_key)
        try:
            answer = await self.c.call("acquire", [*self._args(member), cost, RECOVERY_S])
            if int(answer[0]) == 1:
                self.c.forget(member)
                wait, booked_at, rate = float(answer[1]), float(answer[2]), float(answer[3])
            else:
                wait, booked_at, rate = await self._handed(member, fut)
        except hub._REDIS_ERRORS as exc:
            self.c.forget(member)
            self.c.fail(exc)
            raise _Down from None
        except asyncio.CancelledError:
            self.c.forget(member)
            self.c.later(
                "cancel", [*self._args(member), RECOVERY_S]
            )  # out of the queue, or its slot back
            raise
        self.c.hold(self.slots_key, member)
        return wait, booked_at, rate, member

    async def _handed(self, member: str, fut: asyncio.Future) -> tuple[float, float, float]:
        """Wait for ``member``'s hand-over; every ``lease/2`` seconds without one, ask Redis (a
        message lost)."""
        while True:
            try:
                return await asyncio.wait_for(
                    asyncio.shield(fut), max(1.0, min(5.0, self.c.lease_s / 2))
                )
            except TimeoutError:
                pass
            state = await self.c.call("check", [*self._args(member), RECOVERY_S])
            if isinstance(state, bytes):
                self.c.forget(member)
                wait, booked_at, rate = (float(x) for x in state.decode().split())
                return wait, booked_at, rate
            if int(state) < 0:  # neither queued nor handed a slot (Redis restarted): queued again
                answer = await self.c.call("acquire", [*self._args(member), 0, RECOVERY_S])
                if int(answer[0]) == 1:
                    self.c.forget(member)
                    return float(answer[1]), float(answer[2]), float(answer[3])

    def finish(
        self,
        ticket: Ticket,
        ok: bool,
        error: AdapterError | None = None,
        input_tokens: int | None = None,
        output_tokens: int | None = None,
    ) -> None:
        if not isinstance(ticket, SharedTicket):
            self.fallback.finish(ticket, ok, error, input_tokens, output_tokens)
            return
        self.window.release()
        self.c.drop(self.slots_key, ticket.member)
        self.c.later("release", [*self._args(ticket.member), RECOVERY_S])
        if ok:
            # as ProviderLimiter.finish: a provider that has answered is not stopped by one 400
            self.replies += 1
            w = self.window
            if w.size < self.limits.max_in_flight:
                w.resize(min(float(self.limits.max_in_flight), w.size + 1 / w.size))
            if input_tokens is not None:
                if ticket.token_rate > 0:
                    self.c.later(
                        "correct",
                        [
                            self.limits_key,
                            input_tokens + (output_tokens or 0) - ticket.tokens,
                            self._ceilings[1],
                            RECOVERY_S,
                        ],
                    )
                self.estimate.observe(ticket.body_bytes, input_tokens, output_tokens)
            return
        if not isinstance(error, RateLimited):
            return
        self.rate_limited += 1
        self.c.later(
            "rate_limited",
            [
                self.limits_key,
                ticket.booked_at,
                error.rpm or 0,
                error.tpm or 0,
                *self._ceilings,
                RECOVERY_S,
            ],
        )
        if (
            ticket.sent_at >= self._decreased_at
        ):  # this process's window: once per round of 429s, as locally
            self._decreased_at = time.monotonic()
            if not (error.rpm or error.tpm):
                self.decreases += 1
                self.window.resize(self.window.size * BACKOFF)
        if error.retry_after is not None and error.retry_after <= self.limits.max_stated_wait_s:
            self.pause(
                error.retry_after
            )  # honoured exactly, as ProviderLimiter.finish; a longer wait stops the provider


class SharedBudget(Budget):
    """A Budget whose bound holds for every process of the run (spend and reservations in Redis);
    ``spent`` is still this process's own. While the coordinator is down: a local Budget of its
    share (``share``; ``local_in_flight`` counts its local reservations)."""

    def __init__(self, max_usd: float | None, coordinator: Coordinator):
        super().__init__(max_usd)
        self.c = coordinator
        self.bound = (
            max_usd  # the whole bound (``max_usd`` is this process's share while it is on its own)
        )
        self.keys = [
            coordinator.key("cost"),
            coordinator.key("reservations"),
            coordinator.key("amounts"),
        ]
        self._members: list[tuple[str, float]] = []
        self._unsettled: list[
            str
        ] = []  # reservations in Redis whose attempts ended while it was out
        self.local_in_flight = 0
        self._share: float | None = (
            None  # this fall's (``share``), fixed at its first local reservation
        )

    def share(self) -> float:
        """What this process may have spent and reserved in all while it is on its own (USD; fixed
        at the first local reservation of each fall): ``min(bound/N, held + (bound - others -
        held)/N)``, ``held`` its own spend and reservations, ``others`` what the bound held for the
        other processes as the last answer from Redis said (``Coordinator.others_usd``: their spend
        and reservations, and the shares held back for the shards out; every call answers it, the
        heartbeat's every 2 s). The room the bound leaves, ``bound - others - held``, is the same
        for every shard that falls back, and each takes 1/N of it: when all fall back at once they
        spend together at most the bound, but for 1/N of what the others reserved in Redis after
        each last heard from it and before Redis held back its share (docs/distributed.md).
        ``bound/N`` less its own spend alone was not enough: a shard that had spent past its 1/N
        through Redis kept it, and every other still took its whole 1/N (two shards that had spent
        $0.80 and $0.10 of $1 went on to $1.30)."""
        held, n = self.spent + self.reserved, self.c.shares
        return min(self.bound / n, held + (self.bound - self.c.others_usd - held) / n)

    def rejoin(self) -> None:
        """Back on Redis: the whole bound again (shared). First Redis is told (``restore``) what
        this process spent that it does not count (what it spent on its own while out; all of it
        when Redis lost the run's keys, restarted empty) and its reservations in flight it lost;
        the reservations of attempts that ended while it was out are settled there at nothing (what
        they cost is in what it spent). So the spend a restarted Redis lost comes back from every
        process that rejoins, and a rejoining process never gets room that was spent."""
        self.max_usd = self.bound
        self._share = None
        held = [(member, usd) for member, usd in self._members if member]
        self.c.later(
            "restore",
            [self.spent, self.c.lease_s, len(held), *(x for pair in held for x in pair)],
        )
        for member in self._unsettled:
            self.c.later("settle", [member, 0])
        self._unsettled = []

    async def reserve(self, usd: float) -> float:
        if self.bound is None:  # no bound to share: nothing to ask Redis
            return await super().reserve(usd)
        delay = POLL_S
        while await self.c.mode(turn_taken=True) == "shared":
            member = f"{self.c.member}/{uuid.uuid4().hex[:8]}"
            try:
                answer = int(
                    await self.c.call("reserve", [usd, self.bound, member, self.c.lease_s])
                )
            except hub._REDIS_ERRORS as exc:
                self.c.fail(exc)
                break
            except asyncio.CancelledError:
                self.c.later("settle", [member, 0])  # the script may have run: nothing was sent
                raise
            if answer == 1:
                self.c.hold(self.keys[1], member)
                self._members.append((member, usd))
                self.reserved += usd
                self.in_flight += 1
                return usd
            if answer == -2:
                self.stopped = True
                raise CostBoundReached(
                    f"the cost bound of {amounts.usd(self.bound)} leaves no room for another request within the "
                    f"shares of the shards reaching the coordinator (each shard of {self.c.shares} "
                    "out of reach keeps its share)"
                )
            if answer < 0 or self.stopped:
                self.stopped = True
                raise CostBoundReached(
                    f"the cost bound of {amounts.usd(self.bound)} (for every process of the run) leaves "
                    "no room for another request"
                )
            await asyncio.sleep(delay)
            delay = min(1.0, delay * 1.5)
        if await self.c.mode(turn_taken=True) != "local":  # rejoined meanwhile
            return await self.reserve(usd)
        if self._share is None:  # on its own: its share (``share``), fixed for this fall
            self._share = self.share()
        self.max_usd = self._share
        reserved = await super().reserve(usd)
        self.local_in_flight += 1
        self._members.append(("", usd))
        return reserved

    def settle(self, reserved: float, actual: float) -> None:
        for i, (member, usd) in enumerate(self._members):
            if usd == reserved:
                del self._members[i]
                if member:
                    self.c.drop(self.keys[1], member)
                    if self.c.down:
                        self._unsettled.append(member)
                    self.c.later("settle", [member, actual])
                else:
                    self.local_in_flight -= 1
                break
        super().settle(reserved, actual)

    async def spent_by_all(self) -> float | None:
        """What every process of the run has spent (USD), or None if Redis cannot say."""
        if self.c.down or self.c._client is None:
            return None
        try:
            value = await self.c._client.hget(self.keys[0], "spent")
        except hub._REDIS_ERRORS:
            return None
        return float(value or 0)


def limiters(coordinator: Coordinator, models: Sequence) -> dict[str, ProviderLimiter]:
    """A SharedLimiter per limits key of ``models`` (``runner.planning.plan.ModelRun``), for the
    scheduler's ``run(limiters=)``, each registered with ``coordinator`` (``Coordinator.limiters``:
    the other processes' events reach it there). Called inside the event loop: the coordinator's
    background work (``Coordinator.start``) begins."""
    coordinator.start_soon()
    for m in models:
        if m.limits_key not in coordinator.limiters:
            coordinator.limiters[m.limits_key] = SharedLimiter(
                m.adapter.limits, coordinator, m.limits_key
            )
    return dict(coordinator.limiters)


def budget(coordinator: Coordinator, max_usd: float | None) -> SharedBudget:
    """The run's cost bound (``max_usd``, USD; None: none) shared through ``coordinator``,
    registered with it (``Coordinator.budget``)."""
    coordinator.budget = SharedBudget(max_usd, coordinator)
    return coordinator.budget
