"""What a stopped run counts of its rest (``runner.sending.scheduler.Scheduler.drain``: the first
Ctrl-C or SIGTERM, the cost bound, a stopped provider) without encoding each request where no
request of the rest can be a cache hit (``Scheduler.unencoded``), and by encoding each where one
can: the counts are the same either way.

Encoding a request (its task read and built, its body and key) is ~15 µs: counting a million left
took ~15-20 s, most of ``--grace``'s 25 s, and past it the run's counts were lost (null). The figure
is in ``make bench`` (``benchmarks/bench_runner.py``, "counting the rest of a stopped run")."""

from __future__ import annotations

import asyncio
import dataclasses
import signal
from pathlib import Path

import orjson
import pytest

from dxi import adapters
from dxi.cache import Cache
from dxi.evals import Suite, discover
from dxi.runner.counts import requests_block
from dxi.runner.dispatch import so_far
from dxi.runner.planning.plan import ModelRun
from dxi.runner.sending.cost import Budget
from dxi.runner.sending.limits import ProviderLimiter
from dxi.runner.sending.scheduler import Scheduler
from dxi.runner.sending.scheduler import run as run_tasks
from dxi.runner.sending.stops import RunStop

from .fakes.fake_provider import FakeProvider
from .helpers.synthetic import SyntheticSuite, suite, when2call_row

TASKS = 40
FOUR = adapters.Limits(max_in_flight=4, attempt_timeout_s=120, max_attempts=1)


def data(root: Path, indices: range) -> Path:
    """A data directory of the synthetic When2Call rows ``indices`` (a row's request is the same
    whatever its place in the file)."""
    path = root / "when2call" / "when2call_test_mcq.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(orjson.dumps(when2call_row(i)) + b"\n" for i in indices))
    return root


def suite_of(root: Path) -> Suite:
    s = Suite(discover(root), evals=("when2call",))
    s.validate()  # as a run does before its first request: the survey is kept
    return s


class Counting:
    """A model's adapter whose ``encode`` calls are counted."""

    def __init__(self, url: str):
        self.adapter = adapters.get(f"systemone:m@{url}")
        self.encoded = 0
        encode = self.adapter.encode

        def counted(task, sample=0):
            self.encoded += 1
            return encode(task, sample)

        self.adapter.encode = counted


async def cached_before(url: str, root: Path, cache_dir: Path, indices: range) -> None:
    """An earlier run of the model on the rows ``indices``: their replies are in the cache."""
    model = adapters.get(f"systemone:m@{url}")
    await model.start()
    with Cache(cache_dir) as cache:
        stats = await run_tasks([model], suite_of(data(root, indices)), cache)
    await model.close()
    assert stats[model.label].ok == len(indices)


async def drained(
    url: str, root: Path, cache_dir: Path, taken: int, encoded: bool
) -> tuple[dict, int]:
    """A run of the model on the ``TASKS`` rows that stops after its feed has handed out ``taken``
    requests (nothing sent) and counts the rest (``encoded``: by encoding each, as before); its
    counts and the requests encoded meanwhile."""
    counting = Counting(url)
    run = ModelRun(counting.adapter, 1)
    suite = suite_of(data(root, range(TASKS)))
    with Cache(cache_dir) as cache:
        limiters = {run.limits_key: ProviderLimiter(run.adapter.limits)}
        s = Scheduler([run], suite, cache, limiters, Budget(), RunStop(), None, None)
        if encoded:
            s.unencoded = _none
        stream = s.uncached(run)
        for _ in range(taken):
            next(stream)
        before = counting.encoded
        await s.drain([(run.label, stream, False)])
        st = s.stats[run.label]
    counts = {"total": st.total, "cache_hits": st.cache_hits, "not_sent": st.not_sent}
    return counts, counting.encoded - before


async def _none(label: str) -> None:
    return None


@pytest.mark.parametrize(
    ("earlier", "taken", "counts", "unencoded"),
    [
        # a fresh cache, stopped before the first request: all 40 not sent, none encoded (but the
        # first, for the model's configuration)
        (range(0), 0, {"total": 40, "cache_hits": 0, "not_sent": 40}, True),
        # a rerun after the first 10 were answered, stopped as it hands out task 10: its feed met
        # the 10 cached and the rest of its first batch of 32 (encoded); the 29 after it are not
        # sent, none of them cached: counted without encoding the 8 not yet read
        (range(10), 1, {"total": 40, "cache_hits": 10, "not_sent": 29}, True),
        # the last 10 were answered earlier: they lie in the rest, so each is encoded and looked
        # up (cache hits), the other 30 not sent
        (range(30, 40), 0, {"total": 40, "cache_hits": 10, "not_sent": 30}, False),
        # one in the middle of the rest was answered earlier (another selection): the same
        (range(25, 26), 1, {"total": 40, "cache_hits": 1, "not_sent": 38}, False),
    ],
)
async def test_the_rest_is_counted_without_encoding_only_where_none_of_it_can_be_cached(
    tmp_path: Path, earlier: range, taken: int, counts: dict, unencoded: bool
):
    async with FakeProvider(model=None) as server:
        if earlier:
            await cached_before(server.url, tmp_path / "earlier", tmp_path / "cache", earlier)
        fast, encoded_fast = await drained(
            server.url, tmp_path / "data", tmp_path / "cache", taken, encoded=False
        )
        slow, encoded_slow = await drained(
            server.url, tmp_path / "data", tmp_path / "cache", taken, encoded=True
        )
    handed_out = taken  # a request handed out is its sender's to count (not sent, or sent)
    assert fast == slow == counts
    assert fast["cache_hits"] + fast["not_sent"] + handed_out == TASKS
    read = 32 if taken else 0  # the feed encodes its first batch of 32 when it first hands out
    assert encoded_slow == TASKS - read
    # the first request is encoded once, for the model's configuration (its rows in the cache)
    assert encoded_fast == 1 + (0 if unencoded else TASKS - read)


def test_distinct_tasks_is_known_from_the_kept_survey_only_and_none_for_a_repeated_task(
    tmp_path: Path,
):
    tasks = suite({"when2call": 3})
    plain = SyntheticSuite({"when2call": 3}, lambda: iter(tasks))
    assert plain.distinct_tasks() is None  # no survey kept: nothing is read to know it
    plain.survey()
    assert plain.distinct_tasks() == 3
    plain.gold_frames()  # the survey's rows made frames (the scoring's preparation, on a thread)
    assert plain.distinct_tasks() == 3
    # a fourth task shows what the first does under another id: it sends the same request
    again = [*tasks, dataclasses.replace(tasks[0], id=tasks[0].id + "-again")]
    repeated = SyntheticSuite({"when2call": 4}, lambda: iter(again))
    repeated.survey()
    assert repeated.distinct_tasks() is None
    repeated.gold_frames()
    assert repeated.distinct_tasks() is None
    filed = Suite(discover(data(tmp_path, range(5))), evals=("when2call",))
    assert filed.distinct_tasks() is None
    filed.validate()
    assert filed.distinct_tasks() == 5


async def _never(label: str) -> None:
    await asyncio.Event().wait()


async def test_a_run_cut_short_while_counting_its_rest_records_what_it_counted_and_says_so(
    tmp_path: Path,
):
    """40 tasks, 4 in flight, replies that take a minute: the first signal wakes the feeder (no slot
    comes free) to count the rest, which never ends here (``unencoded`` waits for ever), and the
    end of the grace period cancels the run. What was counted is kept (the old code: nothing, the
    run's ``requests`` null): the 4 on the wire sent and abandoned (no row: the next run sends
    them again), their attempts counted, and ``cache_hits`` and ``not_sent``, which counted
    nothing of the 36 left, named incomplete."""
    async with FakeProvider(model=None, default="sleep:60") as server:
        adapter = adapters.get(f"systemone:m@{server.url}", FOUR)
        await adapter.start()
        run = ModelRun(adapter, 1)
        stop = RunStop()
        with Cache(tmp_path / "cache") as cache:
            limiters = {run.limits_key: ProviderLimiter(adapter.limits)}
            s = Scheduler(
                [run],
                suite_of(data(tmp_path / "data", range(TASKS))),
                cache,
                limiters,
                Budget(),
                stop,
                None,
                None,
            )
            s.unencoded = _never
            sending = asyncio.ensure_future(s.run())
            for _ in range(500):
                if server.stats()["arrivals"] >= 4:
                    break
                await asyncio.sleep(0.02)
            stop.request(signal.SIGINT)
            await asyncio.sleep(0.2)  # the feeder, woken, counts the rest (for ever)
            sending.cancel()
            with pytest.raises(asyncio.CancelledError):
                await sending
            rows = cache.scan().collect().height
        await adapter.close()
        arrivals = server.stats()["arrivals"]
    (block,) = requests_block(so_far(stop, [run])).values()
    assert (arrivals, rows) == (4, 0)
    counted = ("sent", "cache_hits", "not_sent", "refused", "attempts", "cost_usd")
    assert {k: block[k] for k in counted} == {
        "sent": 4,
        "cache_hits": 0,
        "not_sent": 0,
        "refused": 0,
        "attempts": 4,
        "cost_usd": None,
    }
    assert block["abandoned"] == {"requests": 4, "cost_at_reservation_usd": None}
    assert block["incomplete"] == ["cache_hits", "not_sent"]
