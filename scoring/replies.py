"""What the replies say about the model that gave them, beside their answers: which model served
them, and which were cut off at the token limit (summary.json's per-model ``served_models`` and
``cut_off``).

* **Served model.** A reply names the model that answered (OpenAI and Anthropic ``model``, Gemini
  ``modelVersion``; the cache's ``served_model``). A provider may answer a retired model's requests
  with another (Google routes ``gemini-2.5-flash`` to ``gemini-3.5-flash-lite``), and the answers
  are then scored under the name asked for: ``served_models`` counts, per model, the answers each
  served name gave, and ``served_differs`` lists the names that are not the model asked for. A dated
  snapshot of the name asked for (``gpt-6-luna-2026-09-22`` for ``gpt-6-luna``; ``models/`` prefixes
  aside) is the same model (``same_model``). A System One reply that names another model than the
  one asked for (``dxi.served.served_by_other``: stored by an older dxi, before ``check_served``
  refused such replies) is not scored: ``answered_by_other`` counts its ``replies`` and ``answers``
  and the names that ``served`` them, and its answers are missing (their requests are sent again).
* **Cut-offs.** A reply cut off at the token limit is invalid (SPEC §6), so its points are lost to
  the budget, not to the model: ``cut_off`` counts, per model, the ``replies`` cut off, those cut
  off ``while_thinking`` (before any answer text: the limit was spent on reasoning) and the
  ``answers`` they held (the cache's ``cut_off`` column; rows written before it count as not cut
  off).

Counted over exactly the cache rows the answers are scored from (``scoring.pipeline`` ``_current``):
a row whose content several tasks share counts once per task, as its answers are scored.
``usage_and_replies`` reads the cache rows once for both this table and ``scoring.usage``'s (a
second read was ~1 s of a million answers).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping

import numpy as np
import polars as pl

from dxi.shown import shown

from . import measures
from .pipeline import (
    SET_ASIDE,
    USAGE_READ,
    Rows,
    _current,
    _model_epochs,
    _task_frame,
    usage_table,
)
from .records import ModelEntry, Summary, unset

REPLIES_SCHEMA = {
    "label": pl.String,
    "eval": pl.String,
    "served_model": pl.String,
    "cut_off": pl.String,
    "set_aside": pl.Boolean,
    "replies": pl.Int64,
    "answers": pl.Int64,
}
THINKING = "thinking"
CUT_OFF_HINT = (
    "raise the output budget (max_tokens, max_completion_tokens, maxOutputTokens) or lower --effort"
)
_SNAPSHOT = re.compile(r"-(?:\d{4}-\d{2}-\d{2}|\d{8}|\d{3,4}|v\d+(?::\d+)?|latest)$")


def usage_and_replies(
    rows: Rows,
    models: pl.DataFrame,
    gold: pl.DataFrame,
    epochs: int = 1,
    with_calls: bool = False,
    parts: Mapping[str, Mapping[str, Collection[str]]] | None = None,
) -> tuple[pl.DataFrame, ...]:
    """``(scoring.usage(rows, models, gold, epochs), the replies table)`` from one read of the
    current cache rows. The replies table: per (label, eval, served_model, cut_off, set_aside), the
    requests with a reply (``replies``: ok or invalid, one per task and epoch) and the ``answers``
    they hold (``REPLIES_SCHEMA``). ``with_calls`` adds a third table from the same read: one row
    per call (``scoring.measures.calls_table``: latency, time to first token, batch, questions).
    ``parts`` (label -> evaluation -> task ids): the models an adaptive run scored over the part
    they were asked (``scoring.adaptive.asked_part``'s cut): their rows of that evaluation outside
    the part are left out, as their answers are (a round the cost bound cut sent some)."""
    models = models.sort("label").with_row_index("m")
    task_frame = _task_frame(gold.sort("eval", "task_id", "question_id"))
    ttft = (measures.TTFT,) if with_calls and measures.has_column(rows, measures.TTFT) else ()
    extra = (*measures.CALLS_READ, *ttft) if with_calls else ()
    found, m, t, _, _ = _current(
        rows,
        models,
        task_frame,
        _model_epochs(models, epochs),
        (*USAGE_READ, "served_model", "cut_off", SET_ASIDE, *extra),
        each_task=False,
    )
    if parts:
        outside = _outside(parts, models, task_frame, gold)
        keep = ~outside[m, t]
        found, m, t = found.filter(pl.Series(keep)), m[keep], t[keep]
    replies = _replies_table(found, m, t, models, task_frame)
    scored = ~found[SET_ASIDE].to_numpy()  # a reply another model gave is counted apart, alone
    found, m, t = found.filter(pl.Series(scored)), m[scored], t[scored]
    tables = (usage_table(found.select(USAGE_READ), m, models), replies)
    if not with_calls:
        return tables
    questions = task_frame["nq"].to_numpy().astype(np.int64)
    return (*tables, measures.calls_table(found, m, t, models, questions))


def _outside(
    parts: Mapping[str, Mapping[str, Collection[str]]],
    models: pl.DataFrame,
    task_frame: pl.DataFrame,
    gold: pl.DataFrame,
) -> np.ndarray:
    """(models, tasks) bool: the tasks of an evaluation a model was scored over part of
    (``parts``) that are not in its part."""
    out = np.zeros((models.height, task_frame.height), bool)
    ids = task_frame.select("task_id")
    evals = ids.join(
        gold.select("task_id", "eval").unique("task_id"),
        on="task_id",
        how="left",
        maintain_order="left",
    ).get_column("eval")  # each task's evaluation, in the task frame's order
    for k, label in enumerate(models["label"].to_list()):
        for name, part in parts.get(label, {}).items():
            asked = ids.get_column("task_id").is_in(
                pl.Series(list(part), dtype=pl.String).implode()
            )
            out[k] |= ((evals == name) & ~asked).to_numpy()
    return out


def _replies_table(
    found: pl.DataFrame,
    m: np.ndarray,
    t: np.ndarray,
    models: pl.DataFrame,
    task_frame: pl.DataFrame,
) -> pl.DataFrame:
    """The replies table from the current rows (each once, ``t`` the first task of its content)."""
    if found.is_empty():
        return pl.DataFrame(schema=REPLIES_SCHEMA)
    nq = task_frame["nq"].to_numpy().astype(np.int64)
    # the tasks that share each task's content (their requests are one row, scored once per task)
    same = task_frame.select(pl.len().over("task_digest")).to_series().to_numpy().astype(np.int64)
    table = (
        found.select(
            pl.col("status").cast(pl.String),
            pl.col("eval").cast(pl.String),
            pl.col("served_model").cast(pl.String),
            pl.col("cut_off").cast(pl.String),
            SET_ASIDE,
        )
        .with_columns(
            pl.Series("m", m, dtype=pl.UInt32),
            pl.Series("tasks", same[t], dtype=pl.Int64),
            pl.Series("nq", nq[t] * same[t], dtype=pl.Int64),
        )
        .filter(pl.col("status").is_in(["ok", "invalid"]))
        .group_by("m", "eval", "served_model", "cut_off", SET_ASIDE)
        .agg(pl.col("tasks").sum().alias("replies"), pl.col("nq").sum().alias("answers"))
        .sort("m", "eval", "served_model", "cut_off", SET_ASIDE, nulls_last=True)
    )
    return table.select(
        pl.Series("label", models["label"].gather(table["m"]), dtype=pl.String),
        *(c for c in REPLIES_SCHEMA if c != "label"),
    ).cast(REPLIES_SCHEMA)


def set_aside_answers(table: pl.DataFrame) -> dict[str, dict[str, int]]:
    """Per model label and evaluation, the answers of the replies another model gave, set aside
    (missing: ``scoring.summary.build``'s ``answered_by_other``), from a replies table."""
    out: dict[str, dict[str, int]] = {}
    aside = table.filter(pl.col(SET_ASIDE)).group_by("label", "eval").agg(pl.col("answers").sum())
    for label, name, answers in aside.sort("label", "eval").iter_rows():
        out.setdefault(label, {})[name] = answers
    return out


def same_model(asked: str, served: str) -> bool:
    """Whether the reply's ``served`` name is the model ``asked`` for: equal but for a ``models/``
    prefix or case, or a dated or versioned snapshot of it (``-2026-09-22``, ``-20261111``,
    ``-001``, ``-v1``, ``-latest``)."""
    a, s = asked.lower().removeprefix("models/"), served.lower().removeprefix("models/")
    return s == a or (s.startswith(a + "-") and _SNAPSHOT.fullmatch(s[len(a) :]) is not None)


def add_replies(summary: Summary, table: pl.DataFrame, asked: dict[str, str]) -> Summary:
    """``summary`` with each model entry's ``served_models`` ({served name: answers}, most first),
    ``served_differs`` (when any served name is not the model ``asked[label]``: {``requested``,
    ``served``: those names}) and ``cut_off`` ({``replies``, ``while_thinking``, ``answers``}) from
    a replies table (``usage_and_replies``), and ``answered_by_other`` when replies another model
    gave were set aside, not scored ({``requested``, ``replies``, ``answers``, ``served``: {served
    name: answers}}: ``dxi.served.served_by_other``)."""
    for entry in summary.models:
        label = entry.model
        mine = table.filter(pl.col("label") == label)
        aside = mine.filter(pl.col(SET_ASIDE))
        mine = mine.filter(~pl.col(SET_ASIDE))
        if aside.height:
            by_name = (
                aside.group_by("served_model")
                .agg(pl.col("answers").sum())
                .sort(["answers", "served_model"], descending=[True, False])
            )
            entry.answered_by_other = {
                "requested": asked.get(label, label),
                "replies": int(aside["replies"].sum()),
                "answers": int(aside["answers"].sum()),
                "served": dict(by_name.iter_rows()),
            }
        served = (
            mine.filter(pl.col("served_model").is_not_null())
            .group_by("served_model")
            .agg(pl.col("answers").sum())
            .sort(["answers", "served_model"], descending=[True, False])
        )
        entry.served_models = dict(served.iter_rows())
        other = [
            name
            for name in entry.served_models
            if label in asked and not same_model(asked[label], name)
        ]
        if other:
            entry.served_differs = {"requested": asked[label], "served": other}
        cut = mine.filter(pl.col("cut_off").is_not_null())
        entry.cut_off = {
            "replies": int(cut["replies"].sum()),
            "while_thinking": int(cut.filter(pl.col("cut_off") == THINKING)["replies"].sum()),
            "answers": int(cut["answers"].sum()),
        }
    return summary


def model_notes(entry: ModelEntry) -> list[str]:
    """What a reader must know about one model's replies (a summary.json model entry), as sentences:
    the models that served it when they differ from the one asked for, the replies another model
    gave that were set aside (``answered_by_other``; the names they gave shown escaped), its replies
    cut off at the token limit with the hint, and a provider's clamp of P(yes) (``p_yes_range``). []
    when none."""
    notes = []
    served = unset(entry.served_models) or {}
    differs = unset(entry.served_differs)
    if differs:  # the names a reply gave: shown escaped (``dxi.shown``)
        notes.append(
            "answered by "
            + ", ".join(f"{shown(name)} ({served[name]} answers)" for name in differs["served"])
            + f", not {shown(differs['requested'])} as asked: the provider served another model, "
            "and its answers are scored under this name"
        )
    aside = unset(entry.answered_by_other)
    if aside:
        notes.append(
            f"{aside['replies']} {'reply' if aside['replies'] == 1 else 'replies'} ({aside['answers']} "
            "answers) answered by "
            + ", ".join(f"{shown(name)} ({n} answers)" for name, n in aside["served"].items())
            + f", not {shown(aside['requested'])} as asked, set aside: another model's answers, not scored "
            "(missing); the next dxi run sends their requests again"
        )
    cut = unset(entry.cut_off) or {}
    if cut.get("replies"):
        notes.append(
            f"{cut['replies']} replies cut off at the token limit ({cut['while_thinking']} while thinking), "
            f"{cut['answers']} answers scored wrong: the budget, not the model, lost these points; "
            f"{CUT_OFF_HINT}"
        )
    if entry.p_yes_range:
        low, high = entry.p_yes_range
        notes.append(
            f"P(yes) is clamped by the provider to [{low:g}, {high:g}]: its yes/no probabilities never reach "
            "0 or 1, which bounds its Brier score and log loss on confident answers"
        )
    return notes
