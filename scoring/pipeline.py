"""Scoring from the cache alone: one vectorised pass over every model.

``answers(rows, models, gold, categories, epochs)`` selects the cache rows the current tasks and
configuration would send (matching provider, model, sampling parameters and prompt version, and each
task's content digest; ``sample`` below ``epochs``), keeps the row that counts per request (the
cache's rule, ``cache.index.newest``: a final row over a transient failure, then the newest; two
tasks whose requests are byte-identical share one row, as they share its cache key), and lays them
out as one row per (model, question, epoch) beside the gold label. ``metrics(answers)`` computes
every metric per model and evaluation, averaged over epochs (``scoring.scored.score`` adds
intervals, calibration and breakdowns).

Status of an answer: ``ok``; ``invalid`` (a reply came but this answer was unusable); ``failed`` (no
reply after the retry budget, or a deterministic error); ``missing`` (not in the cache: never sent,
or the run stopped; or a System One reply another model gave, set aside: ``dxi.served``, its error
``ANSWERED_BY_OTHER``). Invalid answers are the model's reply, scored as wrong (SPEC §6). Failed and
missing answers are not answers: left out of every figure, which they make provisional, with bounds
for whatever they turn out to be (``scoring.provisional``, ``scoring.bounds``); ``rerun`` marks
those whose request the next ``dxi run`` sends again (missing ones, and failures that were not
deterministic).

Speed: every expected answer has an integer place ``(m·G + g)·E + s`` — model ``m`` (labels in
sorted order), gold row ``g`` (sorted by eval, task id, question id), epoch ``s`` — so cache rows
are placed, deduplicated and completed (failed, unanswered, missing) by integer arithmetic instead
of joins on strings; the gold side is gathered to the answers' order (never the nested answers to
the gold order), and the categorical columns are Polars Enums (``export`` sorts the rows and turns
them into strings).

Why one module over 600 lines: ``answers`` is one vectorised pass (the rows that count, the newest-
row rule, the per-question layout) and the helpers above it share its index arrays; ``usage``,
``metrics`` and ``request_counts`` read the same frames.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import polars as pl

from dxi.cache.index import newest, rank_expr
from dxi.evals import ANSWER_IDS_SEP
from dxi.served import served_by_other_expr
from dxi.stored import probability_expr

from .columns import explode, filtered_parts
from .cost import CONSISTENT, COUNTED
from .sums import _codes, build_cubes, eval_metrics_all, metric_table

CONFIG_COLUMNS = ["provider", "model", "endpoint", "params", "prompt_version"]
ANSWER_FIELDS = (
    "question_id",
    "status",
    "predicted",
    "p_predicted",
    "p_yes",
    "error",
    "warning",
    "probabilities",
)
ANSWER_READ = tuple(
    f"answer_{c}" for c in ANSWER_FIELDS
)  # the cache's flat answer columns (``cache.layout``)
LOOKUP_COLUMNS = (
    *CONFIG_COLUMNS,
    "task_id",
    "task_digest",
)  # what ``_current`` finds a cache row's request by
READ_COLUMNS = (
    *CONFIG_COLUMNS,
    "sample",
    "task_id",
    "task_digest",
    "created_at",
    "status",
    "error",
    "repaired",
    *ANSWER_READ,
)  # what ``answers`` reads of each cache row
MODELS_SCHEMA = {
    "label": pl.String,
    "provider": pl.String,
    "model": pl.String,
    "endpoint": pl.String,
    "params": pl.String,
    "prompt_version": pl.String,
}
STATUSES = ("ok", "invalid", "failed", "missing")
NO_ANSWER = "no answer to this question"
NOT_CACHED = "not in the cache"
SET_ASIDE = "set_aside"  # a reply another model gave: set aside (``dxi.served.served_by_other``)
# the error of each answer of a reply set aside: the model that served it, the model asked for
ANSWERED_BY_OTHER = (
    "answered by {}, not {} as asked: another model's answer, set aside (the next dxi run sends its "
    "request again)"
)
ANSWER_COLUMNS = (
    "label",
    "eval",
    "task_id",
    "question_id",
    "sample",
    "kind",
    "status",
    "error",
    "predicted",
    "gold",
    "correct",
    "p_predicted",
    "p_yes",
    "warning",
    "predicted_category",
    "gold_category",
    "group",
    "adversarial",
    "probabilities",
    "repaired",
    "rerun",
)
_PROBABILITIES = pl.List(pl.Struct({"option": pl.String, "p": pl.Float64}))


def models_in_cache(rows: pl.LazyFrame, prompt_version: str) -> pl.DataFrame:
    """Every (provider, model, endpoint, params) with rows of ``prompt_version``: the columns of
    ``MODELS_SCHEMA`` and ``cached_epochs`` (the highest epoch cached, plus one). Labelled
    ``provider:model``, with the params appended when a model has rows under several parameter sets,
    and ``@endpoint`` when it has rows from several endpoints (one model name on two servers)."""
    found = (
        rows.filter(pl.col("prompt_version") == prompt_version)
        .group_by(CONFIG_COLUMNS)
        .agg((pl.col("sample").max().fill_null(0) + 1).alias("cached_epochs"))
        .collect()
        .sort(CONFIG_COLUMNS)
    )
    label = pl.col("provider") + ":" + pl.col("model")
    label = (
        pl.when(pl.col("params").n_unique().over("provider", "model") > 1)
        .then(label + " " + pl.col("params"))
        .otherwise(label)
    )
    label = (
        pl.when(pl.col("endpoint").n_unique().over("provider", "model") > 1)
        .then(label + " @" + pl.col("endpoint").fill_null(""))
        .otherwise(label)
    )
    return found.with_columns(label.alias("label")).select(
        *MODELS_SCHEMA, pl.col("cached_epochs").cast(pl.Int64)
    )


def _enum(values: Sequence[str] | pl.Series) -> pl.Series:
    """A Series of distinct values as an Enum of themselves, in the given order."""
    s = pl.Series(values, dtype=pl.String)
    return s.cast(pl.Enum(s))


def _model_epochs(models: pl.DataFrame, epochs: int) -> np.ndarray:
    """Each model's number of epochs (in ``models`` order): its ``epochs`` column where given, else
    ``epochs``."""
    if "epochs" in models.columns:
        return models["epochs"].fill_null(epochs).to_numpy().astype(np.int64)
    return np.full(models.height, epochs, np.int64)


def _configured(found: pl.DataFrame, models: pl.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """The rows of ``found`` whose configuration (``CONFIG_COLUMNS``) is one of ``models``' (row
    ``m``): (row numbers ascending, their model numbers). Rows come in runs of one configuration (a
    shard, a log), so only the first row of each run is looked up."""
    h = found.height
    if h == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    start = (
        found.select(
            pl.any_horizontal(pl.col(c).ne_missing(pl.col(c).shift()) for c in CONFIG_COLUMNS)
        )
        .to_series()
        .to_numpy()
        .copy()
    )
    start[0] = True
    heads = np.flatnonzero(start)
    ends = np.r_[heads[1:], h]
    pairs = (
        found.select(CONFIG_COLUMNS)[heads]
        .select(pl.all().cast(pl.String))
        .with_row_index("run")  # heads only
        .join(
            models.select(*CONFIG_COLUMNS, "m"),
            on=CONFIG_COLUMNS,
            maintain_order="left",
            nulls_equal=True,
        )
    )
    run = pairs["run"].to_numpy().astype(np.int64)
    lengths = ends[run] - heads[run]
    first = np.repeat(heads[run] - (np.cumsum(lengths) - lengths), lengths)
    i = first + np.arange(len(first))
    m = np.repeat(pairs["m"].to_numpy().astype(np.int64), lengths)
    if len(i) > 1 and (np.diff(i) < 0).any():  # a configuration listed twice in ``models``
        order = np.argsort(i, kind="stable")
        i, m = i[order], m[order]
    return i, m


def _task_frame(gold: pl.DataFrame) -> pl.DataFrame:
    """One row per task of the (sorted) gold frame: task_id, task_digest, task_id_digest (when the
    gold frame has it), ``nq`` questions, index ``t``."""
    first = [pl.col(c).first() for c in ("task_digest", "task_id_digest") if c in gold.columns]
    return (
        gold.group_by("task_id", maintain_order=True)
        .agg(*first, pl.len().alias("nq"))
        .with_row_index("t")
    )


def _content(found: pl.DataFrame, task_frame: pl.DataFrame) -> tuple[np.ndarray, np.ndarray, int]:
    """The request content of each task and of each cache row: ``(content per row (-1: none of the
    current tasks'), content per task, number of contents)``. A task's content is its digest (what
    the model is shown; the id is never sent), so tasks with equal digests send byte-identical
    requests, which the cache keeps as one row (its key): that row is each such task's. A row
    written before digests left out the id has the old digest (``Task.id_digest``): it is the
    content of the task with its id."""
    digests = task_frame["task_digest"]
    contents = pl.Enum(digests.unique(maintain_order=True))
    of_task = digests.cast(contents).to_physical().to_numpy().astype(np.int64)
    of_row = (
        found["task_digest"]
        .cast(contents, strict=False)
        .to_physical()
        .fill_null(-1)
        .to_numpy()
        .astype(np.int64)
    )
    if "task_id_digest" in task_frame.columns and (of_row < 0).any():
        task_code = (
            found["task_id"].cast(pl.Enum(task_frame["task_id"]), strict=False).to_physical()
        )
        old = (
            task_code.is_not_null()
            & (
                found["task_digest"].cast(pl.String)
                == task_frame["task_id_digest"].gather(task_code.fill_null(0))
            )
        ).to_numpy()
        old &= of_row < 0
        of_row[old] = of_task[task_code.fill_null(0).to_numpy()[old]]
    return of_row, of_task, len(contents.categories)


Rows = (
    pl.LazyFrame | Sequence[pl.LazyFrame]
)  # the cache's rows: one scan, or its parts (``Cache.scan_parts``)


def _read(rows: Rows, task_frame: pl.DataFrame, columns: list[pl.Expr | str]) -> pl.DataFrame:
    """``columns`` of ``rows`` (one LazyFrame: every row) or, of parts (a sequence of LazyFrames),
    the rows whose ``task_digest`` is one of ``task_frame``'s (or the old digest of its id,
    ``_content``), each part read alone (``columns.filtered_parts``): the only rows ``_current`` can
    choose, so the result is the same, in the memory of those rows only."""
    if isinstance(rows, pl.LazyFrame):
        return rows.select(columns).collect()
    digests = task_frame["task_digest"]
    if "task_id_digest" in task_frame.columns:
        digests = pl.concat([digests, task_frame["task_id_digest"].drop_nulls()])
    return filtered_parts(rows, pl.col("task_digest").is_in(digests.unique().implode()), columns)


def _current(
    rows: Rows,
    models: pl.DataFrame,
    task_frame: pl.DataFrame,
    model_epochs: np.ndarray,
    columns: Sequence[str],
    each_task: bool = True,
) -> tuple[pl.DataFrame, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The cache rows the current configuration would send, the newest per request:
    ``(found, m, t, s,     request)`` with ``found`` (those rows, with ``columns``) and per row its
    model ``m`` (index into ``models``, which carries ``m``), task ``t``, epoch ``s`` and request
    number ``(m·T + t)·E + s`` (E the largest number of epochs). A request is found by what it is
    made of (configuration, epoch, the task's content: ``_content``), as its cache key is: a row
    whose content several tasks share is each of those tasks' row, repeated once per task
    (``each_task``; False: each row once, ``t`` the first such task). Rows of other models,
    parameters, prompt versions, task contents, and epochs beyond a model's own are left out.
    ``columns`` may name ``SET_ASIDE``: whether the row is a reply another model gave
    (``dxi.served.served_by_other``), which counts only when no other row of its request does."""
    n_epochs, n_tasks = int(model_epochs.max(initial=1)), task_frame.height
    if n_tasks == 0:  # nothing to score (e.g. every task excluded): no row is current
        none = np.empty(0, np.int64)
        first = rows if isinstance(rows, pl.LazyFrame) else rows[0]
        empty = first.head(0).select(
            served_by_other_expr() if c == SET_ASIDE else c for c in columns
        )
        return empty.collect(), none, none, none, none
    # Read every epoch's rows (a filter on ``sample`` in the scan is slower than dropping rows
    # below). The columns only looked up here are read as Categoricals, cast in the scan: a row's
    # configuration, task id and digest repeat over many rows, and as strings they were the largest
    # part of the read.
    lookup = [
        pl.col(c).cast(pl.Categorical) if c not in columns else pl.col(c)
        for c in (*CONFIG_COLUMNS, "task_id", "task_digest")
    ]
    # what ``newest`` orders a request's rows by (``served_model``: a reply another model gave is
    # set aside, ``rank_expr``; a Categorical, as the lookup columns, unless asked for)
    order = ("created_at", "status", "error_kind")
    served = () if "served_model" in columns else (pl.col("served_model").cast(pl.Categorical),)
    found = _read(
        rows,
        task_frame,
        [
            *lookup,
            "sample",
            *(c for c in order if c not in columns),
            *served,
            *(c for c in columns if c not in LOOKUP_COLUMNS and c != SET_ASIDE),
        ],
    )
    i, m = _configured(found, models)
    content, content_of_task, n_contents = _content(found, task_frame)
    sample = found["sample"].fill_null(-1).to_numpy()
    keep = (content[i] >= 0) & (sample[i] >= 0) & (sample[i] < model_epochs[m])
    i, m = i[keep], m[keep]
    c = content[i]
    s = sample[i].astype(np.int64)
    request = (m * n_contents + c) * n_epochs + s
    if (
        len(request) and np.bincount(request).max() > 1
    ):  # several rows for one request: the cache's rule
        rank = found.select(rank_expr())["rank"].to_numpy()[i]
        keep = newest(request, rank, found["created_at"].to_numpy()[i])
        i, m, c, s = i[keep], m[keep], c[keep], s[keep]
    tasks_by_content = np.argsort(
        content_of_task, kind="stable"
    )  # tasks of content k: a run in this order
    shared = np.bincount(content_of_task, minlength=n_contents)
    first = np.searchsorted(content_of_task[tasks_by_content], np.arange(n_contents))
    if each_task and (shared[c] > 1).any():  # one row for several tasks: each of them gets it
        times = shared[c]
        i, m, s = np.repeat(i, times), np.repeat(m, times), np.repeat(s, times)
        within = np.arange(len(i)) - np.repeat(np.cumsum(times) - times, times)
        t = tasks_by_content[np.repeat(first[c], times) + within]
    else:
        t = tasks_by_content[first[c]]
    request = (m * n_tasks + t) * n_epochs + s
    found = found.select(served_by_other_expr() if c == SET_ASIDE else c for c in columns)
    if not np.array_equal(i, np.arange(found.height)):
        found = found[i]
    return found, m, t, s, request


def answers(
    rows: Rows, models: pl.DataFrame, gold: pl.DataFrame, categories: pl.DataFrame, epochs: int = 1
) -> pl.DataFrame:
    """One row per (model label, question, epoch): ``ANSWER_COLUMNS`` — label, eval, task_id,
    question_id, sample, kind, status, error, predicted, gold, correct, p_predicted, p_yes, warning,
    predicted_category / gold_category (When2Call), group and adversarial (for breakdowns),
    probabilities (every option's probability as returned, ``list<struct{option, p}>``; empty for
    invalid answers, null for failed and missing ones), repaired, and rerun (the next ``dxi run``
    sends this answer's request again: a missing answer, or a failure whose ``error_kind`` is not
    ``fatal``; not written to answers.parquet).

    ``label``, ``eval``, ``task_id``, ``question_id``, ``kind`` and ``group`` are Enums whose
    categories are sorted (labels; gold rows by eval, task id, question id), so sorting by them is
    the canonical order. Rows come in cache order (the answers found), then the questions without an
    answer: sort them (``export`` does) for a stable order. ``rows`` is the cache's scan, or its
    parts (``Cache.read_parts``: each part is read alone, only the rows of ``gold``'s tasks; the
    same result with less memory when ``gold`` is one evaluation's). ``models`` has the columns of
    ``MODELS_SCHEMA`` (and optionally ``epochs`` per model; ``epochs`` otherwise); ``gold`` and
    ``categories`` those of ``evals.gold_frames``."""
    models = models.sort("label").with_row_index("m")
    model_epochs = _model_epochs(models, epochs)
    n_epochs = int(model_epochs.max(initial=1))
    gold = gold.sort("eval", "task_id", "question_id").with_row_index("g")
    task_frame = _task_frame(gold)
    n_models, n_gold, n_tasks = models.height, gold.height, task_frame.height
    n = n_models * n_gold * n_epochs
    task_of_gold = np.repeat(np.arange(n_tasks), task_frame["nq"].to_numpy())
    found, m, t, s, request = _current(
        rows,
        models,
        task_frame,
        model_epochs,
        (
            "status",
            "error",
            "error_kind",
            "repaired",
            "served_model",
            SET_ASIDE,
            *ANSWER_READ,
        ),
    )
    row_of_request = np.full(n_models * n_tasks * n_epochs, -1, np.int64)
    row_of_request[request] = np.arange(len(request))
    row_failed = (found["status"] == "failed").to_numpy()
    # a reply another model gave: none of its answers is this model's (missing, sent again)
    row_aside = found[SET_ASIDE].to_numpy()
    row_rerun = row_aside | (
        row_failed & (found["error_kind"] != "fatal").fill_null(True).to_numpy()
    )  # as ``Cache.has`` decides
    row_repaired = found["repaired"].fill_null(False).to_numpy()
    row_error = found.select(
        pl.when(pl.col(SET_ASIDE))
        .then(
            pl.format(
                ANSWERED_BY_OTHER,
                pl.col("served_model"),
                pl.lit(models["model"].gather(m)),  # the row's model: its configuration's
            )
        )
        .otherwise(pl.col("error"))
    ).to_series()

    # every answer the cache holds (the flat answer columns of the cache's logical shape), with its
    # place (model, gold row, epoch)
    r = np.repeat(
        np.arange(found.height), found["answer_question_id"].list.len().fill_null(0).to_numpy()
    )
    per_question = pl.DataFrame({c: explode(found[f"answer_{c}"]) for c in ANSWER_FIELDS})
    found = found.drop(
        ANSWER_READ
    )  # the lists' offsets are not needed again: freed before the frame is built
    question_names = sorted(set(gold["question_id"].to_list()))
    gold_of = np.full((n_tasks, max(1, len(question_names))), -1, np.int64)
    gold_of[task_of_gold, [question_names.index(q) for q in gold["question_id"].to_list()]] = (
        np.arange(n_gold)
    )
    qcode = (
        per_question["question_id"]
        .cast(pl.Enum(question_names), strict=False)
        .to_physical()
        .cast(pl.Int64)
        .fill_null(-1)
        .to_numpy()
    )
    g = np.where(qcode >= 0, gold_of[t[r], np.maximum(qcode, 0)], -1)
    pos = (m[r] * n_gold + g) * n_epochs + s[r]
    valid = (g >= 0) & ~row_aside[r]
    if not valid.all() or (len(pos) and np.bincount(pos[valid], minlength=n).max() > 1):
        keep = np.zeros(
            len(pos), bool
        )  # unknown question ids are dropped; a repeated one keeps its first answer
        keep[np.unique(np.where(valid, pos, -1), return_index=True)[1]] = True
        keep &= valid
        per_question, r, g, pos = per_question.filter(pl.Series(keep)), r[keep], g[keep], pos[keep]
    per_question = _as_replied(per_question, gold, g)
    status = pl.select(
        pl.when(pl.Series(row_failed[r]))
        .then(pl.lit("failed"))
        .otherwise(per_question["status"].fill_null("invalid"))
    ).to_series()
    answered = pl.DataFrame(
        {
            "status": status,
            "error": _answer_errors(per_question["error"], row_error, r, status),
            **{c: per_question[c] for c in ("predicted", "p_predicted", "p_yes", "warning")},
            "probabilities": per_question["probabilities"].cast(_PROBABILITIES),
            "repaired": pl.Series(row_repaired[r]) & (status == "ok"),
            "rerun": pl.Series(row_rerun[r]),
        }
    )

    # the rest: questions a found request did not answer, failed requests, and requests not in the
    # cache (within each model's own epochs)
    taken = np.zeros(n, bool)
    taken[pos] = True
    rest = np.flatnonzero(~taken)
    if (model_epochs < n_epochs).any():
        rest = rest[rest % n_epochs < model_epochs[rest // (n_gold * n_epochs)]]
    rest_m, rest_g, rest_s = (
        rest // (n_gold * n_epochs),
        (rest // n_epochs) % n_gold,
        rest % n_epochs,
    )
    rest_row = row_of_request[(rest_m * n_tasks + task_of_gold[rest_g]) * n_epochs + rest_s]
    absent = rest_row < 0
    aside = ~absent & (row_aside[np.maximum(rest_row, 0)] if len(row_aside) else False)
    rest_status = pl.Series(
        np.where(
            absent | aside,
            "missing",
            np.where(
                row_failed[np.maximum(rest_row, 0)] if len(row_failed) else False,
                "failed",
                "invalid",
            ),
        ),
        dtype=pl.String,
    )
    rest_error = (
        row_error.gather(np.maximum(rest_row, 0))
        if found.height
        else pl.Series([None] * len(rest), dtype=pl.String)
    )
    filler = pl.DataFrame(
        {
            "status": rest_status,
            "error": pl.select(
                pl.when(pl.Series(aside))
                .then(rest_error)
                .when(rest_status == "missing")
                .then(pl.lit(NOT_CACHED))
                .otherwise(
                    pl.coalesce(
                        rest_error, pl.when(rest_status == "invalid").then(pl.lit(NO_ANSWER))
                    )
                )
            ).to_series(),
        }
    ).with_columns(
        pl.lit(None, pl.String).alias("predicted"),
        pl.lit(None, pl.Float64).alias("p_predicted"),
        pl.lit(None, pl.Float64).alias("p_yes"),
        pl.lit(None, pl.String).alias("warning"),
        pl.lit(None, _PROBABILITIES).alias("probabilities"),
        pl.lit(False).alias("repaired"),
        pl.Series(
            "rerun", absent | (row_rerun[np.maximum(rest_row, 0)] if len(row_rerun) else False)
        ),
    )
    placed = pl.concat([answered, filler], how="vertical_relaxed") if len(rest) else answered
    row_m = np.concatenate([m[r], rest_m])
    row_g = np.concatenate([g, rest_g])
    row_s = np.concatenate([s[r], rest_s])

    # gold-side columns, gathered by integer index into each row's place
    gold_side = gold.join(
        categories.rename({"option": "gold", "category": "gold_category"}),
        on=["task_id", "gold"],
        how="left",
        maintain_order="left",
    ).with_columns(
        pl.col("eval").cast(pl.Enum(sorted(set(gold["eval"].to_list())))),
        pl.col("task_id").cast(pl.Enum(task_frame["task_id"])),
        pl.col("question_id").cast(pl.Enum(question_names)),
        pl.col("kind").cast(pl.Enum(sorted(set(gold["kind"].to_list())))),
        pl.col("group").cast(pl.Enum(sorted(set(gold["group"].drop_nulls().to_list())))),
    )
    predicted = pl.select(pl.when(placed["status"] == "ok").then(placed["predicted"])).to_series()
    at = pl.Series(row_g)
    side = gold_side.select(
        pl.col(c).gather(at)
        for c in (
            "eval",
            "task_id",
            "question_id",
            "kind",
            "gold",
            "gold_category",
            "group",
            "adversarial",
        )
    )  # in parallel
    gold_answer = side["gold"]
    columns = {
        "label": _enum(models["label"]).gather(row_m),
        **{c: side[c] for c in ("eval", "task_id", "question_id")},
        "sample": pl.Series(row_s, dtype=pl.Int32),
        "kind": side["kind"],
        "status": placed["status"],
        "error": placed["error"],
        "predicted": predicted,
        "gold": gold_answer,
        "correct": predicted.eq_missing(gold_answer),
        **{c: placed[c] for c in ("p_predicted", "p_yes", "warning")},
        "predicted_category": _predicted_category(gold_side, row_g, predicted, categories),
        **{c: side[c] for c in ("gold_category", "group", "adversarial")},
        "probabilities": placed["probabilities"],
        "repaired": placed["repaired"],
        "rerun": placed["rerun"],
    }
    return pl.DataFrame([series.alias(name) for name, series in columns.items()])


def _as_replied(per_question: pl.DataFrame, gold: pl.DataFrame, g: np.ndarray) -> pl.DataFrame:
    """The answers read from the cache (``per_question``, gold rows ``g``), each ``ok`` one held to
    what the adapters accept of a reply: its answer one of its question's allowed answers (gold's
    ``answer_ids``: ``evals.Question.answer_ids``), its probabilities probabilities
    (``dxi.stored.probability_expr``). One that is not is ``invalid`` (as the adapters make a reply
    naming it), its error saying why, its probabilities dropped: a row stored so was damaged before
    a log line's seal or a shard's checksums could tell (docs/cache.md). A gold frame without
    ``answer_ids`` (made by hand) checks the probabilities only. Cost: a lookup per answer in a
    table of (gold row, answer) and one pass over the probabilities' values."""
    if not per_question.height:
        return per_question
    named = np.ones(len(g), bool)
    if "answer_ids" in gold.columns:
        allowed = gold["answer_ids"].str.split(ANSWER_IDS_SEP)
        names = sorted(set(allowed.explode().drop_nulls().to_list()))
        table = np.zeros((gold.height, len(names) + 1), bool)  # the last column: not an answer
        table[
            np.repeat(np.arange(gold.height), allowed.list.len().to_numpy()),
            allowed.explode().cast(pl.Enum(names)).to_physical().to_numpy(),
        ] = True
        code = per_question["predicted"].cast(pl.Enum(names), strict=False).to_physical()
        named = table[g, code.fill_null(len(names)).to_numpy()]
    p = pl.element().struct.field("p")
    values = per_question.select(
        probability_expr(pl.col("p_predicted")) & probability_expr(pl.col("p_yes")),
        pl.col("probabilities").explode().struct.field("p").pipe(probability_expr).all(),
    )
    fits = values.to_series(0).to_numpy()
    if not values.item(0, 1):  # rare: find the answers holding a value that is not a probability
        fits &= (
            per_question.select(
                pl.col("probabilities").list.eval(probability_expr(p)).list.all().fill_null(True)
            )
            .to_series()
            .to_numpy()
        )
    bad = (per_question["status"] == "ok").fill_null(False).to_numpy() & ~(named & fits)
    if not bad.any():
        return per_question
    at = pl.Series(bad)
    names_of = (
        gold["answer_ids"].gather(g).str.replace_all(ANSWER_IDS_SEP, ", ", literal=True)
        if "answer_ids" in gold.columns
        else pl.lit("")
    )
    why = pl.select(
        pl.when(pl.Series(named))
        .then(pl.lit("read from the cache with a probability not in [0, 1]: damaged"))
        .otherwise(
            pl.format(
                "read from the cache as {}, which is not one of the allowed answers ({}): damaged",
                per_question["predicted"].fill_null("no answer"),
                names_of,
            )
        )
    ).to_series()
    return per_question.with_columns(
        status=pl.when(at).then(pl.lit("invalid")).otherwise(pl.col("status")),
        error=pl.when(at).then(why).otherwise(pl.col("error")),
        p_predicted=pl.when(~at).then(pl.col("p_predicted")),
        p_yes=pl.when(~at).then(pl.col("p_yes")),  # none, as an invalid answer's
        probabilities=pl.when(~at)
        .then(pl.col("probabilities"))
        .otherwise(pl.col("probabilities").list.head(0)),
    )


def _answer_errors(
    question_error: pl.Series, row_error: pl.Series, r: np.ndarray, status: pl.Series
) -> pl.Series:
    """Each answer's error: its own, else, unless it is ``ok``, its row's (``row_error[r]``: an
    ``ok`` answer beside an invalid sibling in one reply does not carry the sibling's error), else
    ``NO_ANSWER`` where it is invalid. Only the few answers without their own error are looked
    at."""
    error = question_error
    unset = error.is_null().to_numpy() & (status != "ok").to_numpy()
    invalid = (status == "invalid").to_numpy()
    from_row = np.flatnonzero(unset & row_error.is_not_null().to_numpy()[r])
    if len(from_row):
        error = error.scatter(from_row, row_error.gather(r[from_row]))
        unset[from_row] = False
    no_answer = np.flatnonzero(unset & invalid)
    if len(no_answer):
        error = error.scatter(no_answer, NO_ANSWER)
    return error


def current_rows(
    rows: Rows,
    models: pl.DataFrame,
    gold: pl.DataFrame,
    epochs: int = 1,
    columns: Sequence[str] = ("key",),
) -> pl.DataFrame:
    """The cache rows ``answers`` scores (the newest current row per request, by the same
    selection): ``columns`` of each, plus its model ``label`` and epoch ``sample`` (Int64), in cache
    order. ``models`` and ``gold`` as for ``answers`` (``dxi view`` passes one task's gold to show
    that task's requests)."""
    models = models.sort("label").with_row_index("m")
    task_frame = _task_frame(gold.sort("eval", "task_id", "question_id"))
    found, m, _, s, _ = _current(rows, models, task_frame, _model_epochs(models, epochs), columns)
    return found.with_columns(
        pl.Series("label", models["label"].gather(m), dtype=pl.String),
        pl.Series("sample", s, dtype=pl.Int64),
    )


def requests_found(
    rows: Rows, models: pl.DataFrame, gold: pl.DataFrame, epochs: int = 1
) -> pl.DataFrame:
    """The requests of ``models`` over ``gold``'s tasks that ``rows`` hold a row of, found as
    ``answers`` finds them (``_current``): ``label``, ``task_id``, ``sample`` (every task of a row
    that several tasks share). ``rows`` need the lookup columns, ``sample``, ``created_at``,
    ``status``, ``error_kind`` and ``served_model`` only (``cache.aside.IDENTITY``: the requests of
    damaged shards)."""
    models = models.sort("label").with_row_index("m")
    task_frame = _task_frame(gold.sort("eval", "task_id", "question_id"))
    _, m, t, s, _ = _current(rows, models, task_frame, _model_epochs(models, epochs), ("status",))
    return pl.DataFrame(
        {
            "label": models["label"].cast(pl.String).gather(m),
            "task_id": task_frame["task_id"].cast(pl.String).gather(t),
            "sample": pl.Series(s, dtype=pl.Int64),
        }
    )


def missing_found(ans: pl.DataFrame, found: pl.DataFrame) -> dict[tuple[str, str], int]:
    """Per (label, eval), how many of ``ans``'s missing answers are of a request in ``found``
    (``requests_found``); pairs with none are left out."""
    missing = ans.filter(pl.col("status").cast(pl.String) == "missing").select(
        *(pl.col(c).cast(pl.String) for c in ("label", "eval", "task_id")),
        pl.col("sample").cast(pl.Int64),
    )
    hit = missing.join(found, on=["label", "task_id", "sample"], how="semi")
    return {(label, name): n for label, name, n in hit.group_by("label", "eval").len().iter_rows()}


USAGE_SCHEMA = {
    "label": pl.String,
    "eval": pl.String,
    "requests": pl.Int64,
    "replies": pl.Int64,
    "with_usage": pl.Int64,
    "counted": pl.Int64,
    "input_tokens": pl.Int64,
    "output_tokens": pl.Int64,
    "cached_input_tokens": pl.Int64,
    "cache_write_tokens": pl.Int64,
    "cache_write_1h_tokens": pl.Int64,
    "batch": pl.Boolean,
}
_TOKENS = [
    "input_tokens",
    "output_tokens",
    "cached_input_tokens",
    "cache_write_tokens",
    "cache_write_1h_tokens",
]


def usage(rows: Rows, models: pl.DataFrame, gold: pl.DataFrame, epochs: int = 1) -> pl.DataFrame:
    """Token usage per (label, eval, batch) over exactly the cache rows ``answers`` scores (the
    newest current row per request): ``requests`` rows found, ``replies`` among them with a reply
    (ok or invalid), ``with_usage`` rows whose reply reported input tokens, ``counted`` those that
    reported more than 0 (``scoring.cost.COUNTED``: what a token estimate learns from), and the
    ``input_tokens`` / ``output_tokens`` they reported, with ``cached_input_tokens``,
    ``cache_write_tokens`` and ``cache_write_1h_tokens`` of the input (``USAGE_SCHEMA``;
    ``scoring.cost``); ``batch``: the rows a provider batch brought (``transport`` "batch", priced
    at the batch rate), apart from the others. A row whose counts no reply can state
    (``scoring.cost.inconsistent``: more cached input than input, a count below 0; kept by earlier
    versions) counts as a reply without usage. Usage of earlier attempts, rows of other
    configurations, rows replaced by newer ones and replies another model gave (set aside: not
    scored) is not counted: this is what the answers scored cost."""
    models = models.sort("label").with_row_index("m")
    task_frame = _task_frame(gold.sort("eval", "task_id", "question_id"))
    found, m, _, _, _ = _current(
        rows,
        models,
        task_frame,
        _model_epochs(models, epochs),
        (*USAGE_READ, SET_ASIDE),
        each_task=False,
    )
    scored = ~found[SET_ASIDE].to_numpy()
    return usage_table(found.filter(scored).select(USAGE_READ), m[scored], models)


USAGE_READ = ("eval", "status", *_TOKENS, "transport")  # what ``usage`` reads


def usage_table(found: pl.DataFrame, m: np.ndarray, models: pl.DataFrame) -> pl.DataFrame:
    """``usage``'s table from the current rows ``found`` (``USAGE_READ`` columns, each row once) and
    their model numbers ``m`` (into ``models``, sorted by label and numbered ``m``)."""
    if found.is_empty():
        return pl.DataFrame(schema=USAGE_SCHEMA)
    # grouped by the model's number (its label's place in sorted order), not by a label string per
    # row
    sums = (
        found.with_columns(
            pl.Series("m", m, dtype=pl.UInt32),
            *(pl.when(CONSISTENT).then(pl.col(c)).alias(c) for c in _TOKENS),
            (pl.col("transport") == "batch").fill_null(False).alias("batch"),
        )
        .group_by("m", "eval", "batch")
        .agg(
            pl.len().alias("requests"),
            pl.col("status").is_in(["ok", "invalid"]).sum().alias("replies"),
            pl.col("input_tokens").is_not_null().sum().alias("with_usage"),
            COUNTED.sum().alias("counted"),
            *(pl.col(c).sum() for c in _TOKENS),
        )
        .sort("m", "eval", "batch")
    )
    return sums.select(
        pl.Series("label", models["label"].gather(sums["m"]), dtype=pl.String),
        pl.exclude("m", "batch"),
        "batch",
    ).cast({c: pl.Int64 for c in list(USAGE_SCHEMA)[2:-1]})


def _predicted_category(
    gold_side: pl.DataFrame, row_g: np.ndarray, predicted: pl.Series, categories: pl.DataFrame
) -> pl.Series:
    """When2Call: the reply category of each row's predicted option (null elsewhere)."""
    if categories.is_empty():
        return pl.repeat(None, len(row_g), dtype=pl.String, eager=True)
    options = sorted(set(categories["option"].to_list()))
    names = sorted(set(categories["category"].to_list()))
    g_of_task = {t: g for g, t in enumerate(gold_side["task_id"].cast(pl.String).to_list())}
    table = np.full(
        (gold_side.height, len(options)), -1, np.int64
    )  # gold row x option -> category code
    for task, option, category in categories.iter_rows():
        if task in g_of_task:
            table[g_of_task[task], options.index(option)] = names.index(category)
    rows = np.flatnonzero((table >= 0).any(axis=1)[row_g])
    option = (
        predicted.gather(rows)
        .cast(pl.Enum(options), strict=False)
        .to_physical()
        .fill_null(-1)
        .to_numpy()
    )
    code = np.full(len(row_g), -1, np.int64)
    code[rows] = np.where(option >= 0, table[row_g[rows], np.maximum(option, 0)], -1)
    index = pl.select(
        pl.when(pl.lit(pl.Series(code)) >= 0).then(pl.lit(pl.Series(code)))
    ).to_series()
    return pl.Series(names, dtype=pl.String).gather(index)


def export(ans: pl.DataFrame) -> pl.DataFrame:
    """The answers frame as written to answers.parquet: sorted by label, eval, task id, question id
    and epoch, Enums as strings, ``label`` named ``model``, without ``rerun`` (what the next run
    would do, not an answer's property)."""
    return (
        ans.drop("rerun", strict=False)
        .rechunk()
        .sort("label", "eval", "task_id", "question_id", "sample")
        .with_columns(pl.col(pl.Enum).cast(pl.String))
        .rename({"label": "model"})
    )


def metrics(ans: pl.DataFrame) -> pl.DataFrame:
    """Per (label, eval): ``n`` tasks, counts of invalid / failed / missing answers, ``epochs``, and
    each metric (0-100; calibration in its own units) as the mean over epochs with its standard
    deviation (``<metric>_sd``, null for one epoch); intervals are null here
    (``scoring.scored.score`` adds them). Metric columns not defined for an evaluation are null, and
    so are all metrics of an evaluation with missing answers."""
    cubes = build_cubes(ans)
    return metric_table(cubes, eval_metrics_all(cubes))


def request_counts(ans: pl.DataFrame) -> dict[str, dict[str, int]]:
    """Per model label, the requests found in the cache (one per task and epoch): ``cache_hits``,
    and how many of them ``failed``, had an ``invalid`` answer or were ``repaired``; ``sent`` is 0
    (nothing is sent).

    Counted on integer codes (label, task, epoch -> one request number; ``np.bincount`` per flag)
    rather than a group-by over the strings: a million answers need a few arrays of a million
    integers."""
    if ans.is_empty():
        return {}
    label, labels = _codes(ans["label"])
    task, tasks = _codes(ans["task_id"])
    sample = ans["sample"].to_numpy().astype(np.int64)
    n_s, n_t = int(sample.max()) + 1, max(len(tasks), 1)
    requests, request = np.unique((label * n_t + task) * n_s + sample, return_inverse=True)

    def any_of(flag: pl.Series) -> np.ndarray:  # per request: does any of its answers have ``flag``
        return (
            np.bincount(request, weights=flag.fill_null(False).to_numpy(), minlength=len(requests))
            > 0
        )

    status = ans["status"]
    flags = {
        "cache_hits": ~any_of(status == "missing"),
        "failed": any_of(status == "failed"),
        "invalid": any_of(status == "invalid"),
        "repaired": any_of(ans["repaired"]),
    }
    owner = requests // (n_t * n_s)
    counts = {
        k: np.bincount(owner, weights=v, minlength=len(labels)).astype(np.int64)
        for k, v in flags.items()
    }
    return {
        labels[i]: {"sent": 0, **{k: int(c[i]) for k, c in counts.items()}}
        for i in np.unique(owner)
    }
