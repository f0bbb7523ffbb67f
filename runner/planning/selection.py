"""Which tasks a command that scores the cache scores when it is given no selection: what the runs
selected.

``dxi run`` records what it selected in the cache folder (``cache.runs``: ``runs.jsonl``, one line
per distinct selection: its models, evaluations, ``--limit`` or ``--sample``/``--seed``,
WildGuardTest subset). ``dxi score``, ``report``, ``export`` and ``view`` given no selection (no
``--limit``, ``--sample``, ``--seed`` or ``--all-tasks``, and no ``limit``/``sample`` in a run file)
score the tasks *the runs selected*, defined as:

* the runs: the records of the current prompt version that ran at least one of the models scored
  (every model in the cache, or those ``--model`` or the run file names);
* the evaluations: those the runs read (all of their union), unless ``--evals`` (or the run file)
  names some;
* the tasks of each evaluation: the union of the runs' selections of it. A run of every task makes
  it every task; of several ``--limit``, the largest; equal selections, that one: then the tasks are
  exactly those of that flag, and the outputs are byte for byte those of ``dxi score`` given it.
  Otherwise (say a ``--limit 10`` run and a ``--sample 20`` run) the union itself (``UnionSuite``),
  listed in summary.json (``data.<eval>.union``);
* the WildGuardTest subset: the runs', when they agree and neither the command line
  (``--wildguard-subset``) nor a run file gives one (``--model`` flags do not).

A cache without records (written before this version, or only pulled from a remote cache) scores
every task, as before. Whatever the selection, where a model's runs selected other tasks of an
evaluation than those scored, the evaluation's ``data`` block in summary.json says so (``runs``:
label -> flags, a union's joined by " + "), and the reason given for that model's missing answers
names those flags (``scoring.summary``): a ``--sample 20`` run scored with ``--limit 50`` says to
score with ``--sample 20``.

Whatever chose the tasks scored (flags, a run file's ``limit`` or ``sample``, the runs' records),
they are compared with those the last ``dxi run`` into the output folder asked (``last_run``: its
line in OUT/run-history.jsonl, ``runner.outputs.history``, the last one about this cache and one of
these models; without one, the cache's record when it holds a single selection of these models, run
by every one of them; else nothing is compared): the
evaluations, the tasks each evaluation's selection takes (``same_tasks``: ``--limit 1000`` and
``--all-tasks`` are the same tasks of evaluations of at most 1000) and the WildGuardTest subset
(where the run's line records it). Where they differ, ``against_last_run`` says how (``Differs``:
both selections' flags, and where the scored one comes from), which the commands print on standard
error and summary.json (and the eee export) keeps in ``provenance.selection_differs``. The run file
still wins over the last run's flags; the difference is only never silent.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING

from dxi.cache import runs
from dxi.cache.runs import RunRecord
from dxi.evals import PROMPT_VERSION, Suite, Task
from dxi.evals.wildguardtest import NAME as WILDGUARDTEST

from ..outputs import history
from .sample import SampledSuite
from .sample import choose as sampled_ids

if TYPE_CHECKING:
    import polars as pl

    from .inputs import PlanInputs
    from .plan import Plan
    from .shard import Shard

log = logging.getLogger("dxi.selection")


@dataclass(frozen=True, slots=True, order=True)
class Pick:
    """One run's selection of an evaluation's tasks: the first ``limit``, a ``sample`` (with
    ``seed``), or (both None) every task."""

    limit: int | None = None
    sample: int | None = None
    seed: int = 0

    @property
    def every(self) -> bool:
        return self.limit is None and self.sample is None

    def as_dict(self) -> dict:
        """As summary.json's data block writes a selection: ``{"limit": N}``, ``{"sample": {"tasks":
        N, "seed": S}}``, or ``{}`` for every task."""
        if self.sample is not None:
            return {"sample": {"tasks": self.sample, "seed": self.seed}}
        return {} if self.limit is None else {"limit": self.limit}

    def flags(self) -> str:
        """The flags that select these tasks: ``--sample 20``, ``--sample 20 --seed 1``,
        ``--limit 10`` or ``--all-tasks``."""
        from dxi.scoring.missing import (
            selection_flags,  # scoring (Polars) loads when scoring, not for a run's record
        )

        return selection_flags(self.as_dict())

    @classmethod
    def of(cls, record: RunRecord) -> Pick:
        return cls(record.limit, record.sample, record.seed if record.sample is not None else 0)


def reduced(picks: set[Pick]) -> tuple[Pick, ...]:
    """The fewest picks whose union is that of ``picks`` (sorted): every task absorbs the others,
    the largest limit the smaller ones."""
    if not picks or any(p.every for p in picks):
        return (Pick(),)
    limits = [p.limit for p in picks if p.limit is not None]
    out = {p for p in picks if p.sample is not None} | (
        {Pick(limit=max(limits))} if limits else set()
    )
    return tuple(
        sorted(out, key=lambda p: (p.sample is not None, p.limit or 0, p.sample or 0, p.seed))
    )


@dataclass
class UnionSuite(Suite):
    """A ``Suite`` whose tasks of each evaluation are the union of several selections (``picks``:
    name -> the picks; an evaluation without picks keeps every task), each applied to the
    evaluation's tasks after exclusions, in file order."""

    picks: dict[str, tuple[Pick, ...]] = field(default_factory=dict)
    _chosen: dict[str, set[str] | None] = field(default_factory=dict, repr=False, compare=False)

    def chosen(self, name: str) -> set[str] | None:
        """The task ids of ``name`` in the union (None: every task), computed once."""
        if name not in self._chosen:
            ids: set[str] | None = set()
            for p in self.picks.get(name, (Pick(),)):
                if p.every:
                    ids = None
                    break
                stream = Suite.tasks(self, name)
                ids |= (
                    sampled_ids(list(stream), p.sample, p.seed)
                    if p.sample is not None
                    else {t.id for t in islice(stream, p.limit)}
                )
            self._chosen[name] = ids
        return self._chosen[name]

    def tasks(self, name: str | None = None) -> Iterator[Task]:
        for n in [name] if name else self.selected():
            keep = self.chosen(n)
            yield from (t for t in Suite.tasks(self, n) if keep is None or t.id in keep)

    def data_block(self) -> dict[str, dict]:
        """``Suite.data_block`` with each evaluation's selection: its ``limit`` or ``sample`` (as
        the other suites write them) where it has one, ``union`` (a list of ``Pick.as_dict``) where
        it has several."""
        block = super().data_block()
        for name, entry in block.items():
            picks = self.picks.get(name, ())
            if "files" in entry and len(picks) > 1:
                entry["union"] = [p.as_dict() for p in picks]
            elif "files" in entry and picks:
                entry |= picks[0].as_dict()
        return block


def flags_of(picks: dict[str, tuple[Pick, ...]]) -> str:
    """The flags of a selection (``picks``: evaluation -> its picks): a pick every evaluation
    shares, its flags (``--limit 10``); else per evaluation, a union's joined by " + "
    (``hle_multichoice: --limit 10 + --sample 20; when2call: --sample 20``)."""
    kinds = set(picks.values())
    if len(kinds) == 1 and len(one := next(iter(kinds))) == 1:
        return one[0].flags()
    return "; ".join(f"{name}: {' + '.join(p.flags() for p in ps)}" for name, ps in picks.items())


def flagged(inputs: PlanInputs) -> bool:
    """Whether the command line chose the tasks (``--limit``, ``--sample``, ``--seed``,
    ``--all-tasks``)."""
    return any(
        getattr(inputs, name) not in (None, False)
        for name in ("limit", "sample", "seed", "all_tasks")
    )


def given(inputs: PlanInputs, plan: Plan | None) -> bool:
    """Whether the command line or the run file chose the tasks (``--limit``, ``--sample``,
    ``--seed``, ``--all-tasks``, a run file's ``limit`` or ``sample``)."""
    if flagged(inputs):
        return True
    suite = plan.suite if plan is not None else None
    return suite is not None and (suite.limit is not None or isinstance(suite, SampledSuite))


def selection_of(plan: Plan, shard: Shard | None = None) -> dict:
    """What ``plan`` selects, as a run's line in OUT/run-history.jsonl writes it
    (``runner.outputs.history``): the run file (None for ``--model``), the models' names and
    configurations, the cache folder (``history.about``: what a rescoring compares), the
    evaluations, the tasks (``limit``, or ``sample`` {tasks, seed}; neither: every task), the
    WildGuardTest subset (``wildguard_subset``) where the run reads WildGuardTest, the cost bound
    (USD; None without one), ``prices`` (each model's price tuple, ``scoring.cost``: USD per million
    tokens; None: no price), which ``dxi score`` uses for a model it is given no price for
    (``runner.rescore``), and ``until`` (an adaptive run) and ``shard`` where given."""
    record = record_of(plan)  # what the cache's record of the run's selection says
    selection = {
        "run_file": None if plan.source is None else str(plan.source),
        "models": [m.label for m in plan.models],
        "configs": [dict(zip(runs.MODEL_FIELDS, key, strict=True)) for key in record.models],
        "cache_dir": str(Path(plan.cache_dir).resolve()),
        "evals": list(record.evals),
        **Pick.of(record).as_dict(),
    }
    if WILDGUARDTEST in record.evals:
        selection["wildguard_subset"] = record.wildguard_subset
    selection["max_cost_usd"] = plan.max_cost
    selection["prices"] = {m.label: None if m.price is None else list(m.price) for m in plan.models}
    if plan.until is not None:
        selection["until"] = str(plan.until)
    if shard is not None and shard.count > 1:
        selection["shard"] = str(shard)
    return selection


def record_of(plan: Plan) -> RunRecord:
    """The record of what ``plan`` runs (its models started: a server-named model has its name)."""
    suite = plan.suite
    sample = suite.sample if isinstance(suite, SampledSuite) else None
    models = tuple(m.identity.key for m in plan.models)
    return RunRecord(
        PROMPT_VERSION,
        models,
        tuple(suite.selected()),
        suite.limit,
        sample,
        suite.seed if isinstance(suite, SampledSuite) else 0,
        suite.wildguard_subset,
        round(time.time(), 3),
    )


def remember(plan: Plan) -> None:
    """Record what ``plan`` runs in its cache folder (``cache.runs``); a folder that cannot take the
    line costs only the record (a warning: the run's replies are what matter)."""
    try:
        runs.append(plan.cache_dir, record_of(plan))
    except OSError as exc:
        log.warning(
            f"could not record this run's selection in {plan.cache_dir / runs.RUNS_FILE} ({exc}); "
            "`dxi score` will need its --limit/--sample"
        )


@dataclass(frozen=True)
class LastRun:
    """What the last ``dxi run`` asked (``last_run``): its ``evals``, its ``pick`` of each, its
    WildGuardTest ``subset`` (None: its line does not say, written before the line had it),
    ``ended`` (None for the cache's record, which has no end time) and ``source``, the file it was
    read from (OUT/run-history.jsonl, or the cache's runs.jsonl: ``recorded``); ``latest``: no
    later line of OUT/run-history.jsonl (about another cache or other models) follows it."""

    evals: tuple[str, ...]
    pick: Pick
    subset: str | None
    ended: str | None
    source: Path
    recorded: bool = False
    latest: bool = True


def last_run(
    out: Path, mine: dict[str, list[RunRecord]], cache_dir: Path, configs: dict[str, tuple]
) -> LastRun | None:
    """The selection of the last ``dxi run`` into ``out`` of the models scored (``configs``: label
    -> configuration) on the cache in ``cache_dir``: the ``selection`` of the last line of
    OUT/run-history.jsonl (``runner.outputs.history``) about them (``history.about``: a run on
    another cache, or of other models, says nothing of this scoring). Without one (a folder from
    before the file existed, a new ``--out``, runs of other caches or models only), the cache's
    record of runs (``cache.runs``) when it is unambiguous: one selection recorded of these models
    (``mine``: label -> their records), and every one of them ran in it (runs.jsonl keeps one line
    per distinct selection, so of several the latest cannot be told); else None."""
    lines = [line for line in history.runs(out) if isinstance(line.get("selection"), dict)]
    ours = [line for line in lines if history.about(line["selection"], cache_dir, configs)]
    if ours:
        ran = ours[-1]["selection"]
        sample = ran.get("sample") if isinstance(ran.get("sample"), dict) else {}
        subset = ran.get("wildguard_subset")
        return LastRun(
            tuple(ran.get("evals") or ()),
            Pick(ran.get("limit"), sample.get("tasks"), sample.get("seed") or 0),
            subset if isinstance(subset, str) else None,
            ours[-1].get("ended"),
            Path(out) / history.RUNS_FILE,
            latest=ours[-1] is lines[-1],
        )
    distinct = {replace(r, at=0.0) for rs in mine.values() for r in rs}
    if len(distinct) != 1 or not all(mine.values()):
        return None
    (record,) = distinct
    return LastRun(
        record.evals,
        Pick.of(record),
        record.wildguard_subset,
        None,
        Path(cache_dir) / runs.RUNS_FILE,
        recorded=True,
    )


@dataclass(frozen=True)
class Differs:
    """The tasks scored are not those the last ``dxi run`` into the output folder asked
    (``last_run``: the last line of its ``history``, OUT/run-history.jsonl, which ``ended`` then;
    or the one run of these models the cache records, ``recorded``): ``scored`` and ``asked`` are
    their flags (``--limit 15``; with ``--evals`` where the evaluations differ, with
    ``--wildguard-subset`` where the subsets do), ``why`` says where the scored ones come from
    (``FLAGS``, ``RUN_FILE``, ``RECORDED`` or ``EVERY``), ``history`` the file the last run was
    read from."""

    scored: str
    why: str
    asked: str
    ended: str | None
    history: Path
    recorded: bool = False
    latest: bool = True

    def line(self) -> str:
        """What ``dxi score``, ``report``, ``export`` and ``view`` print on standard error."""
        fix = f"give {self.asked} instead" if FLAGS in self.why else f"add {self.asked}"
        ours = "" if self.latest else " with this cache and these models"
        where = (
            f"the one dxi run of these models recorded in this cache ({self.history}; the output "
            "folder records none with this cache and these models)"
            if self.recorded
            else f"the last dxi run here{ours} ({self.history}, ended {self.ended})"
        )
        return (
            f"{where} asked {self.asked}; this scoring uses {self.scored} ({self.why}): {fix} to "
            "score what it asked"
        )

    def block(self) -> dict:
        """summary.json's ``provenance.selection_differs`` (and the eee export's)."""
        return {
            "scored": self.scored,
            "why": self.why,
            "last_run": self.asked,
            "last_run_ended": self.ended,
            "run_history": str(self.history),
        }


# where the tasks scored come from (``Differs.why``)
FLAGS = "given on the command line"
RUN_FILE = "the run file's"
RECORDED = "the tasks this cache's runs selected"
EVERY = "every task: no run of these models is recorded in this cache"


DEFAULT_SUBSET = "the default"  # of the WildGuardTest subset: neither given nor the runs'


def against_last_run(
    suite: Suite, why: str, last: LastRun | None, subset_why: str = DEFAULT_SUBSET
) -> Differs | None:
    """How the tasks ``suite`` scores differ from those the ``last`` run asked (``last_run``: its
    evaluations, its ``limit`` or ``sample`` and, where it says, its WildGuardTest subset); None
    when they are the same tasks (``same_tasks``: ``--limit 1000`` is ``--all-tasks`` for
    evaluations of at most 1000 tasks) or no run is known. ``why``: where ``suite``'s tasks come
    from; ``subset_why``: where its WildGuardTest subset does (``why`` when only the subset
    differs, added to it when both do)."""
    if last is None:
        return None
    scored = {name: scored_picks(suite, name) for name in suite.selected()}
    other = set(last.evals) != set(scored)
    subset = (
        last.subset is not None
        and WILDGUARDTEST in scored
        and WILDGUARDTEST in last.evals
        and last.subset != suite.wildguard_subset
    )
    same = not other and all(
        same_tasks(suite, name, picks, (last.pick,)) for name, picks in scored.items()
    )
    if same and not subset:
        return None
    ours, theirs = flags_of(scored), last.pick.flags()
    if other:
        ours += f" --evals {','.join(scored)}"
        theirs += f" --evals {','.join(last.evals)}"
    if subset:
        ours += f" --wildguard-subset {suite.wildguard_subset}"
        theirs += f" --wildguard-subset {last.subset}"
        if same:
            why = subset_why
        elif subset_why != why:
            why = f"{why}; the subset {subset_why}"
    return Differs(ours, why, theirs, last.ended, last.source, last.recorded, last.latest)


def same_tasks(suite: Suite, name: str, *picks: tuple[Pick, ...]) -> bool:
    """Whether the selections ``picks`` (each a union of picks) take the same tasks of evaluation
    ``name`` of ``suite``'s files, exclusions and WildGuardTest subset: a limit or a sample of at
    least the evaluation's tasks is every task. Read only when the picks differ."""
    if len({frozenset(p) for p in picks}) == 1:
        return True
    every: set[str] | None = None
    chosen = []
    for p in picks:
        union = UnionSuite(
            suite.data, suite.exclusions, None, suite.wildguard_subset, (name,), picks={name: p}
        )
        ids = union.chosen(name)
        if ids is None:
            every = every if every is not None else {t.id for t in Suite.tasks(union, name)}
            ids = every
        chosen.append(ids)
    return all(ids == chosen[0] for ids in chosen)


@dataclass(frozen=True)
class Chosen:
    """What ``choose`` decided: the ``suite`` to score, ``notes`` for the user, ``key`` (equal
    keys, equal selections: ``dxi view`` keeps its suite while the key stays the same) and
    ``differs`` (``against_last_run``; None: the same tasks, or not asked)."""

    suite: Suite
    notes: list[str]
    key: tuple
    differs: Differs | None = None


def choose(
    inputs: PlanInputs,
    plan: Plan | None,
    suite: Suite,
    models: pl.DataFrame,
    cache_dir: Path,
    out: Path | None = None,
) -> Chosen:
    """The suite to score over ``models`` (``scoring.MODELS_SCHEMA`` frame) from the cache in
    ``cache_dir``: ``suite`` (the command line's or the run file's) when a selection is given or no
    run of these models is recorded, else the tasks the runs selected (the module docstring). Either
    way the suite's data block tells, per evaluation, what each model's runs selected
    (``Suite.runs``); with ``out`` (the output folder), ``differs`` says whether those tasks are not
    the ones the last ``dxi run`` there asked (``last_run``). The run file's selection still wins
    over the last run's: the difference is said, never settled silently."""
    records, warnings = runs.read(cache_dir)
    notes = list(warnings)
    configs = _configs(models)
    mine = _runs_of(models, records)
    relevant = [r for r in records if any(r in rs for rs in mine.values())]
    key: tuple = ()
    why = FLAGS if flagged(inputs) else RUN_FILE if given(inputs, plan) else EVERY
    if relevant and why == EVERY:
        why = RECORDED
        suite, key, note = _remembered(inputs, suite, relevant, cache_dir)
        if note:
            notes.append(note)
    annotate(suite, mine)
    if out is None:
        return Chosen(suite, notes, key)
    subset_why = (
        FLAGS
        if inputs.wildguard_subset is not None
        else RUN_FILE
        if inputs.run_file is not None
        else RECORDED
        if why == RECORDED
        else DEFAULT_SUBSET
    )
    last = last_run(out, mine, cache_dir, configs)
    differs = against_last_run(suite, why, last, subset_why)
    return Chosen(suite, notes, key, differs)


def _runs_of(models: pl.DataFrame, records: list[RunRecord]) -> dict[str, list[RunRecord]]:
    """Per model label of ``models``, the records of the current prompt version that ran it."""
    configs = _configs(models)
    return {
        label: [r for r in records if r.prompt_version == PROMPT_VERSION and config in r.models]
        for label, config in configs.items()
    }


def _configs(models: pl.DataFrame) -> dict[str, tuple[str, str, str, str]]:
    """Per model label of ``models``, its configuration (the cache's ``runs.MODEL_FIELDS``)."""
    return {
        r["label"]: tuple(r[f] for f in runs.MODEL_FIELDS) for r in models.iter_rows(named=True)
    }


def annotate(
    suite: Suite,
    mine: dict[str, list[RunRecord]] | None = None,
    models: pl.DataFrame | None = None,
    cache_dir: Path | None = None,
) -> None:
    """Set ``suite.runs``: per evaluation, the models whose recorded runs (``mine``: label ->
    records, else read from ``cache_dir`` for ``models``) selected other tasks of it than ``suite``
    scores, with the flags of what they selected (a union's joined by " + ", as
    ``scoring.missing.selection_flags`` writes the scored one), so that the reason for missing
    answers can name them. Where every model's runs selected what is scored, nothing is set: the
    summary is that of a run with the same selection. And ``suite.recorded``: per evaluation, every
    model whose recorded runs read it (those of them not in ``runs`` selected exactly what is
    scored: their missing answers are not put down to other tasks run)."""
    if mine is None:
        mine = _runs_of(models, runs.read(cache_dir)[0])
    out: dict[str, dict[str, str]] = {}
    recorded: dict[str, frozenset[str]] = {}
    for name in suite.selected():
        scored = " + ".join(p.flags() for p in scored_picks(suite, name))
        ran = set()
        for label, rs in mine.items():
            picks = {Pick.of(r) for r in rs if name in r.evals}
            flags = " + ".join(p.flags() for p in reduced(picks)) if picks else None
            if flags is not None:
                ran.add(label)
            if flags is not None and flags != scored:
                out.setdefault(name, {})[label] = flags
        if ran:
            recorded[name] = frozenset(ran)
    suite.runs, suite.recorded = out, recorded


def scored_picks(suite: Suite, name: str) -> tuple[Pick, ...]:
    """The selections ``suite`` scores of evaluation ``name``."""
    if isinstance(suite, UnionSuite):
        return suite.picks.get(name, (Pick(),))
    if isinstance(suite, SampledSuite):
        return (Pick(sample=suite.sample, seed=suite.seed),)
    return (Pick(limit=suite.limit),)


def _remembered(
    inputs: PlanInputs, suite: Suite, relevant: list[RunRecord], cache_dir: Path
) -> tuple[Suite, tuple, str | None]:
    """The suite of the tasks the ``relevant`` runs selected, its key and the note that says so
    (None, with ``suite`` itself, when that is every task of the evaluations ``suite`` reads). The
    WildGuardTest subset is the runs' where they agree and neither ``--wildguard-subset`` nor a run
    file gives one (``--model`` flags do not)."""
    evals = tuple(
        n
        for n in suite.selected()
        if suite.evals is not None or any(n in r.evals for r in relevant)
    )
    picks = {name: reduced({Pick.of(r) for r in relevant if name in r.evals}) for name in evals}
    subsets = {r.wildguard_subset for r in relevant if WILDGUARDTEST in r.evals}
    subset = (
        subsets.pop()
        if len(subsets) == 1 and inputs.wildguard_subset is None and inputs.run_file is None
        else suite.wildguard_subset
    )
    key = (evals, tuple(sorted(picks.items())), subset)
    kinds = set(picks.values())
    one = next(iter(kinds))[0] if len(kinds) == 1 and len(next(iter(kinds))) == 1 else None
    if not evals or (
        kinds == {(Pick(),)}
        and evals == tuple(suite.selected())
        and subset == suite.wildguard_subset
    ):
        # every task of what it reads anyway (or no run read what is here): said only where some run
        # selected fewer (a run of every task holds their tasks), so that a rescore of a sample is
        # not widened unseen listed in numeric order (--limit before --sample, then by size and
        # seed); the hint is the latest run's (runs.jsonl is appended to: its last line is the
        # latest, whatever the clocks said)
        others = [p for r in relevant if (p := Pick.of(r)) != Pick()]
        fewer = sorted(
            set(others), key=lambda p: (p.sample is not None, p.limit or 0, p.sample or 0, p.seed)
        )
        note = (
            None
            if not evals or not fewer
            else f"scoring every task: a run recorded in this cache ({cache_dir / runs.RUNS_FILE}) selected every task, "
            f"which holds the other runs' {', '.join(p.flags() for p in fewer)}; give {others[-1].flags()} (the "
            "latest) to score only those"
        )
        return suite, key, note
    if one is not None and one.sample is not None:
        chosen: Suite = SampledSuite(
            suite.data, suite.exclusions, None, subset, evals, sample=one.sample, seed=one.seed
        )
    elif one is not None:
        chosen = Suite(suite.data, suite.exclusions, one.limit, subset, evals)
    else:
        chosen = UnionSuite(suite.data, suite.exclusions, None, subset, evals, picks=picks)
    if subset == suite.wildguard_subset:
        chosen._validated = suite._validated  # the same files, read the same way: checked already
    else:
        chosen.validate()
    what = flags_of(picks)
    if suite.evals is None and evals != tuple(suite.selected()):
        what += f" --evals {','.join(evals)}"
    if subset != suite.wildguard_subset:
        what += f" --wildguard-subset {subset}"
    note = (
        f"scoring the tasks the runs recorded in this cache selected ({what}; {cache_dir / runs.RUNS_FILE}); "
        "give --limit, --sample or --all-tasks to score others"
    )
    return chosen, key, note
