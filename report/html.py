"""The published report: ``OUT/report.html`` plus every table as ``OUT/tables/<name>.csv`` and ``.parquet``.

The HTML file is self-contained: styles inline, charts as SVG ``<img>`` data URIs, no script, no font
or file from elsewhere; a Content-Security-Policy forbids scripts and any load from the network. Every
text that comes from a model, a dataset or the cache (model names, error messages quoting model output,
group names, paths) goes through Jinja2's autoescaping, so it shows as text and never becomes markup.
"""
from __future__ import annotations

import base64
import os
from collections.abc import Sequence
from pathlib import Path

import jinja2
import polars as pl

from dxi.evals import EVALS
from dxi.scoring import Scored
from dxi.scoring.calibration import CALIBRATION_METRICS
from dxi.scoring.sums import METRICS

from . import charts

METRIC_TITLES = {"accuracy": "accuracy", "non_hallucination_rate": "non-hallucination rate",
                 "f1_prompt_harm": "F1 prompt harm", "f1_response_refusal": "F1 response refusal",
                 "f1_response_harm": "F1 response harm", "mean_f1": "mean F1", "brier": "Brier score",
                 "ece": "ECE", "log_loss": "log loss", "auroc": "AUROC"}
DIMENSION_TITLES = {"domain": "domain", "category": "category", "reply_type": "gold reply type",
                    "subcategory": "subcategory", "adversarial": "adversarial prompt"}
_ENV = jinja2.Environment(loader=jinja2.PackageLoader("dxi.report", "templates"), autoescape=True,
                          trim_blocks=True, lstrip_blocks=True)


def _num(v: float | None, digits: int = 1) -> str:
    return "—" if v is None else f"{v:.{digits}f}"


def _with_ci(row: dict, metric: str, digits: int = 1) -> str:
    """"37.0 [32.8, 41.2]" (value and interval), "—" when null."""
    v = row.get(metric)
    if v is None:
        return "—"
    low, high = row.get(f"{metric}_low"), row.get(f"{metric}_high")
    text = _num(v, digits)
    if low is not None and high is not None:
        text += f" [{_num(low, digits)}, {_num(high, digits)}]"
    sd = row.get(f"{metric}_sd")
    if sd is not None:
        text += f" ±{_num(sd, digits)} sd"
    return text


def _uri(svg: str) -> str:
    return "data:image/svg+xml;base64," + base64.b64encode(svg.encode()).decode()


def _table(columns: Sequence[str], rows: Sequence[Sequence[object]]) -> dict:
    return {"columns": list(columns), "rows": [[("—" if c is None else str(c)) for c in r] for r in rows]}


def _index_section(summary: dict, scored: Scored) -> dict:
    index = {r["label"]: r for r in scored.index.iter_rows(named=True)}
    metrics = {(r["label"], r["eval"]): r for r in scored.metrics.iter_rows(named=True)}
    headers = ["model", "Decision Index [95% CI]"]
    cells = [(name, m) for name in METRICS for m in METRICS[name]]
    headers += [f"{EVALS[name].title} {METRIC_TITLES[m]}" for name, m in cells] + ["invalid", "failed"]
    rows = []
    labels = [m["model"] for m in summary["models"]]
    for entry in summary["models"]:
        label = entry["model"]
        row = [label, _with_ci(index.get(label, {}), "decision_index") if entry["decision_index"] is not None else "—"]
        row += [_with_ci(metrics.get((label, name), {}), m) if entry["evals"][name].get(m) is not None else "—"
                for name, m in cells]
        row += [sum(b.get("invalid", 0) for b in entry["evals"].values()),
                sum(b.get("failed", 0) for b in entry["evals"].values())]
        rows.append(row)
    chart = charts.bars("Decision Index (95% CI)", labels,
                        {"Decision Index": [index.get(lb, {}).get("decision_index") for lb in labels]},
                        {"Decision Index": [index.get(lb, {}).get("decision_index_low") for lb in labels]},
                        {"Decision Index": [index.get(lb, {}).get("decision_index_high") for lb in labels]})
    reasons = [f"{e['model']}: {e['decision_index_reason']}" for e in summary["models"] if e.get("decision_index_reason")]
    return {"table": _table(headers, rows), "chart": _uri(chart), "reasons": reasons}


def _eval_sections(summary: dict, scored: Scored) -> list[dict]:
    labels = [m["model"] for m in summary["models"]]
    sections = []
    for name, metrics in METRICS.items():
        data = summary["data"].get(name, {})
        section: dict = {"name": name, "title": EVALS[name].title, "missing": data.get("missing"), "note": data.get("note")}
        sections.append(section)
        if data.get("missing"):
            continue
        rows = {r["label"]: r for r in scored.metrics.filter(pl.col("eval") == name).iter_rows(named=True)}
        series = {METRIC_TITLES[m]: [rows.get(lb, {}).get(m) for lb in labels] for m in metrics}
        low = {METRIC_TITLES[m]: [rows.get(lb, {}).get(f"{m}_low") for lb in labels] for m in metrics}
        high = {METRIC_TITLES[m]: [rows.get(lb, {}).get(f"{m}_high") for lb in labels] for m in metrics}
        section["chart"] = _uri(charts.bars(f"{EVALS[name].title} (95% CI)", labels, series, low, high))
        section["table"] = _table(
            ["model", "tasks", *[METRIC_TITLES[m] for m in metrics], "invalid", "failed", "missing", "reason"],
            [[lb, rows[lb]["n"], *[_with_ci(rows[lb], m) for m in metrics], rows[lb]["invalid"], rows[lb]["failed"],
              rows[lb]["missing"], next((e["evals"][name].get("reason") for e in summary["models"] if e["model"] == lb), None)]
             for lb in labels if lb in rows])
        section["breakdowns"] = []
        if not scored.breakdowns.is_empty():
            mine = scored.breakdowns.filter(pl.col("eval") == name)
            for dimension in mine["dimension"].unique(maintain_order=True).to_list():
                part = mine.filter(pl.col("dimension") == dimension).sort("group", "label")
                section["breakdowns"].append({
                    "title": DIMENSION_TITLES.get(dimension, dimension),
                    "table": _table(["group", "model", "tasks", *[METRIC_TITLES[m] for m in metrics]],
                                    [[r["group"], r["label"], r["n"], *[_with_ci(r, m) for m in metrics]]
                                     for r in part.iter_rows(named=True)])})
        if name == "when2call" and not scored.confusion.is_empty():
            section["confusion"] = []
            for label in labels:
                cm = scored.confusion.filter(pl.col("label") == label)
                if cm.is_empty():
                    continue
                wide = cm.pivot("predicted", index="gold_category", values="count")
                section["confusion"].append({"model": label, "table": _table(
                    ["gold \\ predicted", *wide.columns[1:]], wide.rows())})
    return sections


def _calibration_section(summary: dict, scored: Scored) -> dict:
    labels = [m["model"] for m in summary["models"]]
    rows = []
    for r in scored.calibration.sort("label", "eval", "question").iter_rows(named=True):
        rows.append([r["label"], EVALS[r["eval"]].title, r["question"], r["answers"], r["excluded"],
                     *[_with_ci(r, m, 3) for m in CALIBRATION_METRICS],
                     _with_ci(r, "auroc", 3) if r.get("auroc") is not None else "—"])
    diagrams = []
    for label in labels:
        bins = scored.reliability.filter(pl.col("label") == label)
        if bins.is_empty():
            continue
        panels = {}
        for name in METRICS:
            b = bins.filter(pl.col("eval") == name)
            if not b.is_empty():
                panels[EVALS[name].title] = {c: b[c].to_list() for c in ("low", "high", "accuracy", "confidence", "n")}
        diagrams.append({"model": label, "chart": _uri(charts.reliability(label, panels))})
    return {"table": _table(["model", "evaluation", "question", "answers", "excluded", "Brier score", "ECE", "log loss",
                             "AUROC"], rows), "diagrams": diagrams}


def _status_section(scored: Scored) -> dict:
    statuses = scored.statuses.sort("label", "eval")
    status_rows = [[r["label"], EVALS[r["eval"]].title, *[r[c] for c in statuses.columns[2:]]]
                   for r in statuses.iter_rows(named=True)]
    error_rows = [[r["label"], EVALS[r["eval"]].title, r["status"], r["count"], r["example"], r["error"]]
                  for r in scored.errors.iter_rows(named=True)] if not scored.errors.is_empty() else []
    return {"statuses": _table(["model", "evaluation", *statuses.columns[2:]], status_rows),
            "errors": _table(["model", "evaluation", "status", "answers", "example task", "error"], error_rows)}


def render(summary: dict, scored: Scored) -> str:
    """The report as one HTML document (text)."""
    data = [{"title": EVALS[name].title, **d, "file": (d.get("files") or [{}])[0]} for name, d in summary["data"].items()]
    return _ENV.get_template("report.html.j2").render(
        summary=summary, data=data, index=_index_section(summary, scored), evals=_eval_sections(summary, scored),
        calibration=_calibration_section(summary, scored), status=_status_section(scored),
        intervals=summary.get("intervals"), calibration_methods=summary.get("calibration"))


def write(summary: dict, scored: Scored, out: Path) -> Path:
    """Write ``out/report.html`` (to a temporary name, then renamed) and ``out/tables/<name>.csv`` and
    ``.parquet`` for every table of ``scored.tables()``; returns the report's path."""
    tables = out / "tables"
    tables.mkdir(parents=True, exist_ok=True)
    for name, table in scored.tables().items():
        table.write_parquet(tables / f"{name}.parquet")
        table.write_csv(tables / f"{name}.csv")
    path = out / "report.html"
    tmp = out / ".report.html.tmp"
    tmp.write_text(render(summary, scored), encoding="utf-8")
    os.replace(tmp, path)
    return path
