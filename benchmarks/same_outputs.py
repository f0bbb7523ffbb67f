"""Before/after check: the main job's outputs are byte-identical between a baseline commit and this
tree.

    python -m benchmarks.same_outputs [BASE_REV] [--data-dir ../shared/data] [--model MODEL] [--limit N]

For the baseline (default ``main``, extracted with ``git archive`` into a temporary folder and
imported from there ahead of the installed package) and for this working tree (copied likewise,
uncommitted changes included: neither side runs from a git checkout, so summary.json's
``provenance.git`` is null on both), in that order, it runs the main job on a fresh cache:
``dxi run`` (summary.json, answers.parquet), ``dxi run`` again (all cached), then ``dxi report``
(report.html, tables/*, and its summary.json and answers.parquet), each into its own folder, and
compares every output file byte for byte. Exit status 0 when all are identical.

Nothing legitimately varies between the two but the call latencies of summary.json's ``measures``
and the report's section showing them (``_timeless`` leaves those out): the outputs hold no other
timings, dates or paths of temporary folders (both sides use the same cache and output paths, so the
data block's file paths match too). A run's ``requests`` block counts what this invocation sent, so
the fresh and the cached run differ from each other, but each must match the same step of the other
side.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {
    "runner": "runner",
    "adapters": "adapters",
    "scoring": "scoring",
    "cache": "cache",
    "evals": "evals",
    "report": "report",
    "view": "view",
}
MAIN = "import sys; from dxi.runner.cli import main; sys.exit(main())"


def _baseline(rev: str | None, where: Path) -> Path:
    """A folder to put first on PYTHONPATH that imports ``dxi`` from commit ``rev`` (None: this
    working tree as it is, uncommitted changes included). Both sides are copies outside any git
    checkout, so that summary.json's ``provenance.git`` (``runner.outputs.provenance``) is null on
    both and only the code differs."""
    src = where / "src"
    src.mkdir(parents=True)
    if rev is None:
        for name in {"dxi", *PACKAGES.values()}:
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    else:
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", rev], check=True, capture_output=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    pkg = where / "pkg"
    shutil.copytree(src / "dxi", pkg / "dxi")
    for name, folder in PACKAGES.items():
        (pkg / "dxi" / name).symlink_to(src / folder)
    return pkg


def _job(pythonpath: Path, work: Path, args: argparse.Namespace) -> dict[str, float]:
    """Run the three steps with the code on ``pythonpath``; their wall seconds."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(pythonpath)
    common = ["--data-dir", str(args.data_dir), "--cache-dir", str(work / "cache"), "-q"]
    if args.limit:
        common += ["--limit", str(args.limit)]
    steps = {
        "run": ["run", "--model", args.model, *common, "--out", str(work / "run")],
        "cached": ["run", "--model", args.model, *common, "--out", str(work / "cached")],
        "report": ["report", *common, "--out", str(work / "report")],
    }
    walls = {}
    for name, argv in steps.items():
        started = time.perf_counter()
        subprocess.run(
            [sys.executable, "-c", MAIN, *argv],
            env=env,
            check=True,
            cwd=work,
            stdout=subprocess.DEVNULL,
        )
        walls[name] = time.perf_counter() - started
    return walls


def _timeless(path: Path) -> bytes:
    """A file's bytes with the measured call latencies left out (``scoring.measures``: each run's
    own timings, the one thing that legitimately varies): in a summary.json every
    ``measures.latency`` block becomes null; in report.html the "Latency, cost and confidence"
    section is cut (its figures are the summary's, compared there). Other files as they are."""
    raw = path.read_bytes()
    if path.name == "summary.json":
        doc = json.loads(raw)
        for m in doc.get("models", []):
            evals = m.get("evals", {}).values()
            for block in [m.get("measures") or {}, *((e.get("measures") or {}) for e in evals)]:
                if "latency" in block:
                    block["latency"] = None
        return json.dumps(doc, sort_keys=False).encode()
    if path.name == "report.html":
        return re.sub(rb'<h2 id="measures">.*?(?=<h2 )', b"", raw, flags=re.S)
    return raw


def _files(root: Path) -> set[Path]:
    return {p.relative_to(root) for p in root.rglob("*") if p.is_file()}


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.same_outputs")
    p.add_argument("base", nargs="?", default="main", help="the baseline commit (default main)")
    p.add_argument("--data-dir", type=Path, default=(ROOT.parent / "shared" / "data"))
    p.add_argument("--model", default="embedded:sparrow-nano-general-v1.1")
    p.add_argument("--limit", type=int)
    args = p.parse_args()
    args.data_dir = args.data_dir.resolve()
    with tempfile.TemporaryDirectory(prefix="dxi-same-") as tmp:
        tmp = Path(tmp)
        pkg = _baseline(args.base, tmp / "base-code")
        mine = _baseline(None, tmp / "this-code")
        results = {}
        for side, path in (("base", pkg), ("this", mine)):
            work = tmp / "job"  # the same paths on both sides: the data block and logs name them
            work.mkdir()
            results[side] = _job(path, work, args)
            shutil.move(work, tmp / side)
        differ = []
        for step in ("run", "cached", "report"):
            a, b = tmp / "base" / step, tmp / "this" / step
            names = _files(a) | _files(b)
            for name in sorted(names):
                same = (
                    (a / name).is_file()
                    and (b / name).is_file()
                    and (
                        filecmp.cmp(a / name, b / name, shallow=False)
                        or _timeless(a / name) == _timeless(b / name)
                    )
                )
                if not same:
                    differ.append(f"{step}/{name}")
            print(
                f"{step}: {len(names)} file(s) compared; base {results['base'][step]:.2f} s, "
                f"this {results['this'][step]:.2f} s"
            )
    if differ:
        print("DIFFERENT: " + ", ".join(differ))
        return 1
    print(f"identical to {args.base}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
