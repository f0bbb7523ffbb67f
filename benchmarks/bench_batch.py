"""Batch mode (docs/batch.md): ``MODELS`` models × ``TASKS`` requests (one model-epoch of the index:
2,193) through the fake batch server (``tests.fakes.fake_batches``, OpenAI's Files and Batches
endpoints, in its own process) in one ``dxi run --batch``: the run's peak memory (the ``dxi run``
process's own peak RSS, from ``wait4``: not the server's, nor a process an earlier benchmark
started), the requests made to the provider per answer beyond the upload and the download (creates,
status reads, lists), and the time from a batch's end (the status read that finds it ended) to its
answers being in the cache (the ledger's ``ended`` and ``collected`` events: the time some batch is
being collected, those collected side by side counted once), per 10,000 answers. The fake makes a
batch's answers when it is created, so that ending twenty batches at once does not take the shared
machine's CPU from the collections being timed.

``DXI_BENCH_BATCH_MODELS`` / ``DXI_BENCH_BATCH_TASKS`` scale it (defaults 20 and 2,193; the tasks
are the real data's first evaluation rows when ``../shared/data`` is there, else synthetic When2Call
rows).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from . import Result

MODELS = int(os.environ.get("DXI_BENCH_BATCH_MODELS", 20))
TASKS = int(os.environ.get("DXI_BENCH_BATCH_TASKS", 2193))
POLL_S = 1.0


def _data(tmp: Path) -> Path:
    from tests.helpers.synthetic import data_dir

    return data_dir(tmp / "data", TASKS, seed=11)


def _busy(spans: list[tuple[float, float]]) -> float:
    """Seconds covered by the union of ``spans`` ((start, end) pairs): the time some batch was
    between its end and its answers all in the cache (batches collected side by side count once)."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def _sample_cpu(
    proc: subprocess.Popen, out: list[tuple[float, float]], every: float = 0.05
) -> None:
    """Append (Unix seconds, CPU seconds of ``proc`` so far: user + system, all its threads) every
    ``every`` seconds until it ends (``/proc/PID/stat``; nothing elsewhere)."""
    tick = os.sysconf("SC_CLK_TCK")
    while proc.poll() is None:
        try:
            fields = Path(f"/proc/{proc.pid}/stat").read_text().rpartition(")")[2].split()
            out.append((time.time(), (int(fields[11]) + int(fields[12])) / tick))
        except (OSError, IndexError, ValueError):
            return
        time.sleep(every)


def _cpu_in(spans: list[tuple[float, float]], cpu: list[tuple[float, float]]) -> float:
    """CPU seconds the run spent while some span of ``spans`` was open (from the samples
    ``cpu``)."""
    total = 0.0
    for (t0, c0), (t1, c1) in zip(cpu, cpu[1:], strict=False):
        if any(start <= (t0 + t1) / 2 <= end for start, end in spans):
            total += c1 - c0
    return total


def run() -> list[Result]:
    from dxi.cache import Cache
    from dxi.cache.ledger import Ledger
    from tests.fakes.fake_provider import serve

    with tempfile.TemporaryDirectory(prefix="dxi-bench-batch-") as name:
        tmp = Path(name)
        data = _data(tmp)
        with serve(model=None, record=False, batch={"polls": 1, "validate": False}) as server:
            run_file = tmp / "run.toml"
            run_file.write_text(
                f'data_dir = "{data}"\ncache_dir = "{tmp / "cache"}"\nout = "{tmp / "out"}"\n'
                f'[providers.fake]\nkind = "openai"\nbase_url = "{server.url}/v1"\nbatch = true\n'
                + "".join(
                    f'[[models]]\nprovider = "fake"\nmodel = "m{i:02d}"\n' for i in range(MODELS)
                )
            )
            started = time.perf_counter()
            with open(tmp / "stderr", "w+b") as err:
                proc = subprocess.Popen(
                    [
                        str(Path(sys.executable).with_name("dxi")),
                        "run",
                        str(run_file),
                        "-q",
                        "--poll",
                        str(POLL_S),
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=err,
                )
                cpu: list[tuple[float, float]] = []  # (Unix seconds, the run's CPU seconds so far)
                sampler = threading.Thread(target=_sample_cpu, args=(proc, cpu), daemon=True)
                sampler.start()
                _, status, usage = os.wait4(
                    proc.pid, 0
                )  # this process's own peak (and its children's, none here)
                sampler.join()
                proc.returncode = os.waitstatus_to_exitcode(status)
                err.seek(0)
                stderr = err.read().decode("utf-8", "replace")
            wall = time.perf_counter() - started
            peak_mb = usage.ru_maxrss / 1024  # KiB on Linux
            stats = server.stats()
        if proc.returncode != 0:
            raise RuntimeError(f"dxi run --batch failed ({proc.returncode}): {stderr[-2000:]}")
        answers = Cache(tmp / "cache").scan().select("key").collect().height
        entries = list(Ledger(tmp / "cache").entries().values())
    expected = MODELS * TASKS
    extra_calls = (
        stats["batch_creates"]
        + stats["batch_polls"]
        + stats["batch_lists"]
        + stats["batch_cancels"]
    )
    spans = [(e.ended_at, e.collected_at) for e in entries if e.collected_at and e.ended_at]
    lag = _busy(spans)
    per_10k = lag / max(1, answers) * 10_000
    cpu_10k = _cpu_in(spans, cpu) / max(1, answers) * 10_000
    load = os.getloadavg()[0]
    note = (
        f"{MODELS} models x {TASKS:,} requests, {len(entries)} batches, {stats['batch_uploads']} uploads, "
        f"{stats['batch_polls']} status reads, {stats['batch_downloads']} downloads; wall {wall:.1f} s"
    )
    return [
        Result(
            "batch",
            "answers stored",
            answers,
            "answers",
            f"= {expected:,}",
            answers == expected,
            note,
        ),
        Result(
            "batch", "peak RSS of dxi run --batch", peak_mb, "MB", "≤ 300 MB", peak_mb <= 300, note
        ),
        Result(
            "batch",
            "provider calls per answer beyond upload and download",
            extra_calls / max(1, answers),
            "calls",
            "≤ 0.01",
            extra_calls / max(1, answers) <= 0.01,
            "creates + status reads + lists + cancels",
        ),
        Result(
            "batch",
            "from a batch's end to its answers in the cache",
            per_10k,
            "s per 10,000 answers",
            "≤ 2 s",
            per_10k <= 2.0,
            "download, decode and append of every result line; the time any batch is being "
            f"collected, per 10,000 answers (load average {load:.1f} on {os.cpu_count()} cores)",
        ),
        Result(
            "batch",
            "CPU time of dxi run while batches are being collected",
            cpu_10k,
            "s per 10,000 answers",
            note="user + system, every thread of the run (the time above less what other processes took); "
            f"load average {load:.1f}",
        ),
    ]
