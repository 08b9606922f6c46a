"""``CPUOffloadConnector``: computed KV kept in a host block pool, loaded on a prefix hit.

The pool holds ``capacity_blocks`` blocks (each slot as large as the largest
group's block) and, when a save needs room, evicts from the tail of the prefix
chain used longest ago — never a block a load or a save is using, nor one of
the prefix the save extends (see :mod:`capkv.connectors._host_pool`). On CUDA the pool is pinned
and copies run on a side stream.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from capkv._homes import publish
from capkv.config._options import ConnectorOptions, Option
from capkv.connectors._base import PrefixStoreConnector, require_store_spec
from capkv.connectors._host_pool import HostPoolIndex
from capkv.connectors._metadata import BlockMove
from capkv.connectors._worker import Landing, StoreWorker, StoredWhenCopied, consecutive_runs
from capkv.contracts._arguments import require_int, require_str
from capkv.contracts._engine import BlockIds, ComputedTokenRequest, KVTransferParams
from capkv.contracts._spec import KVSpec
from capkv.errors import ConfigError
from capkv.transfer._copier import BlockCopier
from capkv.transfer._handle import CopyHandle, all_of

__all__ = ["CPUOffloadConnector", "HostPoolConnector", "HostPoolWorker"]

_SLOT_ALIGNMENT = 64
"""Slots start on cache lines, so every group's rows take the widest copy word."""


class HostPoolWorker(StoreWorker):
    """The pool memory: ``capacity`` slots, allocated when the engine registers its KV cache."""

    def __init__(self, spec: KVSpec, capacity: int, *, owner: str) -> None:
        super().__init__(spec, owner=owner)
        self._capacity = capacity
        self._pool: torch.Tensor | None = None

    def _attached(self, copier: BlockCopier) -> None:
        largest = max(copier.block_nbytes(g) for g in range(self._spec.num_groups))
        slot_nbytes = -(-largest // _SLOT_ALIGNMENT) * _SLOT_ALIGNMENT
        if self._pool is not None:  # registered again: the stored blocks must survive
            if self._pool.shape[1] != slot_nbytes:
                raise ConfigError(
                    f"{self._owner}.register_kv_caches: the new KV cache has {slot_nbytes}-byte slots, the "
                    f"pool was built for {self._pool.shape[1]}; its stored blocks would be lost",
                    connector=self._owner, method="register_kv_caches", value=slot_nbytes,
                )
            return
        self._pool = copier.host_rows(self._capacity, slot_nbytes)

    def _rows(self, copier: BlockCopier, group: int, first_slot: int, count: int) -> torch.Tensor:
        pool = self._pool
        if pool is None:  # set with the copier
            raise ConfigError(f"{self._owner}: no host pool", connector=self._owner)
        return pool[first_slot : first_slot + count, : copier.block_nbytes(group)]

    def _load(self, copier: BlockCopier, move: BlockMove) -> tuple[CopyHandle, set[int]]:
        handles = [
            copier.scatter(move.group, move.block_ids[i : i + n], self._rows(copier, move.group, slot, n))
            for i, n, slot in consecutive_runs(move.slots)
        ]
        return all_of(handles), set()

    def _save(self, copier: BlockCopier, move: BlockMove) -> tuple[CopyHandle, Landing]:
        copied = all_of([
            copier.gather(move.group, move.block_ids[i : i + n], self._rows(copier, move.group, slot, n))
            for i, n, slot in consecutive_runs(move.slots)
        ])
        return copied, StoredWhenCopied(copied)


class HostPoolConnector(PrefixStoreConnector):
    """A prefix cache in a host block pool — the single-group methods only.

    ``spec`` describes the engine's KV cache (every group's layers, block size,
    sliding window, per-layer shape; the dtype). ``capacity_blocks`` bounds the
    pool. ``namespace`` separates models that share layer names and shapes.
    Whether it serves several groups is its subclasses' choice.
    """

    extra_config_options: ClassVar[ConnectorOptions] = ConnectorOptions(
        takes_spec=True,
        capacity_blocks=Option(int, minimum=1, required=True, help="blocks the host pool holds"),
        namespace=Option(str, help="separates models that share layer names and shapes"),
    )
    """What a configuration may set (``capkv check`` and the builder refuse anything else)."""

    def __init__(self, spec: KVSpec, *, capacity_blocks: int, namespace: str = "") -> None:
        name = type(self).__name__
        require_store_spec(spec, name)
        capacity_blocks = require_int(capacity_blocks, name, "capacity_blocks", minimum=1, connector=name, method="__init__")
        require_str(namespace, name, "namespace", connector=name, method="__init__")
        self.pool: HostPoolIndex = HostPoolIndex(capacity_blocks)
        """Which blocks the pool holds (scheduler side)."""
        super().__init__(spec, self.pool, HostPoolWorker(spec, capacity_blocks, owner=name), namespace=namespace)


class CPUOffloadConnector(HostPoolConnector):
    """Host-memory prefix cache for every KV-cache group (HMA-capable)."""

    def request_finished_all_groups(
        self, request: ComputedTokenRequest, block_ids: BlockIds, /
    ) -> tuple[bool, KVTransferParams | None]:
        """Save the request's computed full blocks of every group; hold them until the copy completes."""
        return self._finish(request, block_ids, "request_finished_all_groups")


publish(__name__)
