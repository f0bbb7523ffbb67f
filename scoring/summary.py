"""summary.json: the contract users script against. ``build`` makes it as a typed record
(``scoring.records.Summary``: its ``models`` are ``ModelEntry`` records, ``comparisons``
``Comparison`` records; each evaluation block stays a mapping), written with ``records.to_json``.

    {"prompt_version": str, "epochs": int, "complete": bool, "allow_failed": {...} | null, "accepted": bool,
     "data": {...},
     "intervals": {"method", "confidence", "resamples", "seed", "methods", "note"},
     "calibration": {"answers", "brier", "ece", "log_loss", "auroc", "epochs"},
     "models": [{"model": str, "decision_index": float | null, "decision_index_reason"?: str,
                 "decision_index_ci": [low, high] | null, "decision_index_sd"?: float,
                 "evals": {"aa_omniscience_decision": {"n", "accuracy", "non_hallucination_rate", ...},
                           "hle_multichoice": {"n", "accuracy"}, "when2call": {"n", "accuracy"},
                           "wildguardtest": {"n", "f1_prompt_harm", "f1_response_refusal",
                                             "f1_response_harm", "mean_f1"}},
                 "requests": {"sent", "cache_hits", "failed", "invalid", ...}}]}

Metrics are 0-100, computed at full precision and rounded to 6 decimals when written (the index from
the unrounded terms, so it equals ``tables/index.parquet``'s rounded); ``n`` counts tasks
(WildGuardTest: rows). Each evaluation block also counts its ``invalid``, ``failed`` and ``missing``
answers, and the ``repaired`` ones (scored normally; a language model's JSON arrived in a Markdown
code fence); a null metric comes with a ``reason``. With several epochs each metric is the mean and
``<metric>_sd`` its standard deviation.

Added with intervals and calibration (existing keys keep their meaning): each metric's 95% interval
``<metric>_ci`` = [low, high] (null when the metric is null), the index's ``decision_index_ci`` (and
``decision_index_sd`` with several epochs), and per evaluation a ``calibration`` block for models
that return probabilities: ``answers`` counted, ``excluded`` (without probabilities), ``brier``,
``ece``, ``log_loss`` (each with ``_ci``), and for WildGuardTest ``questions``: the same per yes/no
question plus ``auroc`` and ``auroc_ci``. The top-level ``intervals`` and ``calibration`` blocks say
how they are computed (``intervals.methods``: each metric's interval method by name).

Added with run files and costs: each model's ``epochs`` (a run file may give models their own; the
top-level ``epochs`` is the run's default) and ``usage`` (tokens and USD, ``scoring.cost``), and the
run's ``usage``. A model with invalid answers gets ``invalid_reasons``: its three most frequent
reasons (``[{"error", "count"}]``, every evaluation pooled; the text can quote model output).

Added with provisional figures (``scoring.provisional``): each evaluation block's ``complete`` (no
failed or missing answer) and, when false, ``rerun`` (the answers the next ``dxi run`` requests
again) and ``replied`` (the tasks with a reply: the *n* its figures and intervals are over), and
when some of its missing answers' requests were set aside as damaged by the cache,
``set_aside`` (how many: ``Damaged``, ``cache.aside``); each model's ``complete`` and, when false,
``within_tolerance``; the summary's ``complete``,
``allow_failed`` (``{"answers": N}``, ``{"fraction": x}`` or null) and ``accepted`` (every model
complete or within it). Failed and missing answers are not answers: every figure is computed over
the answered questions, and a provisional one (an evaluation block with ``complete`` false, a
model's index with a provisional term) carries its bounds ``<metric>_bounds`` /
``decision_index_bounds`` = [lowest, highest] beside it: the values it could take whatever the
failed and missing answers turn out to be (``scoring.bounds``; absent for a complete figure). An
evaluation none of whose answers is a reply has null metrics with the reason.

Added with paired comparisons (``scoring.compare``): each model's ``rank`` by the index, ``rank_ci``
(marginal), ``rank_set`` (simultaneous) and ``tied_group``; the summary's ``comparison_method`` (the
procedures and the family, ``compare.METHOD``), ``comparisons`` (every pair of models in the
summary's order, the index and every metric: ``{"a", "b", "eval", "metric", "difference", "ci",
"p_value", "p_adjusted", "significant", "complete"}``, plus ``discordant`` and ``mcnemar_p`` for
accuracy, and ``settled`` where ``complete`` is false: whether no outcome of the failed and missing
answers could overturn the difference, ``scoring.bounds``; a difference not settled is not
significant) and ``ranking`` (the tied groups).

Added with the measures (``scoring.measures.add_measures``, after ``build``): each model's and each
evaluation block's ``measures`` (latency per call, the cost of 1,000 decisions, the risk–coverage
curve with AURC and accuracy at confidence ≥ τ) and the summary's ``measures`` (how); each
evaluation block's ``rounded`` (answers accepted with probabilities rounded to fewer than 4
decimals, ``scoring.ties``) when it has any.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

import polars as pl

from . import calibration as cal
from .compare import METHOD
from .decision_index import decision_index, index_bounds
from .missing import Damaged, missing_reason
from .provisional import Tolerance, judge
from .records import Comparison, EvalBlock, ModelEntry, Ranking, Summary, unset
from .sums import EVERY_FAILED, METRICS, NONE_CACHED

UNDEFINED_F1 = (
    "undefined (no positive gold label and no positive prediction); mean_f1 is the mean of "
    "the defined F1 scores"
)


def _round(value: float | None) -> float | None:
    return None if value is None else round(float(value), 6)


def _interval(row: dict, metric: str) -> list[float | None] | None:
    low, high = row.get(f"{metric}_low"), row.get(f"{metric}_high")
    if row.get(metric) is None or low is None or high is None:
        return None
    return [_round(low), _round(high)]


def signed(value: float, digits: int = 1) -> str:
    """A difference as every output prints it: with its sign (``+3.2``, ``-0.4``), except one that
    is zero to the digits shown, which has none (``0.0``: not ``-0.0`` for a pair read the other way
    round, nor ``+0.0``)."""
    text = f"{value:+.{digits}f}"
    return text[1:] if float(text) == 0 else text


def p_text(p: float | None, threshold: float = 0.05, significant: bool = False) -> str:
    """An adjusted p-value as the terminal, the report and the adaptive notes print it: 3 decimals
    (``significant``: 3 significant digits, as ``dxi view``'s pages), "< 0.001" below that, "—" for
    none; one below ``threshold`` never shows as the threshold itself (0.04995 reads "0.04995", not
    "0.050" beside its † and a legend of "p < 0.05")."""
    if p is None:
        return "—"
    if p < 0.001:
        return "< 0.001"
    digits, style = 3, "g" if significant else "f"
    while p < threshold <= float(f"{p:.{digits}{style}}") and digits < 9:
        digits += 1
    return f"{p:.{digits}{style}}"


def eval_block(
    name: str,
    row: dict | None,
    data: dict,
    epochs: int,
    label: str | None = None,
    damaged: Damaged | None = None,
    other: int = 0,
    recorded: bool = False,
) -> EvalBlock:
    """One evaluation's block for one model (``label``) from its ``scoring.pipeline.metrics`` row
    (None: no answers): ``n`` tasks, the answer counts, ``complete`` (and ``rerun`` when not), each
    metric with its interval (and spread over epochs), and a ``reason`` for a null metric or for
    answers missing from the cache (``scoring.missing.missing_reason``: which flags score what the
    model's runs selected, those set aside as damaged, ``damaged``: counted in ``set_aside``, and
    ``other`` replies another model gave, set aside; ``recorded``: the model's runs of it are
    recorded, ``runner.planning.selection.annotate``)."""
    block: EvalBlock = {"n": 0, **{m: None for m in METRICS[name]}}
    if "missing" in data:
        block["reason"] = f"no data: {data['missing']}"
        return block
    if row is None:
        block["reason"] = "no answers for this evaluation"
        return block
    block |= {
        "n": row["n"],
        "invalid": row["invalid"],
        "failed": row["failed"],
        "missing": row["missing"],
        "repaired": row["repaired"],
        "complete": row["failed"] + row["missing"] == 0,
    }
    if not block[
        "complete"
    ]:  # provisional (``scoring.provisional``): what the next `dxi run` requests again
        block["rerun"] = row["rerun"]
        # and the tasks with a reply: the n its figures and intervals are over
        block["replied"] = row.get("replied", row["n"])
    if row["missing"]:  # left out (provisional); why they are missing, and what to do
        aside = (damaged or Damaged()).counts.get((label, name), 0)
        if aside:  # of them, those whose request the cache set aside as damaged
            block["set_aside"] = aside
        block["reason"] = missing_reason(
            row["missing"], data, label, damaged, name, other, recorded, row.get("missing_tasks")
        )
    if row.get(
        "reason"
    ):  # no answer is a reply: nothing to score, so no metric (never 0.0 as a score)
        block["reason"] = _no_reply(row, block.get("reason"))
        return block
    reasons = []
    for m in METRICS[name]:
        block[m] = _round(row[m])
        if epochs > 1:
            block[f"{m}_sd"] = _round(row[f"{m}_sd"])
        if f"{m}_low" in row:
            block[f"{m}_ci"] = _interval(row, m)
        bounds = _bounds(row, m)
        if bounds is not None:  # provisional: what it could be whatever the open answers are
            block[f"{m}_bounds"] = bounds
        if block[m] is None and m != "mean_f1":
            reasons.append(f"{m}: {UNDEFINED_F1}")
    if reasons:
        block["reason"] = "; ".join([*([block["reason"]] if block.get("reason") else []), *reasons])
    return block


def _bounds(row: dict, metric: str) -> list[float] | None:
    """A provisional figure's bounds [lowest, highest] (``scoring.bounds``) from its table row; None
    for a complete or null figure."""
    low, high = row.get(f"{metric}_lowest"), row.get(f"{metric}_highest")
    if row.get(metric) is None or low is None or high is None:
        return None
    return [_round(low), _round(high)]


def _no_reply(row: dict, missing: str | None) -> str:
    """Why an evaluation whose answers are all failed or missing has no metrics
    (``sums.EvalMetrics.reason``); ``missing``: why its missing answers are missing
    (``scoring.missing.missing_reason``), when it has some."""
    if row["reason"] == NONE_CACHED:
        return missing or f"{NONE_CACHED} ({row['missing']} answer(s))"
    if row["reason"] == EVERY_FAILED:
        return f"{EVERY_FAILED} ({row['failed']} answer(s) failed; see each model's errors)"
    return f"{row['reason']} ({row['failed']} failed, {row['missing']} missing)" + (
        f"; {missing}" if missing else ""
    )


def _calibration_entry(row: dict, epochs: int) -> dict:
    entry: dict = {"answers": row["answers"], "excluded": row["excluded"]}
    for m in (*cal.CALIBRATION_METRICS, *(("auroc",) if row.get("auroc") is not None else ())):
        entry[m] = _round(row.get(m))
        if epochs > 1 and m != "auroc":
            entry[f"{m}_sd"] = _round(row.get(f"{m}_sd"))
        entry[f"{m}_ci"] = _interval(row, m)
    if "positives" in row and row.get("auroc") is not None:
        entry["positives"], entry["negatives"] = row["positives"], row["negatives"]
    return entry


def calibration_block(rows: list[dict], epochs: int) -> dict | None:
    """One evaluation's ``calibration`` block from its ``Scored.calibration`` rows (None: no
    probabilities)."""
    pooled = next((r for r in rows if r["question"] == "all"), None)
    if pooled is None:
        return None
    block = _calibration_entry(pooled, epochs)
    questions = {
        r["question"]: _calibration_entry(r, epochs) for r in rows if r["question"] != "all"
    }
    if questions:
        block["questions"] = questions
    return block


def invalid_counts(answers: pl.DataFrame) -> pl.DataFrame:
    """The invalid answers' reasons per model label, every evaluation and epoch pooled: columns
    ``label``, ``shape`` (the reason with its numbers replaced by ``#``: "probabilities sum to 1.4"
    and "... 1.37" are one shape), ``error`` (each reason as written) and ``count`` (its answers).
    Counts of different answers frames (evaluations scored apart, ``scoring.Scorer``) add up:
    ``invalid_reasons`` takes them all."""
    invalid = answers.filter(pl.col("status").cast(pl.String) == "invalid")
    error = pl.col("error").fill_null("")
    return (
        invalid.select(
            pl.col("label").cast(pl.String),
            error.alias("error"),
            error.str.replace_all(r"[0-9]+(?:\.[0-9]+)?", "#").alias("shape"),
        )
        .group_by("label", "shape", "error")
        .agg(pl.len().cast(pl.Int64).alias("count"))
    )


def invalid_reasons(counts: pl.DataFrame, top: int = 3) -> dict[str, list[dict]]:
    """Per model label with invalid answers, its ``top`` most frequent reasons from
    ``invalid_counts`` (one frame, or several concatenated): ``[{"error": str, "count": int}]``,
    most frequent first, each shape (its answers counted together) shown by its most frequent
    reason as written (the first in text order among equally frequent ones). Reasons can quote
    model output: untrusted text."""
    if counts.is_empty():
        return {}
    counts = (
        counts.group_by("label", "shape", "error")
        .agg(pl.col("count").sum())
        .group_by("label", "shape")
        .agg(
            pl.col("count").sum(),
            pl.col("error").sort_by(["count", "error"], descending=[True, False]).first(),
        )
        .sort(["label", "count", "error"], descending=[False, True, False])
        .group_by("label", maintain_order=True)
        .head(top)
    )
    out: dict[str, list[dict]] = {}
    for label, error, count in counts.select("label", "error", "count").iter_rows():
        out.setdefault(label, []).append({"error": error, "count": count})
    return out


def build(
    metrics: pl.DataFrame,
    labels: list[str],
    data: dict[str, dict],
    prompt_version: str,
    epochs: int,
    requests: dict[str, dict],
    scored: object | None = None,
    model_epochs: dict[str, int] | None = None,
    usage: tuple[dict[str, dict], dict] | None = None,
    tolerance: Tolerance | None = None,
    damaged: Damaged | None = None,
    answered_by_other: dict[str, dict[str, int]] | None = None,
    recorded: Mapping[str, Collection[str]] | None = None,
) -> Summary:
    """The whole summary (``scoring.records.Summary``): one entry per model label (in ``labels``
    order), from the metrics table, the suite's data block and each model's request counts. With
    ``scored`` (a ``scoring.scored.Scored``) the intervals, the index's spread and interval and the
    calibration blocks are added.

    ``epochs`` is the run's number of epochs, ``model_epochs`` a model's own where it differs (each
    model entry gets its ``epochs``); ``usage`` is ``scoring.cost.usage_blocks``' (per model, run):
    each model gets its ``usage`` block and the summary the run's. ``tolerance`` is
    ``--allow-failed``'s (``scoring.provisional``): recorded, and deciding ``accepted``.
    ``damaged``: the missing answers whose requests the cache set aside (their reasons say so).
    ``answered_by_other`` (label -> evaluation -> answers): the missing answers that are replies
    another model gave (``scoring.replies.set_aside_answers``), said so in their evaluation's
    reason. ``recorded`` (evaluation -> labels): the models whose runs of it the cache recorded
    (``Suite.recorded``): a missing answer of one whose runs selected what is scored is not put down
    to other tasks run."""
    model_epochs = model_epochs or {}
    by_key = {(r["label"], r["eval"]): r for r in metrics.iter_rows(named=True)}
    index_rows = (
        {r["label"]: r for r in scored.index.iter_rows(named=True)} if scored is not None else {}
    )
    reasons = invalid_reasons(scored.invalid) if scored is not None else {}
    calibration: dict[tuple[str, str], list[dict]] = {}
    if scored is not None and not scored.calibration.is_empty():
        for r in scored.calibration.iter_rows(named=True):
            calibration.setdefault((r["label"], r["eval"]), []).append(r)
    models: list[ModelEntry] = []
    complete = all_accepted = True
    for label in labels:
        n_epochs = model_epochs.get(label, epochs)
        evals = {
            name: eval_block(
                name,
                by_key.get((label, name)),
                data.get(name, {"missing": "unknown"}),
                n_epochs,
                label,
                damaged,
                (answered_by_other or {}).get(label, {}).get(name, 0),
                label in (recorded or {}).get(name, ()),
            )
            for name in METRICS
        }
        index, reason = decision_index(evals, {name: by_key.get((label, name)) for name in METRICS})
        done, accepted = judge(
            evals,
            {name: (by_key.get((label, name)) or {}).get("answers", 0) for name in METRICS},
            tolerance,
        )
        entry = ModelEntry(
            model=label,
            epochs=n_epochs,
            decision_index=_round(index),
            complete=done,
            evals=evals,
            requests=requests.get(label, {}),
        )
        bounds = index_bounds({name: by_key.get((label, name)) for name in METRICS})
        if index is not None and bounds is not None:
            entry.decision_index_bounds = [_round(bounds[0]), _round(bounds[1])]
        if reason:
            entry.decision_index_reason = reason
        if not done:
            entry.within_tolerance = accepted
        complete, all_accepted = complete and done, all_accepted and accepted
        if scored is not None:
            row = index_rows.get(label, {})
            entry.decision_index_ci = (
                _interval(row, "decision_index") if index is not None else None
            )
            if n_epochs > 1:
                entry.decision_index_sd = (
                    _round(row.get("decision_index_sd")) if index is not None else None
                )
            if (
                row.get("rank") is not None
            ):  # with comparisons (``scoring.compare``): the rank by the index
                entry.rank, entry.rank_ci, entry.tied_group = (
                    row["rank"],
                    [row["rank_low"], row["rank_high"]],
                    row["tied_group"],
                )
                entry.rank_set = [row["rank_set_low"], row["rank_set_high"]]
            for name, block in evals.items():
                if block.get("n"):
                    block["calibration"] = calibration_block(
                        calibration.get((label, name), []), n_epochs
                    )
        if label in reasons:
            entry.invalid_reasons = reasons[label]
        if usage is not None:
            entry.usage = usage[0].get(label)
        models.append(entry)
    summary = Summary(
        prompt_version=prompt_version,
        epochs=epochs,
        complete=complete,
        allow_failed=tolerance.describe() if tolerance is not None else None,
        accepted=all_accepted,
        data=data,
        models=models,
    )
    if scored is not None:
        summary.intervals = scored.bootstrap.describe() if scored.bootstrap else None
        summary.calibration = cal.describe()
    if usage is not None:
        summary.usage = usage[1]
    if (
        scored is not None and "rank" in scored.index.columns
    ):  # comparisons computed (one model: no pairs)
        summary.comparison_method = dict(METHOD)
        summary.comparisons = comparisons(scored.comparisons, labels)
        summary.ranking = ranking(models)
    return summary


def in_order(table: pl.DataFrame, labels: list[str]) -> pl.DataFrame:
    """``scoring.compare``'s table of comparisons with each figure's pairs in ``labels``' order (a
    before b; a pair the table has the other way round is turned: the difference and interval
    negated, the discordant counts swapped), the figures in the table's order: summary.json's
    ``comparisons`` and the report's ``tables/comparisons`` (``report.html``)."""
    if table.is_empty():
        return table
    place = {lb: k for k, lb in enumerate(labels)}
    pa = pl.col("a").replace_strict(place, default=None, return_dtype=pl.Int64)
    pb = pl.col("b").replace_strict(place, default=None, return_dtype=pl.Int64)
    turned = pa > pb
    swap = {
        "a": pl.col("b"),
        "b": pl.col("a"),
        "difference": 0.0 - pl.col("difference"),  # 0.0 − x: never −0.0 (a tie turned round)
        "low": 0.0 - pl.col("high"),
        "high": 0.0 - pl.col("low"),
        "a_only": pl.col("b_only"),
        "b_only": pl.col("a_only"),
    }
    if "anytime_low" in table.columns:  # an adaptive run's (``scoring.stopped_pairs``)
        swap |= {
            "anytime_low": 0.0 - pl.col("anytime_high"),
            "anytime_high": 0.0 - pl.col("anytime_low"),
        }
    return (
        table.with_row_index("row")
        .with_columns(pl.col("row").min().over("eval", "metric").alias("figure"))
        .with_columns(
            *(pl.when(turned).then(v).otherwise(pl.col(k)).alias(k) for k, v in swap.items())
        )
        .with_columns(pa.alias("pa"), pb.alias("pb"))
        .sort("figure", "pa", "pb", nulls_last=True, maintain_order=True)
        .drop("row", "figure", "pa", "pb")
    )


def comparisons(table: pl.DataFrame, labels: list[str] | None = None) -> list[Comparison]:
    """summary.json's ``comparisons``, one entry per row of ``scoring.compare``'s table: ``a``,
    ``b``, ``eval`` (null for the index), ``metric``, ``difference`` (a − b, points), ``ci`` [low,
    high], ``p_value`` (the pair's own test), ``p_adjusted`` and ``significant`` (the simultaneous
    procedure), for accuracy with one epoch ``discordant`` [a right and b wrong, the other way] and
    ``mcnemar_p``, ``complete`` (false: a figure compared is provisional) and, when not complete,
    ``settled`` (``scoring.bounds.settle``: false where the open answers could overturn it). Figures
    in the table's order; within one, pairs in ``labels``' order (``in_order``), the table's order
    without ``labels``. Differences are rounded to 6 decimals, p-values
    kept whole (a small one must not read 0)."""
    if labels is not None:
        table = in_order(table, labels)

    def rounded(name: str) -> list[float | None]:  # column by column: 11,025 entries for 50 models
        return [None if v is None else round(v, 6) for v in table[name].to_list()]

    out = []
    columns = (
        table["a"].to_list(),
        table["b"].to_list(),
        table["eval"].to_list(),
        table["metric"].to_list(),
        rounded("difference"),
        rounded("low"),
        rounded("high"),
        table["p_value"].to_list(),
        table["p_adjusted"].to_list(),
        table["significant"].to_list(),
        table["a_only"].to_list(),
        table["b_only"].to_list(),
        table["mcnemar_p"].to_list(),
        table["complete"].to_list(),
        (table["settled"] if "settled" in table.columns else table["complete"]).to_list(),
    )
    for (
        a,
        b,
        name,
        metric,
        difference,
        low,
        high,
        p,
        p_adj,
        sig,
        a_only,
        b_only,
        mcnemar,
        complete,
        settled,
    ) in zip(*columns, strict=True):
        entry = Comparison(
            a=a,
            b=b,
            eval=name,
            metric=metric,
            difference=difference,
            ci=[low, high] if low is not None else None,
            p_value=p,
            p_adjusted=p_adj,
            significant=bool(sig),
            complete=complete,
        )
        if not complete:
            entry.settled = bool(settled)
        if a_only is not None:
            entry.discordant, entry.mcnemar_p = [a_only, b_only], mcnemar
        out.append(entry)
    return out


def ranking(models: list[ModelEntry]) -> Ranking:
    """summary.json's ``ranking``: the models by Decision Index in groups that are statistically
    tied (``scoring.compare``: each group's models in rank order, ``ModelEntry.placing``, a
    provisional index placed by its lowest bound; models without an index are left out)."""
    ranked = sorted((m for m in models if unset(m.rank) is not None), key=ModelEntry.placing)
    groups: dict[int, list[str]] = {}
    for m in ranked:
        groups.setdefault(m.tied_group, []).append(m.model)
    return Ranking(
        by="decision_index",
        groups=[groups[g] for g in sorted(groups)],
        method=(
            "rank: 1 + the models with a higher index; rank_ci: its marginal "
            "95% rank set (Mogstad, Romano, Shaikh & Wilhelm 2024, §3.1: the max-T "
            "step-down over that model's pairs alone); rank_set: the simultaneous "
            "95% rank set (Mogstad, Romano, Shaikh & Wilhelm 2024); groups: "
            "consecutive in rank order, parted only where every model above is "
            "significantly higher than every model below (the comparisons' significant: "
            "max-T step-down over every pair, p_adjusted < 0.05); where an index is "
            "provisional, only a difference its failed and missing answers could not "
            "overturn is significant, and rank_ci and rank_set cover every rank its "
            "bounds allow"
            + (
                "; a provisional index is placed, and its rank counted, by its lowest bound "
                "(the worst outcome of its failed and missing answers), not its point value"
                if any(not m.complete for m in ranked)
                else ""
            )
        ),
    )
