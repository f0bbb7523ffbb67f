"""The key space and its parts: which shard of a run owns a request, and where a remote cache keeps
it.

A request's place is the first 64 bits of its cache key (``cache.index.prefix``: the key is a
sha256, so the bits are uniform), read as an unsigned integer ``p`` in ``[0, 2**64)``.

**Shards** (``dxi run --shard K/N``): shard K of N owns the ``p`` with
``floor(p * N / 2**64) == K``, the K-th of N equal, contiguous ranges of the key space
(``shard_of``, ``shard_range``). Every process on every machine computes the same assignment; the
shards are disjoint and together cover every request; and a shard's keys lie in one range, which is
what lets a remote cache give each shard only its part.

**Nodes** (the remote cache's partitions, ``cache.remote``): the key space split by its top bits at
each of the levels ``LEVELS`` (0, 2, 4, ... 10 bits): node ``(level, index)`` holds the keys whose
top ``level`` bits are ``index`` (a range of ``2**(64 - level)`` prefixes); level 0 is the whole key
space, level 10 one of 1,024 parts. Each remote object lies in one node. A reader of one shard lists
only the nodes its range meets (``nodes_meeting``: coarse levels first), so at level 10 shard K of N
reads at most ``1024 / N + 1`` parts: for N = 100, 11 or 12 of 1,024 (at most 1.17× its share of the
key space); for N up to 1,024, at most 2×. A writer puts a small upload at a coarse level
(``upload_level``: a few objects per upload, whatever N) and compaction moves rows to finer levels
as they grow (``split_level``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

SPACE = 1 << 64  # prefixes are in [0, SPACE)
LEVELS = (0, 2, 4, 6, 8, 10)  # bits of a node's index; 10 bits: 1,024 parts of the key space
FINEST = LEVELS[-1]


def shard_of(p: int, count: int) -> int:
    """The shard (0 .. count-1) that owns prefix ``p`` among ``count`` shards."""
    return (p * count) >> 64


def shard_range(index: int, count: int) -> tuple[int, int]:
    """The prefixes shard ``index`` of ``count`` owns: ``[lo, hi)`` (``shard_of(p, count) == index``
    exactly for ``lo <= p < hi``)."""
    return -((-index * SPACE) // count), -((-(index + 1) * SPACE) // count)


@dataclass(frozen=True, order=True, slots=True)
class Node:
    """The keys whose top ``level`` bits are ``index`` (``level`` one of ``LEVELS``)."""

    level: int
    index: int

    @property
    def lo(self) -> int:
        return self.index << (64 - self.level)

    @property
    def hi(self) -> int:
        return (self.index + 1) << (64 - self.level)

    @property
    def path(self) -> str:
        """Its folder under ``parts/`` on the remote: ``b10/3ff`` (the level, then the index in
        hex)."""
        return f"b{self.level:02d}/{self.index:03x}"

    @property
    def tag(self) -> str:
        """A short name, for object names: ``p10-3ff``."""
        return f"p{self.level:02d}-{self.index:03x}"

    @classmethod
    def parse(cls, path: str) -> Node:
        """The node of a folder ``b10/3ff``; ValueError for anything else."""
        level_part, _, index_part = path.partition("/")
        if not level_part.startswith("b") or not index_part:
            raise ValueError(f"{path!r} is not a node folder (bLL/III)")
        level, index = int(level_part[1:]), int(index_part, 16)
        if level not in LEVELS or not 0 <= index < (1 << level):
            raise ValueError(f"{path!r} is not a node folder (bLL/III)")
        return cls(level, index)

    @classmethod
    def from_tag(cls, tag: str) -> Node:
        """The node of a tag ``p10-3ff`` (``tag``); ValueError for anything else."""
        level, _, index = tag.removeprefix("p").partition("-")
        return cls.parse(f"b{level}/{index}")

    def meets(self, lo: int, hi: int) -> bool:
        """Whether the node holds any prefix of ``[lo, hi)``."""
        return self.lo < hi and lo < self.hi

    def owned_by(self, lo: int, hi: int) -> bool:
        """Whether the node's first prefix lies in ``[lo, hi)``: the process reading that range is
        the one that compacts the node (one owner per node among the shards of a run)."""
        return lo <= self.lo < hi


ROOT = Node(0, 0)


def nodes_meeting(lo: int, hi: int) -> list[list[Node]]:
    """The nodes that hold any prefix of ``[lo, hi)``, one list per level, coarse levels first (the
    order a reader lists them in: see ``cache.remote``)."""
    out = []
    for level in LEVELS:
        shift = 64 - level
        out.append([Node(level, i) for i in range(lo >> shift, ((hi - 1) >> shift) + 1)])
    return out


def upload_level(count: int) -> int:
    """The level a process that is one of ``count`` shards writes its uploads at: the coarsest with
    at least two nodes per shard (so a shard's range meets at most a few nodes, and its reader lists
    a few), at most ``FINEST``; a single process writes at level 0 (one object per upload)."""
    if count <= 1:
        return 0
    for level in LEVELS:
        if (1 << level) >= 2 * count:
            return level
    return FINEST


def split_level(rows: int, level: int, target_rows: int) -> int:
    """The level to write ``rows`` rows held at ``level`` at: the coarsest at or below ``level``
    (and at most ``FINEST``) whose nodes hold about ``target_rows`` rows or fewer each (rows spread
    evenly over the key space)."""
    out = level
    while out < FINEST and rows > target_rows * (1 << (out - level)):
        out += 2
    return out


def node_indexes(prefixes: np.ndarray, level: int) -> np.ndarray:
    """The index at ``level`` of each prefix (a uint64 array)."""
    import numpy as np

    if level == 0:
        return np.zeros(len(prefixes), np.uint64)
    return prefixes >> np.uint64(64 - level)


def covered(lo: int, hi: int, ranges: list[tuple[int, int]]) -> bool:
    """Whether ``[lo, hi)`` lies inside the union of ``ranges`` (each ``[a, b)``)."""
    at = lo
    for a, b in sorted(ranges):
        if a > at:
            break
        at = max(at, b)
        if at >= hi:
            return True
    return at >= hi
