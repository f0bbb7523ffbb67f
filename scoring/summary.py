"""summary.json: the contract users script against.

    {"prompt_version": str, "epochs": int, "data": {...},
     "models": [{"model": str, "decision_index": float | null, "decision_index_reason"?: str,
                 "evals": {"aa_omniscience_decision": {"n", "accuracy", "non_hallucination_rate", ...},
                           "hle_multichoice": {"n", "accuracy"}, "when2call": {"n", "accuracy"},
                           "wildguardtest": {"n", "f1_prompt_harm", "f1_response_refusal",
                                             "f1_response_harm", "mean_f1"}},
                 "requests": {"sent", "cache_hits", "failed", "invalid", ...}}]}

Metrics are 0-100, rounded to 6 decimals; ``n`` counts tasks (WildGuardTest: rows). Each evaluation
block also counts its ``invalid``, ``failed`` and ``missing`` answers, and the ``repaired`` ones (scored
normally; a language model's JSON arrived in a Markdown code fence); a null metric comes with a
``reason``. With several epochs each metric is the mean and ``<metric>_sd`` its standard deviation.
"""
from __future__ import annotations

import polars as pl

from .index import decision_index
from .score import WILDGUARD_F1

METRICS: dict[str, tuple[str, ...]] = {
    "aa_omniscience_decision": ("accuracy", "non_hallucination_rate"),
    "hle_multichoice": ("accuracy",),
    "when2call": ("accuracy",),
    "wildguardtest": (*WILDGUARD_F1.values(), "mean_f1"),
}
UNDEFINED_F1 = ("undefined (no positive gold label and no positive prediction); mean_f1 is the mean of "
                "the defined F1 scores")


def _round(value: float | None) -> float | None:
    return None if value is None else round(float(value), 6)


def eval_block(name: str, row: dict | None, data: dict, epochs: int) -> dict:
    """One evaluation's block for one model from its ``scoring.score.metrics`` row (None: no answers)."""
    block: dict = {"n": 0, **{m: None for m in METRICS[name]}}
    if "missing" in data:
        block["reason"] = f"no data: {data['missing']}"
        return block
    if row is None:
        block["reason"] = "no answers for this evaluation"
        return block
    block |= {"n": row["n"], "invalid": row["invalid"], "failed": row["failed"], "missing": row["missing"],
              "repaired": row["repaired"]}
    if row["missing"]:
        block["reason"] = (f"{row['missing']} answer(s) not in the cache: the run is incomplete; rerun "
                           "`dxi run` with the same options to complete it")
        return block
    reasons = []
    for m in METRICS[name]:
        block[m] = _round(row[m])
        if epochs > 1:
            block[f"{m}_sd"] = _round(row[f"{m}_sd"])
        if block[m] is None and m != "mean_f1":
            reasons.append(f"{m}: {UNDEFINED_F1}")
    if reasons:
        block["reason"] = "; ".join(reasons)
    return block


def build(metrics: pl.DataFrame, labels: list[str], data: dict[str, dict], prompt_version: str, epochs: int,
          requests: dict[str, dict]) -> dict:
    """The whole summary: one entry per model label (in ``labels`` order), from the metrics table, the
    suite's data block and each model's request counts."""
    by_key = {(r["label"], r["eval"]): r for r in metrics.iter_rows(named=True)}
    models = []
    for label in labels:
        evals = {name: eval_block(name, by_key.get((label, name)), data.get(name, {"missing": "unknown"}), epochs)
                 for name in METRICS}
        index, reason = decision_index(evals)
        entry: dict = {"model": label, "decision_index": _round(index)}
        if reason:
            entry["decision_index_reason"] = reason
        entry["evals"] = evals
        entry["requests"] = requests.get(label, {})
        models.append(entry)
    return {"prompt_version": prompt_version, "epochs": epochs, "data": data, "models": models}
