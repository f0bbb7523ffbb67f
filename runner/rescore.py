"""Scoring from the cache alone, without the network, as library calls: what ``dxi score``,
``report``, ``export`` and ``view`` score (``select``: the plan or every model in the cache, the
cache and output folders, the tasks, the remote tier; ``models_to_score``: the models under the
names ``dxi run`` gives them, their prices and epochs) and ``rescore``, which scores that selection
into summary.json and answers.parquet (with ``html``: report.html and its tables too) and returns a
``Rescored``; ``browse``, the browser ``dxi view`` serves over it.

``select`` takes the selection as ``runner.planning.inputs.PlanInputs`` (from a program or a test:
``select(PlanInputs(cache_dir=..., data_dir=..., out=..., sample=2))``), or as ``dxi score`` parses
it (an ``argparse.Namespace``, turned into ``PlanInputs`` by ``runner.planning.inputs.inputs_of``).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from dxi import adapters
from dxi.cache import Cache
from dxi.cache.ledger import LEDGER_DIR
from dxi.evals import PROMPT_VERSION
from dxi.lazy import LazyModule

from .distributed import setup as distributed
from .errors import EXIT_FAILED_REQUESTS, UsageError
from .outputs import amounts, history
from .outputs import staging as _staging
from .planning import paths
from .planning.inputs import PlanInputs, inputs_of
from .planning.plan import (
    from_inputs,
    price_flags,
    price_of,
    refuse_missing,
    suite_of,
    tolerance,
    with_effort,
)
from .planning.selection import Differs, choose

# Imported on first use (``dxi.lazy``): Polars and the scoring once the cache is read, matplotlib
# and Jinja2 only for a report, the view's data only for ``dxi view``; ``dxi score --help`` needs
# none
pl = LazyModule("polars")
scoring = LazyModule("dxi.scoring")
_files = LazyModule("dxi.runner.outputs.files")
_report = LazyModule("dxi.report.html")
_view_data = LazyModule("dxi.view.data")
_open_batches = LazyModule("dxi.runner.open_batches")  # a cache with batches only

if TYPE_CHECKING:
    from tempfile import TemporaryDirectory

    from dxi.cache.remote import Remote
    from dxi.evals import Suite
    from dxi.scoring.provisional import Tolerance
    from dxi.scoring.records import Summary
    from dxi.view.data import Browser

    from .planning.plan import ModelRun, Plan


@dataclass
class Selection:
    """What is scored: ``plan`` (a run file's or the ``--model`` flags'; None: every model in the
    cache), ``cache_dir`` and ``out`` (folders), ``suite`` (the tasks the inputs name;
    ``scored_suite`` narrows it to those the runs selected), ``remote`` (the remote cache tier, or
    None), ``inputs`` (as given) and, once scored, ``differs``: how the tasks scored differ from
    those the last ``dxi run`` into ``out`` asked (``runner.planning.selection.Differs``; None: the
    same, or no run recorded there), which the commands print on standard error."""

    plan: Plan | None
    cache_dir: Path
    out: Path
    suite: Suite
    remote: Remote | None
    inputs: PlanInputs
    differs: Differs | None = None


@dataclass
class ToScore:
    """The models to score (a ``scoring.MODELS_SCHEMA`` frame), their prices (label -> USD per
    million input, output tokens; None: unknown), the default epochs, notes for the user and
    ``recorded``: label -> where the price of a model given none came from (``recorded_prices``),
    summary.json's ``provenance.prices``."""

    frame: pl.DataFrame
    prices: dict
    epochs: int
    notes: list[str] = field(default_factory=list)
    recorded: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Rescored:
    """What ``rescore`` wrote: ``summary`` (summary.json's document, ``scoring.records.Summary``),
    ``out`` (its folder), ``report`` (the report.html written, or None), ``notes`` (for the user:
    epochs left out, the selection the runs made) and ``exit_code`` (0, or
    ``runner.errors.EXIT_FAILED_REQUESTS`` for a provisional result not accepted) and ``ranked``
    (no run file or ``--model`` gave the models' order: every table shows them by Decision Index,
    ``Summary.order``)."""

    summary: Summary
    out: Path
    report: Path | None
    notes: list[str]
    exit_code: int
    ranked: bool = False


def select(inputs: PlanInputs | argparse.Namespace, mirror: Path | None = None) -> Selection:
    """What ``dxi score`` (and ``report``, ``export``, ``view``) scores, from ``inputs`` (or the
    command's parsed flags): the models of ``inputs.run_file`` or ``inputs.models``, else every
    model in the cache; the remote cache tier (``cache_remote``) has its shards pulled into the
    cache folder, which it creates, or into ``mirror`` (``dxi view`` never writes to the cache
    folder: with a remote tier it reads a cache folder that does not exist as an empty one).
    UsageError for a run file beside models, a bad setting (``runner.planning.plan``), an
    evaluation selected without data (``refuse_missing``, as ``dxi run`` refuses it), or no cache
    folder and no remote tier."""
    if isinstance(inputs, argparse.Namespace):
        inputs = inputs_of(inputs)
    if inputs.run_file is not None and inputs.models:
        raise UsageError(
            f"--model cannot be combined with a run file ({inputs.run_file}): the file names the models"
        )
    plan = from_inputs(inputs) if inputs.run_file is not None or inputs.models else None
    cache_dir = plan.cache_dir if plan else (inputs.cache_dir or Path(".dxi-cache"))
    out = plan.out if plan else (inputs.out or Path("out"))
    suite = plan.suite if plan else suite_of(inputs)
    # as `dxi run` refuses it: an evaluation selected (all four unless --evals or the run file's
    # [evals] select leaves it out) without data, before the cache or OUT is touched
    refuse_missing(suite, plan.source if plan else None, scoring=True)
    uri = inputs.cache_remote or (plan.cache_remote if plan else None)
    if not cache_dir.is_dir() and not uri:  # a remote tier is pulled into it (or into ``mirror``)
        raise paths.no_cache(cache_dir)
    remote = distributed.remote_for(uri, cache_dir, mirror)
    return Selection(plan, cache_dir, out, suite, remote, replace(inputs, cache_dir=cache_dir))


def models_to_score(cache: Cache, selection: Selection, empty_ok: bool = False) -> ToScore:
    """The models to score: the plan's (a run file's, or the ``--model`` flags' with their
    ``--param``) under the names ``dxi run`` gives them, else every model in the cache. UsageError
    for a ``--model`` whose configuration (adapter, model, endpoint, parameters) has no rows in the
    cache, and for a cache with no model at all unless ``empty_ok`` (``dxi view``, which shows the
    models as a run adds them)."""
    plan, inputs = selection.plan, selection.inputs
    found = cache.read(lambda rows: scoring.models_in_cache(rows, PROMPT_VERSION))
    if plan is None:
        if found.is_empty() and not empty_ok:
            aside = cache.set_aside()  # what it held may have been set aside as damaged
            raise UsageError(
                f"no models in {selection.cache_dir} for prompt version {PROMPT_VERSION}: "
                + (
                    f"the cache found {aside.shards} shard(s) damaged and {aside.where}; their "
                    "answers are not scored: `dxi run` with the same models and tasks requests them again"
                    if aside.shards
                    else "run `dxi run` first"
                )
            )
        prices, given = _flag_prices(found, inputs.prices, selection.cache_dir)
        epochs = inputs.epochs or 1
        done = ToScore(with_effort(found), prices, epochs, more_epochs(found, epochs))
        return recorded_prices(done, given, selection.out, selection.cache_dir)
    same = []
    for m in plan.models:
        a = m.adapter
        config = _config(a)
        if (
            not a.model
        ):  # a System One server that names its model: the one model cached from that server
            kinds = found.filter(config)
            if kinds.height != 1:
                raise UsageError(
                    f"{m.label}: no model name is given and the cache holds {kinds.height} models from "
                    f"{a.endpoint}; name it ({a.kind}:NAME@URL, or model = NAME in a run file)"
                )
            a.model = kinds["model"].item()
        match = found.filter(config & (pl.col("model") == a.model))
        if inputs.models and match.is_empty():
            near = (
                found.filter((pl.col("provider") == a.kind) & (pl.col("model") == a.model))
                .select("endpoint", "params")
                .unique()
                .sort("endpoint", "params")
            )
            cached = (
                f" It is cached with: {'; '.join(f'endpoint {e}, parameters {p}' for e, p in near.iter_rows())}."
                if near.height
                else f" Models there: {', '.join(found['label'].to_list()) or 'none'}."
            )
            # an in-process model's endpoint is its cache key's, no server: not named
            where = "" if a.fixed_endpoint else f"endpoint {a.endpoint or '-'}, "
            raise UsageError(
                f"{m.label}: no such model in {selection.cache_dir} ({where}parameters "
                f"{a.params_key}, prompt version {PROMPT_VERSION}); give the model string and "
                f"--param as `dxi run` was given them.{cached}"
            )
        same.append(match.with_columns(pl.lit(m.label).alias("label")))
    plan.check_labels()
    notes = more_epochs(pl.concat(same), plan.epochs) if inputs.models and not inputs.epochs else []
    done = ToScore(plan.models_frame(), plan.prices(), plan.epochs, notes)
    priced = {m.label for m in plan.models if m.priced}
    return recorded_prices(done, priced, selection.out, selection.cache_dir)


def _flag_prices(
    found: pl.DataFrame, items: tuple[str, ...], cache_dir: Path
) -> tuple[dict, set[str]]:
    """The prices of the models ``found`` in the cache (``scoring.models_in_cache``; no run file nor
    ``--model``), and the labels ``items`` (``--price``) priced: each MODEL names a model by its
    label or ADAPTER:MODEL (``runner.planning.plan.names``); a model on this machine is free
    otherwise, any other unpriced. UsageError for a MODEL that names no model of the cache, or a
    model named by two."""
    flags = price_flags(list(items))
    prices, given = {}, set()
    for label, kind, model in found.select("label", "provider", "model").iter_rows():
        cls = adapters.adapter_class(kind)
        named = [k for k in flags if k in (label, f"{kind}:{model}")]
        if len(named) > 1:
            raise UsageError(
                f"--price {' and --price '.join(named)} name the same model ({label}): give one"
            )
        prices[label] = price_of(cls, flags[named[0]] if named else None)
        given |= {label} if named else set()
        flags = {k: v for k, v in flags.items() if k not in named}
    if flags:
        raise UsageError(
            f"--price {next(iter(flags))}: no model in {cache_dir} is named so (its models: "
            f"{', '.join(found['label'].to_list()) or 'none'})"
        )
    return prices, given


def recorded_prices(to_score: ToScore, given: set[str], out: Path, cache_dir: Path) -> ToScore:
    """``to_score`` with each model not in ``given`` (priced by neither ``--price`` nor the run
    file) priced as the newest ``dxi run`` into ``out`` of the cache in ``cache_dir`` that priced
    it recorded it (``runner.outputs.history.prices``), where that differs from its default; a note
    says so, and ``to_score.recorded`` where it came from."""
    for label, (price, started) in history.prices(out, cache_dir).items():
        if label in given or label not in to_score.prices or to_score.prices[label] == price:
            continue
        to_score.prices[label] = price
        where = str(Path(out) / history.RUNS_FILE)
        to_score.recorded[label] = {"price": list(price), "run_started": started, "from": where}
        to_score.notes.append(
            f"{label}: priced at {amounts.price(price)}, as "
            f"its dxi run of {started} recorded it in {where} (--price {label}=IN/OUT[/CACHED] to price it "
            "otherwise)"
        )
    return to_score


def _config(a: adapters.Adapter) -> pl.Expr:
    """The rows of ``scoring.models_in_cache`` of ``a``'s adapter, endpoint and parameters (any
    model name)."""
    return (
        (pl.col("provider") == a.kind)
        & (pl.col("endpoint") == a.endpoint)
        & (pl.col("params") == a.params_key)
    )


def name_from_cache(cache: Cache, models: list[ModelRun]) -> None:
    """Name each of ``models`` that has no model name (a System One server that names its model,
    and could not be asked: it is down) after the one model the cache holds from its endpoint with
    its parameters, as ``models_to_score`` names it; one the cache holds none or several of stays
    unnamed. So a model whose answers are all cached runs from the cache with its server down
    (``runner.session``), and ``dxi estimate`` counts its cached requests."""
    unnamed = [m for m in models if not m.adapter.model]
    if not unnamed:
        return
    found = cache.read(lambda rows: scoring.models_in_cache(rows, PROMPT_VERSION))
    for m in unnamed:
        kinds = found.filter(_config(m.adapter))
        if kinds.height == 1:
            m.adapter.model = kinds["model"].item()


def more_epochs(found: pl.DataFrame, epochs: int) -> list[str]:
    """A note for each model whose cache holds more epochs than are scored."""
    return [
        f"{label}: the cache holds {n} epochs; --epochs {n} scores them all (scored: {epochs})"
        for label, n in found.filter(pl.col("cached_epochs") > epochs)
        .select("label", "cached_epochs")
        .iter_rows()
    ]


def scored_suite(selection: Selection, to_score: ToScore) -> Suite:
    """The suite scored over the models ``to_score``: the selection's, or with no selection given
    the tasks the runs recorded in the cache selected (``runner.planning.selection``; its notes are
    added to ``to_score.notes``, and ``selection.differs`` set)."""
    chosen = choose(
        selection.inputs,
        selection.plan,
        selection.suite,
        to_score.frame,
        selection.cache_dir,
        selection.out,
    )
    to_score.notes += chosen.notes
    selection.differs = chosen.differs
    return chosen.suite


def provenance(selection: Selection, recorded: dict | None = None) -> dict | None:
    """The summary's ``extra`` (``runner.outputs.files.score``) once ``selection`` is scored: its
    ``provenance.selection_differs`` where the tasks scored are not those the last run asked
    (``selection.differs``), and ``provenance.prices`` where models were priced as the runs recorded
    (``recorded``: ``ToScore.recorded``); None where neither applies."""
    differs = selection.differs
    block: dict = {"selection_differs": differs.block()} if differs is not None else {}
    if recorded:  # prices given by no flag nor run file: those the runs recorded
        block["prices"] = recorded
    return {"provenance": block} if block else None


def rescore(selection: Selection, html: bool = False) -> Rescored:
    """Score ``selection`` from the cache alone into ``selection.out`` (summary.json,
    answers.parquet; with ``html``: report.html and tables/, models ranked by Decision Index unless
    a plan gives their order). The tolerance of failed answers is the plan's ``allow_failed``, else
    the inputs' (``--allow-failed``). summary.json is rewritten (its ``requests`` counted from the
    cache, no ``cost_bound`` nor ``stopped_providers``; its ``provenance.selection_differs`` where
    the tasks scored are not those the last run into ``out`` asked: ``selection.differs``); the
    runs' own record, OUT/run-history.jsonl (``runner.outputs.history``), is only read: a note
    points at it."""
    plan, out = selection.plan, selection.out
    _staging.writing(out)  # a stop from here on says what OUT holds (left as it was, until commit)
    allowed: Tolerance | None = (
        plan.tolerance() if plan else tolerance(selection.inputs.allow_failed)
    )
    path = None
    # an earlier report here, which this scoring takes away (``runner.outputs.staging``)
    stale = [] if html else _staging.report_held(out)
    with Cache(selection.cache_dir, remote=selection.remote) as cache:
        to_score = models_to_score(cache, selection)
        suite = scored_suite(selection, to_score)
        batch_prices = plan.batch_prices() if plan is not None else None
        extra = provenance(selection, to_score.recorded)
        held = in_open_batches(cache, selection, suite, to_score)
        if not html:
            summary = _files.score(
                cache,
                suite,
                to_score.frame,
                out,
                None,
                to_score.epochs,
                to_score.prices,
                extra=extra,
                batch_prices=batch_prices,
                tolerance=allowed,
                in_open_batches=held,
            )
        else:  # the report staged with summary.json and answers.parquet: put in place together
            summary = _files.score_all(
                cache,
                suite,
                to_score.frame,
                out,
                None,
                to_score.epochs,
                breakdowns=True,
                prices=to_score.prices,
                extra=extra,
                batch_prices=batch_prices,
                tolerance=allowed,
                report=lambda summary, scored, into: _report.write(
                    summary, scored, into, ranked=plan is None
                ),  # no order given: by Decision Index
                in_open_batches=held,
            ).summary
            path = out / "report.html"
        # an adaptive run over this cache that did not finish: said once, with its command
        from .outputs.adaptive import unfinished

        left = (
            None
            if summary.complete
            else unfinished(selection.cache_dir, _files.scored_tasks(suite.gold_frames()[0]))
        )
        if left is not None:
            to_score.notes.append(left.line())
        else:  # one that ended with models its rule had not settled (the cost bound, ...)
            from dxi.scoring.adaptive import unsettled

            line = unsettled(summary)
            if line is not None:
                to_score.notes.append(line)
    if (removed := _staging.removed_note(out, stale)) is not None:
        to_score.notes.append(removed)
    # summary.json now holds the cache's figures; what the runs sent and spent is in
    # run-history.jsonl
    if (runs := history.note(out)) is not None:
        to_score.notes.append(runs)
    return Rescored(
        summary,
        out,
        path,
        to_score.notes,
        0 if summary.accepted else EXIT_FAILED_REQUESTS,
        ranked=plan is None,
    )


def in_open_batches(
    cache: Cache, selection: Selection, suite: Suite, to_score: ToScore
) -> dict[str, dict] | None:
    """What open batches of the cache's ledger hold of the requests scored that the cache does not
    (label -> {requests, answers}: ``runner.open_batches.waiting``, the keys ``dxi estimate`` counts
    ``in_open_batches``), for the provisional note (``scoring.provisional``: collected, not asked
    for again). Scoring every model in the cache (no plan), its models are rebuilt from their cache
    rows and the ledger (``runner.open_batches.of_cache``); one that cannot be has how many accepted
    batches it has open (label -> {batches}). None without a ledger."""
    if not (selection.cache_dir / LEDGER_DIR).is_dir():  # no ledger: no batch (nothing loaded)
        return None
    if selection.plan is not None:
        return _open_batches.waiting(cache, selection.plan.models, suite)
    rebuilt = _open_batches.of_cache(selection.cache_dir, to_score.frame, to_score.epochs)
    labels = set(to_score.frame["label"].to_list()) - {m.label for m in rebuilt}
    return _open_batches.waiting(cache, rebuilt, suite) | {
        label: {"batches": n}
        for label, n in _open_batches.accepted_by_label(selection.cache_dir).items()
        if label in labels
    }


def browse(selection: Selection, home: TemporaryDirectory) -> tuple[Browser, list[str]]:
    """``dxi view``'s browser over ``selection`` (``view.data.Browser``, its snapshots in ``home``,
    the view's private folder: nothing is written to the cache folder) and the notes for the user.
    With no plan it follows the cache: each rescoring takes every model in it again and the tasks
    their runs selected. ``selection.differs`` is set as it starts (``scored_suite``)."""
    plan, cache_dir, given = selection.plan, selection.cache_dir, selection.suite
    with Cache(cache_dir, read_only=True, remote=selection.remote) as cache:
        to_score = models_to_score(cache, selection, empty_ok=True)
        kept = choose(selection.inputs, plan, given, to_score.frame, cache_dir, selection.out)
    notes = to_score.notes + kept.notes
    selection.differs = kept.differs  # as it starts (said once, not at each rescoring)

    def again(
        cache: Cache,
    ) -> tuple:  # every model in the cache again, and the tasks their runs selected
        nonlocal kept
        now_scored = models_to_score(cache, selection, empty_ok=True)
        now = choose(selection.inputs, plan, given, now_scored.frame, cache_dir)
        if now.key != kept.key:
            kept = now
        kept.suite.runs, kept.suite.recorded = now.suite.runs, now.suite.recorded
        return now_scored.frame, now_scored.prices, now_scored.epochs, kept.suite

    def held(suite: Suite, models: pl.DataFrame, epochs: int) -> dict[str, dict] | None:
        # what open batches hold of the answers missing, as ``dxi score`` says it (each snapshot)
        if not (cache_dir / LEDGER_DIR).is_dir():  # no ledger: the cache is not even opened
            return None
        with Cache(cache_dir, read_only=True, remote=selection.remote) as cache:
            return in_open_batches(cache, selection, suite, ToScore(models, {}, epochs))

    browser = _view_data.Browser.build(
        cache_dir,
        kept.suite,
        to_score.frame,
        _files.summarize,
        to_score.epochs,
        to_score.prices,
        home=home,
        remote=selection.remote,
        select=again if plan is None else None,
        ranked=plan is None,  # no order given: by Decision Index, as the report
        held=held,
    )
    return browser, notes
