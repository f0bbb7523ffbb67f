"""Shared limits and cost through Redis: ``--coordinator redis://HOST:PORT/DB`` (the ``distributed`` extra).

Every process of a run (the shards of a job array, or several processes on one shard) shares, per
provider key (``ModelRun.limits_key``):

* **pacing**: the same GCRA booking as ``runner.limits`` (each attempt books the next free instant at the
  current rate, requests and tokens), done atomically in one Lua script on Redis's clock, so N processes
  together keep to the provider's rate as one would;
* **the pause a 429 states** (``Retry-After`` and the like): every process waits it out;
* **the narrowed rate after 429s** (× ``runner.limits.BACKOFF`` once per round of 429s, recovering
  linearly over ``RECOVERY_S``) and a limit a 429's headers state;
* **the in-flight slots** (``Limits.max_in_flight`` for all processes together): each is a lease in a
  sorted set, renewed by its holder every ``lease/3`` seconds; a dead process's slots come back when their
  leases end (``?lease=SECONDS`` in the URI, default 30);
* **the spend under ``--max-cost``**: reservations and spend are kept in Redis; an attempt reserves its
  cost bound there, and once the bound leaves no room with nothing in flight anywhere, every process stops.
  A dead process's reservations are counted as spent when their leases end (it may have been billed).

What each process keeps to itself: its window of attempts (AIMD, ``runner.limits.Window``) and its token
estimate. Keys live under ``dxi:<run id>:``, expiring a day after their last use. The run id is
``DXI_RUN_ID``, else Slurm's ``SLURM_ARRAY_JOB_ID``, else a digest of the command line without its
``--shard``, ``--cache-dir``, ``--out`` and ``-q`` (the shards of one run are otherwise the same command).

If Redis cannot be reached at start, or stops answering during the run, each process falls back, with a
warning, to 1/N of each provider's limits and of the cost bound (N from ``--shard``), never to the full
limit.

An alternative without Redis in the runner: point every process at a LiteLLM proxy that keeps the limits
(its ``router_settings`` with ``redis_host`` share rpm/tpm across proxy instances), with ``--rpm`` left
unset here; see docs/distributed.md.
"""
from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import time
import uuid
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

from dxi.adapters import AdapterError, Limits, RateLimited, Request

from .cost import Budget, CostBoundReached
from .limits import BACKOFF, MIN_FRACTION, RECOVERY_S, ProviderLimiter, Ticket
from .shard import divide

log = logging.getLogger("dxi.coordinator")

TTL_S = 86_400  # keys expire a day after their last use
POLL_S = 0.02   # how often a process waiting for a slot or for room under the bound asks again

# Rates are units per second; times are Redis's clock (seconds). Floats go back to Python as strings
# (a Lua number returned to Redis is truncated to an integer).
_RATE = """
local function rate(h, now, p, ceil, recovery)
  local v = redis.call('HMGET', h, p .. 'learned', p .. 'low', p .. 'since')
  local learned = tonumber(v[1])
  if learned and (ceil <= 0 or learned < ceil) then ceil = learned end
  if ceil <= 0 then return 0, 0 end
  local low = tonumber(v[2])
  if not low then return ceil, ceil end
  return math.min(ceil, low + ceil * (now - tonumber(v[3])) / recovery), ceil
end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
"""

# KEYS[1] provider hash; ARGV: request ceiling, token ceiling (per second; 0 = none), tokens, recovery s, ttl
BOOK = _RATE + """
local h = KEYS[1]
local recovery, tokens = tonumber(ARGV[4]), tonumber(ARGV[3])
local start = math.max(now, tonumber(redis.call('HGET', h, 'paused')) or 0)
local wait = start - now
local rr = rate(h, now, 'r', tonumber(ARGV[1]), recovery)
if rr > 0 then
  local s = math.max(tonumber(redis.call('HGET', h, 'rtat')) or 0, start)
  redis.call('HSET', h, 'rtat', tostring(s + 1 / rr))
  wait = math.max(wait, s - now)
end
local tr = rate(h, now, 't', tonumber(ARGV[2]), recovery)
if tr > 0 and tokens > 0 then
  local s = math.max(tonumber(redis.call('HGET', h, 'ttat')) or 0, start)
  redis.call('HSET', h, 'ttat', tostring(s + tokens / tr))
  wait = math.max(wait, s - now)
end
redis.call('EXPIRE', h, tonumber(ARGV[5]))
return {tostring(wait), tostring(now), tostring(tr)}
"""

# KEYS[1]; ARGV: seconds -> seconds left of the pause (after holding it for ``seconds``, when > 0)
PAUSE = _RATE + """
local h = KEYS[1]
local paused = tonumber(redis.call('HGET', h, 'paused')) or 0
local s = tonumber(ARGV[1])
if s > 0 and now + s > paused then
  paused = now + s
  redis.call('HSET', h, 'paused', tostring(paused))
  redis.call('HINCRBYFLOAT', h, 'paused_s', tostring(s))
  redis.call('EXPIRE', h, tonumber(ARGV[2]))
end
return tostring(math.max(0, paused - now))
"""

# KEYS[1]; ARGV: booked_at, stated rpm, stated tpm (0 = none), request ceiling, token ceiling, recovery, ttl
RATE_LIMITED = _RATE + """
local h = KEYS[1]
local recovery = tonumber(ARGV[6])
local learned = false
for i, p in ipairs({'r', 't'}) do
  local stated = tonumber(ARGV[1 + i]) / 60
  if stated > 0 then
    local cur, ceil = rate(h, now, p, tonumber(ARGV[3 + i]), recovery)
    if ceil <= 0 or stated < ceil then
      redis.call('HSET', h, p .. 'learned', tostring(stated), p .. 'low', tostring(math.min(cur > 0 and cur or stated, stated)),
                 p .. 'since', tostring(now))
      learned = true
    end
  end
end
local decreased = tonumber(redis.call('HGET', h, 'decreased')) or -1
local cut = 0
if tonumber(ARGV[1]) >= decreased then
  redis.call('HSET', h, 'decreased', tostring(now))
  if not learned then
    cut = 1
    redis.call('HINCRBY', h, 'decreases', 1)
    for i, p in ipairs({'r', 't'}) do
      local cur, ceil = rate(h, now, p, tonumber(ARGV[3 + i]), recovery)
      if cur > 0 then
        redis.call('HSET', h, p .. 'low', tostring(math.max(ceil * @MIN@, cur * @BACKOFF@)), p .. 'since', tostring(now))
      end
    end
  end
end
redis.call('HINCRBY', h, 'rate_limited', 1)
redis.call('EXPIRE', h, tonumber(ARGV[7]))
return cut
""".replace("@MIN@", repr(MIN_FRACTION)).replace("@BACKOFF@", repr(BACKOFF))

# KEYS[1] provider hash; ARGV: tokens to add (or give back when negative), token ceiling, recovery
CORRECT = _RATE + """
local tr = rate(KEYS[1], now, 't', tonumber(ARGV[2]), tonumber(ARGV[3]))
if tr > 0 then redis.call('HINCRBYFLOAT', KEYS[1], 'ttat', tostring(tonumber(ARGV[1]) / tr)) end
return 1
"""

# KEYS[1] slots zset; ARGV: size, member, lease s, ttl -> 1 taken, 0 full
TAKE_SLOT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[1]) then
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[2])
  redis.call('EXPIRE', KEYS[1], tonumber(ARGV[4]))
  return 1
end
return 0
"""

# KEYS[1] zset of leases; ARGV: lease s, members... -> renews the members' leases
RENEW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
for i = 2, #ARGV do redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[1]), ARGV[i]) end
return 1
"""

_EXPIRE_RESERVATIONS = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local dead = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)
for _, m in ipairs(dead) do
  local usd = tonumber(redis.call('HGET', KEYS[3], m)) or 0
  redis.call('HINCRBYFLOAT', KEYS[1], 'spent', tostring(usd))
  redis.call('HINCRBYFLOAT', KEYS[1], 'reserved', tostring(-usd))
  redis.call('HDEL', KEYS[3], m)
  redis.call('ZREM', KEYS[2], m)
end
"""

# KEYS: cost hash, reservations zset, amounts hash; ARGV: usd, bound (-1: none), member, lease, ttl
# -> 1 reserved, 0 no room while others are in flight (ask again), -1 stopped
RESERVE = _EXPIRE_RESERVATIONS + """
for i = 1, 3 do redis.call('EXPIRE', KEYS[i], tonumber(ARGV[5])) end
if redis.call('HGET', KEYS[1], 'stopped') == '1' then return -1 end
local usd, bound = tonumber(ARGV[1]), tonumber(ARGV[2])
local spent = tonumber(redis.call('HGET', KEYS[1], 'spent')) or 0
local reserved = tonumber(redis.call('HGET', KEYS[1], 'reserved')) or 0
local n = redis.call('ZCARD', KEYS[2])
if n == 0 then reserved = 0; redis.call('HSET', KEYS[1], 'reserved', '0') end
if bound < 0 or spent + reserved + usd <= bound then
  redis.call('HINCRBYFLOAT', KEYS[1], 'reserved', tostring(usd))
  redis.call('HSET', KEYS[3], ARGV[3], tostring(usd))
  redis.call('ZADD', KEYS[2], now + tonumber(ARGV[4]), ARGV[3])
  return 1
end
if n > 0 then return 0 end
redis.call('HSET', KEYS[1], 'stopped', '1')
return -1
"""

# KEYS as RESERVE; ARGV: member, actual usd
SETTLE = """
local usd = tonumber(redis.call('HGET', KEYS[3], ARGV[1]))
if usd then
  redis.call('HINCRBYFLOAT', KEYS[1], 'reserved', tostring(-usd))
  redis.call('HDEL', KEYS[3], ARGV[1])
  redis.call('ZREM', KEYS[2], ARGV[1])
end
redis.call('HINCRBYFLOAT', KEYS[1], 'spent', tostring(tonumber(ARGV[2])))
return 1
"""

_REDIS_ERRORS: tuple[type[BaseException], ...] = (OSError,)


PER_PROCESS = ("--shard", "--cache-dir", "--out")  # flags whose values differ between the processes of one run


def run_id(argv: Sequence[str], env: Mapping[str, str] | None = None) -> str:
    """The run's id (see the module docstring): ``DXI_RUN_ID``, ``SLURM_ARRAY_JOB_ID``, else a digest of
    ``argv`` without the flags that differ between its processes (``PER_PROCESS``) and ``-q``."""
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
    """Raise ``asyncio.CancelledError`` if the current task has a cancellation pending that was swallowed.

    On Python 3.11, ``asyncio.wait_for`` returns the inner result, dropping the cancellation, when the task
    is cancelled just as the awaited operation completes (CPython gh-86296, fixed in 3.12). redis-py wraps
    every command's socket write in ``wait_for`` when ``socket_timeout`` is set, so a ``cancel()`` that
    lands as a command is written is lost: the heartbeat went on renewing a "dead" process's leases (and
    ``close()`` would wait for it forever), a cancelled ``acquire`` went on waiting for a slot. A cancellation
    not withdrawn (``Task.uncancel``) shows in ``Task.cancelling()``."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


class CoordinatorError(ValueError):
    """A ``--coordinator`` URI that is not ``redis://HOST:PORT/DB``, or the extra is not installed."""


class Coordinator:
    """One process's connection to the run's Redis (``uri``: ``redis://HOST:PORT/DB[?lease=SECONDS]``; a
    password, if any, from ``REDIS_PASSWORD``, never in messages). ``shares`` is N, the number of processes
    to divide the limits by should Redis be unreachable. ``down`` says the process has fallen back (the
    reason in ``warnings``). ``connect()`` checks Redis at start (synchronously, 2 s timeout)."""

    def __init__(self, uri: str, run: str, shares: int = 1):
        parts = urlsplit(uri)
        if parts.scheme not in ("redis", "rediss") or "@" in parts.netloc:
            raise CoordinatorError(f"--coordinator {parts.scheme}://{parts.hostname or ''}...: expected "
                                   "redis://HOST:PORT/DB (a password goes in REDIS_PASSWORD, not the URI)")
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        try:
            self.lease_s = float(query.pop("lease", 30.0))
        except ValueError:
            raise CoordinatorError("--coordinator ...?lease=SECONDS: not a number") from None
        self.url = urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(query), ""))
        self.name = f"{parts.scheme}://{parts.hostname}:{parts.port or 6379}{parts.path or '/0'}"
        self.run, self.shares = run, max(1, shares)
        self.prefix = f"dxi:{run}:"
        self.member = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self.down = False
        self.warnings: list[str] = []
        self._client = None
        self._scripts: dict[str, object] = {}
        self._leases: dict[str, set[str]] = {}  # zset key -> members this process holds
        self._heartbeat: asyncio.Task | None = None
        self._background: set[asyncio.Task] = set()

    # ---- connection -------------------------------------------------------------------------
    def _kwargs(self) -> dict:
        pw = os.environ.get("REDIS_PASSWORD")
        return {"socket_timeout": 5.0, "socket_connect_timeout": 2.0} | ({"password": pw} if pw else {})

    def connect(self) -> bool:
        """Whether Redis answers (a PING, 2 s timeout); if not, fall back (``down``) with a warning."""
        try:
            import redis
        except ImportError:
            raise CoordinatorError("--coordinator needs the distributed extra: pip install "
                                   "'decision-index[distributed]'") from None
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
        """Fall back to 1/N of every limit (once), with a warning."""
        if self.down:
            return
        self.down = True
        message = (f"coordinator {self.name} unreachable ({type(exc).__name__}: {exc}); this process falls back to "
                   f"1/{self.shares} of each provider's limits and of the cost bound")
        self.warnings.append(message)
        log.warning(message)

    async def _redis(self):
        if self._client is None:
            import redis.asyncio as aioredis

            self._client = aioredis.Redis.from_url(self.url, **self._kwargs())
            for name, text in (("book", BOOK), ("pause", PAUSE), ("rate_limited", RATE_LIMITED), ("correct", CORRECT),
                               ("take_slot", TAKE_SLOT), ("renew", RENEW), ("reserve", RESERVE), ("settle", SETTLE)):
                self._scripts[name] = self._client.register_script(text)
            self._heartbeat = asyncio.get_running_loop().create_task(self._renew_leases())
        return self._client

    async def call(self, script: str, keys: list[str], args: list) -> object:
        """Run one of the Lua scripts; raises a Redis connection error (the caller falls back), and
        ``asyncio.CancelledError`` if the calling task was cancelled meanwhile, even when redis-py returned
        the reply instead (see ``_raise_if_cancelled``): the script may then have run."""
        await self._redis()
        result = await self._scripts[script](keys=keys, args=args)
        _raise_if_cancelled()
        return result

    def later(self, script: str, keys: list[str], args: list) -> None:
        """Run a script without waiting for it (from synchronous code: a release, a settle, a 429)."""
        if self.down:
            return

        async def go() -> None:
            try:
                await self.call(script, keys, args)
            except _REDIS_ERRORS as exc:
                self.fail(exc)

        task = asyncio.get_running_loop().create_task(go())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def key(self, *parts: str) -> str:
        return self.prefix + ":".join(parts)

    # ---- leases -----------------------------------------------------------------------------
    def hold(self, zset: str, member: str) -> None:
        self._leases.setdefault(zset, set()).add(member)

    def drop(self, zset: str, member: str) -> None:
        self._leases.get(zset, set()).discard(member)

    async def _renew_leases(self) -> None:
        while True:
            await asyncio.sleep(self.lease_s / 3)
            if self.down:
                return
            try:
                for zset, members in list(self._leases.items()):
                    if members:
                        await self.call("renew", [zset], [self.lease_s, *members])
            except _REDIS_ERRORS as exc:
                self.fail(exc)
                return

    async def close(self) -> None:
        """Let the background calls finish (releases, settles), stop renewing, close the connection."""
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._heartbeat
            self._heartbeat = None
        if self._client is not None:
            with contextlib.suppress(Exception):
                await self._client.aclose()
            self._client = None

    # ---- what the runner uses ---------------------------------------------------------------
    def limiters(self, models: Sequence) -> dict[str, ProviderLimiter]:
        """A SharedLimiter per provider key of ``models`` (``runner.run.ModelRun``), for ``run(limiters=)``."""
        out: dict[str, ProviderLimiter] = {}
        for m in models:
            if m.limits_key not in out:
                out[m.limits_key] = SharedLimiter(m.adapter.limits, self, m.limits_key)
        return out

    def budget(self, max_usd: float | None) -> Budget:
        return SharedBudget(max_usd, self)


class LeasedSlots:
    """The provider's in-flight slots for all processes: ``await acquire()``, ``release()`` (the interface
    of the ``asyncio.Semaphore`` it replaces). Each slot held is a lease in Redis; while ``down``, a local
    semaphore of 1/N of the slots. A waiter asks Redis again every ``POLL_S`` seconds (a slot another
    process gives back), and at once when this process gives one back (the first waiter only)."""

    def __init__(self, coordinator: Coordinator, key: str, size: int, fallback: asyncio.Semaphore):
        self.c, self.key, self.size, self.fallback = coordinator, key, size, fallback
        self._held: list[str | None] = []  # a member per shared slot held; None for a local one
        self._waiters: deque[asyncio.Future[None]] = deque()

    async def acquire(self) -> bool:
        while not self.c.down:
            member = f"{self.c.member}-{uuid.uuid4().hex[:8]}"
            try:
                taken = await self.c.call("take_slot", [self.key], [self.size, member, self.c.lease_s, TTL_S])
            except _REDIS_ERRORS as exc:
                self.c.fail(exc)
                break
            except asyncio.CancelledError:
                self._zrem(member)  # the script may have run: give back the slot it may have taken
                raise
            if taken:
                self.c.hold(self.key, member)
                self._held.append(member)
                return True
            woken = asyncio.get_running_loop().create_future()
            self._waiters.append(woken)
            try:
                await asyncio.wait_for(woken, POLL_S)
            except TimeoutError:
                pass
            finally:
                with contextlib.suppress(ValueError):
                    self._waiters.remove(woken)
        await self.fallback.acquire()
        self._held.append(None)
        return True

    def release(self) -> None:
        member = self._held.pop() if self._held else None
        if member is None:
            self.fallback.release()
            return
        self.c.drop(self.key, member)
        self._zrem(member)

    def _zrem(self, member: str) -> None:
        if self.c.down:
            return

        async def go() -> None:
            try:
                client = await self.c._redis()
                await client.zrem(self.key, member)
            except _REDIS_ERRORS as exc:
                self.c.fail(exc)
            while self._waiters:  # the slot is free in Redis: the first waiter asks for it now
                waiter = self._waiters.popleft()
                if not waiter.done():
                    waiter.set_result(None)
                    break

        task = asyncio.get_running_loop().create_task(go())
        self.c._background.add(task)
        task.add_done_callback(self.c._background.discard)


@dataclass(slots=True)
class SharedTicket(Ticket):
    """A Ticket booked in Redis: ``booked_at`` on Redis's clock; ``token_rate`` the shared rate it used."""

    booked_at: float = 0.0
    token_rate: float = 0.0


class SharedLimiter(ProviderLimiter):
    """A ProviderLimiter whose pacing, pause, narrowed rates and slots are shared through the coordinator
    (see the module docstring). While the coordinator is down it is a local ProviderLimiter with 1/N of
    the limits (``fallback``)."""

    def __init__(self, limits: Limits, coordinator: Coordinator, provider: str):
        super().__init__(limits)
        self.c = coordinator
        self.hash = coordinator.key("provider", provider)
        self.fallback = ProviderLimiter(divide(limits, coordinator.shares))
        self.slots = LeasedSlots(coordinator, coordinator.key("slots", provider), max(1, limits.max_in_flight),
                                 self.fallback.slots)
        self._ceilings = (limits.rpm / 60 if limits.rpm else 0.0, limits.tpm / 60 if limits.tpm else 0.0)

    def pause(self, seconds: float) -> None:
        super().pause(seconds)
        self.fallback.pause(seconds)
        self.c.later("pause", [self.hash], [seconds, TTL_S])

    def halt(self, error) -> None:
        """Stop this provider (``ProviderLimiter.halt``), the fallback used while Redis is down included."""
        super().halt(error)
        self.fallback.halt(error)

    def close(self) -> None:
        """The run is stopping (``ProviderLimiter.close``), the fallback used while Redis is down included."""
        super().close()
        self.fallback.close()

    async def acquire(self, request: Request) -> Ticket:
        if self.c.down:
            return await self.fallback.acquire(request)
        await self.window.acquire()
        size = len(request.body)
        try:
            while True:
                cost = self.estimate(size)  # booked only where there is a token rate (configured or stated)
                try:
                    wait, booked_at, token_rate = await self.c.call(
                        "book", [self.hash], [*self._ceilings, cost, RECOVERY_S, TTL_S])
                    wait = float(wait)
                    if wait > 0:
                        await self.sleep(wait)  # ends at once when the provider is stopped (halt) or the run stops
                        if self.ending:  # the attempt checks ``halted`` and ``closed`` and sends nothing
                            return SharedTicket(time.monotonic(), size, cost, float(booked_at), float(token_rate))
                        left = float(await self.c.call("pause", [self.hash], [0, TTL_S]))
                        if left > 0:  # a 429 came in while we waited our turn: book again after it
                            await self.sleep(left)
                            continue
                except _REDIS_ERRORS as exc:
                    self.c.fail(exc)
                    self.window.release()
                    return await self.fallback.acquire(request)
                return SharedTicket(time.monotonic(), size, cost, float(booked_at), float(token_rate))
        except BaseException:
            self.window.release()
            raise

    def finish(self, ticket: Ticket, ok: bool, error: AdapterError | None = None,
               input_tokens: int | None = None, output_tokens: int | None = None) -> None:
        if not isinstance(ticket, SharedTicket):
            self.fallback.finish(ticket, ok, error, input_tokens, output_tokens)
            return
        self.window.release()
        if ok:
            self.replies += 1  # as ProviderLimiter.finish: a provider that has answered is not stopped by one 400
            w = self.window
            if w.size < self.limits.max_in_flight:
                w.resize(min(float(self.limits.max_in_flight), w.size + 1 / w.size))
            if input_tokens is not None:
                if ticket.token_rate > 0:
                    self.c.later("correct", [self.hash], [input_tokens + (output_tokens or 0) - ticket.tokens,
                                                          self._ceilings[1], RECOVERY_S])
                self.estimate.observe(ticket.body_bytes, input_tokens, output_tokens)
            return
        if not isinstance(error, RateLimited):
            return
        self.rate_limited += 1
        self.c.later("rate_limited", [self.hash], [ticket.booked_at, error.rpm or 0, error.tpm or 0, *self._ceilings,
                                                   RECOVERY_S, TTL_S])
        if ticket.sent_at >= self._decreased_at:  # this process's window: once per round of 429s, as locally
            self._decreased_at = time.monotonic()
            if not (error.rpm or error.tpm):
                self.decreases += 1
                self.window.resize(self.window.size * BACKOFF)
        if error.retry_after is not None and error.retry_after <= self.limits.max_stated_wait_s:
            self.pause(error.retry_after)  # honoured exactly, as ProviderLimiter.finish; a longer wait stops the provider


class SharedBudget(Budget):
    """A Budget whose bound holds for every process of the run (spend and reservations in Redis); ``spent``
    is still this process's own. While the coordinator is down: a local Budget of 1/N of the bound."""

    def __init__(self, max_usd: float | None, coordinator: Coordinator):
        super().__init__(max_usd)
        self.c = coordinator
        self.keys = [coordinator.key("cost"), coordinator.key("reservations"), coordinator.key("amounts")]
        self._members: list[tuple[str, float]] = []
        self._fallen = False

    def _fall_back(self) -> None:
        if not self._fallen and self.max_usd is not None:
            self.max_usd = self.max_usd / self.c.shares
        self._fallen = True

    async def reserve(self, usd: float) -> float:
        if self.max_usd is None:  # no bound to share: nothing to ask Redis
            return await super().reserve(usd)
        while not self.c.down:
            member = f"{self.c.member}-{uuid.uuid4().hex[:8]}"
            try:
                answer = int(await self.c.call("reserve", self.keys,
                                               [usd, -1 if self.max_usd is None else self.max_usd, member,
                                                self.c.lease_s, TTL_S]))
            except _REDIS_ERRORS as exc:
                self.c.fail(exc)
                break
            except asyncio.CancelledError:
                self.c.later("settle", self.keys, [member, 0])  # the script may have run: nothing was sent
                raise
            if answer == 1:
                self.c.hold(self.keys[1], member)
                self._members.append((member, usd))
                self.reserved += usd
                self.in_flight += 1
                return usd
            if answer < 0 or self.stopped:
                self.stopped = True
                raise CostBoundReached(f"the cost bound of ${self.max_usd:g} (for every process of the run) leaves "
                                       "no room for another request")
            await asyncio.sleep(POLL_S)
        self._fall_back()
        return await super().reserve(usd)

    def settle(self, reserved: float, actual: float) -> None:
        for i, (member, usd) in enumerate(self._members):
            if usd == reserved:
                del self._members[i]
                self.c.drop(self.keys[1], member)
                self.c.later("settle", self.keys, [member, actual])
                break
        super().settle(reserved, actual)

    async def spent_by_all(self) -> float | None:
        """What every process of the run has spent (USD), or None if Redis cannot say."""
        if self.c.down:
            return None
        try:
            client = await self.c._redis()
            value = await client.hget(self.keys[0], "spent")
        except _REDIS_ERRORS:
            return None
        return float(value or 0)
