"""The order in which an adaptive run asks each evaluation's tasks: seeded, random, stratified, and
recorded in the cache folder so that a resumed or extended run continues the same sequence.

Each evaluation has its own sequence of task ids (``ordered``). Within a stratum the tasks come in
the order of sha256(seed, task id) (as ``runner.sample.choose`` ranks them: it depends on the seed
and the ids only, never on the file's order or the machine); WildGuardTest's strata are its gold
label combinations (``runner.sample.stratum``), the other evaluations are one stratum each. The
strata are interleaved so that every prefix holds each stratum in proportion to its size: position
``i`` (1-based) takes the next task of the stratum furthest behind its share, ``i·size/N - taken``
largest (ties by stratum name), so after any ``n`` tasks each stratum has within one task of
``n·size/N``. A prefix of ``n`` tasks is therefore a proportionally stratified random sample without
replacement of the evaluation, and each evaluation progresses at the same fraction because rounds
ask the same fraction of each (``scoring.sequential.round_sizes``).

The order is written to ``<cache>/adaptive/order-<digest>.json`` (``record``): digest of the seed
and every evaluation's set of task ids, written to a temporary name then renamed, so a file is whole
or absent. A later run with the same seed over the same tasks reads it (and checks it holds exactly
those tasks); tasks added or excluded make another set, hence another file.
"""

from __future__ import annotations

import hashlib
import os
from collections import defaultdict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from dxi.evals import Suite, Task
from dxi.evals.wildguardtest import NAME as WILDGUARDTEST

from ..outputs.adaptive import ORDER_DIR
from ..planning.sample import stratum

# the order's seed when --seed is not given (recorded in summary.json's adaptive block)
DEFAULT_SEED = 0


@dataclass(frozen=True)
class Order:
    """``seed``, ``evals`` (evaluation -> its task ids in asking order: every task of the run's
    selection of it) and ``path`` (the file recording it in the cache folder)."""

    seed: int
    evals: dict[str, tuple[str, ...]]
    path: Path

    def populations(self) -> dict[str, int]:
        """Evaluation -> its number of tasks (the whole set the run estimates)."""
        return {name: len(ids) for name, ids in self.evals.items()}

    def prefix(self, name: str, n: int, start: int = 0) -> tuple[str, ...]:
        """The task ids of evaluation ``name`` from position ``start`` up to ``n`` (0-based, end
        excluded): the first ``n`` by default (all of them when ``n`` exceeds its size)."""
        return self.evals[name][max(start, 0) : max(n, 0)]


def _rank(seed: int, task_id: str) -> bytes:
    return hashlib.sha256(f"{seed}\0{task_id}".encode()).digest()


def ordered(tasks: list[Task], seed: int, stratified: bool) -> list[str]:
    """The asking order of one evaluation's ``tasks`` (ids), see the module docstring;
    ``stratified``: interleave the gold strata (``runner.sample.stratum``) in proportion, else one
    random sequence."""
    strata: dict[str, list[str]] = defaultdict(list)
    for t in tasks:
        strata[stratum(t) if stratified else ""].append(t.id)
    queues = {s: sorted(ids, key=lambda i: _rank(seed, i)) for s, ids in strata.items()}
    total = len(tasks)
    sizes = {s: len(ids) for s, ids in queues.items()}
    taken = dict.fromkeys(queues, 0)
    out: list[str] = []
    names = sorted(queues)
    for i in range(1, total + 1):
        # the stratum furthest behind its share i·size/N (ties: the first name); compared as
        # integers
        best = max(
            (s for s in names if taken[s] < sizes[s]),
            key=lambda s: (i * sizes[s] - taken[s] * total, -names.index(s)),
        )
        out.append(queues[best][taken[best]])
        taken[best] += 1
    return out


def digest(seed: int, ids: Mapping[str, list[str] | tuple[str, ...]]) -> str:
    """16 hex digits of sha256 over the seed and each evaluation's sorted task ids: the order file's
    key."""
    h = hashlib.sha256(f"order\0{seed}".encode())
    for name in sorted(ids):
        h.update(f"\0{name}\0".encode())
        for task_id in sorted(ids[name]):
            h.update(task_id.encode() + b"\n")
    return h.hexdigest()[:16]


def order_of(suite: Suite, seed: int, cache_dir: Path, write: bool = True) -> Order:
    """The order of ``suite``'s tasks (every selected evaluation) with ``seed``: the one recorded in
    ``cache_dir`` for this seed and these tasks, else computed and recorded there (``record``). A
    recorded file that is unreadable or does not hold exactly these tasks is computed again and
    replaced. Raises OSError when the file cannot be written (the run cannot promise to continue its
    sequence). ``write=False`` (``dxi plan``, which writes nothing): computed, not recorded."""
    tasks = {name: list(suite.tasks(name)) for name in suite.selected()}
    ids = {name: [t.id for t in ts] for name, ts in tasks.items()}
    path = cache_dir / ORDER_DIR / f"order-{digest(seed, ids)}.json"
    recorded = _read(path, seed, ids)
    if recorded is not None:
        return recorded
    evals = {name: tuple(ordered(ts, seed, name == WILDGUARDTEST)) for name, ts in tasks.items()}
    order = Order(seed, evals, path)
    if write:
        record(order)
    return order


def _read(path: Path, seed: int, ids: Mapping[str, list[str]]) -> Order | None:
    try:
        doc = orjson.loads(path.read_bytes())
        evals = {name: tuple(seq) for name, seq in doc["evals"].items()}
    except (OSError, orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
        return None
    same = (
        doc.get("seed") == seed
        and set(evals) == set(ids)
        and all(len(evals[n]) == len(ids[n]) and set(evals[n]) == set(ids[n]) for n in ids)
    )
    return Order(seed, evals, path) if same else None


def record(order: Order) -> None:
    """Write ``order`` to ``order.path`` atomically (a temporary name, then renamed)."""
    order.path.parent.mkdir(parents=True, exist_ok=True)
    tmp = order.path.with_name(f".{order.path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(
        orjson.dumps({"seed": order.seed, "evals": {n: list(s) for n, s in order.evals.items()}})
    )
    os.replace(tmp, order.path)


@dataclass
class PrefixSuite(Suite):
    """A ``Suite`` of the first ``counts[name]`` tasks of ``order`` for each evaluation of ``base``
    (the run's suite, whose files, exclusions and selection it keeps), or of those after the first
    ``start[name]`` (a round's new tasks), streamed in ``base``'s order."""

    base: Suite | None = None
    keep: dict[str, frozenset[str]] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def of(
        cls,
        base: Suite,
        order: Order,
        counts: Mapping[str, int],
        start: Mapping[str, int] | None = None,
    ) -> PrefixSuite:
        """The suite of ``order``'s first ``counts[e]`` tasks of each evaluation ``e`` over
        ``base``, less the first ``start[e]`` (None: none left out)."""
        start = start or {}
        keep = {
            n: frozenset(order.prefix(n, counts.get(n, 0), start.get(n, 0))) for n in order.evals
        }
        suite = cls(
            base.data,
            base.exclusions,
            base.limit,
            base.wildguard_subset,
            base.evals,
            base=base,
            keep=keep,
        )
        suite._validated = base._validated  # the same files: checked already
        return suite

    def tasks(self, name: str | None = None) -> Iterator[Task]:
        assert self.base is not None
        for n in [name] if name else self.selected():
            keep = self.keep.get(n, frozenset())
            if keep:
                yield from (t for t in self.base.tasks(n) if t.id in keep)
