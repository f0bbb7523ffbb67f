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

from dxi import scoring
from dxi.cache import Cache
from dxi.evals import EVALS, PROMPT_VERSION, Suite, gold_frames
from dxi.scoring.ties import add_ties


def score(cache: Cache, suite: Suite, models: pl.DataFrame, out: Path, requests: dict[str, dict] | None,
          epochs: int = 1, prices: dict[str, tuple[float, float] | None] | None = None, extra: dict | None = None) -> dict:
    """Score ``models`` (``scoring.MODELS_SCHEMA`` rows, plus an optional ``epochs`` column: a model's own
    number of epochs, else ``epochs``) from the cache over the suite's tasks, write ``out/summary.json``
    and ``out/answers.parquet`` (each written to a temporary name, then renamed) and return the summary.
    ``requests`` is each model's request counts from a run; None (cache-only scoring) counts the requests
    found in the cache instead, with ``sent`` = 0. ``prices`` (label -> USD per million input and output
    tokens; None or absent: no price) make the usage blocks' costs; ``extra`` keys are added to the summary.

    A shard damaged where start-up does not look (outside the index columns) fails here: it is moved to
    the cache's quarantine/ (``Cache.read``) and scoring goes on without it; its answers count as
    missing, and the next ``dxi run`` sends those requests again."""
    return score_all(cache, suite, models, out, requests, epochs, prices=prices, extra=extra)[0]


def score_all(cache: Cache, suite: Suite, models: pl.DataFrame, out: Path, requests: dict[str, dict] | None,
              epochs: int = 1, breakdowns: bool = False, prices: dict[str, tuple[float, float] | None] | None = None,
              extra: dict | None = None) -> tuple[dict, scoring.Scored]:
    """``score``, also returning the tables (``scoring.Scored``; with ``breakdowns`` the per-group ones
    that only the report shows)."""
    gold, categories = gold_frames(suite.tasks())
    answers = cache.read(lambda rows: scoring.answers(rows, models, gold, categories, epochs))
    scored = scoring.score(answers, scoring.Bootstrap(), with_breakdowns=breakdowns)
    if requests is None:
        requests = scoring.request_counts(answers)
    labels = models["label"].to_list()
    model_epochs = (dict(zip(labels, models["epochs"].fill_null(epochs).to_list(), strict=True))
                    if "epochs" in models.columns else None)
    usage = scoring.usage_blocks(cache.read(lambda rows: scoring.usage(rows, models, gold, epochs)), labels, prices or {})
    summary = scoring.build_summary(scored.metrics, labels, suite.data_block(), PROMPT_VERSION, epochs, requests,
                                    scored, model_epochs, usage)
    summary = add_ties(summary, answers) | (extra or {})
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


def _usd(value: float | None) -> str:
    return "—" if value is None else f"${value:.4f}"


def print_usage(summary: dict, console: Console) -> None:
    """Tokens and cost per model (of the answers scored, from the cache) and for the run."""
    if "usage" not in summary:
        return
    table = Table(title="Usage (the scored answers' requests, from the cache)", title_style="bold")
    for header in ("model", "requests", "input tokens", "output tokens", "cost", "this run"):
        table.add_column(header, justify="left" if header == "model" else "right")
    for m in summary["models"]:
        u = m.get("usage") or {}
        spent = (m.get("requests") or {}).get("cost_usd")
        table.add_row(escape(m["model"]), str(u.get("requests", 0)), f"{u.get('input_tokens', 0):,}",
                      f"{u.get('output_tokens', 0):,}", _usd(u.get("cost_usd")), _usd(spent))
    run = summary["usage"]
    table.add_row("all", str(run["requests"]), f"{run['input_tokens']:,}", f"{run['output_tokens']:,}",
                  _usd(run["cost_usd"]), "", style="bold")
    console.print(table)
    if run.get("cost_reason"):
        console.print(escape(f"  cost: {run['cost_reason']}"))


def print_estimate(doc: dict, console: Console) -> None:
    """The dry run (``runner.estimate``) as a table, then the totals and the cost bound, if any."""
    table = Table(title="Estimate: what `dxi run` would send (nothing was sent)", title_style="bold")
    for header in ("model", "requests", "cached", "new", "why new", "input tokens", "output tokens", "cost", "at most"):
        table.add_column(header, justify="left" if header in ("model", "why new") else "right")
    for m in doc["models"]:
        why = ", ".join(f"{n} {r}" for r, n in m["reasons"].items()) or "—"
        table.add_row(escape(m["model"]), str(m["requests"]), str(m["cached"]), str(m["new"]), escape(why),
                      f"{m['input_tokens']:,}", f"{m['output_tokens']:,}", _usd(m["cost_usd"]), _usd(m["bound_usd"]))
    t = doc["total"]
    table.add_row("all", str(t["requests"]), str(t["cached"]), str(t["new"]), "", f"{t['input_tokens']:,}",
                  f"{t['output_tokens']:,}", _usd(t["cost_usd"]), _usd(t["bound_usd"]), style="bold")
    console.print(table)
    for m in doc["models"]:
        if m.get("cost_reason"):
            console.print(escape(f"  {m['model']}: {m['cost_reason']}"))
        if m["new"]:
            console.print(escape(f"  {m['model']}: tokens from " + ", ".join(f"{b} ({n})" for b, n in m["basis"].items())))
    console.print("Tokens and cost are expected values (README: \"The dry run\"); \"at most\" is what the cost bound "
                  "reserves for them: the most they can cost.")
    for problem in doc.get("problems", {}).values():
        console.print(f"[yellow]dxi run will refuse to start[/]: {escape(problem)}")
    bound = doc.get("max_cost_usd")
    if bound is not None:
        if t["bound_usd"] is not None and t["bound_usd"] <= bound:
            console.print(f"max_cost ${bound:g}: the new requests cannot pass it; the run will complete.")
        else:
            console.print(f"[yellow]max_cost ${bound:g}[/]: the run may stop at the bound before it completes "
                          f"(expected cost {_usd(t['cost_usd'])}, at most {_usd(t['bound_usd'])}); rerun with a higher "
                          "bound to continue.")


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
        ci, sd = m.get("decision_index_ci"), m.get("decision_index_sd")
        index = (_fmt(m["decision_index"]) + (f" ±{sd:.1f} sd" if sd is not None else "")
                 + (f" [{_fmt(ci[0])}, {_fmt(ci[1])}]" if ci else ""))
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
        excluded = d.get("excluded") or {}
        if excluded:
            extra += f", {excluded['matched']} of {excluded['listed']} excluded ids matched"
        console.print(f"  {title}: {d['tasks']} tasks from {escape(f['path'])} "
                      f"({f['rows']} rows, sha256 {f['sha256'][:12]}…{extra})")
        if d.get("stand_in"):
            console.print(f"    [yellow]stand-in:[/] {d['note']}")
        elif d.get("note"):
            console.print(f"    [yellow]note:[/] {d['note']}")
        if excluded and excluded["matched"] < excluded["listed"]:
            console.print(f"    [yellow]{excluded['listed'] - excluded['matched']} excluded id(s) matched no task[/]"
                          + (" read (with --limit only the first tasks are read)" if "limit" in d else
                             ": check the ids in the exclusion list"))
    for m in summary["models"]:
        if m.get("decision_index_reason"):
            console.print(f"  [yellow]{escape(m['model'])}: index {escape(m['decision_index_reason'])}[/]")
        for name, block in m["evals"].items():
            if block.get("reason") and "no data" not in block["reason"]:
                console.print(f"  [yellow]{escape(m['model'])} {EVALS[name].title}: {escape(block['reason'])}[/]")
        ties = sum(b.get("ties", 0) for b in m["evals"].values())
        if ties:
            console.print(f"  {escape(m['model'])}: {ties} pick(s) decided by a tie of the highest probabilities "
                          "(scored: the returned choice, else the first in option order)")
        if m.get("invalid_reasons"):
            n = sum(b.get("invalid", 0) for b in m["evals"].values())
            console.print(f"  [yellow]{escape(m['model'])}: {n} invalid answer(s)[/] (scored as wrong; all in "
                          "answers.parquet). Most frequent reasons:")
            for r in m["invalid_reasons"]:
                text = r["error"] if len(r["error"]) <= 200 else r["error"][:200] + "…"
                console.print(f"    {r['count']} × {text}", highlight=False, markup=False)
    print_usage(summary, console)
    written = f"; written to {out}/summary.json and {out}/answers.parquet" if out else ""
    console.print(escape(f"Prompt version {summary['prompt_version']}{written}"))
