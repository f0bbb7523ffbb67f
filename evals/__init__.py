"""The four evaluations of the Decision Index, read from local files as streams of tasks.

``discover(data_dir)`` finds each evaluation's file under a data directory (or takes explicit
paths), ``Suite`` streams their tasks with exclusion lists and a per-evaluation limit applied, and
reports the ``data`` block of summary.json (each file, its sha256 and row count).

Prompt version: ``PROMPT_VERSION`` names how states and questions are rendered (the loaders' state
and question texts, and each adapter's request rendering). It is part of every cache key and
recorded in summary.json; change it whenever a rendering changes, so old cache rows are never mixed
in.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING

from . import hle, omniscience, when2call, wildguardtest
from .check import check_file
from .exclusions import Exclusions
from .rows import DatasetError
from .task import CHOICE, YES_NO, Option, Question, Task

if TYPE_CHECKING:
    import polars as pl

log = logging.getLogger("dxi.data")
_warned: set[tuple[str, tuple[Path, ...]]] = set()  # each ambiguity is reported once per process

__all__ = [
    "EVALS",
    "PROMPT_VERSION",
    "DataFile",
    "DatasetError",
    "EvalData",
    "Exclusions",
    "Option",
    "Question",
    "Suite",
    "Task",
    "CHOICE",
    "YES_NO",
    "discover",
    "gold_frames",
]

PROMPT_VERSION = "dxi-prompt-1"


@dataclass(frozen=True, slots=True)
class EvalSpec:
    """How to find and read one evaluation: ``patterns`` are globs under the data directory, best
    first."""

    name: str
    title: str
    patterns: tuple[str, ...]
    load: Callable[..., Iterator[Task]]
    flag: str  # the command line's option naming its file: --<flag> FILE
    numbered: Callable[
        ..., Iterator[tuple[int, Task]]
    ]  # (row number, Task): for ``Suite.validate``
    id_field: str | None  # the row field the task id is made from (None: the row number)


EVALS: dict[str, EvalSpec] = {
    s.name: s
    for s in (
        EvalSpec(
            omniscience.NAME,
            "AA-Omniscience-Decision",
            omniscience.PATTERNS,
            omniscience.load,
            "omniscience",
            omniscience.numbered,
            "question_id",
        ),
        EvalSpec(hle.NAME, "HLE-MultiChoice", hle.PATTERNS, hle.load, "hle", hle.numbered, "id"),
        EvalSpec(
            when2call.NAME,
            "When2Call",
            when2call.PATTERNS,
            when2call.load,
            "when2call",
            when2call.numbered,
            "uuid",
        ),
        EvalSpec(
            wildguardtest.NAME,
            "WildGuardTest",
            wildguardtest.PATTERNS,
            wildguardtest.load,
            "wildguardtest",
            wildguardtest.numbered,
            None,
        ),
    )
}


@dataclass(frozen=True, slots=True)
class DataFile:
    """A dataset file as used: path, sha256 (hex) of its bytes, its row count and, for a file
    ``dxi data     fetch`` downloaded, ``source``: where from (``{"hf_repo", "revision",
    "requested_revision"}``: the hub repository, the commit it was fetched at, the revision asked
    for), read from the record ``<file>.dxi-source`` it wrote beside it (``evals.fetch``) when that
    record is of these bytes."""

    path: Path
    sha256: str
    rows: int
    source: dict | None = None

    @classmethod
    def inspect(cls, path: Path) -> DataFile:
        """Hash and count rows of ``path``; raises DatasetError when it cannot be read."""
        digest = hashlib.sha256()
        with path.open("rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
        suffix = path.suffix.lower()
        if suffix == ".parquet":
            import pyarrow.parquet as pq

            try:
                rows = pq.ParquetFile(path).metadata.num_rows
            except Exception as exc:
                raise DatasetError(
                    path, None, None, f"not a readable Parquet file ({exc})"
                ) from None
        elif suffix == ".json":
            import orjson

            try:
                doc = orjson.loads(path.read_bytes())
            except orjson.JSONDecodeError as exc:
                raise DatasetError(path, None, None, f"not valid JSON ({exc})") from None
            rows = len(doc) if isinstance(doc, list) else 0
        else:
            with path.open("rb") as f:
                rows = sum(1 for line in f if line.strip())
        return cls(path, digest.hexdigest(), rows, fetched_from(path, digest.hexdigest()))


INDEX_TASKS = {
    "aa_omniscience_decision": 500,
    "hle_multichoice": 513,
    "when2call": 3423,
    "wildguardtest": 835,
}
"""The tasks the published Decision Index scores per evaluation (seed methodology, "Artificial
Analysis Decision Indexの評価": 500 private questions, 513 of HLE's 2,500, 3,423 of When2Call's 3,652
after 229 ambiguous ones are dropped, 835 of WildGuardTest's 1,725 rows); a file with fewer rows is
a subset, which summary.json's ``data`` block notes (``Suite.data_block``).
``evals.fetch.HubFile.rows`` / ``tasks`` are what the hub's file holds and what the product's
default selection makes of it (no exclusion list)."""

# the record ``dxi data fetch`` writes beside a file (no data file pattern matches it)
SOURCE_SUFFIX = ".dxi-source"


def fetched_from(path: Path, sha256: str) -> dict | None:
    """Where ``path`` was fetched from, as ``dxi data fetch`` recorded it in ``<path>.dxi-source``
    (``{"hf_repo", "revision", "requested_revision"}``), or None: no record, an unreadable one, or
    one of other bytes (the file was replaced since: the record no longer describes it)."""
    import orjson

    record = path.with_name(path.name + SOURCE_SUFFIX)
    try:
        doc = orjson.loads(record.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    if not isinstance(doc, dict) or doc.get("sha256") != sha256:
        return None
    return {k: doc.get(k) for k in ("hf_repo", "revision", "requested_revision")}


@dataclass(frozen=True, slots=True)
class EvalData:
    """One evaluation's data: ``file`` when found, else ``missing`` says why."""

    name: str
    file: DataFile | None = None
    missing: str | None = None


def discover(
    data_dir: Path | None,
    paths: dict[str, Path] | None = None,
    selected: Iterable[str] | None = None,
) -> dict[str, EvalData]:
    """Find each evaluation's file: an explicit path in ``paths`` wins, else the first glob match
    under ``data_dir`` (``EvalSpec.patterns``, best first; ties broken by name). Returns every
    evaluation, in index order, with ``missing`` set where nothing was found. Raises
    FileNotFoundError for an explicit path that does not exist. With ``selected`` (evaluation
    names), the others are not looked at (a damaged file of an evaluation not selected stops
    nothing): they are missing, "not selected"."""
    paths = paths or {}
    found: dict[str, EvalData] = {}
    for name, spec in EVALS.items():
        if selected is not None and name not in selected:
            found[name] = EvalData(name, missing="not selected (--evals)")
            continue
        path = paths.get(name)
        if path is not None:
            if not path.is_file():
                raise FileNotFoundError(f"{spec.title} data file not found: {path}")
        elif data_dir is not None and data_dir.is_dir():
            candidates = list(
                dict.fromkeys(
                    m
                    for pattern in spec.patterns
                    for m in sorted(data_dir.glob(pattern))
                    if m.is_file()
                )
            )
            path = candidates[0] if candidates else None
            if len(candidates) > 1 and (name, tuple(candidates)) not in _warned:
                _warned.add((name, tuple(candidates)))
                log.warning(
                    f"{spec.title}: {len(candidates)} files under {data_dir} could be it "
                    f"({', '.join(str(c.relative_to(data_dir)) for c in candidates)}); using {path}. "
                    f"Name the one you mean with --{spec.flag} FILE."
                )
        if path is None:
            where = f"under {data_dir}" if data_dir is not None else "(no --data-dir given)"
            found[name] = EvalData(
                name,
                missing=f"no {spec.title} file {where} (looked for {', '.join(spec.patterns)})",
            )
        else:
            found[name] = EvalData(name, file=DataFile.inspect(path))
    return found


@dataclass(frozen=True, slots=True)
class Survey:
    """One pass over a suite's tasks (``Suite.survey``): ``tasks`` per selected evaluation, and the
    rows of ``gold_frames`` (``gold``: one tuple per question; ``categories``: one per When2Call
    option). Once ``Suite.gold_frames`` has made its frames of them, the suite keeps a Survey with
    ``gold`` and ``categories`` empty: as Python tuples they took several times the frames' memory
    (74 MB for 50,001 questions, held through scoring)."""

    tasks: dict[str, int]
    gold: list[tuple]
    categories: list[tuple]


@dataclass
class Suite:
    """The tasks of the evaluations found, as a re-readable stream.

    ``limit`` keeps the first N tasks of each evaluation (after exclusions); ``wildguard_subset`` is
    "agreed" (the default, all three agreement fields equal to 3) or "all". ``evals`` restricts the
    suite to some evaluations (the others are reported as not selected). ``runs`` (evaluation ->
    model label -> flags) says what each model's recorded runs selected of each evaluation where it
    is not what is scored (``runner.planning.selection``), shown in the data block; ``recorded``
    (evaluation -> model labels) the models whose recorded runs read it at all (so a missing answer
    of one whose runs selected exactly what is scored is not put down to other tasks run).
    """

    data: dict[str, EvalData]
    exclusions: Exclusions = field(default_factory=Exclusions)
    limit: int | None = None
    wildguard_subset: str = "agreed"
    evals: tuple[str, ...] | None = None
    runs: dict[str, dict[str, str]] = field(default_factory=dict, compare=False)
    recorded: dict[str, frozenset[str]] = field(default_factory=dict, compare=False)
    _survey: Survey | None = field(default=None, init=False, repr=False, compare=False)
    _gold: tuple[pl.DataFrame, pl.DataFrame] | None = field(
        default=None, init=False, repr=False, compare=False
    )
    _validated: bool = field(default=False, init=False, repr=False, compare=False)

    def validate(self) -> None:
        """Read every selected file whole, once per Suite (a fast pass, before a run's first
        request; the run still streams): raises DatasetError for a malformed row anywhere in a file,
        or for two rows that make one task id (naming both rows). Exclusions and ``limit`` do not
        apply: the file is checked, not the selection. The same pass makes the survey (``survey``:
        the selection's counts and gold rows), so the tasks need not be read again for it; not for a
        subclass that selects its tasks itself (``tasks`` overridden: a sample), which is surveyed
        by reading its ``tasks``."""
        if self._validated:
            return
        surveying = type(self).tasks is Suite.tasks and self._survey is None
        counts: dict[str, int] = {}
        gold: list[tuple] = []
        categories: list[tuple] = []
        for n in self.selected():
            data, spec = self.data[n], EVALS[n]
            kwargs = {"subset": self.wildguard_subset} if n == wildguardtest.NAME else {}
            counts[n] = 0
            passes = []

            def rows(n=n, spec=spec, kwargs=kwargs, passes=passes) -> Iterator[tuple[int, Task]]:
                first = (
                    surveying and not passes
                )  # check_file reads again only to name a repeated id
                passes.append(1)
                for row, task in spec.numbered(self.data[n].file.path, **kwargs):
                    if first and (self.limit is None or counts[n] < self.limit):
                        kept = self.exclusions.keep(task)
                        if kept is not None:
                            counts[n] += 1
                            _gold_rows(kept, gold, categories)
                    yield row, task

            check_file(data.file.path, rows, spec.id_field)
        if surveying:
            self._survey = Survey(counts, gold, categories)
        self._validated = True

    def selected(self) -> list[str]:
        """The evaluations that will be run and scored: selected and with data."""
        return [
            n
            for n, d in self.data.items()
            if d.file is not None and (self.evals is None or n in self.evals)
        ]

    def left_out(self) -> list[str]:
        """The evaluations of ``EVALS`` that ``evals`` does not select (none when it is None)."""
        return [n for n in EVALS if self.evals is not None and n not in self.evals]

    def not_run(self, selection: str = "--evals") -> dict[str, str]:
        """Every evaluation of ``EVALS`` that will not be run -> why: "left out by ``selection``"
        (what chose ``evals``: "--evals", or a run file's select) or why it has no data
        (``no_data``)."""
        return dict.fromkeys(self.left_out(), f"left out by {selection}") | self.no_data()

    def no_data(self) -> dict[str, str]:
        """The evaluations selected (every one of ``EVALS`` unless ``evals`` leaves it out) that
        have no data -> why (``EvalData.missing``: the file looked for and the folder; "no data"
        when unknown), in index order."""
        left_out = set(self.left_out())
        return {
            n: (self.data[n].missing if n in self.data else None) or "no data"
            for n in EVALS
            if n not in left_out and (n not in self.data or self.data[n].file is None)
        }

    def tasks(self, name: str | None = None) -> Iterator[Task]:
        """Stream the tasks of one evaluation, or of all selected ones in index order."""
        for n in [name] if name else self.selected():
            data = self.data[n]
            if data.file is None:
                continue
            kwargs = {"subset": self.wildguard_subset} if n == wildguardtest.NAME else {}
            stream = self.exclusions.apply(EVALS[n].load(data.file.path, **kwargs))
            yield from islice(stream, self.limit)

    def surveying(self, every: int = 256) -> Iterator[None]:
        """Read every task once, yielding ``None`` after each ``every`` tasks (so that an event loop
        can interleave the pass with its requests: ``dxi run`` does it while the first requests are
        on the wire), and keep what ``survey`` returns. Nothing to do when the survey is kept
        already. Raises what the task streams raise (``DatasetError``)."""
        if self._survey is not None:
            return
        counts: dict[str, int] = {}
        gold: list[tuple] = []
        categories: list[tuple] = []
        seen = 0
        for n in self.selected():
            counts[n] = 0
            for t in self.tasks(n):
                counts[n] += 1
                _gold_rows(t, gold, categories)
                seen += 1
                if seen % every == 0:
                    yield
        self._survey = Survey(counts, gold, categories)

    def survey(self) -> Survey:
        """The number of tasks of each selected evaluation and their gold rows, from one pass over
        the tasks (made the first time it is needed, then kept: the files are read once however
        often it is asked)."""
        for _ in self.surveying():
            pass
        assert self._survey is not None
        return self._survey

    def gold_frames(self) -> tuple[pl.DataFrame, pl.DataFrame]:
        """``gold_frames`` of this suite's tasks, from the kept survey (built once, then kept)."""
        if self._gold is None:
            s = self.survey()
            self._gold = _frames(s.gold, s.categories)
            self._survey = Survey(
                s.tasks, [], []
            )  # the rows are in the frames now (see ``Survey``)
        return self._gold

    def distinct_tasks(self) -> int | None:
        """The number of tasks, when the survey is kept already (``validate`` makes it) and no two
        of them share their digest (``Task.digest``: no two render to the same request); None
        otherwise (no survey kept: nothing is read here). Safe beside ``gold_frames`` on another
        thread (either of its forms is read)."""
        survey, frames = self._survey, self._gold
        if survey is None:
            return None
        n = sum(survey.tasks.values())
        if frames is None and survey.gold:
            digests = {(row[1], row[2]) for row in survey.gold}  # (task id, digest) per question
            return n if len({d for _, d in digests}) == len(digests) == n else None
        frames = frames if frames is not None else self._gold
        if frames is None:
            return None if n else 0
        tasks = frames[0].select("task_id", "task_digest").unique()
        return n if tasks["task_digest"].n_unique() == tasks.height == n else None

    def data_block(self) -> dict[str, dict]:
        """The ``data`` block of summary.json: per evaluation, the file used (path, sha256, rows
        and, for a file fetched from the hub, its ``hf_repo``, ``revision`` and
        ``requested_revision``) and the number of tasks, or the reason it is missing; ``runs`` where
        ``runs`` has it."""
        block: dict[str, dict] = {}
        for n, d in self.data.items():
            if self.evals is not None and n not in self.evals:
                block[n] = {"missing": "not selected (--evals)"}
                continue
            if d.file is None:
                block[n] = {"missing": d.missing}
                continue
            entry: dict = {
                "files": [
                    {
                        "path": str(d.file.path),
                        "sha256": d.file.sha256,
                        "rows": d.file.rows,
                        **(d.file.source or {}),
                    }
                ],
                "tasks": self.survey().tasks[n],
            }
            if self.limit is not None:
                entry["limit"] = self.limit
            if n == omniscience.NAME:
                entry["stand_in"] = omniscience.is_stand_in(d.file.path, d.file.sha256)
                entry["note"] = omniscience.provenance_note(entry["stand_in"])
            elif d.file.rows < INDEX_TASKS[n]:
                entry["note"] = subset_note(n, d.file.rows)
            if n == wildguardtest.NAME:
                entry["subset"] = self.wildguard_subset
            excluded = self.exclusions.summary(n)
            if excluded:
                entry["excluded"] = excluded
            if self.runs.get(n):
                entry["runs"] = dict(self.runs[n])
            block[n] = entry
        return block


def subset_note(name: str, rows: int) -> str:
    """What every report says of a file of evaluation ``name`` holding fewer rows (``rows``) than
    the published Decision Index scores (``INDEX_TASKS``), e.g. When2Call's 300-row LLM-as-judge
    file beside the 3,652-row MCQ set the index takes 3,423 tasks of."""
    return (
        f"The published Decision Index scores {INDEX_TASKS[name]:,} {EVALS[name].title} tasks; this file holds "
        f"{rows:,} rows, a subset, so results are not comparable to published numbers (`dxi data fetch` "
        "downloads the full set)."
    )


def gold_frames(tasks: Iterable[Task]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The gold labels of ``tasks`` as two frames.

    ``gold``: one row per question: eval, task_id, task_digest, question_id, kind ("choice" |
    "yes_no"), gold (option id or "yes"/"no"), group (HLE category, Omniscience domain or
    WildGuardTest subcategory), adversarial (WildGuardTest), task_id_digest (``Task.id_digest``: the
    digest older cache rows carry), answer_ids (``Question.answer_ids``, joined by
    ``ANSWER_IDS_SEP``: what scoring holds an answer read from the cache to). ``categories``:
    When2Call's option-to-reply- category map, one row per (task_id, option).
    """
    gold: list[tuple] = []
    categories: list[tuple] = []
    for t in tasks:
        _gold_rows(t, gold, categories)
    return _frames(gold, categories)


ANSWER_IDS_SEP = "\x1f"  # between a question's allowed answers in the gold frame's ``answer_ids``


def _gold_rows(t: Task, gold: list[tuple], categories: list[tuple]) -> None:
    """Append task ``t``'s rows of the two ``gold_frames``."""
    digest, id_digest = t.digest, t.id_digest
    group = t.meta.get("category") or t.meta.get("domain") or t.meta.get("subcategory")
    for q in t.questions:
        gold.append(
            (
                t.eval,
                t.id,
                digest,
                q.id,
                q.kind,
                t.gold[q.id],
                group,
                t.meta.get("adversarial"),
                id_digest,
                ANSWER_IDS_SEP.join(q.answer_ids),
            )
        )
    for option, category in (t.meta.get("categories") or {}).items():
        categories.append((t.id, option, category))


def _frames(gold: list[tuple], categories: list[tuple]) -> tuple[pl.DataFrame, pl.DataFrame]:
    # imported where scoring needs it: reading tasks (and `dxi --help`) does without
    import polars as pl

    gold_schema = {
        "eval": pl.String,
        "task_id": pl.String,
        "task_digest": pl.String,
        "question_id": pl.String,
        "kind": pl.String,
        "gold": pl.String,
        "group": pl.String,
        "adversarial": pl.Boolean,
        "task_id_digest": pl.String,
        "answer_ids": pl.String,
    }
    category_schema = {"task_id": pl.String, "option": pl.String, "category": pl.String}
    return (
        pl.DataFrame(gold, schema=gold_schema, orient="row"),
        pl.DataFrame(categories, schema=category_schema, orient="row"),
    )
