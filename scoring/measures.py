"""What a decision-model user reads beside accuracy, per model and evaluation (summary.json's
``measures`` blocks; the terminal, the report and ``dxi view`` show them): latency per call, the
cost of 1,000 decisions, and how often a model is right when it is confident (the risk–coverage
curve, its area, accuracy at confidence ≥ τ).

**Latency** (seconds) of the calls whose reply is scored: the cache's ``latency_ms`` of the final
attempt (and ``ttft_s``, time to first token, where a reply was streamed: null where it was not, or
where the cache has no such column). Percentiles p50, p95, p99 are NumPy's default "linear"
definition (Hyndman & Fan type 7: with the n values sorted, percentile q is the value at 0-based
rank (n − 1)·q/100, interpolated linearly between its neighbours; ``numpy.percentile(x, q)``,
Polars' ``quantile(q, "linear")``). Counted: each call once (a reply that several byte-identical
tasks share was one call), its reply ok or invalid. Left out and counted: answers a provider
**batch** brought (``transport`` "batch": the time from submission to collection of a whole batch is
not the latency of a call) and **failed** calls (no reply was scored).

**Cost of 1,000 decisions** (USD) = 1000 × the evaluation's ``usage`` cost (``scoring.cost``: the
prices used, batch prices for batch answers) / its decisions; a *decision* is one question of a call
that got a reply (ok or invalid; each call once; a WildGuardTest row asks three). Null, with the
reason, without a price, for a priced model whose replies reported 0 tokens (a server that counts
none: their cost is unknown) or without a decision.

**Risk–coverage** (Geifman & El-Yaniv 2017, "Selective classification for deep neural networks",
NeurIPS; the AURC as used in Geifman, Uziel & El-Yaniv 2019, "Bias-reduced uncertainty estimation
for deep neural classifiers", ICLR). The answers counted are those with status ``ok`` and a
confidence: the probability the model gave the answer it picked (``p_predicted``: a decision model's
or a logprob model's probability of the option scored; for a yes/no question max(P(yes), 1 −
P(yes))). Invalid, failed and missing answers have none and are counted in ``excluded`` (accuracy
scores the invalid ones wrong and leaves the failed and missing ones out). Epochs are pooled. A
language model with structured outputs names an answer and gives no probability: it has no curve
(null with the reason); none is invented.

With the n answers sorted by confidence, highest first, the model answering only its k most
confident ones covers k/n of them with risk(k) = errors among them / k. Answers of equal confidence
cannot be ordered by it, so the order within a tie is taken as uniformly random and risk(k) is its
expectation: with the answers more confident than the tied group (K of them, E errors) and the
group's own n_g answers and e_g errors, errors(k) = E + (k − K)·e_g/n_g for K < k ≤ K + n_g. This is
deterministic, does not depend on the order rows arrive in, and equals the mean over every order of
the ties.

    AURC = (1/n) Σ_{k=1..n} risk(k)        (in [0, 1]; lower is better)

``curve``: [coverage, risk] at coverage j/20 (j = 1..20; k = ⌈n·j/20⌉). Accuracy at confidence ≥ τ,
for τ in ``TAUS``: over the answers whose confidence is at least τ (a confidence within 1e-12 below
τ counts: the probability of "no" is computed as 1 − P(yes)), 100 × correct / covered (0–100; null
when none is covered), with ``coverage`` = covered / n.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import polars as pl

from .records import ModelEntry, Summary, unset

TAUS = (0.5, 0.8, 0.9, 0.95)
"""The confidence thresholds of ``accuracy at confidence ≥ τ``."""
PERCENTILES = (50, 95, 99)
"""The latency percentiles reported (NumPy's "linear" definition)."""
CURVE_POINTS = 20
"""The risk–coverage curve in summary.json: risk at coverage j/CURVE_POINTS, j = 1..CURVE_POINTS."""
TAU_SLACK = 1e-12
ALL = "all"
"""The ``eval`` of a model's rows pooled over every evaluation."""
TTFT = "ttft_s"
"""The cache column of the time to first token (seconds) of a streamed reply, when the cache has
it."""
CALLS_READ = ("latency_ms",)
"""The cache columns a calls table reads beside ``eval``, ``status`` and ``transport``
(``scoring.pipeline``'s ``USAGE_READ``, read with them) and ``TTFT`` when the cache has it."""
NO_CONFIDENCE = (
    "no confidence: the model's answers carry no probability (a language model with structured "
    "outputs names an answer only); none is invented"
)
NO_ANSWER = "no valid answer to rank"
CALLS_SCHEMA = {
    "label": pl.String,
    "eval": pl.String,
    "status": pl.String,
    "latency_s": pl.Float64,
    "ttft_s": pl.Float64,
    "batch": pl.Boolean,
    "questions": pl.Int64,
}


def describe() -> dict:
    """summary.json's top-level ``measures`` block: how the per-model ``measures`` are computed."""
    return {
        "latency": (
            "seconds per call of the scored replies (ok or invalid), each call once; percentiles "
            "by numpy's default linear interpolation (Hyndman-Fan type 7); answers a provider "
            "batch brought and failed calls are left out and counted (batch_excluded, "
            "failed_excluded); "
            "ttft: time to first token of streamed replies"
        ),
        "cost_per_1000_decisions_usd": (
            "1000 x the usage cost (prices used; batch prices for batch answers) / "
            "decisions (questions of the calls with a reply)"
        ),
        "risk_coverage": (
            "answers ok with a confidence (probability of the option picked; yes/no: "
            "max(P(yes), 1 - P(yes))), epochs pooled; risk(k) = expected error rate of the k most "
            "confident, ties in random order (their expectation); AURC = mean of risk(k), k = 1..n "
            "(Geifman & El-Yaniv 2017); curve: [coverage, risk] at coverage j/20; at: accuracy "
            "(0-100) and coverage of the answers with confidence >= tau"
        ),
        "taus": list(TAUS),
        "percentiles": list(PERCENTILES),
    }


def has_column(rows: pl.LazyFrame | Sequence[pl.LazyFrame], name: str) -> bool:
    """Whether the cache's rows (a scan, or its parts) have column ``name`` (an older dxi's cache
    may not)."""
    first = rows if isinstance(rows, pl.LazyFrame) else (rows[0] if rows else None)
    return first is not None and name in first.collect_schema().names()


def calls_table(
    found: pl.DataFrame, m: np.ndarray, t: np.ndarray, models: pl.DataFrame, questions: np.ndarray
) -> pl.DataFrame:
    """One row per current cache row (each call once, ``scoring.pipeline._current`` with
    ``each_task=False``): ``CALLS_SCHEMA`` — label, eval, status, latency_s and ttft_s (seconds;
    ttft null without a ``ttft_s`` column), batch (brought by a provider batch) and questions (of
    its task). ``found`` has ``eval``, ``status``, ``transport`` and ``CALLS_READ`` (and optionally
    ``ttft_s``); ``m`` its model numbers (into ``models``, sorted by label), ``t`` its task numbers,
    ``questions`` each task's number of questions."""
    if found.is_empty():
        return pl.DataFrame(schema=CALLS_SCHEMA)
    ttft = pl.col(TTFT).cast(pl.Float64) if TTFT in found.columns else pl.lit(None, pl.Float64)
    return found.select(
        pl.Series("label", models["label"].gather(m), dtype=pl.String),
        pl.col("eval").cast(pl.String),
        pl.col("status").cast(pl.String),
        (pl.col("latency_ms").cast(pl.Float64) / 1000).alias("latency_s"),
        ttft.alias("ttft_s"),
        (pl.col("transport").cast(pl.String) == "batch").fill_null(False).alias("batch"),
        pl.Series("questions", questions[t], dtype=pl.Int64),
    ).cast(CALLS_SCHEMA)


def _with_all(frame: pl.DataFrame) -> pl.DataFrame:
    """``frame`` (label, eval as strings) and its rows again under eval ``ALL``."""
    return pl.concat([frame, frame.with_columns(pl.lit(ALL).alias("eval"))])


def call_measures(calls: pl.DataFrame) -> pl.DataFrame:
    """Per (label, eval), and per label under eval ``ALL``: ``calls`` timed (replies not from a
    batch, with a latency), ``p50_s``/``p95_s``/``p99_s`` of their latency, ``ttft_calls`` and
    ``ttft_p50_s``... of the streamed ones, ``batch_excluded`` and ``failed_excluded`` (calls left
    out) and ``decisions`` (questions of the calls with a reply, batch ones included). ``calls`` is
    ``calls_table``'s frame."""
    replied = pl.col("status").is_in(["ok", "invalid"])
    timed = replied & ~pl.col("batch")
    lat = pl.col("latency_s").filter(timed & pl.col("latency_s").is_not_null())
    ttft = pl.col("ttft_s").filter(timed & pl.col("ttft_s").is_not_null())
    return (
        _with_all(calls)
        .group_by("label", "eval")
        .agg(
            lat.len().alias("calls"),
            *(lat.quantile(q / 100, "linear").alias(f"p{q}_s") for q in PERCENTILES),
            ttft.len().alias("ttft_calls"),
            *(ttft.quantile(q / 100, "linear").alias(f"ttft_p{q}_s") for q in PERCENTILES),
            (replied & pl.col("batch")).sum().alias("batch_excluded"),
            (pl.col("status") == "failed").sum().alias("failed_excluded"),
            pl.col("questions").filter(replied).sum().alias("decisions"),
        )
        .sort("label", "eval")
    )


def _harmonic(n: int) -> np.ndarray:
    """H(0..n): H(k) = Σ_{j=1..k} 1/j (H(0) = 0)."""
    return np.concatenate([[0.0], np.cumsum(1.0 / np.arange(1, n + 1))])


def confidence_groups(ans: pl.DataFrame) -> pl.DataFrame:
    """An answers frame (``scoring.answers``: label, eval, status, correct, p_predicted) reduced to
    its tied groups: per (label, eval, conf, valid) the answers ``n`` and their ``errors`` (not
    correct); ``conf`` is the confidence (``p_predicted``) of ok answers, null for the others
    (``valid``: status ok). Small (servers round probabilities, so few distinct values), and the
    groups of several answers frames (evaluations scored apart) concatenate: ``confidence_measures``
    takes them."""
    valid = pl.col("status").cast(pl.String) == "ok"
    return (  # grouped on the label and eval as they come (Enums: integer keys), then named
        ans.select(
            "label",
            "eval",
            pl.when(valid).then(pl.col("p_predicted")).alias("conf"),
            valid.alias("valid"),
            (~pl.col("correct").fill_null(False)).alias("wrong"),
        )
        .group_by("label", "eval", "conf", "valid")
        .agg(
            pl.len().cast(pl.Int64).alias("n"), pl.col("wrong").sum().cast(pl.Int64).alias("errors")
        )
        .with_columns(pl.col("label", "eval").cast(pl.String))
    )


def confidence_measures(groups: pl.DataFrame | Sequence[pl.DataFrame]) -> pl.DataFrame:
    """Per (label, eval), and per label under eval ``ALL``: ``answers`` with a confidence (status ok
    and ``p_predicted`` set), ``excluded`` (the others), ``valid`` (ok answers, with or without a
    confidence), ``aurc`` (module docstring; null without answers), ``curve`` (list of [coverage,
    risk]) and, per τ in ``TAUS``, ``covered_<τ>`` and ``correct_<τ>``. ``groups``:
    ``confidence_groups``' frame(s)."""
    if not isinstance(groups, pl.DataFrame):
        groups = (
            pl.concat(list(groups))
            if groups
            else confidence_groups(
                pl.DataFrame(
                    schema={
                        "label": pl.String,
                        "eval": pl.String,
                        "status": pl.String,
                        "p_predicted": pl.Float64,
                        "correct": pl.Boolean,
                    }
                )
            )
        )
    base = (
        _with_all(groups)
        .group_by("label", "eval", "conf", "valid")
        .agg(pl.col("n", "errors").sum())
        .with_columns((pl.col("valid") & pl.col("conf").is_not_null()).alias("ranked"))
    )
    counts = base.group_by("label", "eval").agg(
        pl.col("n").filter("ranked").sum().alias("answers"),
        pl.col("n").filter(~pl.col("ranked")).sum().alias("excluded"),
        pl.col("n").filter("valid").sum().alias("valid"),
    )
    ranked = base.filter("ranked")
    at = ranked.group_by("label", "eval").agg(
        *(
            e
            for tau in TAUS
            for e in (
                pl.col("n").filter(pl.col("conf") >= tau - TAU_SLACK).sum().alias(f"covered_{tau}"),
                (pl.col("n") - pl.col("errors"))
                .filter(pl.col("conf") >= tau - TAU_SLACK)
                .sum()
                .alias(f"correct_{tau}"),
            )
        )
    )
    return (
        counts.join(at, on=["label", "eval"], how="left")
        .join(_curves(ranked), on=["label", "eval"], how="left")
        .sort("label", "eval")
    )


def _curves(ranked: pl.DataFrame) -> pl.DataFrame:
    """``aurc`` and ``curve`` per (label, eval) of the ranked answers' tied groups (one row per
    label, eval and conf: ``n`` answers, ``errors``), ties as their expectation (module
    docstring)."""
    schema = {
        "label": pl.String,
        "eval": pl.String,
        "aurc": pl.Float64,
        "curve": pl.List(pl.List(pl.Float64)),
    }
    if ranked.is_empty():
        return pl.DataFrame(schema=schema)
    # one row per tied group, most confident first within each (label, eval): each (label, eval) is
    # one block of rows; within it, k0 answers (e0 errors) are more confident than the group
    groups = ranked.sort(["label", "eval", "conf"], descending=[False, False, True])
    ng = groups["n"].to_numpy().astype(np.int64)
    eg = groups["errors"].to_numpy().astype(np.float64)
    first = (
        groups.select(
            (pl.col("label") != pl.col("label").shift())
            | (pl.col("eval") != pl.col("eval").shift())
        )
        .to_series()
        .fill_null(True)
        .to_numpy()
    )
    block = np.cumsum(first) - 1
    k_before, e_before = np.cumsum(ng) - ng, np.cumsum(eg) - eg  # over every block before
    k0, e0 = k_before - k_before[first][block], e_before - e_before[first][block]
    h = _harmonic(int((k0 + ng).max()))
    dh = h[k0 + ng] - h[k0]
    # Σ_{j=1..ng} (e0 + j·eg/ng) / (k0 + j) = e0·ΔH + eg − (eg/ng)·k0·ΔH
    area = e0 * dh + eg - eg / ng * k0 * dh
    n = np.bincount(block, weights=ng).astype(np.int64)
    aurc = groups.filter(pl.Series(first)).select(
        "label", "eval", pl.Series("aurc", np.bincount(block, weights=area) / n)
    )
    # the curve: risk at k = ceil(n·j/CURVE_POINTS), in the tied group that holds the k-th answer
    # (answer k of a block is answer offset + k overall)
    offset = k_before[first]
    j = np.arange(1, CURVE_POINTS + 1)
    k = (n[:, None] * j[None, :] + CURVE_POINTS - 1) // CURVE_POINTS  # (keys, points)
    g = np.searchsorted(np.cumsum(ng), (offset[:, None] + k).ravel(), side="left")
    risk = (e0[g] + (k.ravel() - k0[g]) * eg[g] / ng[g]) / k.ravel()
    coverage = np.tile(j / CURVE_POINTS, len(n))
    curve = pl.Series(
        "curve",
        np.stack([coverage, risk], axis=1).reshape(len(n), CURVE_POINTS, 2).tolist(),
        dtype=pl.List(pl.List(pl.Float64)),
    )
    aurc = aurc.with_columns(curve)
    return aurc.select(list(schema)).cast(schema)


def _r(value: float | None, digits: int = 6) -> float | None:
    return (
        None
        if value is None or (isinstance(value, float) and math.isnan(value))
        else round(float(value), digits)
    )


def _latency(row: dict | None) -> dict:
    if row is None:
        return {
            "calls": 0,
            **{f"p{q}_s": None for q in PERCENTILES},
            "batch_excluded": 0,
            "failed_excluded": 0,
            "ttft": None,
            "reason": "no calls",
        }
    block = {
        "calls": row["calls"],
        **{f"p{q}_s": _r(row[f"p{q}_s"]) for q in PERCENTILES},
        "batch_excluded": row["batch_excluded"],
        "failed_excluded": row["failed_excluded"],
    }
    block["ttft"] = (
        {"calls": row["ttft_calls"], **{f"p{q}_s": _r(row[f"ttft_p{q}_s"]) for q in PERCENTILES}}
        if row["ttft_calls"]
        else None
    )
    if not row["calls"]:
        block["reason"] = (
            f"every reply ({row['batch_excluded']}) came from a provider batch: a batch's time is "
            "not a per-call latency"
            if row["batch_excluded"]
            else "no reply with a latency"
        )
    elif row["batch_excluded"]:
        block["note"] = (
            f"{row['batch_excluded']} answer call(s) from a provider batch are left out: a batch's "
            "time is not a per-call latency"
        )
    return block


def _risk_coverage(row: dict | None) -> tuple[dict | None, str | None]:
    if row is None or not row["valid"]:
        return None, NO_ANSWER
    if not row["answers"]:
        return None, NO_CONFIDENCE
    n = row["answers"]
    at = []
    for tau in TAUS:
        covered, right = row[f"covered_{tau}"], row[f"correct_{tau}"]
        at.append(
            {
                "tau": tau,
                "answers": covered,
                "coverage": _r(covered / n),
                "accuracy": _r(100 * right / covered) if covered else None,
            }
        )
    return {
        "answers": n,
        "excluded": row["excluded"],
        "aurc": _r(row["aurc"]),
        "curve": [[_r(c), _r(r)] for c, r in row["curve"]],
        "at": at,
    }, None


def block(
    call: dict | None, conf: dict | None, cost_usd: float | None, cost_reason: str | None
) -> dict:
    """One ``measures`` block (summary.json; module docstring) from a ``call_measures`` row, a
    ``confidence_measures`` row (None: none) and the usage cost (USD; None with ``cost_reason``)."""
    decisions = call["decisions"] if call else 0
    out: dict = {"latency": _latency(call), "decisions": decisions}
    if cost_usd is None or not decisions:
        out["cost_per_1000_decisions_usd"] = None
        out["cost_reason"] = (cost_reason or "no price") if decisions else "no decision"
    else:
        out["cost_per_1000_decisions_usd"] = _r(1000 * cost_usd / decisions, 9)
    rc, reason = _risk_coverage(conf)
    out["risk_coverage"] = rc
    if reason:
        out["risk_coverage_reason"] = reason
    return out


def add_measures(summary: Summary, calls: pl.DataFrame, confidence: pl.DataFrame) -> Summary:
    """``summary`` with each model's ``measures`` (every evaluation pooled) and each evaluation
    block's ``measures`` (of the evaluations with tasks), and the top-level ``measures``
    (``describe``). ``calls`` is ``call_measures``' table, ``confidence`` ``confidence_measures``';
    the costs come from the model entries' ``usage`` blocks (``scoring.cost``), so they are the
    summary's own."""
    by_call = {(r["label"], r["eval"]): r for r in calls.iter_rows(named=True)}
    by_conf = {(r["label"], r["eval"]): r for r in confidence.iter_rows(named=True)}
    for entry in summary.models:
        usage = unset(entry.usage) or {}
        reason = usage.get("cost_reason")
        for name, evaluation in entry.evals.items():
            if not evaluation.get("n"):
                continue
            costed = (usage.get("evals") or {}).get(name, {})
            evaluation["measures"] = block(
                by_call.get((entry.model, name)),
                by_conf.get((entry.model, name)),
                costed.get("cost_usd"),
                costed.get("cost_reason") or reason,
            )
        entry.measures = block(
            by_call.get((entry.model, ALL)),
            by_conf.get((entry.model, ALL)),
            usage.get("cost_usd"),
            reason,
        )
    summary.measures = describe()
    return summary


def model_rows(entry: ModelEntry) -> list[tuple[str, dict]]:
    """``(evaluation or "all", measures block)`` of one model entry, the pooled one first (for
    tables)."""
    rows = [(ALL, entry.measures)] if unset(entry.measures) else []
    return rows + [(name, b["measures"]) for name, b in entry.evals.items() if b.get("measures")]
