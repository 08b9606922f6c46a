"""What a store connector's two sides tell each other each step.

Plain frozen data, so it would cross a process boundary as it is: the two sides share nothing else.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from capkv._homes import publish
from capkv.stores._keys import BlockKey
from capkv.errors import MetadataError

__all__ = ["BlockMove", "SaveReport", "StoreMetadata"]


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
    """Engine -> store, started in ``start_load_kv``: finished requests' blocks, held by the
    engine (``delay_free``) until the copy has read them."""
    unavailable: tuple[tuple[int, int], ...] = ()
    """``(group, block_id)`` the scheduler promised but can no longer load: reported as load errors."""
    step: int = 0
    """Which step built it (counting from 1): the worker reports loads done by step, so pins
    are released by what ran, not by how often the engine calls ``update_connector_output``."""
    step_saves: tuple[BlockMove, ...] = ()
    """Engine -> store, started in ``wait_for_save``: the blocks this step's forward pass filled,
    read before the engine can free or reuse them (the engine's stream is ordered after the copy)."""
    evicted: tuple[BlockKey, ...] = ()
    """Blocks the scheduler side evicted to make room (a store whose contents it decides, the host
    pool): deleted before this step's saves are written."""
    receiving: tuple[str, ...] = ()
    """Requests whose loads this step are asynchronous (answered ``load_async=True``): read on the
    worker's reader thread and reported in ``get_finished``'s receiving set once over — each of them,
    even one with nothing left to read (every block unavailable)."""
    receiving_loads: tuple[int, ...] = ()
    """The number of each of ``receiving``'s loads, in the same order (the scheduler side numbers every
    load it plans): a load is known by its number, not by its request id, which a later load may reuse.
    The worker reports it back in ``SaveReport.received``. Empty: numbered 0 (metadata made by hand)."""


@dataclass(frozen=True)
class SaveReport:
    """Worker -> scheduler: the saves that ended since the last report, and how far loads got.

    A save is planned once per key and the key counts as held from then on,
    so it is not planned twice while it is in flight; the report ends that
    state, whichever way the save went. With several workers (tensor- and
    pipeline-parallel ranks, each storing its own shard of every block) a
    report says which shard it speaks for, and merging reports keeps each
    shard's apart (``more``): a block is loadable once *every* shard stored
    it, and a failure in any shard fails it.
    """

    stored: frozenset[BlockKey] = frozenset()
    """Complete in the store (this shard's part): loadable once every shard's is."""
    failed: frozenset[BlockKey] = frozenset()
    """Not stored (a disk error, say): the scheduler may plan them again."""
    loaded_through: int | None = None
    """The last step whose loads ran (``None``: no news); the blocks they read may be evicted. For a
    merged report: the last step every worker's loads ran."""
    layout: tuple[bytes, ...] | None = None
    """The worker's memory-layout fingerprint per group, reported once after ``register_kv_caches``
    by stores whose stored bytes depend on it, so a scheduler side that never saw the KV cache offers
    only blocks this worker can load."""
    shard: int = 0
    """The KV-cache shard (``KVShard.index``) whose worker reports ``stored``, ``failed`` and ``layout``."""
    more: tuple[SaveReport, ...] = ()
    """The other shards' reports, merged in by :meth:`aggregate` (one per shard, each without ``more``)."""
    lost: frozenset[BlockKey] = frozenset()
    """Blocks whose value (this shard's part) a load found damaged — and deleted — or absent: the
    scheduler side stops offering them at once, and may save them again."""
    received: frozenset[int] = frozenset()
    """The asynchronous loads (``StoreMetadata.receiving_loads``) this shard's worker reported over in
    the same output's ``finished_recving``: once every shard has, the scheduler side knows the load's
    blocks hold what it read (or the engine heard which failed)."""

    def parts(self) -> tuple[SaveReport, ...]:
        """One report per shard: this one's, then ``more``."""
        return (dataclasses.replace(self, more=()), *self.more) if self.more else (self,)

    def aggregate(self, other: Any, /) -> SaveReport:
        """Merge another worker's report (vLLM merges every worker's each step). Per shard: stored and
        failed keys are united, a key that shard failed to store counts as failed; a step's loads are
        done once every worker has done them (releasing a pin late is safe, early is not)."""
        if not isinstance(other, SaveReport):
            raise MetadataError(
                f"SaveReport.aggregate: expected another SaveReport, got {other!r}",
                connector="SaveReport", method="aggregate", value=other,
            )
        merged: dict[int, SaveReport] = {}
        for part in (*self.parts(), *other.parts()):
            seen = merged.get(part.shard)
            merged[part.shard] = part if seen is None else SaveReport(
                seen.stored | part.stored, seen.failed | part.failed, None, seen.layout or part.layout, part.shard,
                lost=seen.lost | part.lost, received=seen.received | part.received,
            )
        mine, theirs = self.loaded_through, other.loaded_through
        loaded = None if mine is None or theirs is None else min(mine, theirs)  # a later report covers it
        first, *rest = (
            dataclasses.replace(part, stored=part.stored - part.failed, loaded_through=None)
            for _, part in sorted(merged.items())
        )
        return dataclasses.replace(first, loaded_through=loaded, more=tuple(rest))


publish(__name__, "capkv.connectors")
