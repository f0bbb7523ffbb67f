"""The Lua side of ``--coordinator`` (``runner.distributed.coordinator``): one script, run
atomically by Redis, with every operation a process has for Redis (``library``).

Each call carries the operations of one event-loop turn of one process (a batch) and first says the
caller is alive (its shard and its process: ``members`` and ``procs``, sorted sets of expiry times)
and computes the share ``f`` of the limits the shards alive (or done) may use,
``(alive + done) / N``. Then each operation:

* ``acquire`` / ``release`` / ``cancel`` / ``check``: the in-flight slots, a sorted set of leases
  per provider, and its queue of waiters (first come first served); ``grant`` hands free slots to
  the queue's head, books each one's turn (GCRA, at ``f`` of the rates) and tells its process on its
  pub/sub channel;
* ``pause``, ``rate_limited``, ``correct``: the shared pause a 429 states (told to every process on
  pub/sub), the narrowed rates and a limit a 429's headers state, the token booking corrected by a
  reply's usage;
* ``reserve`` / ``settle`` / ``restore``: the cost bound (the shares of the shards out held back,
  less what they spent; ``restore``: a process back on Redis adds what Redis does not count of its
  spend and reservations, after falling back or after Redis lost the run's keys); every call also
  answers what the bound holds for the other processes (their spend and reservations, the shares
  held back for the shards out; the batch's last answer), which a process that falls back keeps to
  size its share;
* ``refresh`` (the heartbeat: leases renewed, queues a dead process's slots can serve now served),
  ``join``, ``done``.

Rates are units per second; times are the run's clock (seconds): Redis's ``TIME``, kept from going
back (``skew``, ``clock``: a step back of the Redis host's clock is absorbed, and time goes on from
where it was, so a step back of an hour no longer stalls every process for an hour; a step forward
is taken as time passing, as any clock does: leases and memberships it spans lapse early, bookings
are not affected). Floats go back to Python as strings (a Lua number returned to Redis is truncated
to an integer). The keys are named in the arguments (one Redis, or a primary; not a Redis Cluster).
"""

from __future__ import annotations

from ..sending.limits import BACKOFF, MIN_FRACTION

_LIBRARY = """
local TTL = @TTL@
local pre, shard, n, proc, mttl = ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5], tonumber(ARGV[6])

local function keep(key) redis.call('EXPIRE', key, TTL) end

-- the run's clock: Redis's, never going back. A step back of the host's clock (an NTP step, a VM restored)
-- is absorbed into 'skew' and time goes on from where it was: without it every booking, pause and lease
-- made before the step lay that much further ahead, and every process waited as long as the step.
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6 @SHIFT@
local skew = tonumber(redis.call('GET', pre .. 'skew')) or 0
now = now + skew
local last = tonumber(redis.call('GET', pre .. 'clock'))
if last and now < last then
  if last - now > 1 then redis.call('PUBLISH', pre .. 'events', 'clock ' .. tostring(last - now)) end
  skew = skew + (last - now)
  now = last
  redis.call('SET', pre .. 'skew', tostring(skew), 'EX', TTL)
end
redis.call('SET', pre .. 'clock', tostring(now), 'EX', TTL)

redis.call('ZADD', pre .. 'members', now + mttl, shard)
redis.call('SREM', pre .. 'done', shard)
redis.call('ZADD', pre .. 'procs', now + mttl, proc)
keep(pre .. 'members'); keep(pre .. 'procs')
redis.call('ZREMRANGEBYSCORE', pre .. 'members', '-inf', now)
redis.call('ZREMRANGEBYSCORE', pre .. 'procs', '-inf', now)
local f = (redis.call('ZCARD', pre .. 'members') + redis.call('SCARD', pre .. 'done')) / n
if f > 1 then f = 1 end

local function rate(h, p, ceil, recovery)
  local v = redis.call('HMGET', h, p .. 'learned', p .. 'low', p .. 'since')
  local learned = tonumber(v[1])
  if learned and (ceil <= 0 or learned < ceil) then ceil = learned end
  if ceil <= 0 then return 0, 0 end
  local low = tonumber(v[2])
  if not low then return ceil, ceil end
  return math.min(ceil, low + ceil * (now - tonumber(v[3])) / recovery), ceil
end

-- book the next free instant at f of the rates: -> seconds to wait, token rate used
local function book(h, rc, tc, tokens, recovery)
  local start = math.max(now, tonumber(redis.call('HGET', h, 'paused')) or 0)
  local wait = start - now
  local rr = rate(h, 'r', rc, recovery) * f
  if rr > 0 then
    local s = math.max(tonumber(redis.call('HGET', h, 'rtat')) or 0, start)
    redis.call('HSET', h, 'rtat', tostring(s + 1 / rr))
    wait = math.max(wait, s - now)
  end
  local tr = rate(h, 't', tc, recovery) * f
  if tr > 0 and tokens > 0 then
    local s = math.max(tonumber(redis.call('HGET', h, 'ttat')) or 0, start)
    redis.call('HSET', h, 'ttat', tostring(s + tokens / tr))
    wait = math.max(wait, s - now)
  end
  keep(h)
  return wait, tr
end

local function keys(p) return pre .. 'provider:' .. p, pre .. 'slots:' .. p, pre .. 'waitq:' .. p end

local function owner(member) return string.match(member, '^(.*)/[^/]*$') end
local function alive(proc) return proc and redis.call('ZSCORE', pre .. 'procs', proc) end

-- the slots held: leases not ended, of processes alive (a process cut off lets its slots go with its share)
local function held(slots)
  redis.call('ZREMRANGEBYSCORE', slots, '-inf', now)
  local count = 0
  for _, m in ipairs(redis.call('ZRANGE', slots, 0, -1)) do
    if alive(owner(m)) then count = count + 1 else redis.call('ZREM', slots, m) end
  end
  return count
end

-- hand free slots to the queue's head, first come first served (its booking made here, its process told;
-- a slot handed to another process is leased for two heartbeats, until its holder's heartbeat renews it)
local function grant(p, size, lease, rc, tc, recovery, me)
  local h, slots, q = keys(p)
  local count = held(slots)
  local cap = math.max(1, math.floor(size * f + 1e-9))
  local mine = nil
  while count < cap do
    local head = redis.call('ZRANGE', q, 0, 0)[1]
    if not head then break end
    redis.call('ZREM', q, head)
    local tokens = tonumber(redis.call('HGET', q .. ':cost', head)) or 0
    redis.call('HDEL', q .. ':cost', head)
    local proc = owner(head)
    if alive(proc) then
      count = count + 1
      redis.call('ZADD', slots, now + (head == me and lease or math.min(lease, @CLAIM@)), head)
      keep(slots)
      local wait, tr = book(h, rc, tc, tokens, recovery)
      local answer = {1, tostring(wait), tostring(now), tostring(tr)}
      redis.call('HSET', pre .. 'grants:' .. p, head, answer[2] .. ' ' .. answer[3] .. ' ' .. answer[4])
      keep(pre .. 'grants:' .. p)
      if head == me then
        mine = answer
      else
        redis.call('PUBLISH', pre .. 'proc:' .. proc, 'grant ' .. head .. ' ' .. answer[2] .. ' ' .. answer[3] .. ' ' ..
                   answer[4] .. ' ' .. p)
      end
    end
  end
  return mine
end

local OPS = {}

-- p, size, member, lease, request ceiling, token ceiling (per second; 0 = none), tokens, recovery
-- -> {1, wait, now, token rate}: taken and booked; {0}: queued (handed over later)
OPS.acquire = function(a)
  local p, size, member, lease = a[1], tonumber(a[2]), a[3], tonumber(a[4])
  local h, slots, q = keys(p)
  local seq = redis.call('HINCRBY', h, 'seq', 1)
  redis.call('ZADD', q, seq, member)
  redis.call('HSET', q .. ':cost', member, a[7])
  keep(q); keep(q .. ':cost')
  return grant(p, size, lease, tonumber(a[5]), tonumber(a[6]), tonumber(a[8]), member) or {0}
end

-- p, size, member, lease, ceilings, recovery: the slot given back, and handed on
OPS.release = function(a)
  local h, slots, q = keys(a[1])
  redis.call('ZREM', slots, a[3])
  redis.call('HDEL', pre .. 'grants:' .. a[1], a[3])
  grant(a[1], tonumber(a[2]), tonumber(a[4]), tonumber(a[5]), tonumber(a[6]), tonumber(a[7]), nil)
  return 1
end

-- as release, for a waiter that gave up: out of the queue, or its slot given back if it was handed one
OPS.cancel = function(a)
  local h, slots, q = keys(a[1])
  if redis.call('ZREM', q, a[3]) == 1 then
    redis.call('HDEL', q .. ':cost', a[3])
    return 1
  end
  return OPS.release(a)
end

-- as release, for a waiter -> the booking it was handed ("wait now rate"), 0 still queued, -1 neither (lost)
OPS.check = function(a)
  local h, slots, q = keys(a[1])
  grant(a[1], tonumber(a[2]), tonumber(a[4]), tonumber(a[5]), tonumber(a[6]), tonumber(a[7]), nil)
  local granted = redis.call('HGET', pre .. 'grants:' .. a[1], a[3])
  if granted and redis.call('ZSCORE', slots, a[3]) then return granted end
  if redis.call('ZSCORE', q, a[3]) then return 0 end
  return -1
end

-- p, seconds -> seconds left of the pause (after holding it for ``seconds``, when > 0; told to every process)
OPS.pause = function(a)
  local h = keys(a[1])
  local paused = tonumber(redis.call('HGET', h, 'paused')) or 0
  local s = tonumber(a[2])
  if s > 0 and now + s > paused then
    paused = now + s
    redis.call('HSET', h, 'paused', tostring(paused))
    redis.call('HINCRBYFLOAT', h, 'paused_s', tostring(s))
    keep(h)
    redis.call('PUBLISH', pre .. 'events', 'pause ' .. tostring(s) .. ' ' .. a[1])
  end
  return tostring(math.max(0, paused - now))
end

-- p, booked_at, stated rpm, stated tpm (0 = none), request ceiling, token ceiling, recovery -> 1 when cut
OPS.rate_limited = function(a)
  local h = keys(a[1])
  local recovery = tonumber(a[7])
  local learned = false
  for i, p in ipairs({'r', 't'}) do
    local stated = tonumber(a[2 + i]) / 60
    if stated > 0 then
      local cur, ceil = rate(h, p, tonumber(a[4 + i]), recovery)
      if ceil <= 0 or stated < ceil then
        redis.call('HSET', h, p .. 'learned', tostring(stated), p .. 'low', tostring(math.min(cur > 0 and cur or stated, stated)),
                   p .. 'since', tostring(now))
        learned = true
      end
    end
  end
  local decreased = tonumber(redis.call('HGET', h, 'decreased')) or -1
  local cut = 0
  if tonumber(a[2]) >= decreased then
    redis.call('HSET', h, 'decreased', tostring(now))
    if not learned then
      cut = 1
      redis.call('HINCRBY', h, 'decreases', 1)
      for i, p in ipairs({'r', 't'}) do
        local cur, ceil = rate(h, p, tonumber(a[4 + i]), recovery)
        if cur > 0 then
          redis.call('HSET', h, p .. 'low', tostring(math.max(ceil * @MIN@, cur * @BACKOFF@)), p .. 'since', tostring(now))
        end
      end
    end
  end
  redis.call('HINCRBY', h, 'rate_limited', 1)
  keep(h)
  return cut
end

-- p, tokens to add (or give back when negative), token ceiling, recovery
OPS.correct = function(a)
  local h = keys(a[1])
  local tr = rate(h, 't', tonumber(a[3]), tonumber(a[4])) * f
  if tr > 0 then redis.call('HINCRBYFLOAT', h, 'ttat', tostring(tonumber(a[2]) / tr)) end
  return 1
end

-- lease, groups, then groups of (zset, count, members...): the leases this process holds, renewed; then
-- (p, size, lease, ceilings, recovery) of each provider this process waits for: slots freed by leases that
-- ended (a dead process's) handed over
OPS.refresh = function(a)
  local lease, i = tonumber(a[1]), 3
  for _ = 1, tonumber(a[2]) do
    local zset, count = a[i], tonumber(a[i + 1])
    for j = i + 2, i + 1 + count do redis.call('ZADD', zset, 'XX', now + lease, a[j]) end
    i = i + 2 + count
  end
  while i + 5 <= #a do
    grant(a[i], tonumber(a[i + 1]), tonumber(a[i + 2]), tonumber(a[i + 3]), tonumber(a[i + 4]), tonumber(a[i + 5]), nil)
    i = i + 6
  end
  return 1
end

-- this shard is done: its share is the others' (until it starts again)
OPS.done = function(a)
  redis.call('ZREM', pre .. 'members', shard)
  redis.call('SADD', pre .. 'done', shard)
  keep(pre .. 'done')
  return 1
end

OPS.join = function(a) return tostring(f) end

local function keep_cost()
  for _, k in ipairs({'cost', 'reservations', 'amounts', 'spentby', 'spentproc', 'reservedproc'}) do keep(pre .. k) end
end

local function expire_reservations()
  local dead = redis.call('ZRANGEBYSCORE', pre .. 'reservations', '-inf', now)
  for _, m in ipairs(dead) do
    local v = redis.call('HGET', pre .. 'amounts', m)
    if v then
      local usd, by, who = string.match(v, '^(%S+) (%S+) ?(%S*)$')
      redis.call('HINCRBYFLOAT', pre .. 'cost', 'spent', usd)
      redis.call('HINCRBYFLOAT', pre .. 'cost', 'reserved', tostring(-tonumber(usd)))
      redis.call('HINCRBYFLOAT', pre .. 'spentby', by, usd)
      if who ~= '' then
        redis.call('HINCRBYFLOAT', pre .. 'spentproc', who, usd)
        redis.call('HINCRBYFLOAT', pre .. 'reservedproc', who, tostring(-tonumber(usd)))
      end
      redis.call('HDEL', pre .. 'amounts', m)
    end
    redis.call('ZREM', pre .. 'reservations', m)
  end
end

-- what the bound holds back for the shards out (not alive, not done): for each, its share less what it spent here
local function held_out(bound)
  local alive = {}
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', pre .. 'members', now, '+inf')) do alive[m] = true end
  for _, m in ipairs(redis.call('SMEMBERS', pre .. 'done')) do alive[m] = true end
  local spentby = {}
  local flat = redis.call('HGETALL', pre .. 'spentby')
  for i = 1, #flat, 2 do spentby[flat[i]] = tonumber(flat[i + 1]) end
  local out = 0
  for k = 0, n - 1 do
    if not alive[tostring(k)] then out = out + math.max(0, bound / n - (spentby[tostring(k)] or 0)) end
  end
  return out
end

-- usd, bound, member, lease -> 1 reserved, 0 no room while others are in flight (ask again), -1 stopped,
-- -2 no room within the shares of the shards in Redis, though within the whole bound (this process stops).
-- The bound for the shards in Redis: all of it but, for each shard out, its share less what it spent here.
-- 'stopped' is the bound the run stopped at: a higher bound (a rerun under the same run id) goes on.
OPS.reserve = function(a)
  local c = pre .. 'cost'
  keep_cost()
  expire_reservations()
  local usd, bound = tonumber(a[1]), tonumber(a[2])
  local stopped = tonumber(redis.call('HGET', c, 'stopped'))
  if stopped and bound <= stopped then return -1 end
  if stopped then redis.call('HDEL', c, 'stopped') end
  redis.call('SET', pre .. 'bound', a[2], 'EX', TTL)  -- (for the shares held back each answer counts)
  local out = held_out(bound)
  local spent = tonumber(redis.call('HGET', c, 'spent')) or 0
  local reserved = tonumber(redis.call('HGET', c, 'reserved')) or 0
  local inflight = redis.call('ZCARD', pre .. 'reservations')
  if inflight == 0 then reserved = 0; redis.call('HSET', c, 'reserved', '0'); redis.call('DEL', pre .. 'reservedproc') end
  if spent + reserved + usd <= bound - out then
    redis.call('HINCRBYFLOAT', c, 'reserved', tostring(usd))
    redis.call('HINCRBYFLOAT', pre .. 'reservedproc', proc, tostring(usd))
    redis.call('HSET', pre .. 'amounts', a[3], a[1] .. ' ' .. shard .. ' ' .. proc)
    redis.call('ZADD', pre .. 'reservations', now + tonumber(a[4]), a[3])
    return 1
  end
  if inflight > 0 then return 0 end
  if spent + usd <= bound then return -2 end
  redis.call('HSET', c, 'stopped', tostring(bound))
  return -1
end

-- member, actual usd
OPS.settle = function(a)
  local v = redis.call('HGET', pre .. 'amounts', a[1])
  if v then
    local usd, _, who = string.match(v, '^(%S+) (%S+) ?(%S*)$')
    redis.call('HINCRBYFLOAT', pre .. 'cost', 'reserved', tostring(-tonumber(usd)))
    if who ~= '' then redis.call('HINCRBYFLOAT', pre .. 'reservedproc', who, tostring(-tonumber(usd))) end
    redis.call('HDEL', pre .. 'amounts', a[1])
    redis.call('ZREM', pre .. 'reservations', a[1])
  end
  redis.call('HINCRBYFLOAT', pre .. 'cost', 'spent', a[2])
  redis.call('HINCRBYFLOAT', pre .. 'spentby', shard, a[2])
  redis.call('HINCRBYFLOAT', pre .. 'spentproc', proc, a[2])
  keep(pre .. 'spentby'); keep(pre .. 'spentproc')
  return 1
end

-- what this process spent in all, lease, count, then (member, usd) of each of its reservations in flight:
-- a process back on Redis adds what it spent that Redis does not count ('spentproc': what it spent on its
-- own while out, or all of it when Redis lost the run's keys) and puts back the reservations Redis lost
OPS.restore = function(a)
  local c = pre .. 'cost'
  local more = tonumber(a[1]) - (tonumber(redis.call('HGET', pre .. 'spentproc', proc)) or 0)
  if more > 0 then
    redis.call('HINCRBYFLOAT', c, 'spent', tostring(more))
    redis.call('HINCRBYFLOAT', pre .. 'spentby', shard, tostring(more))
    redis.call('HINCRBYFLOAT', pre .. 'spentproc', proc, tostring(more))
  end
  for i = 4, 3 + 2 * tonumber(a[3]), 2 do
    if not redis.call('HGET', pre .. 'amounts', a[i]) then
      redis.call('HINCRBYFLOAT', c, 'reserved', a[i + 1])
      redis.call('HINCRBYFLOAT', pre .. 'reservedproc', proc, a[i + 1])
      redis.call('HSET', pre .. 'amounts', a[i], a[i + 1] .. ' ' .. shard .. ' ' .. proc)
      redis.call('ZADD', pre .. 'reservations', now + tonumber(a[2]), a[i])
    end
  end
  keep_cost()
  return 1
end

-- ARGV[1] "batch", the common arguments, the number of operations, then each as (name, count, arguments...)
-- -> each operation's answer, in order, then what the cost bound holds for the other processes: what
-- they spent and reserved (all's, less this process's) and the shares held back for the shards out. A
-- process that falls back sizes its share by the last it saw (``SharedBudget.share``)
local out, i = {}, 8
for _ = 1, tonumber(ARGV[7]) do
  local count = tonumber(ARGV[i + 1])
  out[#out + 1] = OPS[ARGV[i]]({unpack(ARGV, i + 2, i + 1 + count)}) or 0
  i = i + 2 + count
end
local cost = redis.call('HMGET', pre .. 'cost', 'spent', 'reserved')
local bound = redis.call('GET', pre .. 'bound')
local all = (tonumber(cost[1]) or 0) + (tonumber(cost[2]) or 0)
local mine = (tonumber(redis.call('HGET', pre .. 'spentproc', proc)) or 0)
  + (tonumber(redis.call('HGET', pre .. 'reservedproc', proc)) or 0)
local others = math.max(0, all - mine)
if bound then others = others + held_out(tonumber(bound)) end
out[#out + 1] = tostring(others)
return out
"""


def library(ttl_s: float, claim_s: float, shift_key: str | None = None) -> str:
    """The script: keys expire ``ttl_s`` seconds after their last use; a slot handed to another
    process is leased ``claim_s`` seconds until its holder's heartbeat renews it. ``shift_key``
    (tests: the time source injected) names a Redis key whose value, seconds, is added to Redis's
    clock (a step of the host's clock, made by setting it)."""
    shift = "" if shift_key is None else f"+ (tonumber(redis.call('GET', {shift_key!r})) or 0)"
    return (
        _LIBRARY.replace("@TTL@", str(int(ttl_s)))
        .replace("@CLAIM@", repr(claim_s))
        .replace("@MIN@", repr(MIN_FRACTION))
        .replace("@BACKOFF@", repr(BACKOFF))
        .replace("@SHIFT@", shift)
    )
