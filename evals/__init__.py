"""The four evaluations of the Decision Index, read from local files as streams of tasks.

``discover(data_dir)`` finds each evaluation's file under a data directory (or takes explicit paths),
``Suite`` streams their tasks with exclusion lists and a per-evaluation limit applied, and reports the
``data`` block of summary.json (each file, its sha256 and row count).

Prompt version: ``PROMPT_VERSION`` names how states and questions are rendered (the loaders' state and
question texts, and each adapter's request rendering). It is part of every cache key and recorded in
summary.json; change it whenever a rendering changes, so old cache rows are never mixed in.
"""
from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import partial
from itertools import islice
from pathlib import Path

import polars as pl

from . import hle, omniscience, when2call, wildguardtest
from .check import check_file
from .exclusions import Exclusions
from .rows import DatasetError
from .task import CHOICE, YES_NO, Option, Question, Task

log = logging.getLogger("dxi.data")
_warned: set[tuple[str, tuple[Path, ...]]] = set()  # each ambiguity is reported once per process

__all__ = ["EVALS", "PROMPT_VERSION", "DataFile", "DatasetError", "EvalData", "Exclusions", "Option",
           "Question", "Suite", "Task", "CHOICE", "YES_NO", "discover", "gold_frames"]

PROMPT_VERSION = "dxi-prompt-1"


@dataclass(frozen=True, slots=True)
class EvalSpec:
    """How to find and read one evaluation: ``patterns`` are globs under the data directory, best first."""

    name: str
    title: str
    patterns: tuple[str, ...]
    load: Callable[..., Iterator[Task]]
    flag: str  # the command line's option naming its file: --<flag> FILE
    numbered: Callable[..., Iterator[tuple[int, Task]]]  # (row number, Task): for ``Suite.validate``
    id_field: str | None  # the row field the task id is made from (None: the row number)


EVALS: dict[str, EvalSpec] = {
    s.name: s for s in (
        EvalSpec(omniscience.NAME, "AA-Omniscience-Decision", omniscience.PATTERNS, omniscience.load, "omniscience",
                 omniscience.numbered, "question_id"),
        EvalSpec(hle.NAME, "HLE-MultiChoice", hle.PATTERNS, hle.load, "hle", hle.numbered, "id"),
        EvalSpec(when2call.NAME, "When2Call", when2call.PATTERNS, when2call.load, "when2call", when2call.numbered,
                 "uuid"),
        EvalSpec(wildguardtest.NAME, "WildGuardTest", wildguardtest.PATTERNS, wildguardtest.load, "wildguardtest",
                 wildguardtest.numbered, None),
    )
}


@dataclass(frozen=True, slots=True)
class DataFile:
    """A dataset file as used: path, sha256 (hex) of its bytes, and its row count."""

    path: Path
    sha256: str
    rows: int

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
                raise DatasetError(path, None, None, f"not a readable Parquet file ({exc})") from None
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
        return cls(path, digest.hexdigest(), rows)


@dataclass(frozen=True, slots=True)
class EvalData:
    """One evaluation's data: ``file`` when found, else ``missing`` says why."""

    name: str
    file: DataFile | None = None
    missing: str | None = None


def discover(data_dir: Path | None, paths: dict[str, Path] | None = None) -> dict[str, EvalData]:
    """Find each evaluation's file: an explicit path in ``paths`` wins, else the first glob match under
    ``data_dir`` (``EvalSpec.patterns``, best first; ties broken by name). Returns every evaluation, in
    index order, with ``missing`` set where nothing was found. Raises FileNotFoundError for an explicit
    path that does not exist."""
    paths = paths or {}
    found: dict[str, EvalData] = {}
    for name, spec in EVALS.items():
        path = paths.get(name)
        if path is not None:
            if not path.is_file():
                raise FileNotFoundError(f"{spec.title} data file not found: {path}")
        elif data_dir is not None and data_dir.is_dir():
            candidates = list(dict.fromkeys(m for pattern in spec.patterns for m in sorted(data_dir.glob(pattern))
                                            if m.is_file()))
            path = candidates[0] if candidates else None
            if len(candidates) > 1 and (name, tuple(candidates)) not in _warned:
                _warned.add((name, tuple(candidates)))
                log.warning(f"{spec.title}: {len(candidates)} files under {data_dir} could be it "
                            f"({', '.join(str(c.relative_to(data_dir)) for c in candidates)}); using {path}. "
                            f"Name the one you mean with --{spec.flag} FILE.")
        if path is None:
            where = f"under {data_dir}" if data_dir is not None else "(no --data-dir given)"
            found[name] = EvalData(name, missing=f"no {spec.title} file {where} "
                                                  f"(looked for {', '.join(spec.patterns)})")
        else:
            found[name] = EvalData(name, file=DataFile.inspect(path))
    return found


@dataclass
class Suite:
    """The tasks of the evaluations found, as a re-readable stream.

    ``limit`` keeps the first N tasks of each evaluation (after exclusions); ``wildguard_subset`` is
    "agreed" (the default, all three agreement fields equal to 3) or "all". ``evals`` restricts the
    suite to some evaluations (the others are reported as not selected).
    """

    data: dict[str, EvalData]
    exclusions: Exclusions = field(default_factory=Exclusions)
    limit: int | None = None
    wildguard_subset: str = "agreed"
    evals: tuple[str, ...] | None = None
    _validated: bool = field(default=False, init=False, repr=False, compare=False)

    def validate(self) -> None:
        """Read every selected file whole, once per Suite (a fast pass, before a run's first request; the
        run still streams): raises DatasetError for a malformed row anywhere in a file, or for two rows
        that make one task id (naming both rows). Exclusions and ``limit`` do not apply: the file is
        checked, not the selection."""
        if self._validated:
            return
        for n in self.selected():
            data, spec = self.data[n], EVALS[n]
            kwargs = {"subset": self.wildguard_subset} if n == wildguardtest.NAME else {}
            check_file(data.file.path, partial(spec.numbered, data.file.path, **kwargs), spec.id_field)
        self._validated = True

    def selected(self) -> list[str]:
        """The evaluations that will be run and scored: selected and with data."""
        return [n for n, d in self.data.items() if d.file is not None and (self.evals is None or n in self.evals)]

    def tasks(self, name: str | None = None) -> Iterator[Task]:
        """Stream the tasks of one evaluation, or of all selected ones in index order."""
        for n in ([name] if name else self.selected()):
            data = self.data[n]
            if data.file is None:
                continue
            kwargs = {"subset": self.wildguard_subset} if n == wildguardtest.NAME else {}
            stream = self.exclusions.apply(EVALS[n].load(data.file.path, **kwargs))
            yield from islice(stream, self.limit)

    def data_block(self) -> dict[str, dict]:
        """The ``data`` block of summary.json: per evaluation, the file used (path, sha256, rows) and
        the number of tasks, or the reason it is missing."""
        block: dict[str, dict] = {}
        for n, d in self.data.items():
            if self.evals is not None and n not in self.evals:
                block[n] = {"missing": "not selected (--evals)"}
                continue
            if d.file is None:
                block[n] = {"missing": d.missing}
                continue
            entry: dict = {"files": [{"path": str(d.file.path), "sha256": d.file.sha256, "rows": d.file.rows}],
                           "tasks": sum(1 for _ in self.tasks(n))}
            if self.limit is not None:
                entry["limit"] = self.limit
            if n == omniscience.NAME:
                entry["stand_in"] = omniscience.is_stand_in(d.file.path, d.file.sha256)
                entry["note"] = omniscience.provenance_note(entry["stand_in"])
            if n == wildguardtest.NAME:
                entry["subset"] = self.wildguard_subset
            excluded = self.exclusions.summary(n)
            if excluded:
                entry["excluded"] = excluded
            block[n] = entry
        return block


GOLD_SCHEMA = {"eval": pl.String, "task_id": pl.String, "task_digest": pl.String, "question_id": pl.String,
               "kind": pl.String, "gold": pl.String, "group": pl.String, "adversarial": pl.Boolean,
               "task_id_digest": pl.String}
CATEGORY_SCHEMA = {"task_id": pl.String, "option": pl.String, "category": pl.String}


def gold_frames(tasks: Iterable[Task]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The gold labels of ``tasks`` as two frames.

    ``gold``: one row per question (``GOLD_SCHEMA``): eval, task_id, task_digest, question_id, kind
    ("choice" | "yes_no"), gold (option id or "yes"/"no"), group (HLE category, Omniscience domain or
    WildGuardTest subcategory), adversarial (WildGuardTest), task_id_digest (``Task.id_digest``: the digest
    older cache rows carry). ``categories``: When2Call's option-to-reply-
    category map, one row per (task_id, option).
    """
    gold, categories = [], []
    for t in tasks:
        digest, id_digest = t.digest, t.id_digest
        group = t.meta.get("category") or t.meta.get("domain") or t.meta.get("subcategory")
        for q in t.questions:
            gold.append((t.eval, t.id, digest, q.id, q.kind, t.gold[q.id], group, t.meta.get("adversarial"),
                         id_digest))
        for option, category in (t.meta.get("categories") or {}).items():
            categories.append((t.id, option, category))
    return (pl.DataFrame(gold, schema=GOLD_SCHEMA, orient="row"),
            pl.DataFrame(categories, schema=CATEGORY_SCHEMA, orient="row"))
