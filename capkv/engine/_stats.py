"""What the engine counts while serving: prefix hits per group, bytes loaded, time in transfers.

Counted from the engine's side of the contract, so they are available for any connector; a load
reported failed is recomputed, and counted as failed, not loaded.
"""

from __future__ import annotations

import time
from collections.abc import Generator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import cast

from capkv._homes import publish

__all__ = ["EngineStats", "GroupStats"]


@dataclass
class GroupStats:
    """One KV-cache group's prefix reuse.

    Token counts cover positions whose KV the group actually holds: a sliding-window
    group reuses only the blocks inside its window, so it counts fewer tokens (and
    moves fewer bytes) than a full-attention group for the same hit.
    """

    local_hit_tokens: int = 0
    """Tokens served from blocks already in the paged cache."""
    loaded_tokens: int = 0
    """Tokens in blocks a connector loaded: offered, and not reported failed (nor after a failed block)."""
    loaded_blocks: int = 0
    loaded_bytes: int = 0
    """Bytes of the loaded blocks, over every layer of the group."""
    load_error_blocks: int = 0
    """Blocks of this group the connector reported failed (``get_block_ids_with_load_errors``)."""
    failed_load_tokens: int = 0
    """Tokens a connector offered to load in this group that the engine recomputed: from a request's first
    failed block on, in every group."""


@dataclass
class EngineStats:
    """Counters of one engine, since it started or since :meth:`reset`.

    Counts are what the engine asked connectors to load, and how long their worker-side calls took.
    Connectors' own statistics (``get_kv_connector_stats``) are kept too, as reported, for callers that know
    their shape.
    """

    num_groups: int
    requests_finished: int = 0
    steps: int = 0
    prompt_tokens: int = 0
    computed_tokens: int = 0
    local_hit_tokens: int = 0
    """Prompt tokens covered by local prefix-cache hits (all groups agree on the length)."""
    external_hit_tokens: int = 0
    """Prompt tokens connectors offered to load (``num_external_tokens``), whether the loads landed or not."""
    failed_load_tokens: int = 0
    """Of those, tokens whose load failed: the engine recomputed them (see :attr:`loaded_hit_tokens`)."""
    hit_limit_tokens: int = 0
    """Prompt tokens hits could have covered: per request admitted, the longest hit the engine takes (whole
    blocks, one token left to compute) — what a connector holding every block of every prompt would spare."""
    load_error_blocks: int = 0
    """Blocks connectors reported failed, over every group."""
    kv_events: int = 0
    transfer_seconds: float = 0.0
    """Wall time inside the connector calls that may copy KV: ``start_load_kv``,
    ``wait_for_layer_load``, ``save_kv_layer``, ``wait_for_save``, ``get_finished``
    and ``finish_request``. Copies a connector runs in the background are not in it."""
    groups: list[GroupStats] = field(default_factory=lambda: list[GroupStats]())
    connector_stats: list[object] = field(default_factory=lambda: list[object]())
    """Every non-``None`` ``get_kv_connector_stats()`` answer, in step order."""

    def __post_init__(self) -> None:
        if not self.groups:
            self.groups = [GroupStats() for _ in range(self.num_groups)]

    @property
    def loaded_bytes(self) -> int:
        """Bytes of the blocks connectors loaded (loads that landed), over every group."""
        return sum(g.loaded_bytes for g in self.groups)

    @property
    def loaded_hit_tokens(self) -> int:
        """Prompt tokens connectors loaded: offered (:attr:`external_hit_tokens`), less those whose load failed."""
        return self.external_hit_tokens - self.failed_load_tokens

    def connector_total(self, counter: str) -> int | None:
        """``counter`` summed over the connectors' statistics of every step (``None``: no statistics at all).

        The contract says ``get_kv_connector_stats`` covers the time since the
        last call, so per-step answers add up; a step without the counter counts
        as zero. A counter is read from a mapping key or an attribute; mappings
        of per-child statistics (a stack's) are walked, and their children's
        counters summed.
        """
        if not self.connector_stats:
            return None
        return sum(_counter(stats, counter) or 0 for stats in self.connector_stats)

    @contextmanager
    def transferring(self) -> Generator[None]:
        """Count the time spent in the block as time in transfers."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.transfer_seconds += time.perf_counter() - started

    def snapshot(self) -> EngineStats:
        """A copy that later steps do not change."""
        return replace(self, groups=[replace(g) for g in self.groups], connector_stats=list(self.connector_stats))

    def reset(self) -> None:
        """Zero every counter (between a cold and a warm run)."""
        fresh = EngineStats(self.num_groups)
        self.__dict__.update(fresh.__dict__)


def _counter(stats: object, name: str) -> int | None:
    if isinstance(stats, Mapping):
        entries = cast("Mapping[object, object]", stats)
        value = entries.get(name)
        if isinstance(value, int):
            return value
        found = [n for child in entries.values() if (n := _counter(child, name)) is not None]
        return sum(found) if found else None
    value = getattr(stats, name, None)
    return value if isinstance(value, int) else None


publish(__name__)
