"""What ``dxi view`` shows, as queries over the scored answers and the cache: no HTML here.

Built once at start-up (``Browser.build``) from what ``dxi score`` computes (the summary and the
scored tables: one code path, nothing recomputed) and the cache, opened read-only. The scoring and
the writing of the snapshot run in a child process (``write_snapshot``; it scores one evaluation at
a time, ``runner.outputs.files.summarize``'s ``each``), which writes the files below and exits, so
that scoring's peak memory over a large cache is not held while serving:

* per evaluation and epoch, a *wide* frame in memory: one row per question (task id, question id,
  category, gold, the state's text for search) and per model its pick, status, whether it is
  correct, the probability it gave the gold answer, its confidence and calibration bin. The
  evaluation, compare and calibration pages are lazy Polars queries over these frames (filter, sort,
  slice).
* two Parquet files in the view's private folder (``view.home``; never in the cache), sorted by task
  id in small row groups, so that a question's rows are found by a lazy scan whose filter on
  ``task_id`` is pushed down to the row-group statistics: ``answers.parquet`` (the scored answers,
  the same rows and values as ``dxi score``'s answers.parquet) and ``requests.parquet`` (the cache
  rows of the current prompt version and tasks, without their nested answers). A question's current
  requests are then chosen by scoring's own selection (``scoring.pipeline.current_rows``).

Model labels are the summary's; in frames a model is its position ``i`` in that order (columns
``pick{i}``, ``status{i}``, ...), so untrusted names never become column names.

Why one module over 600 lines: ``Browser`` and ``write_snapshot`` are the two sides (the server's
queries, the child that writes what they read) of one set of files whose layout they must agree on.
"""

from __future__ import annotations

import contextlib
import functools
import math
import multiprocessing
import os
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np
import orjson
import polars as pl
import pyarrow.parquet as pq

from dxi.cache import Cache
from dxi.evals import EVALS, PROMPT_VERSION, Suite, Task, gold_frames
from dxi.scoring import adaptive, records, stopped_pairs
from dxi.scoring.calibration import ECE_BINS, answer_terms
from dxi.scoring.compare import open_counts
from dxi.scoring.cost import USAGE_COLUMNS, batch_price, known_cost
from dxi.scoring.pipeline import CONFIG_COLUMNS, STATUSES, current_rows
from dxi.scoring.records import Summary, unset
from dxi.scoring.simultaneous import mcnemar_p, worst_mcnemar
from dxi.scoring.sums import WILDGUARD

from .home import private_home

if TYPE_CHECKING:
    from dxi.cache.remote import Remote
    from dxi.scoring.scored import ScoredRun

PAGE_SIZE = 50
ROW_GROUP = 2_048  # rows per row group of the temporary files: a question's rows span one or two
NOT_ASKED = "not asked"  # a question an adaptive run never asked a model (no answer row of it)
VIEW_STATUSES = (
    *STATUSES,
    "repaired",
    NOT_ASKED,
)  # "repaired": ok, from JSON in a Markdown code fence (SPEC §6)
OPEN = ("failed", "missing")  # no reply: whatever it would have been (``scoring.provisional``)
SORTS = ("task", "category", "gold", "p_gold", "confidence")
CELLS = {
    "both_right": (True, True),
    "a_only": (True, False),
    "b_only": (False, True),
    "both_wrong": (False, False),
}
REQUEST_COLUMNS = (
    "key",
    "status",
    "error",
    "error_kind",
    "http_status",
    "attempts",
    "retry_waits_s",
    "raw_reply",
    "request_body",
    "served_model",
    *USAGE_COLUMNS,
    "latency_ms",
    "transport",
)
_REQUESTS_READ = (
    *CONFIG_COLUMNS,
    "sample",
    "task_id",
    "task_digest",
    "created_at",
    *REQUEST_COLUMNS,
)
WRITE_CHUNK = 8 * ROW_GROUP  # rows gathered and written at a time (``_write_by_task``)
# The start-up child's allocator: Polars' jemalloc (its options in ``_RJEM_MALLOC_CONF``) keeps
# freed pages for reuse 0.5 s and 1 s by Polars' defaults, so one step's temporary memory was still
# resident under the next step's. The child gives them back after 10 ms. Measured on bench_view's
# cache (child's peak, user + system CPU): Polars' defaults 933 MB; 10 ms 769 MB, 13.2 s; 0 ms 737
# MB, 16.6 s (every free returned at once costs ~4 s of system time, paid again at every rescoring
# while a run writes). With the evaluations scored one at a time, its threads' many arenas each kept
# their own freed pages: one arena for the child (``narenas:1``) measured 553 -> 496 MB at the same
# CPU time (13.4 s start-up; 0 ms decay instead: 486 MB, 20 s).
JEMALLOC_VAR = "_RJEM_MALLOC_CONF"
CHILD_JEMALLOC = "narenas:1,dirty_decay_ms:10,muzzy_decay_ms:0"
# NumPy's arrays come from glibc's malloc, whose threshold for giving a freed block straight back to
# the system grows with every large block freed (up to 32 MB), after which blocks of the bootstrap's
# size stay in its heap: a fixed threshold (glibc's ``MALLOC_MMAP_THRESHOLD_`` tunable, 128 KiB, its
# default start) returns them. Measured: 475-486 -> 455 MB.
CHILD_GLIBC = {"MALLOC_MMAP_THRESHOLD_": "131072"}
# requests.parquet is read from the cache in this many ranges of task ids (``_write_requests``)
REQUEST_PARTS = 8
WIDE_COLUMNS = (
    "eval",
    "sample",
    "task_id",
    "question_id",
    "group",
    "gold_category",
    "gold",
    "label",
    "predicted",
    "view_status",
    "correct",
    "p_gold",
    "p_predicted",
    "bin",
)  # what ``_wide`` reads
ANSWER_FILE_COLUMNS = (
    "label",
    "task_id",
    "question_id",
    "sample",
    "status",
    "error",
    "predicted",
    "gold",
    "correct",
    "p_predicted",
    "p_yes",
    "warning",
    "probabilities",
    "repaired",
)


class Summarize(Protocol):
    """How the view scores (``runner.outputs.files.summarize``): the cache (opened read-only), the
    suite, the models (``scoring.MODELS_SCHEMA`` rows), ``requests`` (None: counted from the cache),
    the run's epochs, the prices (label -> USD per million input and output tokens) and ``each``
    (called with each evaluation's answers frame, one at a time) -> the summary and the scored
    tables (without answers)."""

    def __call__(
        self,
        cache: Cache,
        suite: Suite,
        models: pl.DataFrame,
        requests: dict[str, dict] | None,
        epochs: int = 1,
        *,
        prices: dict[str, tuple[float, float] | None] | None = None,
        each: Callable[[pl.DataFrame], None] | None = None,
    ) -> ScoredRun: ...


class NotFound(LookupError):
    """An unknown evaluation, task, model or bin: the page answers 404 with this message."""


class BadQuery(ValueError):
    """A malformed query parameter (a page that is not a number, an unknown sort): 400 with this
    message."""


@dataclass(frozen=True)
class EvalQuery:
    """The evaluation page's filters (all optional), as its URL gives them.

    ``model`` is the model ``status`` and ``result`` apply to (None: any model); ``result`` is
    "right" or "wrong"; ``a`` and ``b`` (both or neither) keep the questions where the two models'
    picks differ; ``category`` an exact category; ``text`` a case-insensitive search in the task id
    and state; ``sort`` one of ``SORTS`` ("task": the dataset's order; ``p_gold`` and ``confidence``
    are ``model``'s, else the first model's; ties in the dataset's order); ``page`` 1-based;
    ``epoch`` 0-based."""

    model: str | None = None
    status: str | None = None
    result: str | None = None
    a: str | None = None
    b: str | None = None
    category: str | None = None
    text: str | None = None
    sort: str = "task"
    desc: bool = False
    page: int = 1
    epoch: int = 0


@dataclass
class Page:
    """One page of question rows: ``rows`` (dicts), ``total`` matching, ``page`` / ``pages``
    (1-based)."""

    rows: list[dict]
    total: int
    page: int
    pages: int
    size: int = PAGE_SIZE


# the cache -> (models, prices, epochs) to score, and optionally the suite (the tasks the runs
# selected: ``runner.planning.selection``)
Select = Callable[[Cache], tuple]
# (suite, models, epochs) -> what open batches of the cache's ledger hold of the answers missing,
# per label (``runner.rescore.in_open_batches``; None: none)
Held = Callable[[Suite, pl.DataFrame, int], dict | None]


@dataclass
class Source:
    """What a Browser was built from, to build it again over newer rows (``Browser.rebuild``): the
    cache folder, the suite, ``summarize``, ``home`` (the view's private folder, ``view.home``; the
    snapshots and the remote's mirror go there), ``remote`` (the remote cache tier, mirrored under
    ``home``, or None), ``select`` (models, prices and epochs from the cache, and optionally the
    suite: every model in it is chosen again, so that a model a run adds shows, with the tasks its
    run selected; None: the models given at start-up) and ``ranked`` (no run file or ``--model``
    gave the models' order: they are shown by Decision Index, ``Summary.order``, as ``dxi report``
    shows them), ``held`` (asked in this process before each snapshot: what the cache's open
    batches hold of the answers missing, scored with them as ``dxi score`` scores them, so the
    overview's provisional note says which of them the next run collects and which it asks for
    again, ``scoring.provisional``; None: nothing asked)."""

    cache_dir: Path
    suite: Suite
    summarize: Summarize
    home: tempfile.TemporaryDirectory
    models: pl.DataFrame
    epochs: int
    prices: dict[str, tuple[float, float] | None]
    remote: Remote | None = None
    select: Select | None = None
    ranked: bool = False
    owns_home: bool = False  # the home was made for this Browser alone: ``close`` removes it too
    held: Held | None = None

    def mirror(self) -> tuple[str, Path] | None:
        """The remote tier for the child: (its URI, the mirror folder), or None."""
        return None if self.remote is None else (self.remote.uri, self.remote.mirror)


@dataclass
class Browser:
    """The data behind every page (see the module docstring). Build with ``Browser.build``;
    ``close`` removes its snapshot. ``snapshot_peak_mb`` is the start-up child's peak resident set
    (MB); ``as_of`` the time (Unix seconds) the cache was read for this snapshot; ``source`` what
    ``rebuild`` reads again."""

    summary: Summary
    labels: list[str]
    tasks: dict[str, Task]
    models: pl.DataFrame
    epochs: int
    model_epochs: dict[str, int]
    prices: dict[str, tuple[float, float] | None]
    reliability: pl.DataFrame
    wide: dict[tuple[str, int], pl.DataFrame]
    categories: dict[str, list[str]]
    workdir: tempfile.TemporaryDirectory
    cache_dir: str
    warnings: list[str] = field(default_factory=list)
    snapshot_peak_mb: float | None = None
    as_of: float = 0.0
    source: Source | None = None

    # ---- building -------------------------------------------------------------------------------
    @classmethod
    def build(
        cls,
        cache_dir: Path,
        suite: Suite,
        models: pl.DataFrame,
        summarize: Summarize,
        epochs: int = 1,
        prices: dict[str, tuple[float, float] | None] | None = None,
        child: bool = True,
        home: tempfile.TemporaryDirectory | None = None,
        remote: Remote | None = None,
        select: Select | None = None,
        ranked: bool = False,
        held: Held | None = None,
    ) -> Browser:
        """Score ``models`` over ``suite`` from the cache in ``cache_dir`` (opened read-only; with
        the ``remote`` tier's shards mirrored in ``home``) with ``summarize``
        (``runner.outputs.files.summarize``: what ``dxi score`` computes) and lay the results out
        for the pages (``write_snapshot``) in a new folder of ``home`` (the view's private folder,
        ``view.home.private_home``; None: one made for this Browser). With ``child`` (the default)
        that runs in a child process, so that scoring's peak memory over a large cache is returned
        to the system before serving; the server keeps only the summary, the per-question frames and
        the tasks. ``select`` is kept for ``rebuild``. ``ranked``: no order of the models was given,
        every page shows them by Decision Index (``Summary.order``: the report's order). ``held``:
        what the cache's open batches hold of the answers missing (``Source.held``), asked before
        each snapshot."""
        owns = home is None
        source = Source(
            Path(cache_dir),
            suite,
            summarize,
            home or private_home(),
            models,
            epochs,
            prices or {},
            remote,
            select,
            ranked,
            owns,
            held,
        )
        try:
            return cls._built(source, child)
        except BaseException:
            if owns:
                source.home.cleanup()
            raise

    @classmethod
    def _built(cls, source: Source, child: bool) -> Browser:
        workdir = tempfile.TemporaryDirectory(prefix="snapshot-", dir=source.home.name)
        as_of = time.time()
        summarize = source.summarize
        if source.held is not None and (
            held := source.held(source.suite, source.models, source.epochs)
        ):  # (a partial of the module-level summarize: the spawned child gets it pickled)
            summarize = functools.partial(summarize, in_open_batches=held)
        args = (
            Path(workdir.name),
            source.cache_dir,
            source.suite,
            source.models,
            summarize,
            source.epochs,
            source.prices,
            source.mirror(),
            source.ranked,
        )
        try:
            if child:
                with (
                    ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool,
                    _child_env(),
                ):
                    peak = pool.submit(write_snapshot, *args).result()
            else:
                peak = write_snapshot(*args)
            browser = cls.open(
                workdir,
                source.suite.tasks(),
                source.models,
                source.epochs,
                source.prices,
                str(source.cache_dir),
                peak,
            )
        except BaseException:
            workdir.cleanup()
            raise
        browser.as_of, browser.source = as_of, source
        return browser

    def rebuild(self, child: bool = True) -> Browser:
        """A new Browser over the cache as it is now (newer shards and logs; the remote's shards
        pulled first), in the same private folder; this one is left as it is (``close`` it when
        done). With ``source.select`` the models are chosen again."""
        source = self.source
        if source is None:
            raise RuntimeError(
                "this Browser was opened from a snapshot, not built: nothing to rebuild from"
            )
        if source.remote is not None:
            source.remote.pull()
        if source.select is not None:
            with Cache(source.cache_dir, read_only=True, remote=source.remote) as cache:
                models, prices, epochs, *suite = source.select(cache)
            source = replace(
                source,
                models=models,
                prices=prices,
                epochs=epochs,
                suite=suite[0] if suite else source.suite,
            )
        return type(self)._built(source, child)

    @classmethod
    def open(
        cls,
        workdir: tempfile.TemporaryDirectory,
        tasks: Iterable[Task],
        models: pl.DataFrame,
        epochs: int,
        prices: dict[str, tuple[float, float] | None],
        cache_dir: str,
        peak: float | None = None,
    ) -> Browser:
        """The Browser over a folder ``write_snapshot`` wrote."""
        root = Path(workdir.name)
        meta = orjson.loads((root / "meta.json").read_bytes())
        summary = records.decode(meta["summary"])
        wide, categories = {}, {}
        for name, sample in meta["frames"]:
            frame = pl.read_parquet(root / f"wide-{name}-{sample}.parquet")
            wide[(name, sample)] = frame
            categories.setdefault(name, sorted(frame["category"].drop_nulls().unique().to_list()))
        return cls(
            summary,
            summary.labels,
            {t.id: t for t in tasks},
            models,
            epochs,
            {m.model: m.epochs for m in summary.models},
            prices,
            pl.read_parquet(root / "reliability.parquet"),
            wide,
            categories,
            workdir,
            cache_dir,
            meta["warnings"],
            peak,
        )

    def close(self) -> None:
        """Remove this snapshot's folder (and the private folder, when it was made for this
        Browser)."""
        self.workdir.cleanup()
        if self.source is not None and self.source.owns_home:
            self.source.home.cleanup()

    # ---- lookups --------------------------------------------------------------------------------
    @property
    def evals(self) -> list[str]:
        """The evaluations with answers, in index order."""
        present = {name for name, _ in self.wide}
        return [name for name in EVALS if name in present]

    def model(self, label: str | None, what: str = "model") -> int | None:
        """The position of ``label`` (None for None); NotFound for a label not in this view."""
        if label is None:
            return None
        try:
            return self.labels.index(label)
        except ValueError:
            raise NotFound(f"no {what} {label!r} in this view") from None

    def frame(self, name: str, epoch: int = 0) -> pl.DataFrame:
        """The wide frame of ``name`` and ``epoch``; one with no rows for an evaluation with no
        answers in this view (``absent`` says why: its pages show that, with nothing to list).
        NotFound for an unknown evaluation, or an epoch an evaluation with answers does not have."""
        if name not in EVALS:
            raise NotFound(f"no evaluation {name!r}")
        frame = self.wide.get((name, epoch))
        if frame is None:
            if (name, 0) in self.wide:
                raise NotFound(f"{EVALS[name].title}: no answers for epoch {epoch}")
            return self._no_rows()
        return frame

    def absent(self, name: str) -> str | None:
        """Why evaluation ``name`` has no answers in this view (not selected, no data, nothing in
        the cache yet), or None when it has answers (or is no evaluation)."""
        if name not in EVALS or (name, 0) in self.wide:
            return None
        data = self.summary.data.get(name) or {}
        if data.get("missing"):
            return f"no answers in this view: {data['missing']}"
        if not self.labels:
            return "no answers in this view: the cache holds none of this prompt version yet"
        return "no answers in this view: the cache holds none for these models and tasks yet"

    def _no_rows(self) -> pl.DataFrame:
        """A wide frame (``_wide``'s columns for this view's models) with no rows."""
        schema = {
            "task_id": pl.String,
            "question_id": pl.String,
            "category": pl.Categorical,
            "gold": pl.Categorical,
            "order": pl.UInt32,
            "text": pl.String,
        }
        for i in range(len(self.labels)):
            schema |= {
                f"pick{i}": pl.String,
                f"status{i}": pl.String,
                f"correct{i}": pl.Boolean,
                f"pgold{i}": pl.Float64,
                f"conf{i}": pl.Float64,
                f"bin{i}": pl.Int8,
            }
        return pl.DataFrame(schema=schema)

    @property
    def calibrated(self) -> set[str]:
        """The models with a reliability diagram (those that returned probabilities)."""
        return set(self.reliability["label"].to_list())

    def epochs_of(self, name: str) -> list[int]:
        return sorted(s for n, s in self.wide if n == name)

    # ---- the evaluation page ---------------------------------------------------------------------
    def evaluation(self, name: str, q: EvalQuery) -> Page:
        """One page of ``name``'s questions under the filters of ``q``."""
        frame = self.frame(name, q.epoch)
        m, a, b = self.model(q.model), self.model(q.a), self.model(q.b)
        conditions = []
        models = [m] if m is not None else list(range(len(self.labels)))
        if q.status is not None:
            if q.status not in VIEW_STATUSES:
                raise BadQuery(f"status must be one of {', '.join(VIEW_STATUSES)}")
            conditions.append(
                pl.any_horizontal(
                    pl.lit(False), *(pl.col(f"status{i}") == q.status for i in models)
                )
            )
        if q.result is not None:
            if q.result not in ("right", "wrong"):
                raise BadQuery("result must be right or wrong")
            right = [pl.col(f"correct{i}") for i in models]
            conditions.append(
                pl.any_horizontal(
                    pl.lit(False), *(right if q.result == "right" else (~c for c in right))
                )
            )
        if (a is None) != (b is None):
            raise BadQuery("a disagreement needs two models: a and b")
        if a is not None:
            conditions.append(pl.col(f"pick{a}").ne_missing(pl.col(f"pick{b}")))
        if q.category:
            conditions.append(pl.col("category") == q.category)
        if q.text:
            conditions.append(pl.col("text").str.contains(q.text.lower(), literal=True))
        return self._page(frame, conditions, q.sort, q.desc, q.page, m)

    def _page(
        self,
        frame: pl.DataFrame,
        conditions: list[pl.Expr],
        sort: str,
        desc: bool,
        page: int,
        m: int | None,
    ) -> Page:
        if sort not in SORTS:
            raise BadQuery(f"sort must be one of {', '.join(SORTS)}")
        if page < 1:
            raise BadQuery("page must be at least 1")
        then = [
            "order",
            "question_id",
        ]  # "task": the dataset's order (wildguardtest/9 before wildguardtest/10)
        by = {
            "task": then,
            "category": ["category", *then],
            "gold": ["gold", *then],
            "p_gold": [f"pgold{m or 0}", *then],
            "confidence": [f"conf{m or 0}", *then],
        }[sort]
        lf = frame.lazy()
        if conditions:
            lf = lf.filter(pl.all_horizontal(conditions))
        matched = lf.select(pl.len()).collect().item()
        pages = max(1, math.ceil(matched / PAGE_SIZE))
        rows = (
            lf.sort(by, descending=desc, nulls_last=True, maintain_order=True)
            .slice((page - 1) * PAGE_SIZE, PAGE_SIZE)
            .collect()
        )
        return Page(self._rows(rows), matched, page, pages)

    def _rows(self, rows: pl.DataFrame) -> list[dict]:
        out = []
        for r in rows.iter_rows(named=True):
            cells = [
                {
                    "pick": r[f"pick{i}"],
                    "status": r[f"status{i}"],
                    "correct": r[f"correct{i}"],
                    "p_gold": r[f"pgold{i}"],
                    "confidence": r[f"conf{i}"],
                }
                for i in range(len(self.labels))
            ]
            task = self.tasks.get(r["task_id"])
            out.append(
                {
                    "task_id": r["task_id"],
                    "question_id": r["question_id"],
                    "category": r["category"],
                    "gold": r["gold"],
                    "models": cells,
                    "headline": task.headline if task is not None else "",
                }
            )
        return out

    # ---- compare ---------------------------------------------------------------------------------
    def compare(
        self, name: str, a: str, b: str, epoch: int = 0, cell: str | None = None, page: int = 1
    ) -> tuple[dict[str, int], Page]:
        """Models ``a`` and ``b`` over ``name``: the 2×2 of right/wrong counts (``CELLS`` keys;
        ``open``: how many of its questions have a failed or missing answer of either, counted in it
        as not right; ``mcnemar_p``: the exact McNemar test of its discordant cells,
        ``scoring.compare.mcnemar_p``, or where ``open`` is not 0 the largest p any outcome of those
        answers could give (``scoring.compare.worst_mcnemar``, as summary.json's ``mcnemar_p``), for
        a choice evaluation, None for a yes/no one, whose rows hold several answers that are not
        independent pairs; ``one_asked``: the questions an adaptive run asked only one of them) and
        a page of the questions where one is right and the other wrong (``cell``: only those of one
        cell), both over the questions both were asked (a question an adaptive run did not ask one
        of them is in neither)."""
        frame = self.frame(name, epoch)
        i, j = self.model(a), self.model(b)
        a_asked, b_asked = pl.col(f"correct{i}").is_not_null(), pl.col(f"correct{j}").is_not_null()
        both = frame.filter(a_asked & b_asked)  # (an adaptive run's parts: ``_wide``)
        counts = (
            both.group_by(pl.col(f"correct{i}").alias("a"), pl.col(f"correct{j}").alias("b"))
            .len()
            .iter_rows()
        )
        table: dict = dict.fromkeys(CELLS, 0)
        by_pair = {pair: cell_name for cell_name, pair in CELLS.items()}
        for x, y, n in counts:
            table[by_pair[(bool(x), bool(y))]] += n
        table["one_asked"] = frame.filter(a_asked != b_asked).height
        is_open = np.stack([both[f"status{k}"].is_in(OPEN).to_numpy() for k in (i, j)])
        table["open"] = int(is_open.any(axis=0).sum())
        if name == WILDGUARD:
            table["mcnemar_p"] = None
        elif table["open"]:  # summary.json's counts (scoring.compare), of a (row 0) and b (row 1)
            right = np.stack([both[f"correct{k}"].to_numpy() for k in (i, j)]) & ~is_open
            o = open_counts(right, ~right & ~is_open, is_open)  # [k, 0, 1] a's side, [k, 1, 0] b's
            worst = worst_mcnemar(o[0, :1, 1], o[0, 1:, 0], o[1, :1, 1], o[1, 1:, 0], o[2, :1, 1])
            table["mcnemar_p"] = float(worst[0])
        else:
            table["mcnemar_p"] = float(
                mcnemar_p(np.array([table["a_only"]]), np.array([table["b_only"]]))[0]
            )
        if cell is not None and cell not in CELLS:
            raise BadQuery(f"cell must be one of {', '.join(CELLS)}")
        if cell is None:
            conditions = [pl.col(f"correct{i}") != pl.col(f"correct{j}")]
        else:
            x, y = CELLS[cell]
            conditions = [pl.col(f"correct{i}") == x, pl.col(f"correct{j}") == y]
        return table, self._page(frame, conditions, "task", False, page, i)

    def differences(self, name: str, a: str, b: str) -> list[dict]:
        """The summary's paired comparisons of ``a`` and ``b`` (``scoring.compare``): the Decision
        Index's and each metric of ``name``'s, as a − b (an entry stored as b − a is turned round):
        ``metric``, ``eval``, ``difference``, ``ci``, ``p_value``, ``p_adjusted``, ``significant``,
        ``complete`` and, for accuracy, ``discordant`` [a only, b only] and ``mcnemar_p``; where a
        figure is provisional, ``settled`` (false: its failed and missing answers could overturn the
        difference, which is not claimed, ``scoring.bounds``) and ``bounds`` {"a": [lowest,
        highest], "b": [...]} (a complete figure's [value, value]); in an adaptive run's summary
        ``claim`` and, for a pair with an estimate, ``settled``, the index's ``anytime_ci`` and
        ``fixed_sample_significant`` (``scoring.stopped_pairs``), and ``said``: for such a pair
        not claimed, the p-value and which half of its claim failed (``stopped_pairs.said``),
        else None. Empty for a model compared with itself."""
        self.model(a), self.model(b)
        out = []
        for comparison in unset(self.summary.comparisons) or []:
            if (
                comparison.eval not in (None, name)
                or {comparison.a, comparison.b} != {a, b}
                or a == b
            ):
                continue
            c = records.to_builtins(comparison)
            if not c["complete"]:
                c["bounds"] = {
                    "a": self._bounds(a, comparison.eval, comparison.metric),
                    "b": self._bounds(b, comparison.eval, comparison.metric),
                }
            # an adaptive run's pair not claimed: which half failed (``stopped_pairs.said``)
            c["said"] = stopped_pairs.said(c, turned=c["a"] != a)
            if c["a"] == a:
                out.append(c)
                continue
            turned = dict(
                c,
                a=a,
                b=b,
                difference=0.0 - c["difference"],  # never −0.0
                ci=[-c["ci"][1], -c["ci"][0]] if c.get("ci") else c.get("ci"),
            )
            if "discordant" in c:
                turned["discordant"] = c["discordant"][::-1]
            if c.get("anytime_ci"):
                turned["anytime_ci"] = [0.0 - c["anytime_ci"][1], 0.0 - c["anytime_ci"][0]]
            out.append(turned)
        return out

    def _bounds(self, label: str, name: str | None, metric: str) -> list[float] | None:
        """A figure's bounds in the summary (``scoring.bounds``): a provisional one's [lowest,
        highest], a complete one's [value, value]; None when it is null."""
        entry = next(m for m in self.summary.models if m.model == label)
        if name is None:
            value, bounds = entry.decision_index, unset(entry.decision_index_bounds)
        else:
            block = entry.evals.get(name, {})
            value, bounds = block.get(metric), block.get(f"{metric}_bounds")
        return None if value is None else (list(bounds) if bounds is not None else [value, value])

    # ---- calibration -----------------------------------------------------------------------------
    def reliability_bins(self, label: str) -> dict[str, list[dict]]:
        """Per evaluation, ``label``'s reliability-diagram bins (``scoring``'s table: low, high, n,
        confidence, accuracy), empty bins left out; evaluations without probabilities are absent."""
        self.model(label)
        bins = self.reliability.filter(pl.col("label") == label)
        return {
            name: bins.filter(pl.col("eval") == name).sort("bin").to_dicts()
            for name in EVALS
            if not bins.filter(pl.col("eval") == name).is_empty()
        }

    def in_bin(self, name: str, label: str, b: int, epoch: int = 0, page: int = 1) -> Page:
        """The questions whose answer by ``label`` falls in confidence bin ``b`` (0..ECE_BINS-1)."""
        if not 0 <= b < ECE_BINS:
            raise NotFound(f"no confidence bin {b} (bins are 0 to {ECE_BINS - 1})")
        frame = self.frame(name, epoch)
        i = self.model(label)
        return self._page(frame, [pl.col(f"bin{i}") == b], "confidence", True, page, i)

    # ---- the question page -----------------------------------------------------------------------
    def question(self, task_id: str) -> dict:
        """Everything about one task: the task, and per model and epoch its answers (with every
        option's probability, in the question's option order) and its request (the current cache
        row; ``set_aside``: none, its row was in a shard the cache set aside as damaged)."""
        task = self.tasks.get(task_id)
        if task is None:
            raise NotFound(f"no task {task_id!r} in this view")
        root = Path(self.workdir.name)
        ans = (
            pl.scan_parquet(root / "answers.parquet").filter(pl.col("task_id") == task_id).collect()
        )
        gold, _ = gold_frames([task])
        requests = current_rows(
            pl.scan_parquet(root / "requests.parquet").filter(pl.col("task_id") == task_id),
            self.models,
            gold,
            self.epochs,
            REQUEST_COLUMNS,
        )
        by_request = {(r["label"], r["sample"]): r for r in requests.iter_rows(named=True)}
        aside = root / "aside.parquet"  # rows the cache set aside as damaged: told, never shown
        damaged = (
            {
                (r["label"], r["sample"])
                for r in current_rows(
                    pl.scan_parquet(aside).filter(pl.col("task_id") == task_id),
                    self.models,
                    gold,
                    self.epochs,
                    ("status",),
                ).iter_rows(named=True)
            }
            if aside.exists()
            else set()
        )
        by_answer: dict[tuple[str, int], dict[str, dict]] = {}
        for r in ans.iter_rows(named=True):
            by_answer.setdefault((r["label"], r["sample"]), {})[r["question_id"]] = r
        # a model an adaptive run asked part of the set: the answers hold only its part
        # (``scoring.adaptive.asked_part``), so a task with no row of it was never asked
        part_asked = {m.model for m in self.summary.models if adaptive.estimated(self.summary, m)}
        ran = {r["label"] for r in ans.iter_rows(named=True)}
        models = []
        for label in self.labels:
            unasked = label in part_asked and label not in ran
            epochs = []
            for sample in range(self.model_epochs.get(label, self.epochs)):
                answers = by_answer.get((label, sample), {})
                request = by_request.get((label, sample))
                epochs.append(
                    {
                        "sample": sample,
                        "answers": [_answer(q, answers.get(q.id), unasked) for q in task.questions],
                        "request": _request(request, self.prices.get(label)) if request else None,
                        "unasked": unasked,
                        "set_aside": request is None and (label, sample) in damaged,
                    }
                )
            models.append({"label": label, "epochs": epochs})
        return {"task": task, "gold": task.gold, "models": models, "prompt_version": PROMPT_VERSION}


def write_snapshot(
    root: Path,
    cache_dir: Path,
    suite: Suite,
    models: pl.DataFrame,
    summarize: Summarize,
    epochs: int,
    prices: dict[str, tuple[float, float] | None],
    mirror: tuple[str, Path] | None = None,
    ranked: bool = False,
) -> float:
    """Score (``summarize``) and write what the pages read to ``root``: ``meta.json`` (the summary,
    the cache's warnings, the frames written), ``reliability.parquet``,
    ``wide-<eval>-<epoch>.parquet``, the two files sorted by task id (``answers.parquet``,
    ``requests.parquet``) and ``aside.parquet`` (the request columns of the rows the cache set aside
    as damaged: ``cache.aside``). Returns this process's peak resident set in MB. The cache is
    opened read-only, with the shards of a remote tier that ``mirror`` (its URI, the folder they
    were pulled into) holds. The models are in the summary's order, or with ``ranked`` in the
    report's by Decision Index (``Summary.order``).

    The evaluations are scored one at a time (``summarize``'s ``each``): each one's answers are
    written to answers.parquet (in evaluation order, so the file stays sorted by task id) and its
    columns of the evaluation pages to a ``narrow-<eval>.parquet`` before the next one is read; the
    wide frames are made from those once the summary gives the models' order."""
    remote = None
    if mirror is not None:
        from dxi.cache.remote import Remote

        remote = Remote(mirror[0], cache_dir, mirror[1])
    answers_file: list[pq.ParquetWriter | None] = [None]
    narrow: list[str] = []

    def each(ans: pl.DataFrame) -> None:
        terms = answer_terms(ans)
        ans = ans.with_columns(
            pl.Series("p_gold", terms["p_gold"]).fill_nan(
                None
            ),  # calibration's, not computed again
            pl.Series("bin", terms["bin"], dtype=pl.Int8),
            pl.when(pl.col("repaired") & (pl.col("status") == "ok"))
            .then(pl.lit("repaired"))
            .otherwise(pl.col("status"))
            .alias("view_status"),
        )
        del terms
        if ans.height:
            answers_file[0] = _write_by_task(
                ans.select(ANSWER_FILE_COLUMNS),
                root / "answers.parquet",
                writer=answers_file[0],
                keep_open=True,
            )
            name = str(ans["eval"][0])
            ans.select(*WIDE_COLUMNS).write_parquet(
                root / f"narrow-{name}.parquet"
            )  # no probabilities, no text
            narrow.append(name)
        elif (
            answers_file[0] is None
        ):  # no answers (yet): the file with no rows, replaced by a later one's
            _write_by_task(ans.select(ANSWER_FILE_COLUMNS), root / "answers.parquet")

    try:
        with Cache(cache_dir, read_only=True, remote=remote) as cache:
            summary, scored = summarize(
                cache, suite, models, None, epochs, prices=prices, each=each
            )
            summary = summary.ordered(ranked)  # the one order of every table (the report's)
            text = _search_text(suite.tasks())
            ids = text["task_id"].sort()
            _write_requests(cache, ids, root / "requests.parquet")
            # the requests of the shards set aside as damaged (``cache.aside``): told on their pages
            cache.set_aside().rows.write_parquet(root / "aside.parquet")
            warnings = list(cache.warnings)
    finally:
        if answers_file[0] is not None:
            answers_file[0].close()
    labels = summary.labels
    cut = {m.model for m in summary.models if adaptive.estimated(summary, m)}
    frames = []
    for name in narrow:
        path = root / f"narrow-{name}.parquet"
        asked = _questions(*suite.gold_frames(), name)  # those no model was asked too
        for (_, sample), part in (
            pl.read_parquet(path).partition_by("eval", "sample", as_dict=True).items()
        ):
            _wide(part, labels, text, asked, cut).write_parquet(
                root / f"wide-{name}-{sample}.parquet"
            )
            frames.append((name, sample))
        path.unlink()
    scored.reliability.write_parquet(root / "reliability.parquet")
    meta = {"summary": records.to_builtins(summary), "warnings": warnings, "frames": sorted(frames)}
    (root / "meta.json").write_bytes(orjson.dumps(meta))
    return _peak_mb()


@contextlib.contextmanager
def _child_env() -> Iterator[None]:
    """The environment the start-up child is spawned with (it inherits it when it starts):
    ``CHILD_JEMALLOC`` appended to ``_RJEM_MALLOC_CONF`` (Polars sets that variable on import, to
    its defaults and then what it held; jemalloc takes the last value of an option) and
    ``CHILD_GLIBC``'s variables where not set already, then put back."""
    before = {name: os.environ.get(name) for name in (JEMALLOC_VAR, *CHILD_GLIBC)}
    jemalloc = before[JEMALLOC_VAR]
    os.environ[JEMALLOC_VAR] = f"{jemalloc},{CHILD_JEMALLOC}" if jemalloc else CHILD_JEMALLOC
    for name, value in CHILD_GLIBC.items():
        os.environ.setdefault(name, value)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _search_text(tasks: Iterable[Task]) -> pl.DataFrame:
    """Per task, in the dataset's order: ``order`` (0, 1, ...), ``task_id`` and ``text`` (the id and
    the state, lower-cased: what the evaluation page's search looks in). The tasks are streamed:
    only the two strings of each are kept."""
    ids, text = [], []
    for t in tasks:
        ids.append(t.id)
        text.append(f"{t.id}\n{t.state}".lower())
    return pl.DataFrame(
        {"task_id": ids, "text": text}, schema={"task_id": pl.String, "text": pl.String}
    ).with_row_index("order")


def _write_requests(cache: Cache, ids: pl.Series, path: Path) -> None:
    """Write ``requests.parquet``: the cache rows of the current prompt version and of the tasks
    ``ids`` (sorted as text), ``_REQUESTS_READ`` columns, sorted by task id (as ``_write_by_task``
    writes). The cache is read ``REQUEST_PARTS`` times, each time for one consecutive range of
    ``ids`` (the filter pushed down to the scan), so that only that range's request bodies and
    replies are held at a time (all of them at once were the start-up child's peak). Rows of one
    task keep their order in the cache."""
    step = max(1, -(-ids.len() // REQUEST_PARTS))
    writer: pq.ParquetWriter | None = None
    try:
        for start in range(0, max(ids.len(), 1), step):
            part = ids.slice(start, step).implode()
            rows = cache.read(
                lambda lf, part=part: (
                    lf.filter(
                        (pl.col("prompt_version") == PROMPT_VERSION) & pl.col("task_id").is_in(part)
                    )
                    .select(_REQUESTS_READ)
                    .collect()
                )
            )
            writer = _write_by_task(
                rows, path, dictionary=[*CONFIG_COLUMNS, "status"], writer=writer, keep_open=True
            )
            empty = rows.head(0)
            del rows
        if writer is None:  # no rows at all: the file with no rows
            _write_by_task(empty, path, dictionary=[*CONFIG_COLUMNS, "status"])
    finally:
        if writer is not None:
            writer.close()


def _write_by_task(
    frame: pl.DataFrame,
    path: Path,
    dictionary: bool | list[str] = True,
    writer: pq.ParquetWriter | None = None,
    keep_open: bool = False,
) -> pq.ParquetWriter | None:
    """Write ``frame``'s rows sorted by task id (as text; rows of one task in their order in
    ``frame``), Enums as text, in row groups of ``ROW_GROUP`` rows with statistics of ``task_id``
    (what the question page's filter is pushed down to). Written ``WRITE_CHUNK`` rows at a time,
    gathered by the sorting permutation, so that no sorted copy of the whole frame is held. pyarrow,
    LZ4: for nested columns in small row groups several times faster than Polars' writer, and a
    temporary file needs no tighter compression.

    With ``writer`` (an open writer of an earlier part, returned by the call that wrote it) the rows
    are appended to it. With ``keep_open`` the writer is returned open (None when ``frame`` had no
    rows and no writer was given), for the caller to append more and close; else it is closed here
    and None returned."""
    order = frame.select(
        pl.arg_sort_by(pl.col("task_id").cast(pl.String), maintain_order=True)
    ).to_series()
    as_text = [
        pl.col(c).cast(pl.String) if isinstance(t, pl.Enum | pl.Categorical) else pl.col(c)
        for c, t in frame.schema.items()
    ]
    try:
        for start in range(0, frame.height if keep_open else max(frame.height, 1), WRITE_CHUNK):
            part = frame[order[start : start + WRITE_CHUNK]].select(as_text).to_arrow()
            if writer is None:
                writer = pq.ParquetWriter(
                    path,
                    part.schema,
                    compression="lz4",
                    write_statistics=["task_id"],
                    use_dictionary=dictionary,
                )
            writer.write_table(part.cast(writer.schema), row_group_size=ROW_GROUP)
    except BaseException:
        if writer is not None:
            writer.close()
        raise
    if not keep_open and writer is not None:
        writer.close()
    return writer if keep_open else None


def _peak_mb() -> float | None:
    """This process's peak resident set (``VmHWM``) in MB; None where /proc is not there."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def _questions(gold: pl.DataFrame, categories: pl.DataFrame, name: str) -> pl.DataFrame:
    """Every question of the evaluation ``name`` in the suite's gold frames (``gold_frames``):
    ``task_id``, ``question_id``, ``category`` (its group, or When2Call's gold reply type, as
    ``scoring.answers`` gives them) and ``gold``, sorted by task and question."""
    return (
        gold.filter(pl.col("eval") == name)
        .join(
            categories.rename({"option": "gold", "category": "gold_category"}),
            on=["task_id", "gold"],
            how="left",
        )
        .select(
            "task_id",
            "question_id",
            pl.coalesce(pl.col("group"), pl.col("gold_category")).alias("category"),
            "gold",
        )
        .with_columns(pl.all().cast(pl.String))
        .unique(["task_id", "question_id"])
        .sort("task_id", "question_id")
    )


def _wide(
    part: pl.DataFrame,
    labels: list[str],
    text: pl.DataFrame,
    questions: pl.DataFrame,
    cut: Iterable[str] = (),
) -> pl.DataFrame:
    """One evaluation and epoch of the answers as one row per question of ``questions`` (the
    evaluation's, ``_questions``: one no model was asked too), each model's columns beside. A
    question with no answer row of a model is "missing" (not right), or for a model in ``cut`` (one
    an adaptive run asked part of the set: its answers hold only that part,
    ``scoring.adaptive.asked_part``) ``NOT_ASKED``, neither right nor wrong (``correct`` null)."""
    cut = set(cut)
    keys = ["task_id", "question_id"]
    part = part.with_columns(pl.col(pl.Enum).cast(pl.String))
    base = questions.join(text, on="task_id", how="left")
    for i, label in enumerate(labels):
        mine = part.filter(pl.col("label") == label).select(
            *keys,
            pl.col("predicted").alias(f"pick{i}"),
            pl.col("view_status").alias(f"status{i}"),
            pl.col("correct").alias(f"correct{i}"),
            pl.col("p_gold").alias(f"pgold{i}"),
            pl.col("p_predicted").alias(f"conf{i}"),
            pl.col("bin").alias(f"bin{i}"),
        )
        base = base.join(mine, on=keys, how="left", maintain_order="left")
        base = base.with_columns(
            pl.col(f"status{i}").fill_null(NOT_ASKED if label in cut else "missing"),
            pl.col(f"correct{i}") if label in cut else pl.col(f"correct{i}").fill_null(False),
        )
    return base.with_columns(pl.col(c).cast(pl.Categorical) for c in ("category", "gold"))


# a question an adaptive run did not ask a model (``dxi run --until``: its rule stopped before it)
UNASKED = "not asked by the adaptive run: its rule stopped before this question"


def _answer(question, row: dict | None, unasked: bool = False) -> dict:
    """One question's answer for the page: status, pick, error/warning, and the probability of every
    allowed answer in the question's order (those the model returned; others absent). ``unasked``:
    an adaptive run never asked the model this question (status "not asked", not "missing")."""
    ids = question.answer_ids
    if row is None:
        return {
            "question": question,
            "status": "not asked" if unasked else "missing",
            "pick": None,
            "error": UNASKED if unasked else "not in the answers",
            "warning": None,
            "probabilities": [],
            "correct": False,
        }
    given = {p["option"]: p["p"] for p in row["probabilities"] or []}
    order = [o for o in ids if o in given] + [o for o in given if o not in ids]
    status = "repaired" if row["repaired"] and row["status"] == "ok" else row["status"]
    return {
        "question": question,
        "status": status,
        "pick": row["predicted"],
        "error": row["error"],
        "warning": row["warning"],
        "correct": row["correct"],
        "p_yes": row["p_yes"],
        "probabilities": [
            {"option": o, "p": given[o], "picked": o == row["predicted"]} for o in order
        ],
    }


def _request(row: dict, price: tuple[float | None, ...] | None) -> dict:
    """One cache row for the page, with its cost (USD; None without a price, without usage or, at
    a price, with 0 tokens reported: ``scoring.cost.known_cost``; a request a provider batch
    answered, ``transport`` "batch", at the batch rate, ``scoring.cost.batch_price``, as the
    summary prices it) and its body and reply pretty-printed when they are JSON."""
    batch = row.get("transport") == "batch"
    return {
        **row,
        "cost_usd": known_cost(row, batch_price(price) if batch else price),
        "body": _pretty(row["request_body"]),
        "reply": _pretty(row["raw_reply"]),
        "reply_text": reply_text(row["raw_reply"]),
        "messages": prompt_messages(row["request_body"]),
    }


def _pretty(text: str | None) -> str | None:
    if text is None:
        return None
    try:
        return orjson.dumps(orjson.loads(text), option=orjson.OPT_INDENT_2).decode()
    except orjson.JSONDecodeError:
        return text


def _json(text: str | None) -> object:
    if not text:
        return None
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return None


def prompt_messages(body: str | None) -> list[tuple[str, str]]:
    """The prompt in a request body as (role, text) pairs, for the wire formats that carry text:
    Chat Completions and Anthropic ``messages`` (and Anthropic's ``system``), Gemini ``contents``
    and ``systemInstruction``, OpenAI Decisions ``input``, System One ``state``. Empty when none is
    found."""
    doc = _json(body)
    if not isinstance(doc, dict):
        return []

    def text_of(content: object) -> str:
        if isinstance(content, str):
            return content
        if isinstance(content, list):
            return "\n".join(
                text_of(c.get("text", c.get("content", ""))) if isinstance(c, dict) else str(c)
                for c in content
            )
        if isinstance(content, dict):
            return text_of(content.get("parts", content.get("text", "")))
        return "" if content is None else str(content)

    out: list[tuple[str, str]] = []
    if "system" in doc:
        out.append(("system", text_of(doc["system"])))
    if "systemInstruction" in doc:
        out.append(("system", text_of(doc["systemInstruction"])))
    for key in ("messages", "contents"):
        for m in doc.get(key) or []:
            if isinstance(m, dict):
                out.append((str(m.get("role", "user")), text_of(m.get("content", m.get("parts")))))
    if "input" in doc:
        out.append(("input", text_of(doc["input"])))
    if "state" in doc and not out:
        state = doc["state"]
        out.append(
            (
                "state",
                state
                if isinstance(state, str)
                else orjson.dumps(state, option=orjson.OPT_INDENT_2).decode(),
            )
        )
    return out


def reply_text(raw: str | None) -> str | None:
    """A language model's reply text inside a raw response body (Chat Completions
    ``choices[0].message`` content, refusal or reasoning; Anthropic ``content`` text and tool input;
    Gemini ``candidates[0]`` parts), or None when the body has none of these (a decision model's
    reply, a failure)."""
    doc = _json(raw)
    if not isinstance(doc, dict):
        return None
    choices = doc.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        message = choices[0].get("message") or {}
        for k in ("content", "refusal", "reasoning_content"):
            if message.get(k):
                return str(message[k])
        return ""
    content = doc.get("content")
    if isinstance(content, list):
        parts = [
            c.get("text") if c.get("type") == "text" else orjson.dumps(c.get("input")).decode()
            for c in content
            if isinstance(c, dict) and c.get("type") in ("text", "tool_use")
        ]
        return "\n".join(p for p in parts if p)
    candidates = doc.get("candidates")
    if isinstance(candidates, list) and candidates and isinstance(candidates[0], dict):
        parts = (candidates[0].get("content") or {}).get("parts") or []
        return "\n".join(str(p.get("text", "")) for p in parts if isinstance(p, dict))
    return None
