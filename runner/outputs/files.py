"""Scoring the cache and writing the outputs (``OUT/summary.json``, ``OUT/answers.parquet``); the
terminal's tables are ``runner.outputs.terminal``. Used by ``dxi run`` (after running),
``dxi score``, ``dxi report`` and ``dxi export`` (cache only) and ``dxi view`` (``summarize``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import polars as pl

from dxi import adapters, scoring
from dxi.cache import Cache
from dxi.evals import PROMPT_VERSION, Suite
from dxi.scoring import estimates, measures, records, sequential, stopped_pairs
from dxi.scoring.adaptive import asked_part, headline, mark_exact
from dxi.scoring.missing import Damaged
from dxi.scoring.provisional import Tolerance
from dxi.scoring.records import Summary
from dxi.scoring.replies import add_replies, set_aside_answers, usage_and_replies
from dxi.scoring.scored import Scored, ScoredRun
from dxi.scoring.ties import add_ties, rounded_counts, tie_counts

from .adaptive import attach, hint_unfinished, recorded, unfinished
from .provenance import provenance
from .staging import Staging


def score(
    cache: Cache,
    suite: Suite,
    models: pl.DataFrame,
    out: Path,
    requests: dict[str, dict] | None,
    epochs: int = 1,
    prices: dict[str, tuple[float, float] | None] | None = None,
    extra: dict | None = None,
    batch_prices: dict | None = None,
    tolerance: Tolerance | None = None,
    entries: dict[str, dict] | None = None,
    parts: dict[str, dict[str, tuple[str, ...]]] | None = None,
    in_open_batches: dict[str, dict] | None = None,
) -> Summary:
    """Score ``models`` (``scoring.MODELS_SCHEMA`` rows, plus an optional ``epochs`` column: a
    model's own number of epochs, else ``epochs``) from the cache over the suite's tasks, write
    ``out/summary.json`` and ``out/answers.parquet`` (staged, then put in place together, an earlier
    scoring's report taken away: ``runner.outputs.staging``) and return the summary. ``requests`` is
    each model's request counts from a run; None (cache-only scoring) counts the requests found in
    the cache instead, with ``sent`` = 0. ``prices`` (label -> USD per million input and output
    tokens; None or absent: no price) make the usage blocks' costs (``batch_prices``: of the
    requests a provider batch answered; default half, ``scoring.cost.batch_price``); ``extra`` sets
    the summary's optional fields (``cost_bound``, ``stopped_providers``:
    ``scoring.records.Summary``; its ``provenance`` is added to the provenance block:
    ``selection_differs``, ``runner.rescore``); ``tolerance`` is ``--allow-failed``'s
    (``scoring.provisional``); ``entries`` (label -> {field: value}) sets model entries' optional
    fields (an adaptive run's ``adaptive`` blocks, ``runner.adaptive``); ``parts`` (label ->
    evaluation -> task ids: ``Rounds.parts``) scores each model of an adaptive run over the part it
    was asked (``scoring.adaptive.asked_part``; the cache alone: the parts its record in the cache
    folder gives, ``runner.outputs.adaptive.recorded``); ``in_open_batches`` (label -> {requests,
    answers}: ``runner.open_batches.waiting``; or {batches}: ``accepted_by_label``) is added to a
    cache-only scoring's ``requests`` blocks, what open batches hold of the answers missing
    (``scoring.provisional``'s note: collected, not asked for again).

    A shard damaged where start-up does not look (outside the index columns) fails here: it is moved
    to the cache's quarantine/ (``Cache.read``) and scoring goes on without it; its answers count as
    missing, and the next ``dxi run`` sends those requests again."""
    return score_all(
        cache,
        suite,
        models,
        out,
        requests,
        epochs,
        prices=prices,
        extra=extra,
        batch_prices=batch_prices,
        tolerance=tolerance,
        entries=entries,
        parts=parts,
        in_open_batches=in_open_batches,
    )[0]


def score_all(
    cache: Cache,
    suite: Suite,
    models: pl.DataFrame,
    out: Path | None,
    requests: dict[str, dict] | None,
    epochs: int = 1,
    breakdowns: bool = False,
    prices: dict[str, tuple[float, float] | None] | None = None,
    extra: dict | None = None,
    batch_prices: dict | None = None,
    tolerance: Tolerance | None = None,
    entries: dict[str, dict] | None = None,
    parts: dict[str, dict[str, tuple[str, ...]]] | None = None,
    report: Callable[[Summary, Scored, Path], object] | None = None,
    in_open_batches: dict[str, dict] | None = None,
) -> ScoredRun:
    """``score``, also returning the tables (``scoring.Scored``; with ``breakdowns`` the per-group
    ones that only the report shows). ``out`` None writes nothing (``dxi export`` writes its own
    files). ``report(summary, scored, folder)`` writes the report's files into ``folder`` (the
    staging folder: ``report.html.write``), put in place with the others. Every output of an
    earlier scoring that this one does not write (a report, after ``dxi score``) is taken away
    (``staging``)."""
    summary, scored = summarize(
        cache,
        suite,
        models,
        requests,
        epochs,
        breakdowns,
        prices,
        extra,
        batch_prices=batch_prices,
        tolerance=tolerance,
        entries=entries,
        parts=parts,
        in_open_batches=in_open_batches,
    )
    if out is None:
        return ScoredRun(summary, scored)
    # the whole set staged, then put in place in one step (``staging``): stopped anywhere (a
    # signal, a run's grace period over: ``runner.signals.within``), OUT holds the set it held or
    # this one, never some of each
    with Staging(out) as staged:
        scoring.export(scored.answers).write_parquet(staged.path("answers.parquet"))
        staged.path("summary.json").write_bytes(records.to_json(summary))
        if report is not None:
            report(summary, scored, staged.dir)
        staged.commit()
    return ScoredRun(summary, scored)


def summarize(
    cache: Cache,
    suite: Suite,
    models: pl.DataFrame,
    requests: dict[str, dict] | None,
    epochs: int = 1,
    breakdowns: bool = False,
    prices: dict[str, tuple[float, float] | None] | None = None,
    extra: dict | None = None,
    each: Callable[[pl.DataFrame], None] | None = None,
    batch_prices: dict | None = None,
    tolerance: Tolerance | None = None,
    entries: dict[str, dict] | None = None,
    parts: dict[str, dict[str, tuple[str, ...]]] | None = None,
    in_open_batches: dict[str, dict] | None = None,
) -> ScoredRun:
    """``score_all`` without writing anything: the summary (as summary.json holds it) and the tables
    (``dxi view`` shows them; the cache is only read).

    With ``each``, the evaluations are read and scored one at a time (``scoring.Scorer``; the cache
    read in parts, ``Cache.read_parts``), and ``each`` is called with each evaluation's answers
    frame before it is dropped: at most one evaluation's answers are held (``dxi view``'s start-up
    child). The summary and tables are the same; the returned ``Scored`` has no answers and no
    breakdown tables (``breakdowns`` must be False)."""
    if each is not None and breakdowns:
        raise ValueError(
            "summarize: the breakdown tables need every answer at once (each= scores one "
            "evaluation at a time)"
        )
    gold, categories = (
        suite.gold_frames()
    )  # the suite's survey: the tasks are read once (dxi run: during the run)
    labels = models["label"].to_list()
    model_epochs = (
        dict(zip(labels, models["epochs"].fill_null(epochs).to_list(), strict=True))
        if "epochs" in models.columns
        else None
    )
    record = None
    if requests is None:  # the cache alone: an adaptive run's models over what they were asked
        tasks = scored_tasks(gold)
        record = recorded(configs(models), cache.root, tasks)
        parts = record.parts
    cut: set[tuple[str, str]] = set()  # the (label, evaluation) scored over the part asked
    # what the anytime paired sequences read (an adaptive run's: ``stopped_pairs``)
    order, paired = stopped_pairs.order_of(parts or {}), {}
    confidence = []  # each answers frame's tied confidence groups (``scoring.measures``)
    if each is None:
        answers = cache.read(lambda rows: scoring.answers(rows, models, gold, categories, epochs))
        answers, cut = asked_part(answers, parts or {})
        if order:
            paired = sequential.pair_parts(answers, order)
        scored = scoring.score(
            answers, scoring.Bootstrap(), with_breakdowns=breakdowns, with_comparisons=True
        )
        counts = scoring.request_counts(answers) if requests is None else requests
        damaged = _damaged(cache, models, gold, epochs)
        damaged.counts.update(scoring.missing_found(answers, damaged.found))
        ties, rounded = tie_counts(answers), rounded_counts(answers)
        confidence.append(measures.confidence_groups(answers))
        del answers
    else:
        scorer, ties, rounded = scoring.Scorer(scoring.Bootstrap()), {}, {}
        counts = {} if requests is None else requests
        damaged = None  # read after the first read (which sets damaged shards aside)
        for name in gold["eval"].unique().sort().to_list() or [
            None
        ]:  # None: no tasks (``each`` gets no rows)
            mine = gold if name is None else gold.filter(pl.col("eval") == name)
            answers = cache.read_parts(
                lambda rows, mine=mine: scoring.answers(rows, models, mine, categories, epochs)
            )
            answers, now_cut = asked_part(answers, parts or {})
            cut |= now_cut
            if order:
                paired = sequential.merge_parts(paired, sequential.pair_parts(answers, order))
            if requests is None:
                counts = _added(counts, scoring.request_counts(answers))
            damaged = damaged or _damaged(cache, models, gold, epochs)
            damaged.counts.update(scoring.missing_found(answers, damaged.found))
            ties |= tie_counts(answers)
            rounded |= rounded_counts(answers)
            confidence.append(measures.confidence_groups(answers))
            each(answers)
            part = scorer.part(answers)
            del answers  # before the intervals' resampled sums are computed: never both held
            scorer.add_part(part)
            del part
        scored = scorer.result(comparisons=True)
    # usage after the answers (none is held any more: the peak is the larger of the two reads),
    # over the rows of the answers scored: a model cut to its asked part, its part's only
    asked: dict[str, dict] = {}
    for label, name in cut:
        asked.setdefault(label, {})[name] = (parts or {})[label][name]
    used, served, calls = cache.read(
        lambda rows: usage_and_replies(rows, models, gold, epochs, with_calls=True, parts=asked)
    )
    usage = scoring.usage_blocks(used, labels, prices or {}, batch_prices)
    summary = scoring.build_summary(
        scored.metrics,
        labels,
        suite.data_block(),
        PROMPT_VERSION,
        epochs,
        counts,
        scored,
        model_epochs,
        usage,
        tolerance,
        damaged,
        set_aside_answers(served),
        suite.recorded,
    )
    summary = add_ties(summary, ties, rounded)
    summary = add_replies(
        summary, served, dict(zip(labels, models["model"].to_list(), strict=True))
    )
    summary = measures.add_measures(
        summary, measures.call_measures(calls), measures.confidence_measures(confidence)
    )
    summary = msgspec.structs.replace(model_settings(summary, models), **(extra or {}))
    for entry in summary.models:  # the fields the run sets (an adaptive run's ``adaptive``)
        for name, value in (entries or {}).get(entry.model, {}).items():
            setattr(entry, name, value)
        if held := (in_open_batches or {}).get(entry.model):  # (the cache alone: ``score``)
            entry.requests = entry.requests | {"in_open_batches": held}
    # the cache alone: an adaptive run's part-asked models marked (its record)
    if record is not None:
        summary = attach(summary, record, cut)
    if entries is None and not summary.complete:
        # an adaptive run that did not finish (the cache alone, or that run's own Ctrl-C, which
        # scores it without its rounds): its rerun, not only a plain run, sends the rest
        left = unfinished(cache.root, scored_tasks(gold))
        if left is not None:
            summary = hint_unfinished(summary, left)
    summary = mark_exact(summary, cut)  # a model scored over the whole set: exact, not ≈
    # a pair with a model stopped before the end: claimed only by its anytime paired interval
    if of := stopped_pairs.estimates(summary):
        populations = summary.adaptive.get("populations", {})
        intervals = sequential.pair_intervals(
            {m: p for m, p in paired.items() if set(p) <= set(populations)}, populations, of
        )
        summary, scored = stopped_pairs.claim(summary, scored, intervals)
    # a model stopped before the end: its headline intervals the anytime-valid ones
    summary, scored = headline(summary, scored)
    summary = estimates.name_anytime(summary)  # and intervals.methods names them
    # the tables say which figures are estimates, and which interval each has
    scored = estimates.columns(summary, scored)
    # what produced it (the dxi version, the git commit of a checkout, Python, the platform): asked
    # here, when the result is written, never before the first request
    summary.provenance = provenance() | (extra or {}).get("provenance", {})
    return ScoredRun(summary, scored)


@dataclass(frozen=True)
class _Damaged(Damaged):
    found: pl.DataFrame = field(default_factory=pl.DataFrame)  # their requests (label, task, epoch)


def _damaged(cache: Cache, models: pl.DataFrame, gold: pl.DataFrame, epochs: int) -> _Damaged:
    """What the cache set aside as damaged (``Cache.set_aside``), its requests found among the
    scored ones (``scoring.requests_found``); ``counts`` is filled from each answers frame
    (``scoring.missing_found``)."""
    aside = cache.set_aside()
    found = (
        scoring.requests_found(aside.rows.lazy(), models, gold, epochs)
        if aside.rows.height
        else pl.DataFrame(schema={"label": pl.String, "task_id": pl.String, "sample": pl.Int64})
    )
    return _Damaged({}, aside.where, aside.unread, found)


def scored_tasks(gold: pl.DataFrame) -> dict[str, set[str]]:
    """Evaluation -> the task ids of ``gold`` (``Suite.gold_frames``'s first frame)."""
    tasks: dict[str, set[str]] = {}
    for name, task_id in gold.select("eval", "task_id").unique().iter_rows():
        tasks.setdefault(name, set()).add(task_id)
    return tasks


def configs(models: pl.DataFrame) -> dict[str, tuple]:
    """Label -> (provider, model, endpoint, params) of a ``scoring.MODELS_SCHEMA`` frame: a model's
    configuration as the cache tells models apart."""
    return {
        r["label"]: (r["provider"], r["model"], r["endpoint"], r["params"])
        for r in models.iter_rows(named=True)
    }


def model_settings(summary: Summary, models: pl.DataFrame) -> Summary:
    """``summary`` with each model entry's ``effort`` (the level its requests carry: the frame's
    ``effort`` column, ``runner.planning.plan``; null where unset or unknown) and, for a provider
    that clamps P(yes) (``Adapter.P_YES_RANGE``: Gemini Decisions), its ``p_yes_range``."""
    rows = {r["label"]: r for r in models.iter_rows(named=True)}
    for entry in summary.models:
        row = rows.get(entry.model, {})
        entry.effort = row.get("effort")
        kind = row.get("provider")
        clamp = adapters.adapter_class(kind).P_YES_RANGE if kind in adapters.KINDS else None
        if clamp is not None:
            entry.p_yes_range = list(clamp)
    return summary


def _added(a: dict[str, dict[str, int]], b: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """Two ``scoring.request_counts`` results (of different evaluations) as one: the counts added
    per model."""
    out = {label: dict(c) for label, c in a.items()}
    for label, c in b.items():
        mine = out.setdefault(label, dict.fromkeys(c, 0))
        for k, v in c.items():
            mine[k] += v
    return dict(sorted(out.items()))
