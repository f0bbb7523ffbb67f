"""The memory allocators of a ``dxi run --batch`` process, set before Polars and PyArrow are
imported (``tune``).

Batch mode only: the settings trade CPU for memory. On a synchronous run of 2,000 requests beside a
cache of 1,000,000 rows (``benchmarks/bench_process.py``'s big-cache start-up case, 4 alternating
runs each on the 2-core machine) they took the peak from 630 to 531 MB but the CPU time from 6.0-6.7
to 7.6-7.8 s and the wall time from 5.4 to 6.8 s, so a synchronous run keeps the allocators'
defaults.

Three allocators share the process: glibc's ``malloc`` (Python's objects, NumPy's arrays), Polars'
jemalloc and PyArrow's memory pool (mimalloc in its wheels). Each keeps memory it has freed for
reuse, and by their defaults what one step of a run freed stayed resident under the next: the peak
of ``dxi run --batch`` over 20 models × 2,193 requests (``benchmarks/bench_batch.py``) was the
scoring after the run on top of what the batches' collection and the cache's compactions had left in
the three heaps. Measured there (peak RSS of the run, one run each on the 2-core machine, the
settings added one at a time): defaults 389-401 MB; PyArrow on glibc's malloc 350 MB; with
jemalloc's settings 347 MB; with two glibc arenas 309 MB; with the fixed threshold 291 MB (287-294
MB over three runs of the benchmark). A fully cached rerun of the same run (scoring only) went from
252-268 MB and 8.2-9.0 s to 226-228 MB and 5.7-6.2 s: none of it costs time.

* **Polars' jemalloc**: one arena, freed pages given back after 10 ms (``_RJEM_MALLOC_CONF``, which
  Polars reads when it is imported; ``view.data`` gives its start-up child the same settings,
  measured there).
* **PyArrow**: glibc's malloc (``ARROW_DEFAULT_MEMORY_POOL=system``, read when PyArrow is imported),
  whose free pages ``malloc_trim`` returns (``runner.batch.driver`` calls it after each collection)
  and which the other threads' allocations already share.
* **glibc**: at most two arenas (``M_ARENA_MAX``: the threads of the cache's compaction, the
  scoring's preparation and aiohttp's resolver otherwise each keep their own heap) and a fixed 128
  KiB threshold for giving a large freed block straight back to the system (``M_MMAP_THRESHOLD``:
  glibc's default start, which otherwise grows with every large block freed, up to 32 MB, after
  which blocks of that size stay in the heap).

What the user set in the environment (``_RJEM_MALLOC_CONF``'s options,
``ARROW_DEFAULT_MEMORY_POOL``, ``MALLOC_ARENA_MAX``, ``MALLOC_MMAP_THRESHOLD_``) is kept. Outside
glibc (macOS, musl) only the first two apply. The variables are inherited by the processes a run
starts (the embedded model's workers), which use less memory by them too.
"""

from __future__ import annotations

import os
import sys

JEMALLOC_VAR = "_RJEM_MALLOC_CONF"
JEMALLOC = "narenas:1,dirty_decay_ms:10,muzzy_decay_ms:0"
ARROW_VAR = "ARROW_DEFAULT_MEMORY_POOL"
M_MMAP_THRESHOLD, M_ARENA_MAX = -3, -8  # glibc's mallopt parameters (malloc.h)
GLIBC = {
    "MALLOC_ARENA_MAX": (M_ARENA_MAX, 2),
    "MALLOC_MMAP_THRESHOLD_": (M_MMAP_THRESHOLD, 128 << 10),
}


def tune(environ: dict[str, str] | None = None) -> list[str]:
    """Set the allocators as the module docstring says, in ``environ`` (default ``os.environ``) and
    through glibc's ``mallopt``; returns what was set (``NAME=VALUE`` each), for the log. Call it
    before Polars and PyArrow are imported: a library imported already keeps its allocator (then
    nothing is set for it)."""
    env = os.environ if environ is None else environ
    done = []
    if "polars" not in sys.modules:
        given = env.get(JEMALLOC_VAR)
        env[JEMALLOC_VAR] = (
            f"{JEMALLOC},{given}" if given else JEMALLOC
        )  # jemalloc takes an option's last value
        done.append(f"{JEMALLOC_VAR}={env[JEMALLOC_VAR]}")
    if "pyarrow" not in sys.modules and ARROW_VAR not in env:
        env[ARROW_VAR] = "system"
        done.append(f"{ARROW_VAR}=system")
    mallopt = _mallopt()
    if mallopt is not None:
        for name, (param, value) in GLIBC.items():
            if name not in env and mallopt(param, value) == 1:
                done.append(f"mallopt({name.rstrip('_')}={value})")
    return done


def _mallopt():
    """glibc's ``mallopt``, or None elsewhere."""
    try:
        import ctypes

        return ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return None
