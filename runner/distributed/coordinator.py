"""Shared limits and cost through Redis: ``--coordinator redis://HOST:PORT/DB`` (the ``distributed``
extra).

Every process of a run (the shards of a job array, or several processes on one shard) shares, per
limits key (``ModelRun.limits_key``):

* **pacing**: the same GCRA booking as ``runner.sending.limits`` (each attempt books the next free
  instant at the current rate, requests and tokens), done atomically in a Lua script on Redis's
  clock, so N processes together keep to the provider's rate as one would;
* **the in-flight slots** (``Limits.max_in_flight`` for all processes together): an attempt takes a
  slot (a lease in a sorted set, renewed by its holder's heartbeat) before it is sent and gives it
  back when it ends, so every process makes progress; when none is free it queues in Redis, first
  come first served, and the process that gives a slot back hands it (booked) to the head of the
  queue, telling the waiter's process through its pub/sub channel: no polling. A dead process's
  slots come back when their leases end (``?lease=SECONDS`` in the URI, default 30);
* **the pause a 429 states** (``Retry-After`` and the like), told to every process at once
  (pub/sub);
* **the narrowed rate after 429s** (× ``runner.sending.limits.BACKOFF`` once per round of 429s,
  recovering linearly over ``RECOVERY_S``) and a limit a 429's headers state;
* **the spend under ``--max-cost``**: reservations and spend are kept in Redis; an attempt reserves
  its cost bound there, and once the bound leaves no room with nothing in flight anywhere, every
  process stops. A dead process's reservations are counted as spent when their leases end (it may
  have been billed).

**Shares.** Each process keeps its shard alive in Redis (a member per shard, refreshed by every call
and a heartbeat every ``HEARTBEAT_S``; it lapses ``MEMBER_TTL`` seconds after the last). The shards
in Redis use ``f = (shards alive + shards done) / N`` of each limit together (rates, slots; of the
cost bound, all but the shares of the shards out, less what those spent through Redis): a shard that
is out (not started yet, unable to reach Redis, partitioned, dead) leaves its 1/N unused, because it
may be sending on its own. So the aggregate never exceeds a limit whatever mix of shards reaches
Redis (the cost bound: but for what ``SharedBudget.share`` says, when every shard falls back).

**Falling back and rejoining.** A process that cannot reach Redis (at start, or when a call fails)
falls back, with a warning, to 1/N of each limit and of the cost bound (N from ``--shard``; of the
bound, no more than 1/N of what it leaves beyond what every process spent and reserved and the
shares held back, as the last answer from Redis said: ``SharedBudget.share``), never the full
limit; it first waits ``MEMBER_TTL`` seconds, until its share has surely lapsed in Redis
(and the others' turns booked before then have passed: the in-flight limit's worth of request
intervals). It tries Redis again every ``REJOIN_S`` seconds; once Redis answers it stops taking
local turns, lets the attempts sent on its own finish (an attempt that had its turn reserves its
cost on its own meanwhile), rejoins (its share back in Redis; under a cost bound, what it spent that
Redis does not count and its reservations in flight put back: ``SharedBudget.rejoin``) and goes on
through Redis.

**Calls.** An attempt costs one call to take its slot and booking (none more when it waits: the slot
is handed over), and its release is one of the calls that batch every background change of an
event-loop turn (releases, token corrections, 429s, pauses, settlements) into one script call; a
cost bound adds the reservation. ``make bench`` counts them with Redis's ``INFO commandstats``.

**Where things are.** This module is the connection (``Coordinator``: connecting, the batched calls,
the heartbeat, the pub/sub hand-overs, falling back and rejoining); the limiter and the budget that
use it are ``runner.distributed.shared_limits``. It is longer than the ~400 lines modules keep to
because ``Coordinator`` is one state machine (down / local / shared) whose transitions share its
connection, its pending calls and its waiters: split, each part would reach into the other's state.

What each process keeps to itself: its window of attempts (AIMD, ``runner.sending.limits.Window``)
and its token estimate. Keys live under ``dxi:<run id>:``, expiring a day after their last use. The
run id is ``DXI_RUN_ID``, else Slurm's ``SLURM_ARRAY_JOB_ID``, else a digest of the command line
without its ``--shard``, ``--cache-dir``, ``--out`` and ``-q`` (the shards of one run are otherwise
the same command). The scripts reach keys named in their arguments: a single Redis (or a primary),
not a Redis Cluster.

An alternative without Redis in the runner: point every process at a LiteLLM proxy that keeps the
limits (its ``router_settings`` with ``redis_host`` share rpm/tpm across proxy instances), with
``--rpm`` left unset here; see docs/distributed.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import time
import uuid
from collections.abc import Mapping, Sequence
from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

from ..sending.cost import Budget
from ..sending.limits import RECOVERY_S, ProviderLimiter
from .coordinator_script import library

log = logging.getLogger("dxi.coordinator")

TTL_S = 86_400  # keys expire a day after their last use
MEMBER_TTL = 6.0  # seconds a shard stays alive in Redis after its process's last call
HEARTBEAT_S = 2.0  # how often an idle process says it is alive (and renews its leases)
REJOIN_S = 2.0  # how often a process that fell back tries Redis again
POLL_S = 0.05  # how often a reservation that found no room under the bound asks again (backing off to 1 s)

LIBRARY = library(TTL_S, 2 * HEARTBEAT_S)

_REDIS_ERRORS: tuple[type[BaseException], ...] = (OSError,)


PER_PROCESS = (
    "--shard",
    "--cache-dir",
    "--out",
)  # flags whose values differ between the processes of one run


def run_id(argv: Sequence[str], env: Mapping[str, str] | None = None) -> str:
    """The run's id (see the module docstring): ``DXI_RUN_ID``, ``SLURM_ARRAY_JOB_ID``, else a
    digest of ``argv`` without the flags that differ between its processes (``PER_PROCESS``) and
    ``-q``."""
    env = os.environ if env is None else env
    for name in ("DXI_RUN_ID", "SLURM_ARRAY_JOB_ID"):
        if env.get(name):
            return env[name]
    kept, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in PER_PROCESS:
            skip = True
            continue
        if a not in ("-q", "--quiet") and not a.startswith(tuple(f"{f}=" for f in PER_PROCESS)):
            kept.append(a)
    return "cmd-" + hashlib.sha256("\0".join(kept).encode()).hexdigest()[:16]


def _raise_if_cancelled() -> None:
    """Raise ``asyncio.CancelledError`` if the current task has a cancellation pending that was
    swallowed.

    On Python 3.11, ``asyncio.wait_for`` returns the inner result, dropping the cancellation, when
    the task is cancelled just as the awaited operation completes (CPython gh-86296, fixed in 3.12).
    redis-py wraps every command's socket write in ``wait_for`` when ``socket_timeout`` is set, so a
    ``cancel()`` that lands as a command is written is lost: the heartbeat went on renewing a "dead"
    process's leases (and ``close()`` would wait for it forever), a cancelled ``acquire`` went on
    waiting for a slot. A cancellation not withdrawn (``Task.uncancel``) shows in
    ``Task.cancelling()``."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


def _retrieved(fut: asyncio.Future) -> None:
    """Mark a background operation's outcome as seen (its failure is the coordinator's: it falls
    back)."""
    if not fut.cancelled():
        fut.exception()


class CoordinatorError(ValueError):
    """A ``--coordinator`` URI that is not ``redis://HOST:PORT/DB``, or the extra is not
    installed."""


class _Down(Exception):
    """The coordinator fell back while an attempt waited on Redis: take the local path."""


class Coordinator:
    """One process's connection to the run's Redis (``uri``:
    ``redis://HOST:PORT/DB[?lease=SECONDS]``; a password, if any, from ``REDIS_PASSWORD``, never in
    messages). This process is shard ``shard`` of ``shares`` (N: the limits are divided by it while
    Redis is out of reach). ``down`` says the process has fallen back (the reason in ``warnings``);
    ``connect()`` checks Redis at start (synchronously, 2 s timeout). ``rejoined`` counts the times
    it came back after falling back."""

    def __init__(self, uri: str, run: str, shares: int = 1, shard: int = 0):
        parts = urlsplit(uri)
        if parts.scheme not in ("redis", "rediss") or "@" in parts.netloc:
            raise CoordinatorError(
                f"--coordinator {parts.scheme}://{parts.hostname or ''}...: expected "
                "redis://HOST:PORT/DB (a password goes in REDIS_PASSWORD, not the URI)"
            )
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        try:
            self.lease_s = float(query.pop("lease", 30.0))
        except ValueError:
            raise CoordinatorError("--coordinator ...?lease=SECONDS: not a number") from None
        self.url = urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(query), ""))
        self.name = f"{parts.scheme}://{parts.hostname}:{parts.port or 6379}{parts.path or '/0'}"
        self.run, self.shares, self.shard = run, max(1, shares), shard
        self.prefix = f"dxi:{run}:"
        self.member = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self.down = False
        self.rejoined = 0
        self.warnings: list[str] = []
        self._client = None
        self._script = None
        self._leases: dict[str, set[str]] = {}  # zset key -> members this process holds
        self._batch: list[tuple[str, list, asyncio.Future]] = []  # operations queued (``submit``)
        self._sender: asyncio.Task | None = None  # sends them, one batch at a time
        self._background: set[asyncio.Task] = set()
        self._tasks: list[
            asyncio.Task
        ] = []  # heartbeat and listener (while up), rejoin (while down)
        self._waiting: dict[str, asyncio.Future] = {}  # waiter -> its hand-over (a grant message)
        self._waiting_for: dict[str, str] = {}  # waiter -> the provider it waits for
        # the SharedLimiters and the SharedBudget of this process
        # (``runner.distributed.shared_limits`` makes and registers them here): the other processes'
        # events are handed to them
        self.limiters: dict[str, ProviderLimiter] = {}
        self.budget: Budget | None = None
        # what the other processes had spent and reserved under the cost bound (USD), as the last
        # answer from Redis said: a SharedBudget that falls back sizes its share by it
        self.others_usd = 0.0
        self._local_from = (
            0.0  # monotonic time after which a process that fell back may send on its own
        )
        self._rejoining = False
        self._started = False
        self._connecting: asyncio.Lock | None = None

    # ---- connection -------------------------------------------------------------------------
    def _kwargs(self) -> dict:
        pw = os.environ.get("REDIS_PASSWORD")
        return {"socket_timeout": 5.0, "socket_connect_timeout": 2.0} | (
            {"password": pw} if pw else {}
        )

    def connect(self) -> bool:
        """Whether Redis answers (a PING, 2 s timeout); if not, fall back (``down``) with a warning,
        and try again in the background once the run starts."""
        try:
            import redis
        except ImportError:
            raise CoordinatorError(
                "--coordinator needs the distributed extra: pip install "
                "'decision-index[distributed]'"
            ) from None
        global _REDIS_ERRORS
        _REDIS_ERRORS = (OSError, redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)
        try:
            with redis.Redis.from_url(self.url, **self._kwargs()) as client:
                client.ping()
        except (*_REDIS_ERRORS, redis.exceptions.RedisError) as exc:
            self.fail(exc)
            return False
        return True

    def fail(self, exc: BaseException) -> None:
        """Fall back to 1/N of every limit (once per fall), with a warning: local turns begin
        ``MEMBER_TTL`` seconds from now (this shard's share lapses in Redis by then), and Redis is
        tried again every ``REJOIN_S`` seconds."""
        if self.down:
            return
        self.down = True
        self._local_from = time.monotonic() + MEMBER_TTL + self._horizon()
        message = (
            f"coordinator {self.name} unreachable ({type(exc).__name__}: {exc}); this process falls back to "
            f"1/{self.shares} of each provider's limits and of the cost bound, and tries again every "
            f"{REJOIN_S:g} s"
        )
        self.warnings.append(message)
        log.warning(message)
        for fut in self._waiting.values():
            if not fut.done():
                fut.set_exception(_Down())
        self._waiting.clear()
        self._waiting_for.clear()
        batch, self._batch = self._batch, []
        for _, _, fut in batch:
            if not fut.done():
                fut.set_exception(ConnectionError(f"coordinator {self.name} is out of reach"))
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # at start (connect): the run's start begins the rejoin loop
        for task in self._tasks:
            task.cancel()
        self._tasks = [loop.create_task(self._rejoin())]

    def _horizon(self) -> float:
        """How far ahead of now the bookings of the shards in Redis can reach: each slot booked at
        most one request interval after the last (seconds; the slowest provider's)."""
        return max(
            (lim.size / lim._ceilings[0] for lim in self.limiters.values() if lim._ceilings[0]),
            default=0.0,
        )

    async def start(self) -> None:
        """Begin the background work (inside the event loop): heartbeat and listener while Redis
        answers, the attempts to rejoin while it does not."""
        if self._started:
            return
        self._started = True
        if self.down:
            self._tasks = [asyncio.get_running_loop().create_task(self._rejoin())]
            return
        try:
            await self.call("join", [])
        except _REDIS_ERRORS as exc:
            self.fail(exc)

    async def _ready(self) -> None:
        """Connected, script registered, listener and heartbeat running (once, whoever asks
        first)."""
        if self._script is not None:
            return
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:
            if self._script is None:
                await self._connect_async()

    async def _connect_async(self) -> None:
        import redis.asyncio as aioredis

        if self._client is not None:
            with contextlib.suppress(Exception):
                await self._client.aclose()
        self._client = client = aioredis.Redis.from_url(self.url, **self._kwargs())
        pubsub = client.pubsub()
        await pubsub.subscribe(self.key("proc", self.member), self.key("events"))
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._heartbeat()), loop.create_task(self._listen(pubsub))]
        self._script = client.register_script(LIBRARY)

    def _common(self) -> list:
        return [self.prefix, str(self.shard), self.shares, self.member, MEMBER_TTL]

    def submit(self, op: str, args: list) -> asyncio.Future:
        """Queue an operation of the script; a future of its answer. Every operation queued in one
        event-loop turn goes to Redis in one call (``_flush``); a Redis connection error fails them
        all (and this process falls back)."""
        fut = asyncio.get_running_loop().create_future()
        self._batch.append((op, args, fut))
        if len(self._batch) == 1:
            asyncio.get_running_loop().call_soon(self._flush)
        return fut

    async def call(self, op: str, args: list) -> object:
        """Run one operation (in this turn's batch) and return its answer; raises a Redis connection
        error (the caller falls back), and ``asyncio.CancelledError`` if the calling task was
        cancelled meanwhile, even when the answer came (see ``_raise_if_cancelled``): the operation
        may then have run."""
        if self.down and not self._rejoining:
            raise ConnectionError(f"coordinator {self.name} is out of reach")
        result = await self.submit(op, args)
        _raise_if_cancelled()
        return result

    def later(self, op: str, args: list) -> None:
        """Run an operation without waiting for it (from synchronous code: a release, a settle, a
        429)."""
        if self.down:
            return
        self.submit(op, args).add_done_callback(_retrieved)

    def _flush(self) -> None:
        """Send the operations queued, one batch at a time, in order (a release queued after a take
        runs after it), until none are left."""
        if self._sender is not None and not self._sender.done():
            return  # the sender takes what was queued once its call returns
        if not self._batch:
            return
        self._sender = asyncio.get_running_loop().create_task(self._send())
        self._background.add(self._sender)
        self._sender.add_done_callback(self._background.discard)

    async def _send(self) -> None:
        while self._batch:
            batch, self._batch = self._batch, []
            flat: list = ["batch", *self._common(), len(batch)]
            for op, args, _ in batch:
                flat += [op, len(args), *args]
            try:
                await self._ready()
                *answers, others = await self._script(keys=[], args=flat)
            except _REDIS_ERRORS as exc:
                self.fail(exc)
                for _, _, fut in batch:
                    if not fut.done():
                        fut.set_exception(exc)
                return
            except BaseException as exc:
                for _, _, fut in batch:
                    if not fut.done():
                        fut.set_exception(exc)
                if not isinstance(exc, Exception):
                    raise
                continue
            self.others_usd = float(others)
            for (_, _, fut), answer in zip(batch, answers, strict=True):
                if not fut.done():
                    fut.set_result(answer)

    def key(self, *parts: str) -> str:
        return self.prefix + ":".join(parts)

    # ---- leases, heartbeat, hand-overs ----------------------------------------------------------
    def hold(self, zset: str, member: str) -> None:
        self._leases.setdefault(zset, set()).add(member)

    def drop(self, zset: str, member: str) -> None:
        self._leases.get(zset, set()).discard(member)

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(min(HEARTBEAT_S, self.lease_s / 3))
            if self.down:
                return
            groups = [(zset, members) for zset, members in self._leases.items() if members]
            args: list = [self.lease_s, len(groups)]
            for zset, members in groups:
                args += [zset, len(members), *members]
            waiting = set(self._waiting_for.values())
            for limiter in self.limiters.values():
                if limiter.limits_key in waiting:
                    args += [
                        limiter.limits_key,
                        limiter.size,
                        self.lease_s,
                        *limiter._ceilings,
                        RECOVERY_S,
                    ]
            try:
                await self.call("refresh", args)
            except _REDIS_ERRORS as exc:
                self.fail(exc)
                return

    async def _listen(self, pubsub) -> None:
        """Hand-overs for this process's waiters, and pauses any process heard (pub/sub)."""
        try:
            while not self.down:
                message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                if message is None:
                    continue
                kind, _, rest = message["data"].decode().partition(" ")
                if kind == "grant":  # waiter, wait, Redis's time, token rate, provider
                    waiter, wait, booked_at, rate, provider = rest.split(" ", 4)
                    fut = self._waiting.pop(waiter, None)
                    self._waiting_for.pop(waiter, None)
                    if fut is not None and not fut.done():
                        fut.set_result((float(wait), float(booked_at), float(rate)))
                    elif (
                        provider in self.limiters
                    ):  # its waiter gave up meanwhile: the slot goes back
                        self.limiters[provider].give_back(waiter)
                elif kind == "pause":  # seconds, provider
                    seconds, provider = rest.split(" ", 1)
                    if provider in self.limiters:
                        self.limiters[provider].paused_by_other(float(seconds))
                elif (
                    kind == "clock"
                ):  # seconds the Redis host's clock stepped back (absorbed by the script)
                    message = (
                        f"coordinator {self.name}: the Redis host's clock stepped back {float(rest):.1f} s; "
                        "the shared pacing went on from where it was (no process waits for the step)"
                    )
                    self.warnings.append(message)
                    log.warning(message)
        except asyncio.CancelledError:
            raise
        except _REDIS_ERRORS as exc:
            self.fail(exc)
        finally:
            with contextlib.suppress(Exception):
                await pubsub.aclose()

    def expect(self, waiter: str, provider: str) -> asyncio.Future:
        """A future resolved with (wait, Redis's time, token rate) when ``waiter`` (queued for a
        slot of ``provider``) is handed a slot."""
        fut = asyncio.get_running_loop().create_future()
        self._waiting[waiter] = fut
        self._waiting_for[waiter] = provider
        return fut

    def forget(self, waiter: str) -> None:
        self._waiting.pop(waiter, None)
        self._waiting_for.pop(waiter, None)

    # ---- falling back and rejoining --------------------------------------------------------------
    async def mode(self, turn_taken: bool = False) -> str:
        """ "shared" (through Redis) or "local" (fallen back, and its share surely lapsed in Redis):
        waits while the process rejoins, and until its local turns may begin. ``turn_taken``: for an
        attempt that has its turn already (its cost reservation): while the process rejoins, it goes
        on locally if local turns had begun (the rejoin waits for it; waiting for the rejoin, it
        held its local turn, and neither went on)."""
        while True:
            if self._rejoining and not (
                turn_taken and self.down and time.monotonic() >= self._local_from
            ):
                await asyncio.sleep(0.02)
                continue
            if not self.down:
                return "shared"
            delay = self._local_from - time.monotonic()
            if delay <= 0:
                return "local"
            await asyncio.sleep(min(delay, 0.25))

    def _local_idle(self) -> bool:
        """No attempt sent on its own is in flight, and no local pacer has booked ahead of now."""
        now = time.monotonic()
        for limiter in self.limiters.values():
            fb = limiter.fallback
            if fb.window.held:
                return False
            if any(
                rate.pacer is not None and rate.pacer._next > now
                for rate in (fb.requests, fb.tokens)
            ):
                return False
        return self.budget is None or not self.budget.local_in_flight

    async def _rejoin(self) -> None:
        """While fallen back: try Redis every ``REJOIN_S`` seconds; once it answers, stop taking
        local turns, let the local attempts finish, and rejoin."""
        import redis.asyncio as aioredis

        while self.down:
            await asyncio.sleep(REJOIN_S)
            try:
                async with aioredis.Redis.from_url(self.url, **self._kwargs()) as probe:
                    await probe.ping()
            except (*_REDIS_ERRORS, Exception):  # noqa: B014 (redis' own errors besides the connection's)
                continue
            self._rejoining = True
            try:
                while not self._local_idle():
                    await asyncio.sleep(0.02)
                self.down = False
                self._script = None
                await self._ready()
                await self.call("join", [])
            except (*_REDIS_ERRORS, Exception) as exc:  # noqa: B014
                self.down = True
                self._local_from = time.monotonic() + MEMBER_TTL + self._horizon()
                for task in self._tasks:
                    if task is not asyncio.current_task():
                        task.cancel()
                log.warning(
                    "coordinator %s: rejoining failed (%s: %s); still 1/%d of each limit",
                    self.name,
                    type(exc).__name__,
                    exc,
                    self.shares,
                )
                continue
            finally:
                self._rejoining = False
            self.rejoined += 1
            if self.budget is not None:
                self.budget.rejoin()
            message = f"coordinator {self.name} reachable again: this process rejoins the limits shared by run {self.run}"
            self.warnings.append(message)
            log.warning(message)
            return

    async def close(self) -> None:
        """Say this shard is done, let the background calls finish (releases, settles), stop the
        heartbeat, the listener and the rejoining, close the connection."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []
        if not self.down and self._script is not None:
            self.later("done", [])
        self._flush()
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
        if self._client is not None:
            with contextlib.suppress(Exception):
                await self._client.aclose()
            self._client = None
            self._script = None

    # ---- what the runner uses ---------------------------------------------------------------
    def start_soon(self) -> None:
        """Begin the background work (``start``) in the running event loop, once: the first shared
        limiter made (``runner.distributed.shared_limits.limiters``) calls it from inside the
        loop."""
        if not self._started:
            task = asyncio.get_running_loop().create_task(self.start())
            self._background.add(task)
            task.add_done_callback(self._background.discard)
