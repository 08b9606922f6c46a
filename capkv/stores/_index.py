"""The scheduler side's view of a shared backend: which blocks every shard can load.

A backend other processes share is the truth about its contents, so this index asks it, in batches.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from capkv.contracts._spec import KVSpec
from capkv.stores._backend import Backend, PinningBackend, StoreKey
from capkv.stores._keys import BlockKey
from capkv.stores._value import HEADER_SIZE

__all__ = ["BackendIndex"]

_log = logging.getLogger("capkv.stores")


class BackendIndex:
    """What the scheduler side knows of a shared backend's contents (a batched, layout-aware index)."""

    def __init__(self, backend: Backend, spec: KVSpec, *, owner: str) -> None:
        from capkv.transfer._layout import spec_block_nbytes  # noqa: PLC0415 (sizes from the spec alone)

        self._backend = backend
        self._pinning = backend if isinstance(backend, PinningBackend) else None  # asked once: a protocol check is slow
        self._owner = owner
        self._shards = spec.shard.count
        self._sizes = tuple(HEADER_SIZE + spec_block_nbytes(spec, g, owner=owner) for g in range(spec.num_groups))
        self._layouts: dict[int, tuple[bytes, ...]] = {}
        self._known: dict[BlockKey, bool] = {}
        self._pending: set[BlockKey] = set()
        self._pinned: dict[BlockKey, list[list[StoreKey]]] = {}
        self._logged = False
        self.lookups: int = 0
        """Batches asked of the backend."""
        self.unanswered: int = 0
        """Keys whose lookup raised: taken as misses."""

    def set_layout(self, fingerprints: tuple[bytes, ...], /, shard: int = 0) -> None:
        """Shard ``shard``'s memory-layout fingerprint per group (from its worker's report)."""
        if self._layouts.get(shard) != fingerprints:
            self._layouts[shard] = fingerprints
            self._known.clear()

    def physical(self, key: BlockKey) -> list[StoreKey] | None:
        """``key``'s value in every shard, or ``None`` while a shard's layout is unknown."""
        if len(self._layouts) < self._shards:
            return None
        size = self._sizes[key.group]
        return [StoreKey(key, self._layouts[shard][key.group], size) for shard in range(self._shards)]

    def lookup(self, keys: Sequence[BlockKey], /) -> None:
        """Learn, in one ``contains``, whether each of ``keys`` is loadable now (asked afresh: what was
        learnt before may be stale)."""
        unknown = list(dict.fromkeys(keys))
        if not unknown:
            return
        physical = [self.physical(k) for k in unknown]
        asked = [value for values in physical if values is not None for value in values]
        answers: list[bool] = []
        if asked:
            self.lookups += 1
            try:
                answers = [answer is True for answer in self._backend.contains(asked)]
                if len(answers) != len(asked):
                    raise ValueError(f"contains answered {len(answers)} results for {len(asked)} keys")
            except Exception as error:  # noqa: BLE001 (an unanswered lookup is a miss)
                self.unanswered += len(unknown)
                if not self._logged:
                    self._logged = True
                    _log.warning("%s: the backend's contains failed; its keys are misses: %r", self._owner, error)
                answers = [False] * len(asked)
        found = iter(answers)
        for key, values in zip(unknown, physical, strict=True):
            self._known[key] = values is not None and all([next(found) for _ in values])

    def forget(self) -> None:
        """A step's metadata was built: what was learnt may be stale now."""
        self._known.clear()

    def loadable(self, key: BlockKey, /) -> bool:
        """Every shard's value is in the backend (also while a save of it is pending here: a value
        the backend holds whole is loadable whoever wrote it)."""
        if key not in self._known:
            self.lookup((key,))
        return self._known[key]

    def holds(self, key: BlockKey, /) -> bool:
        return key in self._pending or self.loadable(key)

    def touch(self, key: BlockKey, /) -> None:
        return None  # the backend keeps its own recency: reads touch

    def pin(self, key: BlockKey, /) -> int | None:
        """Keep ``key`` until its load ran, where the backend can pin; its slot (0) or ``None``."""
        if not self.loadable(key):
            return None
        pinning = self._pinning
        if pinning is None:
            return 0  # a block evicted before its load runs is a load error then, never wrong KV
        values = self.physical(key) or []
        pinned = list(pinning.pin(values))
        if len(pinned) != len(values) or not all(answer is True for answer in pinned):
            pinning.unpin([v for v, answer in zip(values, pinned) if answer is True])
            self._known[key] = False
            return None
        self._pinned.setdefault(key, []).append(values)
        return 0

    def unpin(self, key: BlockKey, /) -> None:
        held = self._pinned.get(key)
        if held and self._pinning is not None:
            self._pinning.unpin(held.pop())
            if not held:
                del self._pinned[key]

    def reserve(self, key: BlockKey, /) -> int | None:
        self._pending.add(key)
        return 0

    def commit(self, key: BlockKey, /) -> None:
        self._pending.discard(key)
        self._known.pop(key, None)

    def release(self, key: BlockKey, /) -> None:
        self._pending.discard(key)

    def lost(self, key: BlockKey, /) -> None:
        """A load found ``key`` damaged (deleted) or absent: ask the backend afresh."""
        self._known.pop(key, None)
