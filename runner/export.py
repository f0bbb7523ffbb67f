"""``dxi export``: the scored answers and metrics in the formats people share.

* ``csv``, ``parquet``, ``jsonl``: the per-answer table (``ANSWER_COLUMNS``: the columns of
  ``OUT/answers.parquet``, then ``effort``: ``EXPORT_COLUMNS``), one row per (model, question,
  epoch), written to the file ``OUT``. In CSV the nested ``probabilities`` column is a JSON text
  (``[{"option": "A", "p": 0.7}, ...]``).
* ``eee``: the Every Eval Ever schema, version ``EEE_SCHEMA_VERSION``
  (github.com/evaleval/every_eval_ever, ``eval.schema.json`` and
  ``instance_level_eval.schema.json``), laid out as its datastore is under the folder ``OUT``:
  ``data/decision-index/<adapter>/<model>/<uuid>.json``, one aggregate record (an ``EvaluationLog``)
  per model and evaluation with every metric, its 95% interval and the bootstrap that made it, plus
  one for the model's Decision Index; beside each evaluation's record its instance-level records,
  ``<uuid>_samples.jsonl``, one line per (question, epoch), linked by ``evaluation_id`` and
  ``evaluation_result_id`` and checksummed (sha256) in the aggregate's
  ``detailed_evaluation_results``. File names are UUIDs (version 4 in form, as the datastore
  requires) derived from the record's identity (model, endpoint, parameters, evaluation, prompt
  version), so exporting again replaces the same files. Each record's
  ``model_info.additional_details`` has the model's ``effort`` (summary.json's) where its requests
  carry one, and ``generation_args.reasoning`` says whether they asked for reasoning (an effort
  other than none). Where the tasks exported are not those the last ``dxi run`` asked
  (``runner.planning.selection.Differs``), each record's ``eval_library.additional_details`` has
  ``selection_differs``: summary.json's ``provenance.selection_differs`` as JSON text. The answer
  tables have no place for it: the warning is only printed.

The export reads the same selection and the same scoring as ``dxi score``
(``runner.outputs.files.score_all``): it never sends a request. Metrics are 0-100 (``metric_unit``
"percent"); a metric that is null (an undefined F1, no reply at all) has no result, and its reason
is in the record's ``source_metadata.additional_details`` under ``<metric>_reason``. An evaluation
without data has no record. A provisional figure (answers failed or missing,
``scoring.provisional``) is marked: ``complete`` "false" in its result's ``score_details.details``
(with the counts and its bounds, ``bounds_lowest`` and ``bounds_highest``: ``scoring.bounds``) and a
``provisional`` note in the record's ``source_metadata.additional_details``; each interval names its
method (Wilson or bootstrap). ``uncertainty.num_samples`` is what the score and its interval are
over: the tasks with a reply (summary.json's ``replied``; every task, ``n``, of a complete figure;
the index's: summed over its evaluations), and ``score_details.details.num_samples_counts`` says so
with both numbers. An adaptive run's estimates of the whole set (``scoring.estimates.of``: the
figures the terminal marks ``≈``) are marked in every format: each result's ``estimate`` "true"
with the tasks asked of the whole set's and the rule, its interval named as the anytime-valid one
(``scoring.estimates.method``) and the fixed-sample one beside it, an ``estimate`` note on the
record; the answer tables' ``estimate`` column.

Why one module over 600 lines: the Every Eval Ever layout (``write_eee`` and its record builders) is
most of it and follows one external schema; the flat formats share its accounting of missing
answers.
"""

from __future__ import annotations

import hashlib
import os
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

import orjson
import polars as pl

from dxi import adapters, scoring
from dxi.adapters.llm import render
from dxi.evals import EVALS, Suite, Task
from dxi.evals.fetch import HUB_FILES
from dxi.scoring import adaptive, estimates
from dxi.scoring.records import ModelEntry, Summary, unset
from dxi.scoring.sums import METRICS, WILDGUARD_F1

if TYPE_CHECKING:
    from .rescore import Selection

FORMATS = ("eee", "csv", "parquet", "jsonl")
EEE_SCHEMA_VERSION = "0.3.0"
COLLECTION = "decision-index"
ANSWER_COLUMNS = {
    "model": "the model's label (as in summary.json)",
    "eval": "aa_omniscience_decision | hle_multichoice | when2call | wildguardtest",
    "task_id": "the task (namespaced by evaluation, e.g. when2call/<uuid>)",
    "question_id": "the question of the task (WildGuardTest: prompt_harmful, response_refusal, response_harmful)",
    "sample": "the epoch (0-based)",
    "kind": "choice | yes_no",
    "status": "ok | invalid | failed | missing",
    "error": "why an answer is invalid, failed or missing (can quote model output)",
    "predicted": "the answer scored: an option id, or yes/no",
    "gold": "the gold answer: an option id, or yes/no",
    "correct": "predicted == gold (false for invalid, failed and missing answers)",
    "p_predicted": "the probability of the predicted option (decision models)",
    "p_yes": "P(yes) for yes/no questions (decision models)",
    "warning": "a validation note on an answer scored normally",
    "predicted_category": "When2Call: the reply type of the predicted option",
    "gold_category": "When2Call: the reply type of the gold option",
    "group": "HLE category, Omniscience domain or WildGuardTest subcategory",
    "adversarial": "WildGuardTest: the prompt is adversarial",
    "probabilities": "every option's probability as returned, list of {option, p}",
    "repaired": "the answer came from a JSON reply wrapped in a Markdown code fence",
}
EXPORT_COLUMNS = {
    **ANSWER_COLUMNS,
    "effort": "the effort level the model's requests carried (summary.json's "
    "effort: none, minimal, low, medium, high, xhigh, max; null: unset)",
    "estimate": "the model's figures are estimates of the whole set: an adaptive run (dxi run "
    "--until) asked it a random part of each evaluation, and its rows are that part",
}
PROVISIONAL = (
    "provisional: {} failed and {} missing answer(s) are left out (the figures are "
    "over the answered questions, with their bounds whatever those answers turn out "
    "to be in score_details.details); the figure is not final (summary.json: complete "
    "false)"
)
SAMPLES = (
    "tasks with a reply{}: {} of {}{}; the score and its interval are over them, failed and "
    "missing answers left out"
)
ASKED = (
    ", the part an adaptive run asked of the whole set's {:,} (the score estimates the whole set's)"
)
SAMPLES_OF = {
    "wildguardtest": ("", " (WildGuardTest: rows)"),
    "decision_index": (", summed over its evaluations", ""),
}  # what a record's tasks are (else: its tasks)
_OMNISCIENCE_SOURCE = (
    "Artificial Analysis AA-Omniscience (the published Decision Index uses 500 private questions)"
)


class ExportError(ValueError):
    """The export cannot be written as asked (the message names the path and why)."""


@dataclass(frozen=True)
class Missing:
    """The answers of an export missing from the cache (never sent, or sent by a run stopped before
    storing the reply): ``total``, ``counts`` per (model label, evaluation) and ``reason``, the
    summary's reason for the first of them (it names the selection the model's runs made:
    ``scoring.summary``)."""

    total: int
    counts: dict[tuple[str, str], int]
    reason: str | None

    def message(self, included: bool) -> str:
        """What ``dxi export`` says about them, written (``included``) or left out."""
        where = "; ".join(
            f"{label} {EVALS[name].title}: {n:,}" for (label, name), n in self.counts.items()
        )
        done = (
            "written as rows of status missing (the eee format's records mark the figures they touch "
            "provisional)"
            if included
            else "left out of the export (--include-missing writes them as rows of status missing)"
        )
        return f"{self.total:,} answer(s) missing from the cache ({where}): {done}." + (
            f" {self.reason}." if self.reason else ""
        )


def missing_answers(summary: Summary) -> Missing:
    """The answers missing from the cache in ``summary`` (``runner.outputs.files.score_all``'s)."""
    counts = {
        (m.model, name): block["missing"]
        for m in summary.models
        for name, block in m.evals.items()
        if block.get("missing")
    }
    first = next(iter(counts), None)
    reason = None
    if first is not None:
        block = summary.entry(first[0]).evals[first[1]]
        reason = (
            f"{first[0]} {EVALS[first[1]].title}: {block['reason']}"
            if block.get("reason")
            else None
        )
    return Missing(sum(counts.values()), counts, reason)


@dataclass(frozen=True)
class Exported:
    """What ``export`` did: ``written`` (the files), ``notes`` (for the user: the selection the runs
    made, epochs left out), ``missing`` (the answers missing from the cache) and ``exit_code`` (0,
    or ``runner.errors.EXIT_FAILED_REQUESTS`` when answers are missing and were not asked for)."""

    written: list[Path]
    notes: list[str]
    missing: Missing
    exit_code: int


def export(
    selection: Selection,
    fmt: str,
    target: Path,
    include_missing: bool = False,
    now: float | None = None,
) -> Exported:
    """``dxi export`` as a library call: score ``selection`` (``runner.rescore.select``) from the
    cache alone, as ``dxi score`` does, and ``write`` it as ``fmt`` to ``target`` (``now``: as
    ``write`` takes it). Answers missing from the cache are written as rows of status missing with
    ``include_missing``, else left out and counted (exit code 1). ExportError as ``write``;
    UsageError as ``runner.rescore``."""
    from dxi.cache import Cache

    from .errors import EXIT_FAILED_REQUESTS
    from .outputs.files import score_all
    from .rescore import models_to_score, provenance, scored_suite

    with Cache(selection.cache_dir, remote=selection.remote) as cache:
        to_score = models_to_score(cache, selection)
        suite = scored_suite(selection, to_score)
        summary, scored = score_all(
            cache,
            suite,
            to_score.frame,
            None,
            None,
            to_score.epochs,
            prices=to_score.prices,
            extra=provenance(selection, to_score.recorded),
        )
    gap = missing_answers(summary)
    written = write(
        fmt, target, summary, scored, to_score.frame, suite, now, include_missing=include_missing
    )
    parts = adaptive.asked_parts(summary)  # None: no model's figures are estimates
    return Exported(
        written,
        to_score.notes
        + (
            [
                f"an adaptive run asked the models ({parts}): the figures of a model asked "
                "part of the set are estimates of the whole set, marked so (the eee records' "
                "estimate, the answer tables' estimate column)"
            ]
            if parts
            else []
        ),
        gap,
        0 if include_missing or not gap.total else EXIT_FAILED_REQUESTS,
    )


def write(
    fmt: str,
    target: Path,
    summary: Summary,
    scored: scoring.Scored,
    models: pl.DataFrame,
    suite: Suite,
    now: float | None = None,
    include_missing: bool = True,
) -> list[Path]:
    """Write the export ``fmt`` (one of ``FORMATS``) to ``target`` (a file for the answer tables, a
    folder for ``eee``) from ``summary`` and ``scored`` (``runner.outputs.files.score_all``);
    ``models`` is the ``scoring.MODELS_SCHEMA`` frame that was scored, ``suite`` its tasks (for the
    instances' inputs), ``now`` the Unix time recorded as ``retrieved_timestamp`` (default: the
    clock). Without ``include_missing`` the rows of answers missing from the cache (status
    ``missing``) are left out of the answer tables (``eee`` writes an evaluation with missing
    answers either way, its figures marked provisional: ``scoring.provisional``). Returns the files
    written; ExportError when ``target`` is a folder for a table format."""
    if fmt not in FORMATS:
        raise ExportError(f"unknown export format {fmt!r}: one of {', '.join(FORMATS)}")
    if fmt == "eee":
        return write_eee(
            target, summary, scored, models, suite, time.time() if now is None else now
        )
    if target.is_dir():
        raise ExportError(
            f"{target} is a folder: give the file to write, e.g. {target / ('answers.' + fmt)}"
        )
    efforts = {m.model: unset(m.effort) for m in summary.models}
    estimated = {m.model: adaptive.estimated(summary, m) for m in summary.models}
    table = scoring.export(scored.answers)
    table = table.with_columns(
        pl.col("model")
        .replace_strict(efforts, default=None, return_dtype=pl.String)
        .alias("effort"),
        pl.col("model")
        .replace_strict(estimated, default=False, return_dtype=pl.Boolean)
        .alias("estimate"),
    )
    if not include_missing:
        table = table.filter(pl.col("status").cast(pl.String) != "missing")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp")
    if fmt == "parquet":
        table.write_parquet(tmp)
    elif fmt == "jsonl":
        table.write_ndjson(tmp)
    else:
        nested = pl.col("probabilities").map_elements(
            lambda v: orjson.dumps(list(v)).decode() if v is not None else None,
            return_dtype=pl.String,
        )
        table.with_columns(nested).write_csv(tmp)
    os.replace(tmp, target)
    return [target]


def _file_uuid(*parts: str) -> str:
    """A UUID of version-4 form derived from ``parts`` (the same record always gets the same
    name)."""
    return str(
        uuid.UUID(bytes=hashlib.sha256("\x1f".join(parts).encode()).digest()[:16], version=4)
    )


def _safe(name: str) -> str:
    """A path component the datastore accepts: letters, digits, ``.``, ``_`` and ``-``."""
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in name).strip("._") or "unknown"


def _model_info(label: str, config: dict, effort: str | None = None) -> dict:
    provider, model = config["provider"], config["model"]
    details = {
        "deployment_type": "self_deployed" if adapters.adapter_class(provider).free else "unknown",
        "model_availability": "unknown",
        "dxi_label": label,
        "adapter": provider,
        "endpoint": config.get("endpoint") or "",
        "params": config.get("params") or "{}",
    }
    if effort is not None:
        details["effort"] = effort
    info = {
        "name": label,
        "id": f"{provider}/{model}",
        "developer": "unknown",
        "inference_platform": provider,
        "additional_details": details,
    }
    return info


def _source_data(name: str, data: dict) -> dict:
    f = (data.get("files") or [{}])[0]
    details = {
        "file": Path(str(f.get("path", ""))).name,
        "sha256": str(f.get("sha256", "")),
        "rows": str(f.get("rows", "")),
        "tasks": str(data.get("tasks", "")),
    }
    for key, detail in (
        ("revision", "hf_revision"),
        ("requested_revision", "hf_requested_revision"),
    ):
        if f.get(key):  # fetched from the hub by dxi data fetch: the commit it was fetched at
            details[detail] = str(f[key])
    for key in ("subset", "limit", "sample"):
        if data.get(key) is not None:
            details[key] = (
                orjson.dumps(data[key]).decode() if isinstance(data[key], dict) else str(data[key])
            )
    if name == "aa_omniscience_decision":
        details["stand_in"] = str(bool(data.get("stand_in"))).lower()
        if data.get("note"):
            details["note"] = data["note"]
        return {
            "dataset_name": _OMNISCIENCE_SOURCE,
            "source_type": "other",
            "additional_details": details,
        }
    hub = HUB_FILES[name]
    return {
        "dataset_name": EVALS[name].title,
        "source_type": "hf_dataset",
        "hf_repo": hub.repo_id,
        "hf_split": "test",
        "samples_number": int(data.get("tasks", 0)),
        "additional_details": details,
    }


def _generation(effort: str | None) -> dict:
    """An ``evaluation_results`` entry's ``generation_config`` for a model whose requests carry
    ``effort``."""
    return {
        "generation_args": {"reasoning": effort != "none"},
        "additional_details": {"effort": effort},
    }


def _result(
    result_id: str,
    name: str,
    source: dict,
    metric: str,
    block: dict,
    summary: Summary,
    entry: ModelEntry,
) -> dict:
    """One ``evaluation_results`` entry of ``entry``: the metric's score (0-100) with its interval,
    named by the method that produced it (``scoring.estimates.method``); an adaptive run's
    estimate of the whole set (``scoring.estimates.of``) says so, with the tasks asked of the
    whole set's, the rule that stopped it and the fixed-sample interval over the asked part."""
    intervals = unset(summary.intervals) or {}
    estimate = estimates.of(summary, entry)
    # the tasks the score and its interval are over: those with a reply (a provisional block's
    # ``replied``; failed and missing answers are left out), every task of a complete one
    tasks = int(block.get("n", 0))
    replied = int(block.get("replied", tasks))
    uncertainty: dict = {"num_samples": replied}
    ci = block.get(f"{metric}_ci")
    if ci and ci[0] is not None and ci[1] is not None:
        method = estimates.method(summary, entry, metric)
        uncertainty["confidence_interval"] = {
            "lower": ci[0],
            "upper": ci[1],
            "confidence_level": float(intervals.get("confidence", 0.95)),
            "method": str(method),
        }
        if intervals.get("resamples") and "bootstrap" in method:
            uncertainty["num_bootstrap_samples"] = int(intervals["resamples"])
    details = {
        k: str(block[k])
        for k in ("invalid", "failed", "missing", "repaired", "rerun")
        if k in block
    }
    if "complete" in block:  # false: provisional (over the answered questions, with bounds)
        details["complete"] = str(block["complete"]).lower()
    what, rows = SAMPLES_OF.get(name, ("", ""))
    part = None if name == estimates.INDEX else name
    if estimate is not None:  # the part an adaptive run asked: an estimate of the whole set
        asked, whole = estimate.counts(part)
        rows += ASKED.format(whole)
        fixed = estimate.fixed.get("index" if part is None else f"{name}.{metric}")
        details |= {
            "estimate": "true",
            "asked": str(asked),
            "whole_set": str(whole),
            "until": str(estimate.until),
            "stopped_by": estimate.rule or "none: not settled when the run ended",
        }
        if estimate.round is not None:
            details["round"] = str(estimate.round)
        if fixed and fixed[0] is not None and fixed[1] is not None:
            details |= {
                "fixed_sample_ci_lower": str(fixed[0]),
                "fixed_sample_ci_upper": str(fixed[1]),
                "fixed_sample_ci_method": estimates.fixed_method(summary, metric)
                + "; over the tasks asked, not valid after the adaptive run chose when to stop",
            }
    details["num_samples_counts"] = SAMPLES.format(what, replied, tasks, rows)
    bounds = block.get(f"{metric}_bounds")
    if bounds is not None:  # whatever the failed and missing answers are (scoring.bounds)
        details["bounds_lowest"], details["bounds_highest"] = str(bounds[0]), str(bounds[1])
    if block.get(f"{metric}_sd") is not None:
        details["sd_over_epochs"] = str(block[f"{metric}_sd"])
    return {
        "evaluation_result_id": result_id,
        "evaluation_name": name,
        "source_data": source,
        "metric_config": {
            "evaluation_description": f"{EVALS[name].title if name in EVALS else name}: {metric}",
            "metric_id": "accuracy" if metric == "accuracy" else f"decision_index.{metric}",
            "metric_name": metric,
            "metric_kind": "f1" if metric.startswith(("f1", "mean_f1")) else metric,
            "metric_unit": "percent",
            "lower_is_better": False,
            "score_type": "continuous",
            "min_score": 0,
            "max_score": 100,
        },
        "score_details": {"score": block[metric], "details": details, "uncertainty": uncertainty},
    }


def _log(
    evaluation_id: str,
    now: float,
    info: dict,
    summary: Summary,
    results: list[dict],
    reasons: dict[str, str],
    epochs: int,
) -> dict:
    source = {
        "source_name": "Decision Index (dxi)",
        "source_type": "evaluation_run",
        "source_organization_name": "unknown",
        "evaluator_relationship": "third_party",
    }
    if reasons:
        source["additional_details"] = reasons
    made = unset(summary.provenance) or {}
    version = made.get("dxi_version")
    if version is None:
        try:
            version = metadata.version("decision-index")
        except metadata.PackageNotFoundError:  # a checkout that is not installed
            version = "unknown"
    details = {"prompt_version": str(summary.prompt_version), "epochs": str(epochs)}
    git = made.get("git")
    if git:  # run from a git checkout: the commit, and whether tracked files were modified
        details |= {"git_commit": str(git["commit"]), "git_dirty": str(bool(git["dirty"])).lower()}
    details |= {k: str(made[k]) for k in ("python", "platform") if made.get(k)}
    if made.get("selection_differs"):  # other tasks than the last run asked (runner.rescore)
        details["selection_differs"] = orjson.dumps(made["selection_differs"]).decode()
    return {
        "schema_version": EEE_SCHEMA_VERSION,
        "evaluation_id": evaluation_id,
        "retrieved_timestamp": f"{now:.0f}",
        "source_metadata": source,
        "model_info": info,
        "eval_library": {"name": "dxi", "version": str(version), "additional_details": details},
        "evaluation_results": results,
    }


def _instances(
    answers: pl.DataFrame,
    tasks: dict[str, Task],
    evaluation_id: str,
    model_id: str,
    name: str,
    result_of: dict[str, str],
) -> Iterable[bytes]:
    """The instance-level records of one model and evaluation, one JSON line per (question,
    epoch)."""
    inputs: dict[tuple[str, str], tuple[str, list[str]]] = {}
    for r in answers.iter_rows(named=True):
        key = (r["task_id"], r["question_id"])
        if key not in inputs:
            task = tasks[r["task_id"]]
            question = next(q for q in task.questions if q.id == r["question_id"])
            inputs[key] = (
                render(task, [question]),
                [f"{o.id}. {o.text}" for o in question.options],
            )
        raw, choices = inputs[key]
        reference = [r["gold"]]
        sample_hash = hashlib.sha256(
            orjson.dumps({"raw": raw, "reference": reference}, option=orjson.OPT_SORT_KEYS)
        ).hexdigest()
        predicted = r["predicted"] or ""
        reply = {"predicted": r["predicted"]}
        if r["probabilities"] is not None:
            reply["probabilities"] = {p["option"]: p["p"] for p in r["probabilities"]}
        if r["p_yes"] is not None:
            reply["p_yes"] = r["p_yes"]
        metadata_ = {
            "task_id": r["task_id"],
            "question_id": r["question_id"],
            "epoch": str(r["sample"]),
            "status": r["status"],
            "kind": r["kind"],
        }
        for extra in ("group", "gold_category", "predicted_category", "warning"):
            if r.get(extra) is not None:
                metadata_[extra] = str(r[extra])
        if r.get("adversarial") is not None:
            metadata_["adversarial"] = str(r["adversarial"]).lower()
        record = {
            "schema_version": EEE_SCHEMA_VERSION,
            "evaluation_id": evaluation_id,
            "model_id": model_id,
            "evaluation_name": name,
            "evaluation_result_id": result_of.get(r["question_id"], result_of[""]),
            "sample_id": f"{r['task_id']}:{r['question_id']}",
            "sample_hash": sample_hash,
            "interaction_type": "single_turn",
            "input": {"raw": raw, "reference": reference, "choices": choices or None},
            "output": {
                "raw": [orjson.dumps(reply).decode()] if r["status"] in ("ok", "invalid") else []
            },
            "answer_attribution": [
                {
                    "turn_idx": 0,
                    "source": "output.raw",
                    "extracted_value": predicted,
                    "extraction_method": "highest probability"
                    if r["probabilities"]
                    else "structured output (JSON Schema enum)",
                    "is_terminal": True,
                }
            ],
            "evaluation": {"score": 1.0 if r["correct"] else 0.0, "is_correct": bool(r["correct"])},
            "error": r["error"] if r["status"] != "ok" else None,
            "metadata": metadata_,
        }
        yield orjson.dumps(record) + b"\n"


def write_eee(
    target: Path,
    summary: Summary,
    scored: scoring.Scored,
    models: pl.DataFrame,
    suite: Suite,
    now: float,
) -> list[Path]:
    """The ``eee`` export under the folder ``target`` (see the module docstring); returns the
    files."""
    configs = {r["label"]: r for r in models.iter_rows(named=True)}
    answers = scoring.export(scored.answers)
    tasks = {t.id: t for t in suite.tasks()}
    written: list[Path] = []
    for entry in summary.models:
        label = entry.model
        effort = unset(entry.effort)
        info = _model_info(label, configs[label], effort)
        folder = (
            Path("data")
            / COLLECTION
            / _safe(info["inference_platform"])
            / _safe(configs[label]["model"])
        )
        (target / folder).mkdir(parents=True, exist_ok=True)
        identity = f"{label}\x1f{configs[label].get('endpoint')}\x1f{configs[label].get('params')}"
        index_reasons: dict[str, str] = {}
        estimate = estimates.of(summary, entry)  # an adaptive run asked part of the set
        for name, block in entry.evals.items():
            data = summary.data.get(name, {})
            if data.get("missing") or not block.get("n"):
                index_reasons[f"{name}_reason"] = (
                    block.get("reason") or data.get("missing") or "no answers"
                )
                continue
            file_id = _file_uuid(COLLECTION, identity, name, summary.prompt_version)
            evaluation_id = f"{COLLECTION}/{name}/{label}/{now:.0f}"
            source = _source_data(name, data)
            results, reasons = (
                [],
                (
                    {"provisional": PROVISIONAL.format(block["failed"], block["missing"])}
                    if block.get("complete") is False
                    else {}
                ),
            )
            if estimate is not None:
                reasons["estimate"] = estimate.sentence(name)
            for metric in METRICS[name]:
                if block.get(metric) is None:
                    reasons[f"{metric}_reason"] = block.get("reason") or "not defined"
                    continue
                results.append(
                    _result(f"{name}.{metric}", name, source, metric, block, summary, entry)
                )
                if effort is not None:
                    results[-1]["generation_config"] = _generation(effort)
            if not results:
                index_reasons[f"{name}_reason"] = block.get("reason") or "no metric defined"
                continue
            defined = {r["evaluation_result_id"] for r in results}
            first = results[0]["evaluation_result_id"]
            pooled = f"{name}.mean_f1" if f"{name}.mean_f1" in defined else first
            result_of = {"": pooled} | {
                q: f"{name}.{m}" for q, m in WILDGUARD_F1.items() if f"{name}.{m}" in defined
            }
            mine = answers.filter((pl.col("model") == label) & (pl.col("eval") == name))
            samples = target / folder / f"{file_id}_samples.jsonl"
            digest, rows = hashlib.sha256(), 0
            with open(samples.with_name(f".{samples.name}.tmp"), "wb") as fh:
                for line in _instances(mine, tasks, evaluation_id, info["id"], name, result_of):
                    fh.write(line)
                    digest.update(line)
                    rows += 1
            os.replace(samples.with_name(f".{samples.name}.tmp"), samples)
            log = _log(evaluation_id, now, info, summary, results, reasons, entry.epochs)
            log["detailed_evaluation_results"] = {
                "format": "jsonl",
                "file_path": (folder / samples.name).as_posix(),
                "hash_algorithm": "sha256",
                "checksum": digest.hexdigest(),
                "total_rows": rows,
            }
            written += [_write_json(target / folder / f"{file_id}.json", log), samples]
        if entry.decision_index is not None:
            block = {
                "decision_index": entry.decision_index,
                "decision_index_ci": unset(entry.decision_index_ci),
                "decision_index_sd": unset(entry.decision_index_sd),
                "decision_index_bounds": unset(entry.decision_index_bounds),
                "n": sum(b.get("n", 0) for b in entry.evals.values()),
                "replied": sum(b.get("replied", b.get("n", 0)) for b in entry.evals.values()),
                "complete": entry.complete,
            }
            if estimate is not None:
                index_reasons["estimate"] = estimate.sentence()
            if not entry.complete:
                failed = sum(b.get("failed", 0) for b in entry.evals.values())
                index_reasons["provisional"] = PROVISIONAL.format(
                    failed, sum(b.get("missing", 0) for b in entry.evals.values())
                )
            source = {
                "dataset_name": "Decision Index (AA-Omniscience-Decision, HLE-MultiChoice, When2Call, WildGuardTest)",
                "source_type": "other",
                "additional_details": {
                    "formula": "0.125 acc(Omniscience) + 0.125 non-halluc(Omniscience) + "
                    "0.25 acc(HLE) + 0.25 acc(When2Call) + 0.25 mean F1(WildGuardTest)"
                },
            }
            results = [
                _result(
                    "decision_index",
                    "decision_index",
                    source,
                    "decision_index",
                    block,
                    summary,
                    entry,
                )
            ]
            if effort is not None:
                results[-1]["generation_config"] = _generation(effort)
        else:
            results = []
            index_reasons["decision_index_reason"] = (
                unset(entry.decision_index_reason) or "not computed"
            )
        if results:
            file_id = _file_uuid(COLLECTION, identity, "decision_index", summary.prompt_version)
            log = _log(
                f"{COLLECTION}/decision_index/{label}/{now:.0f}",
                now,
                info,
                summary,
                results,
                index_reasons,
                entry.epochs,
            )
            written.append(_write_json(target / folder / f"{file_id}.json", log))
    return written


def _write_json(path: Path, doc: dict) -> Path:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n")
    os.replace(tmp, path)
    return path
