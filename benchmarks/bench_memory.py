"""Memory: peak RSS of the runner with 1,000,000 tasks (goal ≤ 300 MB), and of the all-cached rerun.

Each figure is measured in a fresh process (its ``VmHWM``, the peak resident set of that process
alone; ``ru_maxrss`` would carry over the parent's peak across ``exec``): the run stage of
``dxi run`` (``runner.sending.scheduler`` with the cache) over a million synthetic When2Call tasks
streamed from a generator, answered in-process by the fake provider's System One responder (no HTTP,
so a million requests take a minute, not an hour); then the same million again, now all cached. The
import baseline (aiohttp, polars, pyarrow, numpy) is reported beside them.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

from . import Result

TASKS = 1_000_000
GOAL_MB = 300.0


def peak_rss_mb() -> float:
    """This process's peak resident set size (``VmHWM`` in /proc/self/status), in MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def _child(n: int, cache_dir: str) -> None:
    import asyncio

    import uvloop

    from dxi.adapters import Limits, ModelSpec
    from dxi.cache import Cache
    from dxi.runner.sending.scheduler import run
    from tests.fakes.fake_provider import InProcess
    from tests.helpers.synthetic import SyntheticSuite

    baseline = peak_rss_mb()

    async def main() -> dict:
        adapter = InProcess(
            ModelSpec("systemone", "bench", "http://in-process"), Limits(max_in_flight=64)
        )
        await adapter.start()
        started = time.perf_counter()
        with Cache(cache_dir) as cache:
            stats = (await run([adapter], SyntheticSuite.when2call(n), cache))[adapter.label]
            keys = len(cache)
        return {
            "seconds": time.perf_counter() - started,
            "sent": stats.sent,
            "cache_hits": stats.cache_hits,
            "keys": keys,
        }

    out = uvloop.run(main()) if sys.platform != "win32" else asyncio.run(main())
    out |= {"peak_mb": peak_rss_mb(), "baseline_mb": baseline}
    print(orjson.dumps(out).decode())


def _measure(n: int, cache_dir: Path) -> dict:
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_memory", str(n), str(cache_dir)],
        cwd=root,
        capture_output=True,
        check=True,
        timeout=1800,
    )
    return orjson.loads(done.stdout.splitlines()[-1])


def run() -> list[Result]:
    with tempfile.TemporaryDirectory(prefix="dxi-bench-memory-") as tmp:
        fresh = _measure(TASKS, Path(tmp))
        cached = _measure(TASKS, Path(tmp))
    results = []
    for m, what in (
        (fresh, "1,000,000 tasks sent (fresh cache)"),
        (cached, "1,000,000 tasks, all cached (rerun)"),
    ):
        met = m["peak_mb"] <= GOAL_MB
        note = (
            f"{m['sent']:,} sent, {m['cache_hits']:,} cached, {m['keys']:,} keys in the index, "
            f"{m['seconds']:.0f} s; import baseline {m['baseline_mb']:.0f} MB"
        )
        if not met:
            note += "; over the goal: see the report for what holds the memory"
        results.append(
            Result(
                "memory", f"peak RSS, {what}", m["peak_mb"], "MB", f"≤ {GOAL_MB:g} MB", met, note
            )
        )
    return results


if __name__ == "__main__":
    _child(int(sys.argv[1]), sys.argv[2])
