"""Rescoring a large cache: 1,000,000 cached answers (200 models × 5,000 questions), synthetic,
written as Parquet shards through the real cache schema (``tests.helpers.synthetic``), scored by the
real entry points.

Figures (each the best of ``REPEATS`` runs, as the machine is shared):

* rescoring: ``Cache.scan`` → ``scoring.answers`` (read the shards, select the current rows, join
  gold) → ``scoring.score`` without intervals (every metric of summary.json including calibration
  and AUROC, and the index) — goal ≤ 0.5 s; and the same plus the report's breakdown tables;
* the same with 1,000-resample bootstrap intervals for every metric, the index and every breakdown
  group — goal ≤ 5 s;
* beside them, a plain row-by-row Python scorer on the same shards (reads each shard's rows as
  Python objects, keeps the newest row per request, sums per model and evaluation, the index): the
  baseline that vectorising replaces, run once; its Decision Index must equal the vectorised one.
* for information: opening the cache (``Cache(root)``; its index of keys for ``has()``, which
  scoring does not need, is loaded on first use; issue 4 owns that figure).

The cache is written twice, with the same rows: in the flat answer layout every shard is written in
now (``cache.layout``), and in the nested layout of shards written before it; the rescoring figure
is the flat one, the nested one is measured beside it in the same run (alternating), as is the peak
resident set of a fresh process rescoring each (``dxi score``'s work without intervals).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from dxi import scoring
from dxi.cache import Cache, verify
from dxi.cache.layout import FLAT_LAYOUT, NESTED, read_nested
from dxi.evals import PROMPT_VERSION, gold_frames
from dxi.scoring.decision_index import WEIGHTS
from dxi.scoring.pipeline import READ_COLUMNS
from tests.helpers.synthetic import PROVIDER, model_name, suite, write_cache

from . import Result

SIZES = {
    "aa_omniscience_decision": 1001,
    "hle_multichoice": 1000,
    "when2call": 1001,
    "wildguardtest": 666,
}
MODELS = 200
REPEATS = 5
GOAL_RESCORE, GOAL_BOOTSTRAP = 0.5, 5.0


def plain_index(shards: list[Path], tasks: list, models: list[str]) -> dict[str, float | None]:
    """The Decision Index per model label, computed row by row in plain Python (no Polars, no
    NumPy): the reference a vectorised scorer is measured against, written from the methodology's
    words and SPEC §6: current rows only (prompt version, task digest, epoch 0), the newest final
    row per request; invalid answers wrong (a hallucination in Omniscience: the model's reply, not
    "I don't know"; the wrong side of F1); failed and missing answers left out (they answered
    nothing: every figure is over the replies); null when no answer of an evaluation is a reply."""
    digest = {t.id: t.digest for t in tasks}
    wanted = {f"{PROVIDER}:{m}" for m in models}

    def counts(row: dict) -> tuple[int, float]:
        final = row["status"] != "failed" or row["error_kind"] == "fatal"
        return (1 if final else 0), row["created_at"]

    newest: dict[tuple[str, str], dict] = {}
    for shard in shards:
        for row in read_nested(
            shard,
            [
                "provider",
                "model",
                "params",
                "prompt_version",
                "sample",
                "eval",
                "task_id",
                "task_digest",
                "status",
                "error_kind",
                "created_at",
                "answers",
            ],
        ).to_pylist():
            label = f"{row['provider']}:{row['model']}"
            if (
                row["prompt_version"] != PROMPT_VERSION
                or row["sample"] != 0
                or label not in wanted
                or digest.get(row["task_id"]) != row["task_digest"]
            ):
                continue
            key = (label, row["task_id"])
            # SPEC §4, "the newest final row wins": a final row (a reply, or a deterministic
            # failure) over a transient failure, then the newest; a tie: the later in cache order
            if key not in newest or counts(row) >= counts(newest[key]):
                newest[key] = row
    sums: dict[tuple[str, str, str], dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for label in wanted:
        for task in tasks:
            row = newest.get((label, task.id))
            replied = (
                row is not None and row["status"] != "failed"
            )  # else: failed, or missing from the cache
            given = {a["question_id"]: a for a in (row["answers"] if replied else None) or []}
            for q in task.questions:
                a = given.get(q.id)
                ok = a is not None and a["status"] == "ok"
                predicted = a["predicted"] if ok else None
                gold = task.gold[q.id]
                unit = q.id if task.eval == "wildguardtest" else "all"
                s = sums[(label, task.eval, unit)]
                s["replies"] += replied
                if not replied:
                    continue
                s["n"] += 1
                s["correct"] += predicted == gold
                s["hallucinated"] += replied and predicted != gold and predicted != "E"
                positive = (predicted == "yes") if predicted is not None else gold != "yes"
                s["tp"] += positive and gold == "yes"
                s["fp"] += positive and gold != "yes"
                s["fn"] += (not positive) and gold == "yes"
    out: dict[str, float | None] = {}
    for label in wanted:
        terms: dict[tuple[str, str], float | None] = {}
        for name in SIZES:
            units = [s for (lab, e, _), s in sums.items() if lab == label and e == name]
            if not any(s["replies"] for s in units):
                continue
            if name == "wildguardtest":
                f1s = []
                for q in ("prompt_harmful", "response_refusal", "response_harmful"):
                    s = sums[(label, name, q)]
                    d = 2 * s["tp"] + s["fp"] + s["fn"]
                    if d:
                        f1s.append(100 * 2 * s["tp"] / d)
                terms[(name, "mean_f1")] = sum(f1s) / len(f1s) if f1s else None
            else:
                s = sums[(label, name, "all")]
                terms[(name, "accuracy")] = 100 * s["correct"] / s["n"]
                wrong = s["n"] - s["correct"]
                terms[(name, "non_hallucination_rate")] = 100 * (
                    1 - (s["hallucinated"] / wrong if wrong else 0.0)
                )
        values = [terms.get(k) for k in WEIGHTS]
        out[label] = (
            None
            if any(v is None for v in values)
            else sum(w * v for w, v in zip(WEIGHTS.values(), values, strict=True))
        )
    return out


def _best(fn, repeats: int = REPEATS) -> tuple[float, float, object]:
    """(wall seconds, CPU seconds of this process in that run, result) of the fastest of ``repeats``
    runs. CPU time counts both Polars threads; on a machine shared with other work it barely moves
    while the wall time does."""
    best, cpu, result = float("inf"), float("inf"), None
    for _ in range(repeats):
        started, cpu_started = time.perf_counter(), time.process_time()
        result = fn()
        wall = time.perf_counter() - started
        if wall < best:
            best, cpu = wall, time.process_time() - cpu_started
    return best, cpu, result


_CHILD = """
import sys
from pathlib import Path
from benchmarks.bench_memory import peak_rss_mb
from benchmarks.bench_scoring import SIZES
from tests.helpers.synthetic import suite
from dxi import scoring
from dxi.cache import Cache
from dxi.evals import PROMPT_VERSION, gold_frames
gold, categories = gold_frames(suite(SIZES))
with Cache(Path(sys.argv[1])) as cache:
    models = scoring.models_in_cache(cache.scan(), PROMPT_VERSION)
    scoring.score(scoring.answers(cache.scan(), models, gold, categories), None)
print(peak_rss_mb())
"""


def peak_rescoring_mb(root: Path) -> float:
    """The peak resident set (MB) of a fresh process rescoring the cache in ``root`` without
    intervals."""
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(root)],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parent.parent,
    )
    return float(done.stdout.split()[-1])


def run() -> list[Result]:
    tasks = suite(SIZES)
    gold, categories = gold_frames(tasks)
    with tempfile.TemporaryDirectory(prefix="dxi-bench-scoring-") as tmp:
        root, old_root = Path(tmp) / "flat", Path(tmp) / "nested"
        started = time.perf_counter()
        n_answers = write_cache(root, tasks, MODELS, layout=FLAT_LAYOUT)
        setup = time.perf_counter() - started
        write_cache(old_root, tasks, MODELS, layout=NESTED)
        opened, _, cache = _best(lambda: Cache(root), 1)
        old_cache = Cache(old_root)
        models = scoring.models_in_cache(cache.scan(), PROMPT_VERSION)

        def rescore(boot: scoring.Bootstrap | None, report: bool, of: Cache = cache):
            answers = scoring.answers(of.scan(), models, gold, categories)
            return scoring.score(answers, boot, with_breakdowns=report)

        rescore(
            None, False, old_cache
        )  # its first scan verifies every page, as the flat cache's did in models_in_cache
        rescored = old_rescored = float("inf")
        for _ in range(REPEATS):  # alternating, so that both see the same load
            wall, cpu, point = _best(lambda: rescore(None, False), 1)
            if wall < rescored:
                rescored, rescored_cpu = wall, cpu
            wall, cpu, old_point = _best(lambda: rescore(None, False, old_cache), 1)
            if wall < old_rescored:
                old_rescored, old_rescored_cpu = wall, cpu
        assert point.index.equals(old_point.index), "the two layouts scored differently"
        read, read_cpu, _ = _best(lambda: cache.scan().select(READ_COLUMNS).collect())
        old_read, old_read_cpu, _ = _best(lambda: old_cache.scan().select(READ_COLUMNS).collect())
        peak, old_peak = peak_rescoring_mb(root), peak_rescoring_mb(old_root)
        compacted, _, merged = _best(
            lambda: Cache(old_root).compact_shards(), 1
        )  # dxi cache compact
        merged_cache = Cache(old_root)
        rescore(None, False, merged_cache)  # verifies the new shard's pages once
        after, after_cpu, after_point = _best(lambda: rescore(None, False, merged_cache))
        assert after_point.index.equals(point.index), "compaction changed the scores"
        merged_peak = peak_rescoring_mb(old_root)
        merged_cache.close()
        reported, reported_cpu, _ = _best(lambda: rescore(None, True), 3)
        booted, booted_cpu, with_intervals = _best(
            lambda: rescore(scoring.Bootstrap(resamples=1000), True), 3
        )
        shards = sorted(root.glob("shards/*.parquet"))
        checked, checked_cpu, _ = _best(lambda: verify.Verifier().damaged(shards))
        shard_mb = sum(s.stat().st_size for s in shards) / 1e6
        plain_started = time.perf_counter()
        plain = plain_index(
            sorted(root.glob("shards/*.parquet")), tasks, [model_name(m) for m in range(MODELS)]
        )
        plain_time = time.perf_counter() - plain_started
        cache.close()
        old_cache.close()
    vectorised = {r["label"]: r["decision_index"] for r in point.index.iter_rows(named=True)}
    agree = vectorised.keys() == plain.keys() and all(
        abs(vectorised[k] - plain[k]) < 1e-9 for k in plain
    )
    same = ["label", "decision_index", "decision_index_sd", "reason"]
    assert point.index.select(same).equals(with_intervals.index.select(same)), (
        "intervals changed the point estimates"
    )
    shape = f"{n_answers:,} answers, {MODELS} models, {len(tasks):,} tasks ({len(gold):,} questions); setup {setup:.1f} s"
    return [
        Result(
            "scoring",
            "rescore: read cache, join gold, every metric, index",
            rescored,
            "s",
            f"≤ {GOAL_RESCORE} s",
            rescored <= GOAL_RESCORE,
            f"{shape}; what dxi score computes (index metrics, calibration with "
            f"AUROC, the index) without intervals; best of {REPEATS}; CPU {rescored_cpu:.2f} s",
        ),
        Result(
            "scoring",
            "… of which reading the shards",
            read,
            "s",
            "",
            None,
            f"Cache.scan() of the columns scoring reads (the flat answer columns), collected; best of "
            f"{REPEATS}; CPU {read_cpu:.2f} s",
        ),
        Result(
            "scoring",
            "rescore, shards of the old nested layout",
            old_rescored,
            "s",
            "",
            None,
            f"the same rows in shards written before the flat layout (what dxi cache compact rewrites), "
            f"alternating with the figure above; best of {REPEATS}; CPU {old_rescored_cpu:.2f} s; of which "
            f"reading {old_read:.3f} s (CPU {old_read_cpu:.2f} s)",
        ),
        Result(
            "scoring",
            "rescore after dxi cache compact",
            after,
            "s",
            f"≤ {GOAL_RESCORE} s",
            after <= GOAL_RESCORE,
            f"the nested cache after `dxi cache compact` (Cache.compact_shards: its {MODELS} shards rewritten "
            f"in the flat layout and merged into {len(merged)}, 65,536-row groups; took {compacted:.1f} s); "
            f"best of {REPEATS}; CPU {after_cpu:.2f} s; peak RSS {merged_peak:.0f} MB",
        ),
        Result(
            "scoring",
            "peak RSS of rescoring, flat / nested layout",
            peak,
            "MB",
            "",
            None,
            f"a fresh process: open the cache, answers, every metric without intervals (VmHWM); the nested "
            f"layout's: {old_peak:.0f} MB",
        ),
        Result(
            "scoring",
            "… plus the report's breakdown tables",
            reported,
            "s",
            "",
            None,
            f"per-group metrics, When2Call confusion, statuses, errors (dxi report); best of 3; CPU {reported_cpu:.2f} s",
        ),
        Result(
            "scoring",
            "rescore with 1,000-resample bootstrap intervals",
            booted,
            "s",
            f"≤ {GOAL_BOOTSTRAP} s",
            booted <= GOAL_BOOTSTRAP,
            "intervals for every metric, the index and every breakdown group (the report "
            f"path); best of 3; CPU {booted_cpu:.2f} s",
        ),
        Result(
            "scoring",
            "plain row-by-row Python scorer (index only)",
            plain_time,
            "s",
            "",
            None,
            f"{plain_time / rescored:.0f}× the vectorised rescore; Decision Index "
            f"{'identical' if agree else 'DIFFERENT'} for all {len(plain)} models",
        ),
        Result(
            "scoring",
            "verify every page checksum of every shard",
            checked,
            "s",
            "",
            None,
            f"cache.verify.Verifier: what the first scan of an open cache adds (once; {len(shards)} shards, "
            f"{shard_mb:.0f} MB); best of {REPEATS}; CPU {checked_cpu:.2f} s",
        ),
        Result(
            "scoring",
            "open the cache for rescoring",
            opened,
            "s",
            "",
            None,
            "Cache(root): the key index for has() is loaded on first use, which rescoring never makes "
            "(issue 4's figure measures that load)",
        ),
    ]
