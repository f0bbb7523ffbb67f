"""Hand-written answers frames for scoring tests (the shape of ``scoring.answers``)."""

from __future__ import annotations

import polars as pl

SCHEMA = {
    "label": pl.String,
    "eval": pl.String,
    "task_id": pl.String,
    "question_id": pl.String,
    "sample": pl.Int32,
    "kind": pl.String,
    "status": pl.String,
    "error": pl.String,
    "predicted": pl.String,
    "gold": pl.String,
    "p_predicted": pl.Float64,
    "p_yes": pl.Float64,
    "warning": pl.String,
    "predicted_category": pl.String,
    "gold_category": pl.String,
    "group": pl.String,
    "adversarial": pl.Boolean,
    "probabilities": pl.List(pl.Struct({"option": pl.String, "p": pl.Float64})),
}


def choice(
    label: str,
    eval_name: str,
    task: str,
    gold: str,
    probs: dict[str, float] | None,
    *,
    sample: int = 0,
    status: str = "ok",
    group: str | None = None,
    error: str | None = None,
    categories: dict[str, str] | None = None,
) -> dict:
    """A choice answer: the predicted option is the most probable one (None probabilities: no
    answer)."""
    predicted = max(probs, key=probs.get) if probs and status == "ok" else None
    return {
        "label": label,
        "eval": eval_name,
        "task_id": task,
        "question_id": "answer",
        "sample": sample,
        "kind": "choice",
        "status": status,
        "error": error,
        "predicted": predicted,
        "gold": gold,
        "p_predicted": probs[predicted] if predicted else None,
        "p_yes": None,
        "warning": None,
        "predicted_category": (categories or {}).get(predicted),
        "gold_category": (categories or {}).get(gold),
        "group": group,
        "adversarial": None,
        "probabilities": [{"option": o, "p": p} for o, p in probs.items()]
        if probs and status == "ok"
        else ([] if status == "invalid" else None),
    }


def yes_no(
    label: str,
    task: str,
    question: str,
    gold: str,
    p_yes: float | None,
    *,
    sample: int = 0,
    status: str = "ok",
    group: str | None = None,
    adversarial: bool | None = None,
) -> dict:
    """A WildGuardTest yes/no answer: yes when P(yes) >= 0.5 (None: no answer)."""
    ok = p_yes is not None and status == "ok"
    predicted = ("yes" if p_yes >= 0.5 else "no") if ok else None
    return {
        "label": label,
        "eval": "wildguardtest",
        "task_id": task,
        "question_id": question,
        "sample": sample,
        "kind": "yes_no",
        "status": status,
        "error": None,
        "predicted": predicted,
        "gold": gold,
        "p_predicted": (p_yes if predicted == "yes" else 1 - p_yes) if ok else None,
        "p_yes": p_yes if ok else None,
        "warning": None,
        "predicted_category": None,
        "gold_category": None,
        "group": group,
        "adversarial": adversarial,
        "probabilities": [{"option": "yes", "p": p_yes}, {"option": "no", "p": 1 - p_yes}]
        if ok
        else None,
    }


def frame(rows: list[dict]) -> pl.DataFrame:
    """The rows as an answers frame, with ``correct`` computed."""
    df = pl.DataFrame(rows, schema=SCHEMA)
    return df.with_columns(pl.col("predicted").eq_missing(pl.col("gold")).alias("correct"))
