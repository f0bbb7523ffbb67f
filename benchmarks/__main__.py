"""Run the benchmarks and write the table: ``python -m benchmarks [NAME ...] [--out DIR]``."""

from __future__ import annotations

import argparse
import importlib
import platform
import time
from pathlib import Path

import orjson
from rich.console import Console
from rich.table import Table

HERE = Path(__file__).parent


def main() -> None:
    modules = {p.stem.removeprefix("bench_"): p.stem for p in HERE.glob("bench_*.py")}
    modules |= {
        p.stem: p.stem for p in HERE.glob("stats_*.py")
    }  # the statistics' own (seeded simulations)
    names = sorted(modules)
    p = argparse.ArgumentParser(prog="python -m benchmarks")
    p.add_argument("only", nargs="*", help=f"benchmarks to run (default all): {', '.join(names)}")
    p.add_argument(
        "--out", type=Path, default=Path("out/bench"), help="where results.json and results.md go"
    )
    args = p.parse_args()
    unknown = set(args.only) - set(names)
    if unknown:
        p.error(f"unknown benchmark(s) {', '.join(sorted(unknown))}; known: {', '.join(names)}")
    results = []
    console = Console()
    for name in args.only or names:
        console.print(f"[bold]{name}[/] …")
        started = time.perf_counter()
        results += importlib.import_module(f"benchmarks.{modules[name]}").run()
        console.print(f"  done in {time.perf_counter() - started:.1f} s")
    table = Table(title=f"Benchmarks ({platform.node()}, {time.strftime('%Y-%m-%d %H:%M')})")
    for col in ("benchmark", "figure", "value", "unit", "goal", "met", "note"):
        table.add_column(col, overflow="fold")
    for r in results:
        met = "" if r.met is None else ("yes" if r.met else "NO")
        table.add_row(r.benchmark, r.figure, f"{r.value:,.3f}", r.unit, r.goal, met, r.note)
    console.print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_bytes(
        orjson.dumps([r.as_dict() for r in results], option=orjson.OPT_INDENT_2)
    )
    lines = [
        "| benchmark | figure | value | unit | goal | met | note |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r.benchmark} | {r.figure} | {r.value:,.3f} | {r.unit} | {r.goal} | "
        f"{'' if r.met is None else ('yes' if r.met else 'NO')} | {r.note} |"
        for r in results
    ]
    (args.out / "results.md").write_text("\n".join(lines) + "\n")
    console.print(f"written to {args.out}/results.json and results.md")


if __name__ == "__main__":
    main()
