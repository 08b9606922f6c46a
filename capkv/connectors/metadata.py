"""What a store connector's scheduler side tells its worker side each step.

Plain frozen data, so it would cross a process boundary as it is: the two
sides share nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass

from capkv.connectors.keys import BlockKey

__all__ = ["BlockMove", "StoreMetadata"]


@dataclass(frozen=True)
class BlockMove:
    """Some blocks of one request and one group, moved between the engine and the store.

    ``block_ids[j]`` (an engine block) pairs with ``keys[j]`` (where it is
    stored) and ``slots[j]`` (its host-pool slot; unused by stores without one).
    """

    request_id: str
    group: int
    block_ids: tuple[int, ...]
    keys: tuple[BlockKey, ...]
    slots: tuple[int, ...]


@dataclass(frozen=True)
class StoreMetadata:
    """One step's work for the worker side."""

    loads: tuple[BlockMove, ...] = ()
    """Store -> engine, done before the step's forward pass."""
    saves: tuple[BlockMove, ...] = ()
    """Engine -> store, for finished requests whose blocks are held until the save completes."""
    unavailable: tuple[tuple[int, int], ...] = ()
    """``(group, block_id)`` the scheduler promised but can no longer load: reported as load errors."""
