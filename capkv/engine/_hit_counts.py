"""Counting hits by what landed: a load the connector reported failed is taken back out of the counts.

A check that counts planned loads passes a store that never serves a byte, so the
engine counts a connector's hit when it is offered and uncounts the part the engine
had to recompute when the load fails (the request resumes from its first failed block).
"""

from __future__ import annotations

from capkv.engine._block_tables import BlockTables, LocalHit
from capkv.engine._model import ModelShape
from capkv.engine._outputs import LoadCheck
from capkv.engine._request import Request
from capkv.engine._stats import EngineStats

__all__ = ["count_failed_load", "count_hits"]


def count_hits(stats: EngineStats, shape: ModelShape, tables: BlockTables, request: Request, hit: LocalHit, external: int) -> None:
    """A request was admitted with ``hit`` from the local prefix cache and ``external`` tokens to load."""
    stats.local_hit_tokens += hit.num_tokens
    stats.external_hit_tokens += external
    stats.hit_limit_tokens += tables.hit_limit(request)
    null = tables.pool.null_block_id
    for group, table in zip(shape.groups, tables.block_ids(request), strict=True):
        size = group.block_size
        stats.groups[group.index].local_hit_tokens += sum(
            max(0, min((index + 1) * size, hit.num_tokens) - index * size)
            for index, block in enumerate(table)
            if block != null
        )
    _add_loads(stats, shape, tables, request, hit.num_tokens, hit.num_tokens + external, sign=1)


def count_failed_load(
    stats: EngineStats, shape: ModelShape, tables: BlockTables, request: Request, check: LoadCheck, resume: int
) -> None:
    """The load of ``check``'s range failed from ``resume`` on: those tokens are recomputed, not loaded."""
    if resume >= check.stop:
        return
    stats.failed_load_tokens += check.stop - resume
    before = [group.loaded_tokens for group in stats.groups]
    _add_loads(stats, shape, tables, request, check.start, check.stop, sign=-1)
    _add_loads(stats, shape, tables, request, check.start, resume, sign=1)
    for group, tokens in zip(stats.groups, before, strict=True):
        group.failed_load_tokens += tokens - group.loaded_tokens


def _add_loads(
    stats: EngineStats, shape: ModelShape, tables: BlockTables, request: Request, start: int, stop: int, *, sign: int
) -> None:
    """Add (``sign`` 1) or take out (-1) the tokens, blocks and bytes of loading ``[start, stop)``."""
    null = tables.pool.null_block_id
    for group, table in zip(shape.groups, tables.block_ids(request), strict=True):
        counts = stats.groups[group.index]
        size = group.block_size
        for index, block in enumerate(table):
            if block == null:
                continue
            loaded = max(0, min((index + 1) * size, stop) - max(index * size, start))
            if not loaded:
                continue
            counts.loaded_tokens += sign * loaded
            counts.loaded_blocks += sign
            counts.loaded_bytes += sign * shape.block_bytes(group) * len(group.layer_names)
