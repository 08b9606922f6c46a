"""The scheduler side's map of a host block pool: slots, LRU order, pins.

The pool itself (the memory) lives on the worker side; the scheduler decides
which slot each block goes to and ships the decision in the connector
metadata, so both sides agree without sharing state. A slot being written is
*pending*: not loadable and not evictable until the worker reports the save
over (stored: it becomes loadable; failed: the slot is free again). A slot being read by a load is *pinned*: not evictable until the step
that loads it has run. Everything else is evicted least recently used first.
Free slots are handed out lowest first, so blocks saved together sit in
consecutive slots and move in a few batched copies.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict

from capkv.connectors._keys import BlockKey

__all__ = ["HostPoolIndex"]


class HostPoolIndex:
    """Slots of a ``capacity``-block host pool, keyed by :class:`BlockKey`."""

    __slots__ = ("_free", "_pending", "_pins", "_ready", "capacity", "evictions")

    def __init__(self, capacity: int) -> None:
        self.capacity: int = capacity
        self._free = list(range(capacity))
        self._ready: OrderedDict[BlockKey, int] = OrderedDict()
        """Loadable blocks, least recently used first."""
        self._pending: dict[BlockKey, int] = {}
        self._pins: dict[BlockKey, int] = {}
        self.evictions: int = 0
        """Blocks evicted so far."""

    def __len__(self) -> int:
        return len(self._ready) + len(self._pending)

    def loadable(self, key: BlockKey) -> bool:
        return key in self._ready

    def holds(self, key: BlockKey) -> bool:
        """Stored or being stored."""
        return key in self._ready or key in self._pending

    def touch(self, key: BlockKey) -> None:
        if key in self._ready:
            self._ready.move_to_end(key)

    def pin(self, key: BlockKey) -> int | None:
        """Keep a loadable block from eviction while a load reads it; its slot, or ``None``."""
        slot = self._ready.get(key)
        if slot is not None:
            self._ready.move_to_end(key)
            self._pins[key] = self._pins.get(key, 0) + 1
        return slot

    def unpin(self, key: BlockKey) -> None:
        count = self._pins.get(key, 0)
        if count <= 1:
            self._pins.pop(key, None)
        else:
            self._pins[key] = count - 1

    def reserve(self, key: BlockKey) -> int | None:
        """A slot for a block about to be saved (evicting if needed), or ``None`` when every slot is busy."""
        if not self._free and not self._evict_one():
            return None
        slot = heapq.heappop(self._free)
        self._pending[key] = slot
        return slot

    def commit(self, key: BlockKey) -> None:
        """The save of ``key`` completed: it becomes loadable (most recently used)."""
        slot = self._pending.pop(key, None)
        if slot is not None:
            self._ready[key] = slot

    def release(self, key: BlockKey) -> None:
        """The save of ``key`` failed: its slot is free again."""
        slot = self._pending.pop(key, None)
        if slot is not None:
            heapq.heappush(self._free, slot)

    def _evict_one(self) -> bool:
        victim = next((key for key in self._ready if key not in self._pins), None)
        if victim is None:
            return False
        heapq.heappush(self._free, self._ready.pop(victim))
        self.evictions += 1
        return True
