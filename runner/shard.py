"""Shards: ``dxi run --shard K/N`` sends only the requests whose cache key falls in shard K of N.

A request belongs to shard ``prefix(key) mod N`` (``cache.index.prefix``: the first 64 bits of the key,
itself a sha256; never Python's ``hash()``, which is salted per process), so the N shards are disjoint,
together cover every request, and any process on any machine computes the same assignment. K counts from
0 (``0/4`` ... ``3/4``), as Kubernetes' ``JOB_COMPLETION_INDEX`` does.

``--shard auto`` takes K and N from the scheduler's environment:

* Slurm job arrays: K = (``SLURM_ARRAY_TASK_ID`` - ``SLURM_ARRAY_TASK_MIN``) / ``SLURM_ARRAY_TASK_STEP``
  (so ``--array=1-4`` and ``--array=0-3`` both give 0..3), N = ``SLURM_ARRAY_TASK_COUNT``;
* Kubernetes Indexed Jobs: K = ``JOB_COMPLETION_INDEX``; Kubernetes sets no count variable, so N comes
  from the flag (``--shard auto/8``) or ``DXI_SHARD_COUNT``.

Without a shared coordinator (``runner.coordinator``) each shard keeps to 1/N of each provider's limits
(requests and tokens per minute, requests in flight; at least one in flight) and of the cost bound, so N
shards together never exceed what one process would be allowed: ``divide``.
"""
from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace

from dxi.adapters import Limits
from dxi.cache.index import prefix


class ShardError(ValueError):
    """A ``--shard`` value (or the scheduler's environment behind ``--shard auto``) that names no shard."""


@dataclass(frozen=True, slots=True)
class Shard:
    """Shard ``index`` (0-based) of ``count``; ``source`` says where it came from (for messages)."""

    index: int
    count: int
    source: str = "--shard"

    def owns(self, key: str) -> bool:
        """Whether the request with cache key ``key`` belongs to this shard."""
        return prefix(key) % self.count == self.index

    def owned(self, adapter, suite, epochs: int) -> int:
        """How many of ``adapter``'s requests over ``suite`` (``epochs`` each) this shard owns (for progress)."""
        return sum(self.owns(adapter.encode(task, s).key) for task in suite.tasks() for s in range(epochs))

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
    """``K/N`` (0 <= K < N), ``auto`` or ``auto/N`` (see the module docstring) -> Shard. Raises ShardError
    with the fix."""
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
    task = _int(env, "SLURM_ARRAY_TASK_ID")
    if task is not None:
        low, step = _int(env, "SLURM_ARRAY_TASK_MIN") or 0, _int(env, "SLURM_ARRAY_TASK_STEP") or 1
        n = _int(env, "SLURM_ARRAY_TASK_COUNT")
        if count is not None and n is not None and count != n:
            raise ShardError(f"--shard {text}: SLURM_ARRAY_TASK_COUNT is {n}, not {count}")
        n = count if count is not None else n
        if n is None:
            raise ShardError("--shard auto: SLURM_ARRAY_TASK_COUNT is not set; give the count (--shard auto/N)")
        return _checked((task - low) // step, n, text, "SLURM_ARRAY_TASK_ID")
    index = _int(env, "JOB_COMPLETION_INDEX")
    if index is not None:
        n = count if count is not None else _int(env, "DXI_SHARD_COUNT")
        if n is None:
            raise ShardError("--shard auto: JOB_COMPLETION_INDEX is set but Kubernetes gives no count; write "
                             "--shard auto/N (N = the Job's completions) or set DXI_SHARD_COUNT")
        return _checked(index, n, text, "JOB_COMPLETION_INDEX")
    raise ShardError("--shard auto: neither SLURM_ARRAY_TASK_ID (a Slurm job array) nor JOB_COMPLETION_INDEX "
                     "(a Kubernetes Indexed Job) is set; give the shard as K/N")


def _checked(index: int, count: int, text: str, source: str) -> Shard:
    if count < 1:
        raise ShardError(f"--shard {text}: the number of shards must be at least 1")
    if not 0 <= index < count:
        raise ShardError(f"--shard {text}: shard {index} is not one of 0..{count - 1} (shards count from 0)")
    return Shard(index, count, source)


def divide(limits: Limits, n: int) -> Limits:
    """``limits`` with requests and tokens per minute and requests in flight divided by ``n`` (unlimited
    stays unlimited; at least one request in flight); the retry budget is unchanged."""
    if n <= 1:
        return limits
    return replace(limits, rpm=None if limits.rpm is None else limits.rpm / n,
                   tpm=None if limits.tpm is None else max(1, math.floor(limits.tpm / n)),
                   max_in_flight=max(1, limits.max_in_flight // n))


def describe(limits: Limits) -> str:
    """``limits`` in a few words, for the start-up note."""
    parts = [f"{limits.max_in_flight} in flight"]
    if limits.rpm is not None:
        parts.append(f"{limits.rpm:g} requests/min")
    if limits.tpm is not None:
        parts.append(f"{limits.tpm:g} tokens/min")
    return ", ".join(parts)


def keep_share(models: list, max_cost: float | None, n: int) -> tuple[float | None, list[str]]:
    """Divide each model's limits (``ModelRun.adapter.limits``) by ``n`` in place; returns the cost bound
    divided by ``n`` and one line per provider saying what this process keeps to (for the start-up note)."""
    if n <= 1:
        return max_cost, []
    said, notes = set(), []
    for m in models:
        whole = m.adapter.limits
        m.adapter.limits = divide(whole, n)
        if m.limits_key not in said:
            said.add(m.limits_key)
            notes.append(f"{m.limits_key}: {describe(m.adapter.limits)} (1/{n} of {describe(whole)})")
    if max_cost is not None:
        notes.append(f"cost bound: ${max_cost / n:g} (1/{n} of ${max_cost:g})")
        max_cost = max_cost / n
    return max_cost, notes
