"""Shards: ``dxi run --shard K/N`` sends only the requests whose cache key falls in shard K of N.

A request belongs to shard ``floor(p * N / 2**64)``, ``p`` the first 64 bits of its key
(``cache.index.prefix``; the key is a sha256; never Python's ``hash()``, which is salted per
process): the K-th of N equal ranges of the key space (``cache.partition``), so the N shards are
disjoint, together cover every request, any process on any machine computes the same assignment, and
a shard reads only its part of a remote cache. K counts from 0 (``0/4`` ... ``3/4``), as Kubernetes'
``JOB_COMPLETION_INDEX`` does.

``--shard auto`` takes K from the scheduler's environment and N from a value that survives
resubmitting part of the job (resubmitting one task of a Slurm array, ``sbatch --array=2``, makes an
array of one: its ``SLURM_ARRAY_TASK_COUNT`` is 1 and its ``SLURM_ARRAY_TASK_MIN`` 2, so neither can
say how many shards the run has): ``--shard auto/N``, else ``DXI_SHARD_COUNT``; without either it
refuses, with the fix.

* Slurm job arrays: K = ``SLURM_ARRAY_TASK_ID`` (the array numbered from 0: ``--array=0-7`` for 8
  shards);
* Kubernetes Indexed Jobs: K = ``JOB_COMPLETION_INDEX`` (N is the Job's ``completions``).

Without a shared coordinator (``runner.distributed.coordinator``) each shard keeps to 1/N of each
provider's limits (requests and tokens per minute, requests in flight; at least one in flight) and
of the cost bound, so N shards together never exceed what one process would be allowed: ``divide``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace

from dxi.adapters import Limits

from ..outputs import amounts

# cache.index and cache.partition are imported where a shard is used, not here: the command line
# checks --shard's value as it parses (runner.distributed.setup), before the cache is loaded


class ShardError(ValueError):
    """A ``--shard`` value (or the scheduler's environment behind ``--shard auto``) that names no
    shard."""


@dataclass(frozen=True, slots=True)
class Shard:
    """Shard ``index`` (0-based) of ``count``; ``source`` says where it came from (for messages)."""

    index: int
    count: int
    source: str = "--shard"

    def owns(self, key: str) -> bool:
        """Whether the request with cache key ``key`` belongs to this shard."""
        from dxi.cache.index import prefix
        from dxi.cache.partition import shard_of

        return shard_of(prefix(key), self.count) == self.index

    @property
    def range(self) -> tuple[int, int]:
        """The key prefixes it owns, ``[lo, hi)`` (``cache.partition.shard_range``)."""
        from dxi.cache.partition import shard_range

        return shard_range(self.index, self.count)

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def _int(env: Mapping[str, str], name: str) -> int | None:
    value = env.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise ShardError(f"--shard auto: {name}={value!r} is not a whole number") from None


def parse(text: str, env: Mapping[str, str] | None = None) -> Shard:
    """``K/N`` (0 <= K < N), ``auto`` or ``auto/N`` (see the module docstring) -> Shard. Raises
    ShardError with the fix."""
    env = os.environ if env is None else env
    head, sep, tail = text.strip().partition("/")
    try:
        count = int(tail) if sep else None
    except ValueError:
        raise ShardError(f"--shard {text}: expected K/N (e.g. 0/4), auto or auto/N") from None
    if head != "auto":
        try:
            index = int(head)
        except ValueError:
            raise ShardError(f"--shard {text}: expected K/N (e.g. 0/4), auto or auto/N") from None
        if count is None:
            raise ShardError(f"--shard {text}: give the number of shards too, K/N (e.g. {index}/4)")
        return _checked(index, count, text, "--shard")
    if count is None:
        count = _int(env, "DXI_SHARD_COUNT")
    for name in ("SLURM_ARRAY_TASK_ID", "JOB_COMPLETION_INDEX"):
        index = _int(env, name)
        if index is None:
            continue
        if count is None:
            raise ShardError(
                f"--shard auto: {name} gives this task's index, but nothing here gives the number of shards "
                "for sure (a resubmitted part of a job sees a smaller count); write --shard auto/N or set "
                "DXI_SHARD_COUNT=N (N = the job's tasks), or give the shard as --shard K/N"
            )
        return _checked(index, count, text, name)
    raise ShardError(
        "--shard auto: neither SLURM_ARRAY_TASK_ID (a Slurm job array) nor JOB_COMPLETION_INDEX "
        "(a Kubernetes Indexed Job) is set; give the shard as K/N"
    )


MAX_SHARDS = (
    1_000_000  # more than any cluster runs; the claims' lock bytes (cache.claims) stay in range
)


def _checked(index: int, count: int, text: str, source: str) -> Shard:
    if count < 1:
        raise ShardError(f"--shard {text}: the number of shards must be at least 1")
    if count > MAX_SHARDS:
        raise ShardError(f"--shard {text}: the number of shards must be at most {MAX_SHARDS:,}")
    if not 0 <= index < count:
        fix = (
            f"; number the array from 0 (--array=0-{count - 1})"
            if source == "SLURM_ARRAY_TASK_ID"
            else ""
        )
        raise ShardError(
            f"--shard {text}: shard {index} (from {source}) is not one of 0..{count - 1} (shards count "
            f"from 0){fix}"
        )
    return Shard(index, count, source)


def divide(limits: Limits, n: int) -> Limits:
    """``limits`` with requests and tokens per minute and requests in flight divided by ``n``
    (unlimited stays unlimited; at least one request in flight); the retry budget is unchanged."""
    if n <= 1:
        return limits
    return replace(
        limits,
        rpm=None if limits.rpm is None else limits.rpm / n,
        tpm=None if limits.tpm is None else max(1, math.floor(limits.tpm / n)),
        max_in_flight=max(1, limits.max_in_flight // n),
    )


def describe(limits: Limits) -> str:
    """``limits`` in a few words, for the start-up note."""
    parts = [f"{limits.max_in_flight} in flight"]
    if limits.rpm is not None:
        parts.append(f"{limits.rpm:g} requests/min")
    if limits.tpm is not None:
        parts.append(f"{limits.tpm:g} tokens/min")
    return ", ".join(parts)


def keep_share(
    models: list, max_cost: float | None, n: int, apply: bool = True
) -> tuple[float | None, list[str]]:
    """Divide each model's limits (``ModelRun.adapter.limits``) by ``n`` in place (with ``apply``;
    else only say what the share is: a coordinator that cannot be reached divides them itself);
    returns the cost bound divided by ``n`` and one line per provider saying what this process keeps
    to (for the start-up note)."""
    if n <= 1:
        return max_cost, []
    said, notes = set(), []
    for m in models:
        whole = m.adapter.limits
        share = divide(whole, n)
        if apply:
            m.adapter.limits = share
        if m.limits_key not in said:
            said.add(m.limits_key)
            notes.append(f"{m.limits_key}: {describe(share)} (1/{n} of {describe(whole)})")
    if max_cost is not None:
        notes.append(f"cost bound: {amounts.usd(max_cost / n)} (1/{n} of {amounts.usd(max_cost)})")
        max_cost = max_cost / n
    return max_cost, notes
