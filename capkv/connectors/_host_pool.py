"""The scheduler side's map of a host block pool: slots, recency, pins.

The scheduler decides what the worker's pool holds and ships the decisions in the connector metadata, so both
sides agree without sharing state.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from capkv.stores._keys import BlockKey

__all__ = ["HostPoolIndex"]


class HostPoolIndex:
    """Slots of a ``capacity``-block host pool, keyed by :class:`BlockKey`.

    A slot being written is *pending*: not loadable and not evictable until the worker reports the save over
    (stored: it becomes loadable; failed: the slot is free again). A slot being read by a load is *pinned*:
    not evictable until the step that loads it has run.

    Eviction keeps prefix chains usable. A block is only worth something while every block before it in its
    chain is stored too, so a chain is evicted from its tail: when a request uses its chain (:meth:`use`, head
    first), the head becomes the most recently used block of all and each block after it a little less, so the
    least recently used block — the victim — is the tail of the chain used longest ago. Blocks a request is
    using are protected until :meth:`end_use`: a save never evicts a block of the prefix it extends (that
    would spend a slot to break the chain it is adding to). The index counts slots (the pool's capacity); the
    pool memory places values in its own slots.
    """

    __slots__ = (
        "_clock", "_evicted", "_free", "_heap", "_pending", "_pins", "_protected", "_protected_keys", "_ready",
        "_stamps", "capacity", "evictions",
    )

    def __init__(self, capacity: int) -> None:
        self.capacity: int = capacity
        self._free = list(range(capacity))
        self._ready: dict[BlockKey, int] = {}
        """Loadable blocks and their slots."""
        self._pending: dict[BlockKey, int] = {}
        self._pins: dict[BlockKey, int] = {}
        self._stamps: dict[BlockKey, int] = {}
        """Recency of every block held (ready or pending): larger is more recent."""
        self._heap: list[tuple[int, BlockKey]] = []
        """``(stamp, key)``, lazily cleaned: an entry counts only while its stamp is current."""
        self._clock = 0
        self._protected: dict[int, Sequence[BlockKey]] = {}
        """The chains in use by the request being planned, by identity."""
        self._protected_keys: set[BlockKey] | None = None
        """Their keys, built when an eviction first needs them."""
        self.evictions: int = 0
        """Blocks evicted so far."""
        self._evicted: list[BlockKey] = []
        """Evicted since :meth:`take_evicted`: the worker deletes them from the pool memory."""

    def __len__(self) -> int:
        return len(self._ready) + len(self._pending)

    def loadable(self, key: BlockKey) -> bool:
        return key in self._ready

    def holds(self, key: BlockKey) -> bool:
        """Stored or being stored."""
        return key in self._ready or key in self._pending

    # ---- recency -------------------------------------------------------------------------

    def _stamp(self, key: BlockKey, stamp: int) -> None:
        self._stamps[key] = stamp
        if key in self._ready:
            heapq.heappush(self._heap, (stamp, key))
        if len(self._heap) > 4 * len(self._ready) + 64:
            self._heap = [(s, k) for k, s in self._stamps.items() if k in self._ready]
            heapq.heapify(self._heap)

    def touch(self, key: BlockKey) -> None:
        """``key`` was just used on its own: the most recently used block."""
        if self.holds(key):
            self._clock += 1
            self._stamp(key, self._clock)

    def use(self, chain: Sequence[BlockKey]) -> None:
        """A request uses ``chain`` (one group's keys, head first; blocks not held are skipped): its held
        blocks are protected from eviction until :meth:`end_use`, which makes the head the most recently
        used block and each later one a little less. (A chain passed again, grown, replaces itself.)"""
        self._protected[id(chain)] = chain

    def end_use(self) -> None:
        """The request's plan is over: stamp its chains (head most recent) and let them be evicted again."""
        for chain in self._protected.values():
            base = self._clock
            self._clock += len(chain)
            for position, key in enumerate(chain):
                if key in self._ready or key in self._pending:
                    self._stamp(key, base + len(chain) - position)
        self._protected.clear()
        self._protected_keys = None

    # ---- slots ---------------------------------------------------------------------------------

    def pin(self, key: BlockKey) -> int | None:
        """Keep a loadable block from eviction while a load reads it; its slot, or ``None``."""
        slot = self._ready.get(key)
        if slot is not None:
            self._pins[key] = self._pins.get(key, 0) + 1
        return slot

    def unpin(self, key: BlockKey) -> None:
        count = self._pins.get(key, 0)
        if count <= 1:
            self._pins.pop(key, None)
        else:
            self._pins[key] = count - 1

    def reserve(self, key: BlockKey) -> int | None:
        """A slot for a block about to be saved (evicting if needed), or ``None`` when no block may go."""
        if not self._free and not self._evict_one():
            return None
        slot = heapq.heappop(self._free)
        self._pending[key] = slot
        self._clock += 1
        self._stamps[key] = self._clock
        return slot

    def commit(self, key: BlockKey) -> None:
        """The save of ``key`` completed: it becomes loadable, as recent as its request's last use made it."""
        slot = self._pending.pop(key, None)
        if slot is not None:
            self._ready[key] = slot
            self._stamp(key, self._stamps.get(key, self._clock))

    def release(self, key: BlockKey) -> None:
        """The save of ``key`` failed: its slot is free again."""
        slot = self._pending.pop(key, None)
        if slot is not None:
            self._stamps.pop(key, None)
            heapq.heappush(self._free, slot)

    def lost(self, key: BlockKey) -> None:
        """A load found ``key``'s value damaged or gone (the worker deleted it): its slot is free, and
        the key is neither loadable nor held, so the next request that computes it saves it again."""
        slot = self._ready.pop(key, None)
        if slot is not None:
            self._stamps.pop(key, None)
            heapq.heappush(self._free, slot)

    def _evict_one(self) -> bool:
        """Free the slot of the least recently used block that is neither pinned nor in use."""
        skipped: list[tuple[int, BlockKey]] = []
        victim: BlockKey | None = None
        if self._protected_keys is None:
            self._protected_keys = {key for chain in self._protected.values() for key in chain}
        protected = self._protected_keys
        while self._heap:
            stamp, key = heapq.heappop(self._heap)
            if key not in self._ready or self._stamps.get(key) != stamp:
                continue  # stale entry
            if key in self._pins or key in protected:
                skipped.append((stamp, key))
                continue
            victim = key
            break
        for entry in skipped:
            heapq.heappush(self._heap, entry)
        if victim is None:
            return False
        heapq.heappush(self._free, self._ready.pop(victim))
        del self._stamps[victim]
        self.evictions += 1
        self._evicted.append(victim)
        return True

    def take_evicted(self) -> list[BlockKey]:
        """The blocks evicted since the last call (the worker side deletes them before its next saves)."""
        evicted, self._evicted = self._evicted, []
        return evicted
