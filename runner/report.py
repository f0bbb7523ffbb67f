"""Scoring the cache and writing the outputs (``OUT/summary.json``, ``OUT/answers.parquet``), and the
terminal table. Used by ``dxi run`` (after running) and ``dxi score`` (cache only)."""
from __future__ import annotations

import os
from pathlib import Path

import orjson
import polars as pl
from rich.console import Console
from rich.markup import escape
from rich.table import Table

import scoring
from cache import Cache
from evals import EVALS, PROMPT_VERSION, Suite, gold_frames


def score(cache: Cache, suite: Suite, models: pl.DataFrame, out: Path, requests: dict[str, dict] | None,
          epochs: int = 1) -> dict:
    """Score ``models`` (``scoring.MODELS_SCHEMA`` rows) from the cache over the suite's tasks, write
    ``out/summary.json`` and ``out/answers.parquet`` (each written to a temporary name, then renamed)
    and return the summary. ``requests`` is each model's request counts from a run; None (cache-only
    scoring) counts the requests found in the cache instead, with ``sent`` = 0.

    A shard damaged where start-up does not look (outside the index columns) fails here: it is moved to
    the cache's quarantine/ (``Cache.verify``) and scoring goes on without it; its answers count as
    missing, and the next ``dxi run`` sends those requests again."""
    return score_all(cache, suite, models, out, requests, epochs)[0]


def score_all(cache: Cache, suite: Suite, models: pl.DataFrame, out: Path, requests: dict[str, dict] | None,
              epochs: int = 1, breakdowns: bool = False) -> tuple[dict, scoring.Scored]:
    """``score``, also returning the tables (``scoring.Scored``; with ``breakdowns`` the per-group ones
    that only the report shows)."""
    gold, categories = gold_frames(suite.tasks())
    try:
        answers = scoring.answers(cache.scan(), models, gold, categories, epochs)
    except (pl.exceptions.PolarsError, OSError):
        if not cache.verify():
            raise
        answers = scoring.answers(cache.scan(), models, gold, categories, epochs)
    scored = scoring.score(answers, scoring.Bootstrap(), with_breakdowns=breakdowns)
    if requests is None:
        requests = scoring.request_counts(answers)
    summary = scoring.build_summary(scored.metrics, models["label"].to_list(), suite.data_block(), PROMPT_VERSION,
                                    epochs, requests, scored)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / ".summary.json.tmp"
    tmp.write_bytes(orjson.dumps(summary, option=orjson.OPT_INDENT_2) + b"\n")
    os.replace(tmp, out / "summary.json")
    tmp = out / ".answers.parquet.tmp"
    scoring.export(answers).write_parquet(tmp)
    os.replace(tmp, out / "answers.parquet")
    return summary, scored


def _fmt(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f}"


def print_summary(summary: dict, console: Console, out: Path | None = None) -> None:
    """The index table, then what data was used and anything the reader must know."""
    table = Table(title="Decision Index", title_style="bold")
    for header in ("model", "index [95% CI]", "Omni acc", "Omni non-halluc", "HLE acc", "When2Call acc", "WildGuard F1",
                   "invalid", "repaired", "failed"):
        table.add_column(header, justify="left" if header == "model" else "right")
    for m in summary["models"]:
        e = m["evals"]
        invalid = sum(b.get("invalid", 0) for b in e.values())
        failed = sum(b.get("failed", 0) for b in e.values())
        repaired = sum(b.get("repaired", 0) for b in e.values())
        ci = m.get("decision_index_ci")
        index = _fmt(m["decision_index"]) + (f" [{_fmt(ci[0])}, {_fmt(ci[1])}]" if ci else "")
        table.add_row(escape(m["model"]), index, _fmt(e["aa_omniscience_decision"]["accuracy"]),
                      _fmt(e["aa_omniscience_decision"]["non_hallucination_rate"]),
                      _fmt(e["hle_multichoice"]["accuracy"]), _fmt(e["when2call"]["accuracy"]),
                      _fmt(e["wildguardtest"]["mean_f1"]), str(invalid), str(repaired), str(failed))
    console.print(table)
    console.print("Data used:")
    for name, d in summary["data"].items():
        title = EVALS[name].title
        if "missing" in d:
            console.print(f"  {title}: [yellow]none[/] ({escape(d['missing'])})")
            continue
        f = d["files"][0]
        extra = f", subset {d['subset']}" if "subset" in d else ""
        extra += f", limit {d['limit']}" if "limit" in d else ""
        console.print(f"  {title}: {d['tasks']} tasks from {escape(f['path'])} "
                      f"({f['rows']} rows, sha256 {f['sha256'][:12]}…{extra})")
        if d.get("stand_in"):
            console.print(f"    [yellow]stand-in:[/] {d['note']}")
    for m in summary["models"]:
        if m.get("decision_index_reason"):
            console.print(f"  [yellow]{escape(m['model'])}: index {escape(m['decision_index_reason'])}[/]")
        for name, block in m["evals"].items():
            if block.get("reason") and "no data" not in block["reason"]:
                console.print(f"  [yellow]{escape(m['model'])} {EVALS[name].title}: {escape(block['reason'])}[/]")
    written = f"; written to {out}/summary.json and {out}/answers.parquet" if out else ""
    console.print(escape(f"Prompt version {summary['prompt_version']}{written}"))
