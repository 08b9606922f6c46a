"""Which blocks a prefix hit needs, group by group, and the longest hit available.

A hit counts only when *every* group has every block it needs: loading some groups and not others would hand
the model a cache that never existed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from capkv._homes import publish

__all__ = ["GroupGeometry", "longest_hit"]


@dataclass(frozen=True)
class GroupGeometry:
    """A group's block size and sliding window, in tokens."""

    block_size: int
    sliding_window: int | None = None

    def first_kept(self, end: int) -> int:
        """The first block the engine still holds (not the null block) once ``end`` tokens are computed."""
        if self.sliding_window is None:
            return 0
        return max(0, (end - self.sliding_window + 1) // self.block_size)

    def needed(self, start: int, end: int) -> range:
        """Blocks to load to resume at ``end`` when tokens before ``start`` are already local."""
        return range(max(start // self.block_size, self.first_kept(end)), end // self.block_size)


def longest_hit(
    groups: Sequence[GroupGeometry],
    start: int,
    limit: int,
    present: Callable[[int, int], bool],
) -> int:
    """The largest ``end <= limit`` with every group's needed blocks ``present(group, block)``.

    ``end`` is a multiple of every group's block size (a partial block cannot be
    loaded) and exceeds ``start``; returns ``start`` when there is no such hit.
    """
    step = math.lcm(*(g.block_size for g in groups))
    best = limit // step * step
    for index, group in enumerate(groups):
        if group.sliding_window is None:
            block = start // group.block_size
            while block * group.block_size < best and present(index, block):
                block += 1
            best = min(best, block * group.block_size // step * step)
    windowed = [(i, g) for i, g in enumerate(groups) if g.sliding_window is not None]
    for end in range(best, start, -step):
        if all(all(present(i, b) for b in g.needed(start, end)) for i, g in windowed):
            return end
    return start


publish(__name__, "capkv.connectors")
