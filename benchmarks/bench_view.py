"""``dxi view`` on a large cache: 20 models × 50,000 questions (1,000,000 answers, synthetic,
through the real cache schema: ``tests.helpers.synthetic``), served by the real app in its own
process and asked over HTTP on 127.0.0.1.

Figures:

* start-up: from starting the server process until it answers (scoring the cache as ``dxi score``
  does, with intervals, and laying the answers out for the pages; for information);
* the overview, first request after start-up — goal ≤ 1 s;
* an evaluation page with filters (model, wrong answers, a category, a page further on; and with a
  disagreement of two models and a search in the state), each the slowest of its ``REPEATS`` runs
  over different pages — goal ≤ 300 ms;
* a question page (a WildGuardTest task: three questions, 20 models) — goal ≤ 100 ms, the slowest of
  ``REPEATS`` different tasks;
* memory: the server process's peak resident set (``VmHWM``: start-up included), its resident set
  while serving, after every request, and the start-up child's peak (``VmHWM`` of the process that
  scores the cache and writes the snapshot) — goal ≤ 500 MB each: every process ``dxi view`` starts.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from urllib.parse import quote

import orjson

from tests.helpers.synthetic import PROVIDER, SyntheticSuite, model_name, suite, write_cache

from . import Result

SIZES = {
    "aa_omniscience_decision": 12_500,
    "hle_multichoice": 12_500,
    "when2call": 12_500,
    "wildguardtest": 4_167,
}
MODELS = 20
REPEATS = 5
GOAL_OVERVIEW, GOAL_EVAL, GOAL_QUESTION, GOAL_MB = 1.0, 0.3, 0.1, 500.0


def _status(pid: int) -> dict[str, float]:
    """VmHWM and VmRSS of process ``pid`` in MB."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(("VmHWM:", "VmRSS:")):
            out[line.split(":")[0]] = int(line.split()[1]) / 1024
    return out


def _cpu_seconds(pid: int) -> float:
    """CPU time (user + system) of process ``pid`` and of its children it has waited for, in
    seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def _serve(cache_dir: str, port: int) -> None:
    """The child: what ``dxi view`` does (``runner.commands.view.main``) over the synthetic tasks;
    prints the start-up child's peak memory (MB) before serving."""
    from dxi import scoring
    from dxi.cache import Cache
    from dxi.evals import PROMPT_VERSION
    from dxi.runner.outputs.files import summarize
    from dxi.view.app import serve
    from dxi.view.data import Browser

    with Cache(cache_dir, read_only=True) as cache:
        models = cache.read(lambda rows: scoring.models_in_cache(rows, PROMPT_VERSION))
    prices = dict.fromkeys(models["label"].to_list())
    browser = Browser.build(Path(cache_dir), SyntheticSuite(SIZES), models, summarize, 1, prices)
    print(orjson.dumps({"snapshot_peak_mb": browser.snapshot_peak_mb}).decode(), flush=True)
    serve(browser, "127.0.0.1", port, print_=lambda text: None)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> tuple[float, int, int]:
    """(seconds, status, bytes) of one GET."""
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=120) as resp:
        body = resp.read()
        return time.perf_counter() - started, resp.status, len(body)


def run() -> list[Result]:
    with tempfile.TemporaryDirectory(prefix="dxi-bench-view-") as tmp:
        root = Path(tmp)
        tasks = suite(SIZES)
        n_answers = write_cache(root, tasks, MODELS)
        del tasks
        port = _free_port()
        base = f"http://127.0.0.1:{port}"
        started = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.bench_view", str(root), str(port)],
            cwd=Path(__file__).resolve().parents[1],
            stdout=subprocess.PIPE,
        )
        try:
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"the view exited with {proc.returncode} before serving")
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    time.sleep(0.05)
            startup = time.perf_counter() - started
            startup_cpu = _cpu_seconds(proc.pid)
            child = orjson.loads(proc.stdout.readline())
            overview, status, size = _get(base + "/")
            assert status == 200 and size > 10_000
            m, other = quote(f"{PROVIDER}:{model_name(7)}"), quote(f"{PROVIDER}:{model_name(12)}")
            filtered = [
                _get(f"{base}/eval/hle_multichoice?m={m}&result=wrong&category=Math&page={p}")[0]
                for p in range(1, REPEATS + 1)
            ]
            differ = [
                _get(
                    f"{base}/eval/aa_omniscience_decision?a={m}&b={other}&sort=p_gold&m={m}&page={p}"
                )[0]
                for p in range(1, REPEATS + 1)
            ]
            search = [
                _get(f"{base}/eval/when2call?q={quote(f'request {p}1')}&status=invalid")[0]
                for p in range(1, REPEATS + 1)
            ]
            question = [
                _get(f"{base}/task/wildguardtest/{i * 701}")[0] for i in range(1, REPEATS + 1)
            ]
            question += [
                _get(f"{base}/task/hle_multichoice/h{i * 977}")[0] for i in range(1, REPEATS + 1)
            ]
            compare = _get(f"{base}/compare/hle_multichoice?a={m}&b={other}")[0]
            calibration = _get(f"{base}/calibration?m={m}&eval=hle_multichoice&bin=9")[0]
            memory = _status(proc.pid)
            child_mb = child["snapshot_peak_mb"] or 0.0
        finally:
            proc.terminate()
            proc.wait(30)
    load = f"machine load {Path('/proc/loadavg').read_text().split()[0]} on 2 cores (shared with other work)"
    shape = f"{n_answers:,} answers, {MODELS} models"
    return [
        Result(
            "view",
            "start-up: score the cache and lay out the pages",
            startup,
            "s",
            "",
            None,
            f"{shape}; until the server answers; includes the bootstrap intervals dxi score computes; {load}",
        ),
        Result(
            "view",
            "… its CPU time (server and start-up child)",
            startup_cpu,
            "s",
            "",
            None,
            "user + system seconds, less sensitive to the machine's load than the wall time",
        ),
        Result(
            "view",
            "overview, first request after start-up",
            overview,
            "s",
            f"≤ {GOAL_OVERVIEW:g} s",
            overview <= GOAL_OVERVIEW,
            "the Decision Index table from the summary computed at start-up",
        ),
        Result(
            "view",
            "evaluation page: model, wrong, category, page N",
            max(filtered),
            "s",
            f"≤ {GOAL_EVAL:g} s",
            max(filtered) <= GOAL_EVAL,
            f"slowest of {REPEATS} pages; 12,500 HLE questions × {MODELS} models",
        ),
        Result(
            "view",
            "evaluation page: picks differ, sorted by p(gold)",
            max(differ),
            "s",
            f"≤ {GOAL_EVAL:g} s",
            max(differ) <= GOAL_EVAL,
            f"slowest of {REPEATS} pages",
        ),
        Result(
            "view",
            "evaluation page: search in the state, invalid",
            max(search),
            "s",
            f"≤ {GOAL_EVAL:g} s",
            max(search) <= GOAL_EVAL,
            f"slowest of {REPEATS} searches",
        ),
        Result(
            "view",
            "question page",
            max(question),
            "s",
            f"≤ {GOAL_QUESTION:g} s",
            max(question) <= GOAL_QUESTION,
            f"slowest of {len(question)} tasks (WildGuardTest: 3 questions; HLE: up to 12 options) × {MODELS} models, "
            "with each one's cache row; median "
            f"{sorted(question)[len(question) // 2] * 1000:.0f} ms",
        ),
        Result("view", "compare page (2×2 and the differing list)", compare, "s", "", None, ""),
        Result("view", "calibration page with one bin's questions", calibration, "s", "", None, ""),
        Result(
            "view",
            "memory: peak resident set of the server",
            memory["VmHWM"],
            "MB",
            f"≤ {GOAL_MB:g} MB",
            memory["VmHWM"] <= GOAL_MB,
            "VmHWM of the serving process over its whole life (start-up included)",
        ),
        Result(
            "view",
            "memory: peak of the start-up child (scoring)",
            child_mb,
            "MB",
            f"≤ {GOAL_MB:g} MB",
            child_mb <= GOAL_MB,
            "VmHWM of the child process that scores the cache (as dxi score does, one "
            "evaluation at a time) and writes the snapshot, then exits; what its peak is made of: docs/view.md",
        ),
        Result(
            "view",
            "memory: resident set while serving",
            memory["VmRSS"],
            "MB",
            f"≤ {GOAL_MB:g} MB",
            memory["VmRSS"] <= GOAL_MB,
            "VmRSS after every request above",
        ),
    ]


if __name__ == "__main__":
    _serve(sys.argv[1], int(sys.argv[2]))
