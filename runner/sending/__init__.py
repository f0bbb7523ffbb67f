"""Sending: a plan's requests through the providers' synchronous APIs, under limits, retries and the
cost bound, each outcome appended to the cache.

* ``scheduler``: the job queue, every task of every model through one asyncio queue (``run``);
* ``retry``: one request attempted until it succeeds, fails deterministically or runs out of
  attempts;
* ``limits``: per-provider requests and tokens per minute and requests in flight, adapted to 429s;
* ``outage``: a provider that cannot be reached, paused and probed one request at a time;
* ``stops``: a provider or a model stopped (quota, key, a stated wait), or the run stopping;
* ``cost``: the cost bound (``--max-cost``): spent plus in-flight cost never passes it;
* ``rows``: an outcome as the cache row that records it;
* ``progress``: what a person watches: done/total, rate, time left, spend, retries, per model.
"""
