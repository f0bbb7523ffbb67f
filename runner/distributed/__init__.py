"""Past one machine (docs/distributed.md): shards, a remote cache and limits shared through Redis.

* ``setup``: the command line's part: ``--shard``, ``--cache-remote``, ``--coordinator`` read and
  started;
* ``coordinator``: the connection to Redis, the calls, each process's share and the fallback;
* ``coordinator_script``: the Lua script Redis runs atomically (``library``);
* ``shared_limits``: the limiter and cost budget whose state is in Redis, used by the scheduler.
"""
