"""The published report: ``OUT/report.html`` plus every table as ``OUT/tables/<name>.csv`` and
``.parquet``.

The HTML file is self-contained: styles inline, charts as SVG ``<img>`` data URIs, no script, no
font or file from elsewhere; a Content-Security-Policy forbids scripts and any load from the
network. Every text that comes from a model, a dataset or the cache (model names, error messages
quoting model output, group names, paths) goes through Jinja2's autoescaping, so it shows as text
and never becomes markup.

Why one module over 600 lines: the report is one HTML page built by one ``render``: each
``_*_section`` builds one part of its template's context from the summary and the tables, and they
share the cell formatting, ordering and escaping helpers at the top.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Sequence
from pathlib import Path

import jinja2
import polars as pl

from dxi.evals import EVALS, INDEX_TASKS
from dxi.scoring import WEIGHTS, Scored, adaptive, breakdowns, measures, provisional, stopped_pairs
from dxi.scoring.calibration import CALIBRATION_METRICS
from dxi.scoring.missing import selection_flags
from dxi.scoring.records import Summary, unset
from dxi.scoring.replies import model_notes
from dxi.scoring.stopped_pairs import ANYTIME, NOT_VALID
from dxi.scoring.summary import in_order, p_text, signed
from dxi.scoring.sums import METRICS

from . import charts

METRIC_TITLES = {
    "accuracy": "accuracy",
    "non_hallucination_rate": "non-hallucination rate",
    "f1_prompt_harm": "F1 prompt harm",
    "f1_response_refusal": "F1 response refusal",
    "f1_response_harm": "F1 response harm",
    "mean_f1": "mean F1",
    "brier": "Brier score",
    "ece": "ECE",
    "log_loss": "log loss",
    "auroc": "AUROC",
}
DIMENSION_TITLES = {
    "domain": "domain",
    "category": "category",
    "reply_type": "gold reply type",
    "subcategory": "subcategory",
    "adversarial": "adversarial prompt",
}
_ENV = jinja2.Environment(
    loader=jinja2.PackageLoader("dxi.report", "templates"),
    autoescape=True,
    trim_blocks=True,
    lstrip_blocks=True,
)


MIN_GROUP_TASKS = 30
"""Breakdown groups with fewer tasks than this are marked "*" in the report: with so few tasks a
group's interval is wide and a difference between models there is weak evidence."""
NOT_SCORED_SHARE = 0.05
"""The banner warns when a model's invalid plus failed answers in an evaluation pass this share of
its answers (5%): the invalid ones are scored as wrong, so the score measures the replies' format as
much as the decisions, and the failed ones are left out (a provisional figure)."""
HEADLINE = {
    "aa_omniscience_decision": "accuracy",
    "hle_multichoice": "accuracy",
    "when2call": "accuracy",
    "wildguardtest": "mean_f1",
}
"""The metric a breakdown's heatmap shows, per evaluation (its table shows every metric)."""
SHORT_TITLES = {
    "aa_omniscience_decision": "Omniscience",
    "hle_multichoice": "HLE",
    "when2call": "When2Call",
    "wildguardtest": "WildGuardTest",
}
SCORING_RULE = (
    "Invalid answers are the model's reply, scored as wrong. In AA-Omniscience-Decision an invalid answer "
    "is not an abstention: it counts toward the hallucination rate. In WildGuardTest's F1 scores an invalid "
    "yes/no answer counts as the wrong side (a false negative where the gold label is positive, a false "
    "positive where it is negative). Failed and missing answers answered nothing: "
    "they are left out, and every figure with one is provisional, marked "
    f"{provisional.MARK}: computed over the answered questions, with its bounds under "
    "it: the lowest and highest value it could take whatever those answers turn out "
    "to be. A difference such answers could overturn is not claimed."
)
TIES_NOTE = (
    "ties: picks decided by a tie of the highest probabilities (exactly equal as the server returned them; "
    "a yes/no answer with P(yes) = 0.5), which the model's probabilities did not decide. They are scored as "
    "any answer: the returned choice when it is one of the tied options, else the first of them in option "
    "order (a yes for P(yes) = 0.5). summary.json counts them (ties in each evaluation block)."
)
WARNING_NOTE = (
    "A warning marks an answer that was scored normally but that validation noted: a decision model's "
    "returned choice that is not its most probable option (the most probable one is scored), a "
    "logprob decision renormalised over the allowed answers (the note says how much of the first "
    "token's probability they held), unexpected keys in a JSON reply."
)


def _num(v: float | None, digits: int = 1) -> str:
    return "—" if v is None else f"{v:.{digits}f}"


def _cell(
    row: dict, metric: str, digits: int = 1, incomplete: bool = False, estimate: bool = False
) -> dict:
    """A score for a table cell of several lines: ``v`` the value (marked ``provisional.MARK`` when
    ``incomplete`` or when the row gives it bounds: failed or missing answers in it; preceded by
    ``adaptive.MARK`` when ``estimate``: an adaptive run's estimate of the whole set), ``ci`` "[low,
    high]", ``sd`` "±x sd" (with several epochs), ``bounds`` "bounds [lowest, highest]" (a
    provisional figure's, ``scoring.bounds``, outward to the digits shown); empty strings where
    absent, ``v`` "—" when null."""
    v = row.get(metric)
    if v is None:
        return {"v": "—", "ci": "", "sd": "", "bounds": ""}
    low, high = row.get(f"{metric}_low"), row.get(f"{metric}_high")
    lowest, highest = row.get(f"{metric}_lowest"), row.get(f"{metric}_highest")
    sd = row.get(f"{metric}_sd")
    bounds = lowest is not None and highest is not None
    return {
        "v": (adaptive.MARK if estimate else "")
        + _num(v, digits)
        + (provisional.MARK if incomplete or bounds else ""),
        "ci": f"[{_num(low, digits)}, {_num(high, digits)}]"
        if low is not None and high is not None
        else "",
        "sd": f"±{_num(sd, digits)} sd" if sd is not None else "",
        "bounds": f"bounds {provisional.span([lowest, highest], digits)}" if bounds else "",
    }


def _uri(svg: str) -> str:
    return "data:image/svg+xml;base64," + base64.b64encode(svg.encode()).decode()


def _table(columns: Sequence[str], rows: Sequence[Sequence[object]]) -> dict:
    return {
        "columns": list(columns),
        "rows": [
            [c if isinstance(c, dict) else ("—" if c is None else str(c)) for c in r] for r in rows
        ],
    }


def _order(labels: Sequence[str], column: str = "label") -> pl.Expr:
    """A sort key putting the ``column`` of labels in the report's model order."""
    return (
        pl.col(column)
        .cast(pl.String)
        .replace_strict(
            {lb: i for i, lb in enumerate(labels)}, default=len(labels), return_dtype=pl.Int64
        )
    )


_FEWER = {
    "wildguardtest": " (it also leaves out the questions that consistently trigger model refusals, a list that is "
    "not public: give it with --exclude)"
}
"""Why the published index scores fewer tasks of an evaluation than its whole file gives (seed
methodology; ``evals.wildguardtest``: 880 rows where the three annotators agreed, 835 in the
index)."""


def _selected(d: dict) -> bool:
    """Whether a data block records a selection of tasks (--limit, --sample, a union of runs')."""
    return d.get("limit") is not None or bool(d.get("sample")) or bool(d.get("union"))


def banner(summary: Summary, scored: Scored) -> list[str]:
    """Why the numbers are not the full Decision Index, one sentence each (empty: they are): a
    selection of tasks (``--limit``, ``--sample``), a stand-in dataset, a file holding fewer rows
    than the published index scores (When2Call's 300 of 3,423), more tasks than it scores
    (WildGuardTest's 880 against 835), an evaluation without data or not selected, provisional
    figures (answers failed or missing: ``provisional.notes``), an adaptive run's estimates
    (``scoring.adaptive``), or invalid plus failed answers above ``NOT_SCORED_SHARE`` of a model's
    answers in an evaluation."""
    notes: list[str] = adaptive.sentences(summary)  # an adaptive run's figures: whole-set estimates
    data = summary.data
    limits = sorted({d["limit"] for d in data.values() if d.get("limit") is not None})
    if limits:
        notes.append(
            f"Only the first {', '.join(map(str, limits))} tasks of each evaluation were scored (--limit): "
            "these numbers are a smoke test, not the Decision Index."
        )
    sample = _sample(summary)
    parts = adaptive.asked_parts(summary)  # an adaptive run: each model was asked part of it
    if sample and parts:
        notes.append(
            f"A sample of the tasks was drawn ({sample}), and each model was scored over the part "
            f"of it the adaptive run asked ({parts}): not the full index; intervals are wide."
        )
    elif sample:
        notes.append(
            f"A sample of the tasks was scored ({sample}): not the full index; intervals are wide."
        )
    unions = {name: d for name, d in data.items() if d.get("union")}
    if unions:
        notes.append(
            "The tasks several runs selected were scored together ("
            + "; ".join(f"{EVALS[name].title}: {selection_flags(d)}" for name, d in unions.items())
            + "): not the full index."
        )
    for name, d in data.items():
        if d.get("missing"):
            notes.append(
                f"{EVALS[name].title} is not scored: {d['missing']}. The Decision Index needs all four "
                "evaluations, so it is not computed."
            )
        elif d.get("stand_in"):
            notes.append(
                f"{EVALS[name].title} is a stand-in dataset: {d.get('note') or 'not the published data'}"
            )
        elif d.get("note"):  # a file holding fewer rows than the index scores (evals.subset_note)
            notes.append(f"{EVALS[name].title}: {d['note']}")
        elif (
            (published := INDEX_TASKS.get(name))
            and d.get("tasks", 0) > published
            and not _selected(d)
        ):
            notes.append(
                f"{EVALS[name].title}: {d['tasks']:,} tasks scored where the published Decision Index scores "
                f"{published:,}{_FEWER.get(name, '')}, so results are not comparable to published numbers."
            )
    answers = (
        {(r["label"], r["eval"]): r["answers"] for r in scored.statuses.iter_rows(named=True)}
        if not scored.statuses.is_empty()
        else {}
    )
    notes += provisional.notes(summary)
    for m in summary.models:
        for name, block in m.evals.items():
            bad, total = (
                block.get("invalid", 0) + block.get("failed", 0),
                answers.get((m.model, name), 0),
            )
            if total and bad / total > NOT_SCORED_SHARE:
                notes.append(
                    f"{m.model}, {EVALS[name].title}: {bad} of {total} answers ({100 * bad / total:.0f}%) "
                    f"are invalid or failed (more than {100 * NOT_SCORED_SHARE:.0f}%): "
                    "the invalid ones are scored as wrong, the failed ones left out."
                )
    return notes


def _sample(summary: Summary) -> str:
    """The ``--sample`` selection as recorded in summary.json's data block ("" if none): each
    evaluation's ``sample`` entry (a task count, or a block with the count and seed)."""
    found = []
    for block in (d.get("sample") for d in summary.data.values()):
        if block is None or block is False:
            continue
        if isinstance(block, dict):
            n = next((block[k] for k in ("n", "size", "tasks", "per_eval") if k in block), None)
            seed = block.get("seed")
        else:
            n, seed = block, None
        text = f"{n} tasks per evaluation" if n is not None else "sampled tasks"
        if seed is not None:
            text += f", seed {seed}"
        if text not in found:
            found.append(text)
    return "; ".join(found)


def _index_section(summary: Summary, scored: Scored, labels: list[str]) -> dict:
    index = {r["label"]: r for r in scored.index.iter_rows(named=True)}
    metrics = {(r["label"], r["eval"]): r for r in scored.metrics.iter_rows(named=True)}
    entries = {m.model: m for m in summary.models}
    cells = list(WEIGHTS)  # the index's terms, in the formula's order
    headers = (
        ["model", "Decision Index"]
        + [
            f"{SHORT_TITLES[name]} {METRIC_TITLES[m]} ({100 * WEIGHTS[name, m]:g}%)"
            for name, m in cells
        ]
        + ["invalid", "failed"]
    )
    rows = []
    for label in labels:
        entry = entries[label]
        row: list[object] = [
            label,
            _cell(
                index.get(label, {}),
                "decision_index",
                incomplete=not entry.complete,
                estimate=adaptive.estimated(summary, entry),
            )
            if entry.decision_index is not None
            else _cell({}, "decision_index"),
        ]
        if (
            unset(entry.rank) is not None
        ):  # its rank by the index, with the rank's 95% interval (scoring.compare)
            mark = "" if entry.complete else provisional.MARK  # the rank of a provisional index
            row[1]["rank"] = f"rank {entry.rank}{mark} [{entry.rank_ci[0]}–{entry.rank_ci[1]}]"
            if unset(entry.rank_set) is not None:  # the simultaneous rank set (all models' at once)
                row[1]["rank"] += f", jointly [{entry.rank_set[0]}–{entry.rank_set[1]}]"
        row += [
            _cell(
                metrics.get((label, name), {}),
                m,
                incomplete=entry.evals[name].get("complete") is False,
                estimate=adaptive.estimated(summary, entry),
            )
            if entry.evals[name].get(m) is not None
            else _cell({}, m)
            for name, m in cells
        ]
        row += [
            sum(b.get("invalid", 0) for b in entry.evals.values()),
            sum(b.get("failed", 0) for b in entry.evals.values()),
        ]
        rows.append(row)
    chart = charts.bars(
        "Decision Index (95% CI)",
        labels,
        {"Decision Index": [index.get(lb, {}).get("decision_index") for lb in labels]},
        {"Decision Index": [index.get(lb, {}).get("decision_index_low") for lb in labels]},
        {"Decision Index": [index.get(lb, {}).get("decision_index_high") for lb in labels]},
    )
    reasons = [
        f"{lb}: {entries[lb].decision_index_reason}"
        for lb in labels
        if entries[lb].decision_index_reason
    ]
    reasons += [
        f"{lb}: {note}" for lb in labels for note in model_notes(entries[lb])
    ]  # served model, cut-offs, clamp
    return {
        "table": _table(headers, rows),
        "chart": _uri(chart),
        "reasons": reasons,
        "pairs": _pairs(summary, scored, labels),
    }


def _pairs(summary: Summary, scored: Scored, labels: list[str]) -> dict | None:
    """The pairwise matrix of Decision Index differences (row − column, points) over the models with
    an index, each cell ``{"v", "ci", "p", "sig", "open"}``: the difference, its interval, the
    adjusted p-value, whether the pair is significant (``scoring.compare``: the max-T step-down over
    every pair, the table's ``significant``, which a difference a provisional index's failed and
    missing answers could overturn never is) and why it is not claimed (``open``: "bounds", such
    answers could overturn it; for a pair with a model an adaptive run stopped that is not claimed,
    the p-value and which half of its claim failed, ``scoring.stopped_pairs.said``, shown in place
    of the p-value; None: claimed or not significant); None with fewer than two such models."""
    pairs = scored.comparisons.filter(pl.col("metric") == "decision_index")
    ranked = [
        lb
        for lb in labels
        if any(m.model == lb and m.decision_index is not None for m in summary.models)
    ]
    if pairs.is_empty() or len(ranked) < 2:
        return None
    alpha = 1 - (unset(summary.intervals) or {}).get("confidence", 0.95)
    found = {}
    for r in pairs.iter_rows(named=True):
        sig, settled = bool(r["significant"]), r.get("settled", True) is not False
        # why a difference is not claimed: the open answers, or which half of an adaptive run's
        # claim failed (its words, ``stopped_pairs.said``, with the p-value)
        why = None if settled else "bounds"
        if r.get("claim") in (ANYTIME, NOT_VALID):
            why = stopped_pairs.said(r)
        turned = stopped_pairs.said(r, turned=True) if why and why != "bounds" else why
        found[(r["a"], r["b"])] = (
            r["difference"],
            r["low"],
            r["high"],
            r["p_adjusted"],
            sig,
            why,
        )
        found[(r["b"], r["a"])] = (
            -r["difference"],
            -r["high"],
            -r["low"],
            r["p_adjusted"],
            sig,
            turned,
        )
    rows = []
    for a in ranked:
        cells = []
        for b in ranked:
            if a == b or (a, b) not in found:
                cells.append(None)
                continue
            d, low, high, p, sig, why = found[(a, b)]
            shown = p_text(p)
            cells.append(
                {
                    "v": signed(d),
                    "ci": f"[{signed(low)}, {signed(high)}]",
                    "p": shown,
                    "sig": sig,
                    "open": why,
                }
            )
        rows.append({"model": a, "cells": cells})
    return {
        "models": ranked,
        "rows": rows,
        "alpha": alpha,
        "open": any(c is not None and c["open"] == "bounds" for r in rows for c in r["cells"]),
        "stopped": any(
            c is not None and c["open"] not in (None, "bounds") for r in rows for c in r["cells"]
        ),
    }


def _breakdown(name: str, dimension: str, part: pl.DataFrame, labels: list[str]) -> dict:
    """One breakdown: groups as rows (one row per metric where the evaluation has several), models
    as columns, each cell the score with its interval; plus the heatmap of the ``HEADLINE``
    metric."""
    metrics = METRICS[name]
    by = {(r["group"], r["label"]): r for r in part.iter_rows(named=True)}
    groups = part["group"].unique(maintain_order=True).to_list()
    tasks = {g: max(r["n"] for (gr, _), r in by.items() if gr == g) for g in groups}
    rows = []
    for g in groups:
        for m in metrics:
            rows.append(
                {
                    "group": g,
                    "tasks": tasks[g],
                    "few": tasks[g] < MIN_GROUP_TASKS,
                    "metric": METRIC_TITLES[m],
                    "span": len(metrics) if m == metrics[0] else 0,
                    "cells": [_cell(by.get((g, lb), {}), m) for lb in labels],
                }
            )
    headline = HEADLINE[name]
    title = DIMENSION_TITLES.get(dimension, dimension)
    chart = charts.heatmap(
        f"{EVALS[name].title} {METRIC_TITLES[headline]} by {title}",
        groups,
        labels,
        [[by.get((g, lb), {}).get(headline) for lb in labels] for g in groups],
        [tasks[g] < MIN_GROUP_TASKS for g in groups],
    )
    return {
        "id": f"{name}-{dimension}",
        "title": title,
        "models": labels,
        "metrics": len(metrics),
        "rows": rows,
        "few": any(tasks[g] < MIN_GROUP_TASKS for g in groups),
        "headline": METRIC_TITLES[headline],
        "chart": _uri(chart),
    }


def _eval_sections(summary: Summary, scored: Scored, labels: list[str]) -> list[dict]:
    sections = []
    for name, metrics in METRICS.items():
        data = summary.data.get(name, {})
        section: dict = {
            "name": name,
            "title": EVALS[name].title,
            "missing": data.get("missing"),
            "note": data.get("note"),
            "breakdowns": [],
        }
        sections.append(section)
        if data.get("missing"):
            continue
        rows = {
            r["label"]: r
            for r in scored.metrics.filter(pl.col("eval") == name).iter_rows(named=True)
        }
        series = {METRIC_TITLES[m]: [rows.get(lb, {}).get(m) for lb in labels] for m in metrics}
        low = {
            METRIC_TITLES[m]: [rows.get(lb, {}).get(f"{m}_low") for lb in labels] for m in metrics
        }
        high = {
            METRIC_TITLES[m]: [rows.get(lb, {}).get(f"{m}_high") for lb in labels] for m in metrics
        }
        section["chart"] = _uri(
            charts.bars(f"{EVALS[name].title} (95% CI)", labels, series, low, high)
        )
        reasons = {m.model: m.evals[name].get("reason") for m in summary.models}
        incomplete = {m.model: m.evals[name].get("complete") is False for m in summary.models}
        estimate = {m.model: adaptive.estimated(summary, m) for m in summary.models}
        ties = {m.model: m.evals[name].get("ties", 0) for m in summary.models}  # scoring.ties
        section["table"] = _table(
            [
                "model",
                "tasks",
                *[METRIC_TITLES[m] for m in metrics],
                "invalid",
                "failed",
                "missing",
                "ties",
                "reason",
            ],
            [
                [
                    lb,
                    rows[lb]["n"],
                    *[
                        _cell(
                            rows[lb],
                            m,
                            incomplete=incomplete.get(lb, False),
                            estimate=estimate.get(lb, False),
                        )
                        for m in metrics
                    ],
                    rows[lb]["invalid"],
                    rows[lb]["failed"],
                    rows[lb]["missing"],
                    ties.get(lb, 0),
                    reasons.get(lb),
                ]
                for lb in labels
                if lb in rows
            ],
        )
        section["ties"] = any(ties.get(lb, 0) for lb in labels if lb in rows)
        if not scored.breakdowns.is_empty():
            mine = scored.breakdowns.filter(pl.col("eval") == name)
            for dimension in mine["dimension"].unique(maintain_order=True).to_list():
                part = mine.filter(pl.col("dimension") == dimension).sort("group")
                section["breakdowns"].append(_breakdown(name, dimension, part, labels))
        if name == "when2call" and not scored.confusion.is_empty():
            section["confusion"] = []
            for label in labels:
                cm = scored.confusion.filter(pl.col("label") == label)
                if cm.is_empty():
                    continue
                wide = cm.pivot("predicted", index="gold_category", values="count")
                section["confusion"].append(
                    {
                        "model": label,
                        "table": _table(["gold \\ predicted", *wide.columns[1:]], wide.rows()),
                    }
                )
    return sections


def _calibration_section(summary: Summary, scored: Scored, labels: list[str]) -> dict:
    rows = []
    calib = scored.calibration
    if not calib.is_empty():
        evals = {name: i for i, name in enumerate(METRICS)}
        calib = calib.sort(
            _order(labels),
            pl.col("eval").replace_strict(evals, default=len(evals), return_dtype=pl.Int64),
            "question",
        )
    for r in calib.iter_rows(named=True):
        rows.append(
            [
                r["label"],
                EVALS[r["eval"]].title,
                r["question"],
                r["answers"],
                r["excluded"],
                *[_cell(r, m, 3) for m in CALIBRATION_METRICS],
                _cell(r, "auroc", 3) if r.get("auroc") is not None else "—",
            ]
        )
    diagrams = []
    for label in labels:
        bins = scored.reliability.filter(pl.col("label") == label)
        if bins.is_empty():
            continue
        panels = {}
        for name in METRICS:
            b = bins.filter(pl.col("eval") == name)
            if not b.is_empty():
                panels[EVALS[name].title] = {
                    c: b[c].to_list() for c in ("low", "high", "accuracy", "confidence", "n")
                }
        diagrams.append({"model": label, "chart": _uri(charts.reliability(label, panels))})
    clamps = [
        f"{m.model}: its provider clamps P(yes) to [{m.p_yes_range[0]:g}, {m.p_yes_range[1]:g}], so its "
        "yes/no answers never reach a confidence of 1"
        for m in summary.models
        if m.p_yes_range
    ]
    return {
        "table": _table(
            [
                "model",
                "evaluation",
                "question",
                "answers",
                "excluded",
                "Brier score",
                "ECE",
                "log loss",
                "AUROC",
            ],
            rows,
        ),
        "diagrams": diagrams,
        "notes": clamps,
    }


def _seconds(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def _measures_section(summary: Summary, labels: list[str]) -> dict:
    """The measures a decision-model user reads (``scoring.measures``): per model and evaluation
    (and every evaluation pooled) latency, the cost of 1,000 decisions, AURC and accuracy at
    confidence ≥ τ with its coverage; a risk–coverage chart per model with confidence; the notes
    (batch answers left out, models without confidence or without a cost)."""
    rows, charts_, notes = [], [], []
    entries = {m.model: m for m in summary.models}
    for label in labels:
        entry = entries[label]
        curves = {}
        for name, block in measures.model_rows(entry):
            lat, rc = block["latency"], block["risk_coverage"]
            ttft = lat.get("ttft") or {}
            cost = block["cost_per_1000_decisions_usd"]
            at = (
                [
                    ("—" if a["accuracy"] is None else f"{a['accuracy']:.1f}")
                    + f" ({100 * a['coverage']:.0f}%)"
                    for a in rc["at"]
                ]
                if rc
                else ["—"] * len(measures.TAUS)
            )
            title = "all evaluations" if name == measures.ALL else EVALS[name].title
            latency = [_seconds(lat[f"p{q}_s"]) for q in measures.PERCENTILES]
            rows.append(
                [
                    label,
                    title,
                    lat["calls"],
                    *latency,
                    _seconds(ttft.get("p50_s")),
                    lat["batch_excluded"],
                    block["decisions"],
                    "—" if cost is None else f"${cost:.4f}",
                    "—" if rc is None else f"{rc['aurc']:.4f}",
                    *at,
                ]
            )
            if rc and name != measures.ALL:
                curves[title] = rc["curve"]
            if name == measures.ALL and rc is None:
                notes.append(f"{label}: {block['risk_coverage_reason']}")
            if name == measures.ALL and cost is None and block["decisions"]:
                notes.append(f"{label}: no cost of 1,000 decisions: {block['cost_reason']}")
            if name == measures.ALL and lat["batch_excluded"]:
                notes.append(
                    f"{label}: {lat['batch_excluded']} call(s) answered in a provider batch are "
                    "left out of the latency figures (a batch's time is not a per-call latency)"
                )
        if curves:
            chart = charts.risk_coverage(f"Risk–coverage: {label}", curves)
            charts_.append({"model": label, "chart": _uri(chart)})
    taus = [f"acc ≥ {t:g} (cov.)" for t in measures.TAUS]
    columns = [
        "model",
        "evaluation",
        "calls",
        "p50 s",
        "p95 s",
        "p99 s",
        "TTFT p50 s",
        "batch (not timed)",
        "decisions",
        "$ / 1,000 decisions",
        "AURC",
        *taus,
    ]
    return {
        "table": _table(columns, rows),
        "charts": charts_,
        "notes": notes,
        "methods": unset(summary.measures),
    }


def _status_section(scored: Scored, labels: list[str]) -> dict:
    statuses = (
        scored.statuses.sort(_order(labels), "eval")
        if not scored.statuses.is_empty()
        else scored.statuses
    )
    kinds = {
        (r["label"], r["eval"]): r
        for r in breakdowns.warning_kinds(scored.answers).iter_rows(named=True)
    }
    counts = [c for c in statuses.columns[2:] if c != "warnings"]
    status_rows = []
    for r in statuses.iter_rows(named=True):
        kind = kinds.get((r["label"], r["eval"]))
        warned = (
            "0"
            if kind is None
            else (
                f"{kind['warnings']}: {kind['example']}"
                + (
                    f" (and {kind['kinds'] - 1} other kind{'s' if kind['kinds'] > 2 else ''})"
                    if kind["kinds"] > 1
                    else ""
                )
            )
        )
        status_rows.append([r["label"], EVALS[r["eval"]].title, *[r[c] for c in counts], warned])
    errors = (
        scored.errors.sort(_order(labels), maintain_order=True)
        if not scored.errors.is_empty()
        else scored.errors
    )
    error_rows = [
        [r["label"], EVALS[r["eval"]].title, r["status"], r["count"], r["example"], r["error"]]
        for r in errors.iter_rows(named=True)
    ]
    return {
        "statuses": _table(
            ["model", "evaluation", *counts, "warnings (scored; what they are)"], status_rows
        ),
        "warning_column": 2 + len(counts),
        "errors": _table(
            ["model", "evaluation", "status", "answers", "example task", "error"], error_rows
        ),
    }


def _contents(evals: list[dict]) -> list[dict]:
    """The table of contents: ``{"id", "title", "children"}`` per section, in page order."""
    items = [
        {"id": "data", "title": "Data", "children": []},
        {
            "id": "index",
            "title": "Decision Index",
            "children": [{"id": "index-pairs", "title": "pairwise differences"}],
        },
    ]
    for e in evals:
        items.append(
            {
                "id": e["name"],
                "title": e["title"],
                "children": [{"id": b["id"], "title": f"by {b['title']}"} for b in e["breakdowns"]]
                + (
                    [{"id": "when2call-confusion", "title": "confusion matrix"}]
                    if e.get("confusion")
                    else []
                ),
            }
        )
    items += [
        {"id": "calibration", "title": "Calibration", "children": []},
        {"id": "measures", "title": "Latency, cost and confidence", "children": []},
        {"id": "answers", "title": "Invalid and failed answers", "children": []},
    ]
    return items


def _data_notes(d: dict) -> str:
    """The notes cell of the data table: stand-in or provenance note, WildGuardTest subset,
    selection."""
    parts = [f"stand-in: {d['note']}" if d.get("stand_in") else d.get("note")]
    if d.get("subset"):
        parts.append(f"subset {d['subset']}.")
    if d.get("limit") is not None:
        parts.append(f"limit {d['limit']}.")
    sample = d.get("sample")
    if isinstance(sample, dict):
        parts.append(f"sample {sample.get('tasks')} (seed {sample.get('seed')}).")
    elif sample:
        parts.append(f"sample {sample}.")
    return " ".join(p for p in parts if p)


def render(summary: Summary, scored: Scored, ranked: bool = False) -> str:
    """The report as one HTML document (text). Models appear in ``summary.order(ranked)`` in
    every table and chart."""
    labels = summary.order(ranked)
    data = [
        {
            "title": EVALS[name].title,
            **d,
            "file": (d.get("files") or [{}])[0],
            "notes": _data_notes(d),
        }
        for name, d in summary.data.items()
    ]
    evals = _eval_sections(summary, scored, labels)
    return _ENV.get_template("report.html.j2").render(
        summary=summary,
        data=data,
        index=_index_section(summary, scored, labels),
        evals=evals,
        calibration=_calibration_section(summary, scored, labels),
        status=_status_section(scored, labels),
        measures=_measures_section(summary, labels),
        intervals=unset(summary.intervals),
        calibration_methods=unset(summary.calibration),
        banner=banner(summary, scored),
        contents=_contents(evals),
        min_group_tasks=MIN_GROUP_TASKS,
        scoring_rule=SCORING_RULE,
        warning_note=WARNING_NOTE,
        ties_note=TIES_NOTE,
        order_note=(
            "Models are ordered by Decision Index, highest first."
            if ranked
            else "Models are in the order they were given (run file or --model)."
        ),
    )


def write(summary: Summary, scored: Scored, out: Path, ranked: bool = False) -> Path:
    """Write ``out/report.html`` (to a temporary name, then renamed) and ``out/tables/<name>.csv``
    and ``.parquet`` for every table of ``scored.tables()``, their rows in the report's model order
    (``comparisons``: each pair ``a`` before ``b`` in that order, ``scoring.summary.in_order``);
    returns the report's path. ``ranked``: order the models by Decision Index (when no run file or
    ``--model`` gave an order). ``dxi report`` gives its staging folder as ``out``: the report is
    put in place with summary.json and answers.parquet (``runner.outputs.staging``)."""
    tables = out / "tables"
    tables.mkdir(parents=True, exist_ok=True)
    labels = summary.order(ranked)
    for name, table in scored.tables().items():
        if name == "comparisons":
            table = in_order(table, labels)
        elif "model" in table.columns:  # stable: each model's rows keep their order
            table = table.sort(_order(labels, "model"), maintain_order=True)
        table.write_parquet(tables / f"{name}.parquet")
        table.write_csv(tables / f"{name}.csv")
    path = out / "report.html"
    tmp = out / ".report.html.tmp"
    tmp.write_text(render(summary, scored, ranked), encoding="utf-8")
    os.replace(tmp, path)
    return path
