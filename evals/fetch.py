"""Fetching the evaluation data from the Hugging Face hub into a data directory, and verifying it.

``fetch(data_dir, source)`` downloads each public or gated evaluation file (huggingface_hub; the
``HF_TOKEN`` environment variable authorises gated sets such as ``cais/hle`` and
``allenai/wildguardmix``, whose terms must first be accepted on the hub) into the layout that
``evals.discover`` reads, then ``verify`` loads it with the product's own loaders and compares row
and task counts with the published ones. A ``revision`` (a branch, tag or commit; default the
repository's default branch) is first resolved to its commit, and every file is downloaded at that
commit; beside each file assembled, ``<file>.dxi-source`` records the repository, the commit and the
revision asked for, with the file's sha256, so summary.json can say which revision a number was
computed on (``evals.fetched_from``). ``Mirror(dir)`` reads a local directory laid out like the hub
(``<dir>/<owner>/<name>/<path in the repo>``) instead of the network: for machines without the hub,
and for the tests.

AA-Omniscience-Decision cannot be fetched: the published 500 questions are private. Any JSONL file
of the same shape works (see ``evals.omniscience``).
"""

from __future__ import annotations

import fnmatch
import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from . import (
    EVALS,
    INDEX_TASKS,
    SOURCE_SUFFIX,
    DataFile,
    DatasetError,
    Suite,
    discover,
    fetched_from,
    omniscience,
)

OMNISCIENCE_NOTE = (
    "not downloadable: the published AA-Omniscience-Decision questions are private; put a JSONL "
    "file of the same shape under omniscience*/ (the documentation's data page: docs/data.md)"
)


@dataclass(frozen=True, slots=True)
class HubFile:
    """Where one evaluation's file lives on the hub and what it should hold.

    ``patterns``: fnmatch patterns over the repository's file paths, best first (all files matching
    the first pattern that matches anything are taken, in name order); ``dest``: the path under the
    data directory; ``rows`` / ``tasks``: the published row count and the task count of the default
    subset.
    """

    eval: str
    repo_id: str
    patterns: tuple[str, ...]
    dest: str
    gated: bool
    rows: int
    tasks: int


HUB_FILES: dict[str, HubFile] = {
    f.eval: f
    for f in (
        HubFile(
            "hle_multichoice",
            "cais/hle",
            ("data/test-*.parquet", "test-*.parquet", "*test*.parquet"),
            "hle/hle_test.parquet",
            gated=True,
            rows=2500,
            tasks=513,
        ),
        HubFile(
            "when2call",
            "nvidia/When2Call",
            ("test/when2call_test_mcq.jsonl", "*when2call_test_mcq.jsonl"),
            "when2call/when2call_test_mcq.jsonl",
            gated=False,
            rows=3652,
            tasks=3652,
        ),
        HubFile(
            "wildguardtest",
            "allenai/wildguardmix",
            (
                "test/wildguardtest.parquet",
                "wildguardtest/test-*.parquet",
                "*wildguardtest*.parquet",
            ),
            "wildguardtest/wildguardtest.parquet",
            gated=True,
            rows=1725,
            tasks=880,
        ),
    )
}


class FetchError(Exception):
    """A file could not be fetched; the message says why and what to do (never includes a token)."""


class Source(Protocol):
    """Where dataset files come from. ``resolve`` turns a revision (None: the default branch) into
    the commit to fetch at (None when the source has no commits to name); ``list_files`` and
    ``download`` then read that commit."""

    def resolve(self, repo_id: str, revision: str | None) -> str | None: ...
    def list_files(self, repo_id: str, revision: str | None = None) -> list[str]: ...
    def download(self, repo_id: str, path: str, revision: str | None = None) -> Path: ...


class Hub:
    """The Hugging Face hub through huggingface_hub (``HF_TOKEN`` read from the environment).
    ``endpoint``: another hub (None: huggingface_hub's, ``HF_ENDPOINT``); ``cache_dir``: where
    downloads are kept (None: huggingface_hub's cache)."""

    def __init__(self, endpoint: str | None = None, cache_dir: Path | None = None) -> None:
        from huggingface_hub import HfApi
        from huggingface_hub.utils import logging as hf_logging

        # its retry warnings would repeat what FetchError says once
        hf_logging.set_verbosity_error()
        self.api = HfApi(endpoint=endpoint)
        self.endpoint, self.cache_dir = endpoint, cache_dir

    def _explain(self, repo_id: str, exc: Exception, revision: str | None = None) -> FetchError:
        from huggingface_hub import errors

        if isinstance(exc, errors.RevisionNotFoundError):
            return FetchError(
                f"{repo_id}: no revision {revision!r} on the hub (a branch, tag or commit of the dataset)"
            )
        gated = {f.repo_id: f.gated for f in HUB_FILES.values()}.get(repo_id, False)
        if isinstance(exc, errors.GatedRepoError) or (
            gated and isinstance(exc, errors.RepositoryNotFoundError)
        ):
            token = "HF_TOKEN is set" if os.environ.get("HF_TOKEN") else "HF_TOKEN is not set"
            return FetchError(
                f"{repo_id} is gated: accept its terms at https://huggingface.co/datasets/{repo_id} "
                f"and set HF_TOKEN to a token of that account ({token})"
            )
        if isinstance(exc, errors.RepositoryNotFoundError):
            return FetchError(f"{repo_id}: repository not found on the hub")
        return FetchError(
            f"{repo_id}: cannot reach the Hugging Face hub ({type(exc).__name__}); copy the files "
            "into a local mirror and use --mirror DIR"
        )

    def resolve(self, repo_id: str, revision: str | None) -> str | None:
        """The commit (sha) ``revision`` (None: the default branch) names now
        (``HfApi.dataset_info``)."""
        try:
            return self.api.dataset_info(repo_id, revision=revision).sha
        except (
            Exception
        ) as exc:  # huggingface_hub raises many types (HTTP, offline, auth, unknown revision)
            raise self._explain(repo_id, exc, revision) from None

    def list_files(self, repo_id: str, revision: str | None = None) -> list[str]:
        try:
            return self.api.list_repo_files(repo_id, repo_type="dataset", revision=revision)
        except Exception as exc:  # huggingface_hub raises many types (HTTP, offline, auth)
            raise self._explain(repo_id, exc, revision) from None

    def download(self, repo_id: str, path: str, revision: str | None = None) -> Path:
        from huggingface_hub import hf_hub_download

        try:
            return Path(
                hf_hub_download(
                    repo_id,
                    path,
                    repo_type="dataset",
                    revision=revision,
                    endpoint=self.endpoint,
                    cache_dir=self.cache_dir,
                )
            )
        except Exception as exc:
            raise self._explain(repo_id, exc, revision) from None


class Mirror:
    """A local directory laid out like the hub: ``<root>/<owner>/<name>/<path>`` (or
    ``<root>/datasets/...``)."""

    def __init__(self, root: Path):
        self.root = root

    def _repo(self, repo_id: str) -> Path:
        for base in (self.root / repo_id, self.root / "datasets" / repo_id):
            if base.is_dir():
                return base
        raise FetchError(
            f"{repo_id}: not in the mirror {self.root} (expected {self.root / repo_id}/)"
        )

    def resolve(self, repo_id: str, revision: str | None) -> str | None:
        """A mirror holds one state of each repository: ``revision`` as given (None: not named),
        unchecked."""
        self._repo(repo_id)
        return revision

    def list_files(self, repo_id: str, revision: str | None = None) -> list[str]:
        base = self._repo(repo_id)
        return sorted(str(p.relative_to(base)) for p in base.rglob("*") if p.is_file())

    def download(self, repo_id: str, path: str, revision: str | None = None) -> Path:
        return self._repo(repo_id) / path


@dataclass
class FetchResult:
    """What happened to one evaluation: ``status`` is "fetched", "present", "failed" or
    "unavailable"."""

    eval: str
    status: str
    message: str = ""
    file: DataFile | None = None
    tasks: int | None = None
    expected_rows: int | None = None
    expected_tasks: int | None = None

    @property
    def index_tasks(self) -> int | None:
        """The task count of the published Decision Index for this evaluation (``INDEX_TASKS``)."""
        return INDEX_TASKS.get(self.eval)

    def published(self) -> str:
        """The published counts, the file's and the index's: "file 3652 rows / 3652 tasks; index
        3423 tasks"."""
        parts = (
            []
            if self.expected_rows is None
            else [f"file {self.expected_rows} rows / {self.expected_tasks} tasks"]
        )
        if self.index_tasks is not None:
            parts.append(f"index {self.index_tasks} tasks")
        return "; ".join(parts)

    @property
    def counts_match(self) -> bool | None:
        """Whether the task count equals the published one (rows may differ: a pre-filtered
        file)."""
        if self.file is None or self.tasks is None or self.expected_tasks is None:
            return None
        return self.tasks == self.expected_tasks

    def note_counts(self) -> FetchResult:
        """Append to the message how the counts differ from the published ones, if they do."""
        if self.counts_match is False:
            self.message = "; ".join(
                filter(
                    None,
                    [
                        self.message,
                        (
                            f"published: {self.expected_rows} rows / {self.expected_tasks} tasks, here {self.file.rows} / "
                            f"{self.tasks} (another revision, or a subset)"
                        ),
                    ],
                )
            )
        return self


def _assemble(paths: list[Path], dest: Path) -> None:
    """Copy one file, or concatenate several Parquet shards, to ``dest`` atomically. Shards whose
    columns differ (a revision added one) are written under their unified schema, a column a shard
    lacks as nulls; FetchError when their columns cannot be unified. Nothing is left behind on
    failure."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.part")
    try:
        if len(paths) == 1:
            shutil.copyfile(paths[0], tmp)
        else:
            import pyarrow as pa
            import pyarrow.parquet as pq

            try:
                schema = pa.unify_schemas(
                    [pq.read_schema(p) for p in paths], promote_options="permissive"
                )
            except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
                raise FetchError(
                    f"the files {', '.join(p.name for p in paths)} have incompatible columns: {exc}"
                ) from None
            with pq.ParquetWriter(tmp, schema) as writer:
                for p in paths:
                    for batch in pq.ParquetFile(p).iter_batches():
                        have = set(batch.schema.names)
                        writer.write_table(
                            pa.Table.from_arrays(
                                [
                                    batch.column(f.name).cast(f.type)
                                    if f.name in have
                                    else pa.nulls(batch.num_rows, f.type)
                                    for f in schema
                                ],
                                schema=schema,
                            )
                        )
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)


def record_source(path: Path, repo_id: str, commit: str | None, asked: str | None) -> None:
    """Write ``<path>.dxi-source`` (``evals.SOURCE_SUFFIX``): the repository ``path`` was fetched
    from, the ``revision`` (commit) it was fetched at, the ``requested_revision``, and the sha256 of
    ``path``'s bytes (a record is only read for the bytes it describes: ``evals.fetched_from``).
    Written to a temporary name, then renamed."""
    import orjson

    record = path.with_name(path.name + SOURCE_SUFFIX)
    tmp = record.with_name(f".{record.name}.tmp")
    tmp.write_bytes(
        orjson.dumps(
            {
                "hf_repo": repo_id,
                "revision": commit,
                "requested_revision": asked,
                "sha256": DataFile.inspect(path).sha256,
            },
            option=orjson.OPT_INDENT_2,
        )
        + b"\n"
    )
    os.replace(tmp, record)


def verify(path: Path, name: str) -> tuple[DataFile, int]:
    """Load evaluation ``name`` from ``path`` with the product's loaders: ``(file, task count)`` in
    the default subset. Raises DatasetError (naming file, row and field) when a row is malformed or
    two rows make one task id (naming both), FileNotFoundError when the file is absent."""
    data = discover(None, {name: path})
    suite = Suite(data)
    suite.validate()  # every row, and no task id twice
    return data[name].file, sum(1 for _ in suite.tasks(name))


def fetch(
    data_dir: Path,
    source: Source,
    evals: Iterable[str] | None = None,
    force: bool = False,
    revisions: dict[str, str] | None = None,
) -> list[FetchResult]:
    """Fetch the selected evaluations into ``data_dir`` (a file already there is kept unless
    ``force``, or unless a revision is asked for that it was not fetched at), verify each, and
    return one FetchResult per evaluation. ``revisions`` maps an evaluation to the revision (branch,
    tag or commit) to fetch; the others get the default branch. Each file is fetched at the commit
    its revision resolves to, recorded beside it (``record_source``). Never raises for one
    evaluation's failure."""
    outcomes = []
    revisions = revisions or {}
    for name in evals or EVALS:
        spec = HUB_FILES.get(name)
        if spec is None:
            outcomes.append(FetchResult(name, "unavailable", OMNISCIENCE_NOTE))
            continue
        dest = data_dir / spec.dest
        status = "present"
        asked = revisions.get(name)
        try:
            fetched = (
                fetched_from(dest, DataFile.inspect(dest).sha256)
                if dest.exists() and asked
                else None
            )
            if (
                force
                or not dest.exists()
                or (
                    asked
                    and asked
                    not in {(fetched or {}).get(k) for k in ("revision", "requested_revision")}
                )
            ):
                commit = source.resolve(spec.repo_id, asked)
                files = source.list_files(spec.repo_id, commit)
                matched = next(
                    (
                        sorted(fnmatch.filter(files, p))
                        for p in spec.patterns
                        if fnmatch.filter(files, p)
                    ),
                    [],
                )
                if not matched:
                    raise FetchError(
                        f"{spec.repo_id}: no file matching {', '.join(spec.patterns)}"
                        + (f" at revision {asked}" if asked else "")
                    )
                _assemble([source.download(spec.repo_id, p, commit) for p in matched], dest)
                record_source(dest, spec.repo_id, commit, asked)
                status = "fetched"
            file, tasks = verify(dest, name)
        except (FetchError, DatasetError, FileNotFoundError) as exc:
            outcomes.append(
                FetchResult(
                    name, "failed", str(exc), expected_rows=spec.rows, expected_tasks=spec.tasks
                )
            )
            continue
        except (
            Exception
        ) as exc:  # anything else from one set (a file pyarrow cannot read): the others go on
            outcomes.append(
                FetchResult(
                    name,
                    "failed",
                    f"{type(exc).__name__}: {exc}",
                    expected_rows=spec.rows,
                    expected_tasks=spec.tasks,
                )
            )
            continue
        at = (
            f" at revision {file.source['revision']}"
            if file.source and file.source.get("revision")
            else ""
        )
        outcomes.append(
            FetchResult(
                name, status, f"from {spec.repo_id}{at}", file, tasks, spec.rows, spec.tasks
            ).note_counts()
        )
    return outcomes


def revisions(values: Iterable[str], evals: Iterable[str]) -> dict[str, str]:
    """``dxi data fetch --revision`` values as evaluation -> revision: ``EVAL=REV`` for one
    evaluation, a bare ``REV`` (a branch or tag every repository has, such as ``main``) for each of
    ``evals``; a later value wins. ValueError naming the value for an unknown evaluation or an empty
    revision."""
    out: dict[str, str] = {}
    for value in values:
        name, sep, rev = value.partition("=")
        if not sep:
            name, rev = "", value
        if name and name not in HUB_FILES:
            raise ValueError(
                f"--revision {value!r}: {name!r} is not an evaluation fetched from the hub "
                f"({', '.join(HUB_FILES)})"
            )
        if not rev.strip():
            raise ValueError(
                f"--revision {value!r}: no revision (a branch, tag or commit of the dataset)"
            )
        for e in [name] if name else [e for e in evals if e in HUB_FILES]:
            out[e] = rev.strip()
    return out


def check(data_dir: Path) -> list[FetchResult]:
    """Load every evaluation found in ``data_dir`` and compare its counts with the published
    ones."""
    outcomes = []
    for name, found in discover(data_dir).items():
        spec = HUB_FILES.get(name)
        rows, tasks = (spec.rows, spec.tasks) if spec else (None, None)
        if found.file is None:
            outcomes.append(
                FetchResult(name, "failed", found.missing, expected_rows=rows, expected_tasks=tasks)
            )
            continue
        try:
            file, n = verify(found.file.path, name)
        except DatasetError as exc:
            outcomes.append(
                FetchResult(name, "failed", str(exc), expected_rows=rows, expected_tasks=tasks)
            )
            continue
        note = (
            ""
            if spec is not None
            else omniscience.provenance_note(omniscience.is_stand_in(file.path, file.sha256))
        )
        outcomes.append(FetchResult(name, "present", note, file, n, rows, tasks).note_counts())
    return outcomes
