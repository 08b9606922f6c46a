"""Each request's block tables, one per KV-cache group, and the local prefix-cache lookup.

The rules differ by attention kind (full or sliding window), and this module is where they live.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from capkv.contracts._engine import BlockIds
from capkv.engine._block_pool import BlockPool
from capkv.engine._model import GroupLayout
from capkv.engine._request import Request

__all__ = ["BlockTables", "LocalHit"]


@dataclass(frozen=True)
class LocalHit:
    """The longest prefix whose KV is already in the paged cache, in every group."""

    num_tokens: int
    blocks: BlockIds
    """Per group, the table for those tokens (null ids where a sliding window skips)."""


def _skipped_tokens(group: GroupLayout, num_computed: int) -> int:
    """Leading tokens whose KV the next position to compute no longer attends to."""
    if group.sliding_window is None:
        return 0
    return max(0, num_computed - group.sliding_window + 1)


class BlockTables:
    """Block tables of every live request, allocated from one :class:`BlockPool`.

    * a full-attention group keeps every block, and a prefix hit needs every
      block of the prefix cached;
    * a sliding-window group needs only the blocks covering the last ``window - 1``
      tokens before the next position to compute; blocks entirely before that are
      freed and their places in the table hold the null block.

    A local hit must hold in *every* group at the same length, so the lookup shrinks the candidate length
    until all groups agree (vLLM's hybrid coordinator).
    """

    def __init__(
        self,
        groups: tuple[GroupLayout, ...],
        pool: BlockPool,
        *,
        on_released: Callable[[GroupLayout, list[int]], None] | None = None,
    ) -> None:
        self.groups = groups
        self.pool = pool
        self.on_released = on_released
        """Called with a group and its blocks that nobody holds any more, as they are released."""
        self._alignment = math.lcm(*(g.block_size for g in groups))
        self._tables: dict[str, tuple[list[int], ...]] = {}
        self._num_cached: dict[str, list[int]] = {}
        self._fresh: dict[int, list[int]] = {}

    # ---- lookup ----------------------------------------------------------------

    def hit_limit(self, request: Request) -> int:
        """The longest hit the engine takes for ``request``: whole blocks of every group, one token left to compute."""
        return self._align(request.num_tokens - 1)

    def find_local_hit(self, request: Request) -> LocalHit:
        """The longest cached prefix (at least one prompt token is left to compute)."""
        length = self.hit_limit(request)
        while True:
            found = [self._group_hit(request, group, length) for group in self.groups]
            shortest = self._align(min(tokens for tokens, _ in found))
            if shortest == length:
                blocks = tuple(table[: length // g.block_size] for g, (_, table) in zip(self.groups, found, strict=True))
                return LocalHit(length, blocks)
            length = shortest

    def _group_hit(self, request: Request, group: GroupLayout, limit: int) -> tuple[int, list[int]]:
        """The longest hit of at most ``limit`` tokens in one group, and its table."""
        size = group.block_size
        max_blocks = limit // size
        if group.sliding_window is None:
            table: list[int] = []
            for index in range(max_blocks):
                block = self._lookup(request, group, index)
                if block is None:
                    break
                table.append(block)
            return len(table) * size, table
        needed = math.ceil((group.sliding_window - 1) / size)
        null = self.pool.null_block_id
        if needed == 0:
            return max_blocks * size, [null] * max_blocks
        run: list[int] = []
        for index in range(max_blocks - 1, -1, -1):
            block = self._lookup(request, group, index)
            if block is None:
                run = []
                continue
            run.insert(0, block)
            if len(run) == needed or index == 0:
                return (index + len(run)) * size, [null] * index + run
        return 0, []

    def _lookup(self, request: Request, group: GroupLayout, index: int) -> int | None:
        last = (index + 1) * group.block_size - 1
        return self.pool.lookup((group.index, request.prefix_hash(last)))

    def _align(self, tokens: int) -> int:
        return tokens - tokens % self._alignment

    # ---- allocation --------------------------------------------------------------

    def admit(self, request: Request, hit: LocalHit, num_external_tokens: int) -> bool:
        """Give a new request its tables: the hit's blocks, then fresh ones up to ``num_tokens``.

        Sliding-window places before the window of the first position to compute
        (after the hit and the external load) hold the null block. ``False`` (and
        nothing taken) when the pool is too small right now.
        """
        num_computed = hit.num_tokens + num_external_tokens
        kept: list[list[int]] = []
        for group, hit_blocks in zip(self.groups, hit.blocks, strict=True):
            skipped = _skipped_tokens(group, num_computed) // group.block_size
            kept.append([b if i >= skipped else self.pool.null_block_id for i, b in enumerate(hit_blocks)])
        revived = sum(1 for table in kept for b in table if self.pool.is_free(b))
        fresh = sum(self._new_blocks_needed(g, table, request.num_tokens, num_computed) for g, table in zip(self.groups, kept, strict=True))
        if revived + fresh > self.pool.num_free:
            return False
        for table in kept:
            self.pool.touch(table)
        tables = tuple(kept)
        for group, table in zip(self.groups, tables, strict=True):
            self._extend(group, table, request.num_tokens, num_computed)
        self._tables[request.request_id] = tables
        self._num_cached[request.request_id] = [len(t) for t in hit.blocks]
        return True

    def grow(self, request: Request) -> bool:
        """Make room for every token of a running request; free what left the windows first."""
        tables = self._tables[request.request_id]
        self.remove_skipped(request)
        needed = sum(
            self._new_blocks_needed(g, t, request.num_tokens, request.num_computed_tokens)
            for g, t in zip(self.groups, tables, strict=True)
        )
        if needed > self.pool.num_free:
            return False
        for group, table in zip(self.groups, tables, strict=True):
            self._extend(group, table, request.num_tokens, request.num_computed_tokens)
        return True

    def _new_blocks_needed(self, group: GroupLayout, table: list[int], num_tokens: int, num_computed: int) -> int:
        skipped = _skipped_tokens(group, num_computed) // group.block_size
        target = math.ceil(num_tokens / group.block_size)
        return max(0, target - max(len(table), skipped))

    def _extend(self, group: GroupLayout, table: list[int], num_tokens: int, num_computed: int) -> None:
        skipped = _skipped_tokens(group, num_computed) // group.block_size
        target = math.ceil(num_tokens / group.block_size)
        if len(table) < skipped:
            table.extend([self.pool.null_block_id] * (min(skipped, target) - len(table)))
        if len(table) < target:
            fresh = self.pool.allocate(target - len(table))
            table.extend(fresh)
            self._fresh.setdefault(group.index, []).extend(fresh)

    def take_fresh_blocks(self) -> dict[int, list[int]]:
        """Blocks handed out since the last call, per group (the worker poisons them before use)."""
        fresh, self._fresh = self._fresh, {}
        return fresh

    def remove_skipped(self, request: Request) -> None:
        """Free sliding-window blocks no position from ``num_computed_tokens`` on attends to."""
        null = self.pool.null_block_id
        for group, table in zip(self.groups, self._tables[request.request_id], strict=True):
            skipped = _skipped_tokens(group, request.num_computed_tokens) // group.block_size
            released: list[int] = []
            for index in range(min(skipped, len(table))):
                if table[index] != null:
                    released += self.pool.free([table[index]])
                    table[index] = null
            self._released(group, released)

    # ---- caching and release ----------------------------------------------------------

    def cache_computed(self, request: Request) -> None:
        """Publish the request's full, computed blocks in the prefix cache."""
        counts = self._num_cached[request.request_id]
        for group, table in zip(self.groups, self._tables[request.request_id], strict=True):
            full = min(request.num_computed_tokens // group.block_size, len(table))
            for index in range(counts[group.index], full):
                block = table[index]
                if block != self.pool.null_block_id:
                    last = (index + 1) * group.block_size - 1
                    self.pool.cache((group.index, request.prefix_hash(last)), block)
            counts[group.index] = max(counts[group.index], full)

    def block_ids(self, request: Request) -> BlockIds:
        """A copy of the request's tables (what ``update_state_after_alloc`` gets)."""
        return tuple(list(table) for table in self._tables[request.request_id])

    def computed_block_ids(self, request: Request) -> BlockIds:
        """The tables trimmed to the blocks holding computed tokens (what a finished request hands over)."""
        return tuple(
            list(table[: math.ceil(request.num_computed_tokens / group.block_size)])
            for group, table in zip(self.groups, self._tables[request.request_id], strict=True)
        )

    def free(self, request: Request) -> None:
        """Release every block of the request, tail first (tails are the least likely to be shared)."""
        tables = self._tables.pop(request.request_id)
        del self._num_cached[request.request_id]
        for group, table in zip(self.groups, tables, strict=True):
            self._released(group, self.pool.free(reversed(table)))

    def _released(self, group: GroupLayout, blocks: list[int]) -> None:
        if blocks and self.on_released is not None:
            self.on_released(group, blocks)

    def num_held(self, request: Request) -> int:
        """Real (non-null) blocks the request holds, over every group."""
        null = self.pool.null_block_id
        return sum(1 for table in self._tables[request.request_id] for b in table if b != null)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._tables
