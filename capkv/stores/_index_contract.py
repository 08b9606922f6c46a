"""What a store's scheduler side asks of its index: the contract, and the optional capabilities.

An index says more than :class:`StoreIndex` by implementing one of the others; the scheduler side checks for
each at run time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from capkv.stores._keys import BlockKey

__all__ = [
    "BatchedStoreIndex", "ChainAwareIndex", "EvictingIndex", "LayoutAwareIndex", "LossAwareIndex", "StoreIndex",
]


@runtime_checkable
class StoreIndex(Protocol):
    """What the scheduler side knows of a store's contents."""

    def loadable(self, key: BlockKey, /) -> bool:
        """Stored completely, so a load may read it."""
        ...

    def holds(self, key: BlockKey, /) -> bool:
        """Stored, or reserved and not yet reported over (no need to save it again)."""
        ...

    def touch(self, key: BlockKey, /) -> None:
        """``key`` was just used (LRU stores)."""
        ...

    def pin(self, key: BlockKey, /) -> int | None:
        """Keep ``key`` until the load that reads it has run; its slot, or ``None`` when not loadable."""
        ...

    def unpin(self, key: BlockKey, /) -> None: ...

    def reserve(self, key: BlockKey, /) -> int | None:
        """A slot to save ``key`` into (``key`` is held from now on), or ``None`` when the store has no room."""
        ...

    def commit(self, key: BlockKey, /) -> None:
        """The save of ``key`` has landed: it is loadable."""
        ...

    def release(self, key: BlockKey, /) -> None:
        """The save of ``key`` failed: forget the reservation, so it may be saved again."""
        ...


@runtime_checkable
class BatchedStoreIndex(StoreIndex, Protocol):
    """A store index that answers best in batches (a remote store: one round trip, not one per block).

    The scheduler names the keys it is about to ask about; the index may learn
    them all at once and answer ``loadable``/``holds``/``pin`` from what it
    learnt, until the step's metadata is built (:meth:`forget`).
    """

    def lookup(self, keys: Sequence[BlockKey], /) -> None:
        """The scheduler will ask about ``keys`` next."""
        ...

    def forget(self) -> None:
        """A step's metadata was built: what was learnt before may be stale now."""
        ...


@runtime_checkable
class ChainAwareIndex(Protocol):
    """An index that keeps prefix chains usable when it evicts (the host pool).

    The scheduler side calls :meth:`use` with a request's chain of each group
    (head first) around every plan that may reserve, and :meth:`end_use` after it.
    """

    def use(self, chain: Sequence[BlockKey], /) -> None:
        """The request being planned uses ``chain``: recent (head most), and not evicted until ``end_use``."""
        ...

    def end_use(self) -> None: ...


@runtime_checkable
class LayoutAwareIndex(Protocol):
    """An index whose contents depend on the engine's memory layout (see ``SaveReport.layout``)."""

    def set_layout(self, fingerprints: tuple[bytes, ...], /, shard: int = 0) -> None:
        """Shard ``shard``'s worker's layout fingerprint per group."""
        ...


@runtime_checkable
class LossAwareIndex(Protocol):
    """An index that must hear when a load found a value damaged (the worker deleted it) or absent
    (``SaveReport.lost``) — one that would otherwise go on offering it: the host pool's."""

    def lost(self, key: BlockKey, /) -> None:
        """``key``'s value is gone: not loadable from now on, and saveable again."""
        ...


@runtime_checkable
class EvictingIndex(Protocol):
    """An index that decides what its store evicts (the host pool, whose memory is the worker's): the
    evicted blocks travel in the next metadata (``StoreMetadata.evicted``), for the worker to delete."""

    def take_evicted(self) -> list[BlockKey]:
        """The blocks evicted since the last call."""
        ...
