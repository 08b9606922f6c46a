"""``CPUOffloadConnector``: computed KV kept in a host block pool, loaded on a prefix hit.

The pool is a :class:`~capkv.stores.Backend` in the worker's memory whose contents the scheduler side decides,
so both sides agree without sharing state.
"""

from __future__ import annotations

import heapq
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar, cast

from capkv._homes import publish
from capkv.config._options import ConnectorOptions, Option
from capkv.connectors._host_pool import HostPoolIndex
from capkv.contracts._arguments import require_int, require_str
from capkv.contracts._engine import BlockIds, ComputedTokenRequest, KVTransferParams
from capkv.contracts._spec import KVSpec
from capkv.errors import ConfigError
from capkv.stores._backend import StoreKey
from capkv.stores._base import PrefixStoreConnector, require_store_spec
from capkv.stores._host import rows_memory
from capkv.stores._worker import StoreWorker

if TYPE_CHECKING:  # torch loads with the KV cache, not with the store classes
    import torch

    import capkv.transfer._copier

__all__ = ["CPUOffloadConnector", "HostPool", "HostPoolConnector"]

_SLOT_ALIGNMENT = 64
"""Slots start on cache lines."""


class HostPool:
    """The pool memory: ``capacity`` slots of one value each, allocated when the KV cache is registered.

    A backend whose contents the scheduler side decides: it never evicts on its
    own, and a put that finds no free slot is refused (the save fails).
    """

    slow: bool = False
    """Memory: loads run in the engine's step."""

    def __init__(self, capacity: int, *, owner: str) -> None:
        self._owner = owner
        self.capacity: int = capacity
        self._pool = cast("torch.Tensor | None", None)
        self._memory = memoryview(b"")
        """The pool's bytes (slot ``i`` at ``i * _stride``)."""
        self._stride = 0
        self._slots: dict[StoreKey, int] = {}
        self._lengths: dict[StoreKey, int] = {}
        """How many bytes were put under each key (a value put short reads back short: damaged)."""
        self._free = list(range(capacity))
        self._lock = threading.Lock()

    def allocate(self, value_nbytes: int, *, pinned: bool) -> None:
        """Slots for values of up to ``value_nbytes``; a pool already there keeps its values."""
        import torch  # noqa: PLC0415

        slot_nbytes = -(-value_nbytes // _SLOT_ALIGNMENT) * _SLOT_ALIGNMENT
        if self._pool is not None:  # registered again: the stored blocks must survive
            if self._pool.shape[1] != slot_nbytes:
                raise ConfigError(
                    f"{self._owner}.register_kv_caches: the new KV cache has {slot_nbytes}-byte slots, the "
                    f"pool was built for {self._pool.shape[1]}; its stored blocks would be lost",
                    connector=self._owner, method="register_kv_caches", value=slot_nbytes,
                )
            return
        self._pool = torch.empty((self.capacity, slot_nbytes), dtype=torch.uint8, pin_memory=pinned)
        self._memory, self._stride = rows_memory(self._pool)

    def __len__(self) -> int:
        return len(self._slots)

    def _slot(self, slot: int, nbytes: int) -> memoryview:
        if self._pool is None:
            raise ConfigError(f"{self._owner}: no host pool before register_kv_caches", connector=self._owner)
        start = slot * self._stride
        return self._memory[start : start + nbytes]

    def contains(self, keys: Sequence[StoreKey], /) -> list[bool]:
        with self._lock:
            return [self._lengths.get(key) == key.nbytes for key in keys]

    def _places(self, keys: Sequence[StoreKey]) -> list[tuple[int, int] | None]:
        with self._lock:
            return [
                None if (slot := self._slots.get(key)) is None or (length := self._lengths.get(key)) is None
                else (slot, length)
                for key in keys
            ]

    def get(self, keys: Sequence[StoreKey], /) -> list[bytes | None]:
        return [None if place is None else bytes(self._slot(*place)) for place in self._places(keys)]

    def get_into(self, keys: Sequence[StoreKey], buffers: Sequence[memoryview], /) -> list[int | None]:
        read: list[int | None] = []
        for place, buffer in zip(self._places(keys), buffers, strict=True):
            if place is None:
                read.append(None)
                continue
            slot, length = place
            buffer[:length] = self._slot(slot, length)
            read.append(length)
        return read

    def put(self, items: Sequence[tuple[StoreKey, memoryview]], /) -> list[bool]:
        stored: list[bool] = []
        for key, value in items:
            if len(value) > key.nbytes:  # more than a slot holds for it: refused, whatever was there stays
                stored.append(False)
                continue
            with self._lock:
                slot = self._slots.get(key)
                if slot is None and self._free:
                    slot = self._slots[key] = heapq.heappop(self._free)
                self._lengths.pop(key, None)  # absent while it is rewritten
            if slot is None:
                stored.append(False)
                continue
            self._slot(slot, len(value))[:] = value
            with self._lock:
                if self._slots.get(key) == slot:
                    self._lengths[key] = len(value)
            stored.append(True)
        return stored

    def delete(self, keys: Sequence[StoreKey], /) -> None:
        with self._lock:
            for key in keys:
                slot = self._slots.pop(key, None)
                self._lengths.pop(key, None)
                if slot is not None:
                    heapq.heappush(self._free, slot)

    def close(self) -> None:
        with self._lock:
            self._slots.clear()
            self._lengths.clear()
        self._memory = memoryview(b"")
        self._pool = None


class _PoolWorker(StoreWorker):
    """The shared worker, sizing the pool's slots from the registered KV cache."""

    def __init__(self, spec: KVSpec, pool: HostPool, *, owner: str) -> None:
        super().__init__(spec, pool, owner=owner, background=None)
        self._pool = pool

    def _attached(self, copier: capkv.transfer._copier.BlockCopier) -> None:
        self._pool.allocate(max(self.value_sizes), pinned=copier.device.type == "cuda")


class HostPoolConnector(PrefixStoreConnector):
    """A prefix cache in a host block pool — the single-group methods only.

    ``spec`` describes the engine's KV cache (every group's layers, block size,
    sliding window, per-layer shape; the dtype). ``capacity_blocks`` bounds the
    pool. ``namespace`` separates models that share layer names and shapes.
    Whether it serves several groups is its subclasses' choice.

    The pool holds ``capacity_blocks`` values (each slot as large as the largest group's value) in one host
    tensor (:class:`HostPool`). What it holds is decided on the scheduler side
    (:class:`~capkv.connectors._host_pool.HostPoolIndex`): when a save needs room, it evicts from the tail of
    the prefix chain used longest ago — never a block a load or a save is using, nor one of the prefix the
    save extends — and the evicted blocks travel to the worker in the step's metadata, deleted before the
    step's saves are written. On CUDA the pool is pinned and saves are written in the background.
    """

    extra_config_options: ClassVar[ConnectorOptions] = ConnectorOptions(
        takes_spec=True,
        capacity_blocks=Option(int, minimum=1, required=True, help="blocks the host pool holds"),
        namespace=Option(str, help="separates models that share layer names and shapes"),
    )
    """What a configuration may set (``capkv check`` and the builder refuse anything else)."""
    default_loads_async: ClassVar[bool | None] = False  # memory: loads run in the engine's step

    def __init__(self, spec: KVSpec, *, capacity_blocks: int, namespace: str = "") -> None:
        name = type(self).__name__
        require_store_spec(spec, name)
        capacity_blocks = require_int(capacity_blocks, name, "capacity_blocks", minimum=1, connector=name, method="__init__")
        require_str(namespace, name, "namespace", connector=name, method="__init__")
        self.pool: HostPoolIndex = HostPoolIndex(capacity_blocks)
        """Which blocks the pool holds (scheduler side)."""
        self.memory: HostPool = HostPool(capacity_blocks, owner=name)
        """The pool itself (worker side)."""
        super().__init__(spec, self.pool, _PoolWorker(spec, self.memory, owner=name), namespace=namespace)


class CPUOffloadConnector(HostPoolConnector):
    """Host-memory prefix cache for every KV-cache group (HMA-capable)."""

    def request_finished_all_groups(
        self, request: ComputedTokenRequest, block_ids: BlockIds, /
    ) -> tuple[bool, KVTransferParams | None]:
        """Save the request's computed full blocks of every group; hold them until the copy completes."""
        return self._finish(request, block_ids, "request_finished_all_groups")


publish(__name__)
