"""``--sample N [--seed S]``: a seeded sample of N tasks of each evaluation, stratified by its gold
classes.

The strata (``stratum``): When2Call's gold reply type (tool_call, request_for_info, cannot_answer,
...), WildGuardTest's combination of gold labels (prompt harm, response harm, refusal),
HLE-MultiChoice's category, AA-Omniscience-Decision's domain. The N tasks are shared out in
proportion to the strata's sizes (largest remainders; when N is at least the number of strata, every
stratum gets at least one task, so that a small sample still shows every class: ``allocate``), and
within a stratum the tasks with the smallest sha256(seed, task id) are taken: the sample depends
only on the seed and the task ids, not on the order of the file, and the same seed gives the same
tasks on every machine. The sample is taken after exclusion lists; tasks are streamed in file order.
``--limit`` (the first N) is the other way to run fewer tasks; the two do not combine.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field

from dxi.evals import Suite, Task


def stratum(task: Task) -> str:
    """The gold class a task is stratified by (see the module docstring); "" when the data has
    none."""
    meta = task.meta
    if meta.get("categories"):  # When2Call: the reply type of the gold option
        (gold,) = task.gold.values()
        return str(meta["categories"].get(gold, ""))
    for key in ("category", "domain"):  # HLE-MultiChoice, AA-Omniscience-Decision
        if key in meta:
            return str(meta[key] or "")
    return ",".join(f"{q}={a}" for q, a in sorted(task.gold.items()))  # WildGuardTest: the labels


def allocate(sizes: dict[str, int], n: int) -> dict[str, int]:
    """How many of ``n`` tasks each stratum gets (``sizes``: stratum -> tasks): Hamilton's method
    (each its whole quota n·size/total, the rest to the largest remainders, ties by name), then,
    when ``n`` is at least the number of strata, each empty stratum gets one from the stratum with
    the most. Never more than a stratum holds; sums to min(n, total)."""
    total = sum(sizes.values())
    n = min(n, total)
    quota = {s: n * size / total for s, size in sizes.items()}
    take = {s: int(q) for s, q in quota.items()}
    for s in sorted(sizes, key=lambda s: (-(quota[s] - take[s]), s))[: n - sum(take.values())]:
        take[s] += 1
    if n >= len(sizes):
        for s in sorted(s for s in sizes if take[s] == 0):
            most = max(sorted(take), key=lambda k: take[k])
            take[most] -= 1
            take[s] = 1
    return take


def choose(tasks: list[Task], n: int, seed: int) -> set[str]:
    """The ids of the ``n`` tasks sampled from ``tasks`` (one evaluation's) with ``seed``."""
    strata: dict[str, list[Task]] = defaultdict(list)
    for t in tasks:
        strata[stratum(t)].append(t)
    counts = allocate({s: len(ts) for s, ts in strata.items()}, n)
    chosen: set[str] = set()
    for s, ts in strata.items():
        ranked = sorted(ts, key=lambda t: hashlib.sha256(f"{seed}\0{t.id}".encode()).digest())
        chosen |= {t.id for t in ranked[: counts[s]]}
    return chosen


@dataclass
class SampledSuite(Suite):
    """A ``Suite`` whose tasks are a stratified sample of ``sample`` tasks per evaluation
    (``seed``)."""

    sample: int = 0
    seed: int = 0
    _chosen: dict[str, set[str]] = field(default_factory=dict, repr=False, compare=False)

    def chosen(self, name: str) -> set[str]:
        """The sampled task ids of one evaluation (computed once, by reading it whole)."""
        if name not in self._chosen:
            self._chosen[name] = choose(list(super().tasks(name)), self.sample, self.seed)
        return self._chosen[name]

    def tasks(self, name: str | None = None) -> Iterator[Task]:
        for n in [name] if name else self.selected():
            keep = self.chosen(n)
            yield from (t for t in super().tasks(n) if t.id in keep)

    def data_block(self) -> dict[str, dict]:
        """``Suite.data_block`` with ``sample: {"tasks": N, "seed": S}`` in each evaluation read."""
        block = super().data_block()
        for entry in block.values():
            if "files" in entry:
                entry["sample"] = {"tasks": self.sample, "seed": self.seed}
        return block
