"""Block copies between the engine's paged KV tensors and host rows.

What connectors use: one batched call per group, whatever the block dimension or block size (the row format:
docs/api/transfer.md).
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from capkv._homes import publish
from capkv.contracts._spec import KVSpec
from capkv.contracts._block_ids import check_pool_ids
from capkv.errors import ConfigError, ContractError
from capkv.transfer._cpu import CpuCopies
from capkv.transfer._cuda import DEFAULT_STAGING_BYTES, CudaCopies
from capkv.transfer._handle import FINISHED, CopyHandle
from capkv.transfer._layout import GroupRuns, KVLayout
from capkv.transfer._runs import storage_words, widest_word, word_dtype

if TYPE_CHECKING:
    import torch
else:  # torch loads with the first tensor operation, not with this module
    from capkv._torch import torch

__all__ = ["BlockCopier"]


class BlockCopier:
    """Gathers and scatters blocks of one registered KV cache, group by group."""

    __slots__ = ("_copies", "_owner", "_places", "layout")

    def __init__(
        self,
        spec: KVSpec,
        kv_caches: Mapping[str, torch.Tensor],
        *,
        owner: str = "BlockCopier",
        staging_nbytes: int = DEFAULT_STAGING_BYTES,
    ) -> None:
        self._owner = owner
        self._places: dict[int, tuple[int, tuple[tuple[memoryview, int, int], ...]]] = {}
        self.layout: KVLayout = KVLayout(spec, kv_caches, owner=owner)
        device = self.layout.device
        if device.type == "cuda":
            self._copies: CpuCopies | CudaCopies = CudaCopies(device, staging_nbytes)
        elif device.type == "cpu":
            self._copies = CpuCopies()
        else:
            raise ConfigError(
                f"{owner}: no block copy path for device {device} (cpu and cuda are supported)",
                connector=owner, method="register_kv_caches", value=str(device),
            )

    @property
    def device(self) -> torch.device:
        """The device of the engine's KV tensors."""
        return self.layout.device

    def block_nbytes(self, group: int) -> int:
        """Bytes of one block of ``group``: every layer of the group."""
        return self._group(group, "block_nbytes").block_nbytes

    def host_rows(self, num_rows: int, row_nbytes: int) -> torch.Tensor:
        """A host buffer for ``num_rows`` blocks: pinned when the KV cache is on CUDA."""
        return torch.empty(
            (num_rows, row_nbytes), dtype=torch.uint8, pin_memory=self.device.type == "cuda"
        )

    def gather(self, group: int, block_ids: Sequence[int], rows: torch.Tensor) -> CopyHandle:
        """Copy blocks ``block_ids`` of ``group`` into ``rows`` (one row per id, in order)."""
        runs = self._group(group, "gather")
        ids = self._ids(runs, block_ids, "gather", unique=False)
        if ids is None:
            return FINISHED
        word, host = self._rows(runs, rows, len(block_ids), "gather")
        return self._copies.gather(runs, word, ids, host)

    def scatter(self, group: int, block_ids: Sequence[int], rows: torch.Tensor) -> CopyHandle:
        """Copy ``rows`` into blocks ``block_ids`` of ``group`` (ids must be distinct)."""
        runs = self._group(group, "scatter")
        ids = self._ids(runs, block_ids, "scatter", unique=True)
        if ids is None:
            return FINISHED
        word, host = self._rows(runs, rows, len(block_ids), "scatter")
        return self._copies.scatter(runs, word, ids, host)

    def block_memory(self, group: int, block_ids: Sequence[int]) -> list[list[memoryview]] | None:
        """Per block of ``group``, its bytes where they lie in the KV cache, run by run in the order a
        gathered row holds them (writable views, no copy: the KV tensors must outlive them), so a stored
        value can be read into place; ``None`` off the CPU, whose memory a read cannot land in."""
        if self.device.type != "cpu":
            return None
        runs = self._group(group, "block_memory")
        spec = self.layout.spec
        check_pool_ids(
            block_ids if isinstance(block_ids, list) else [*block_ids], num_blocks=spec.num_blocks, repeatable=None,
            distinct=True, group=runs.index, connector=self._owner, method="block_memory",
        )
        places = self._places.get(group)
        if places is None:  # each layer's storage as one memoryview, made once: a slice per run is cheap
            places = self._places[group] = (runs.run_nbytes, tuple(
                (memory, layer.block_stride, offset)
                for layer in runs.layers for memory in (_storage_memory(layer.tensor),) for offset in layer.run_offsets
            ))
        size, where = places
        return [
            [memory[(start := block * stride + offset) : start + size] for memory, stride, offset in where]
            for block in block_ids
        ]

    # ---- checks --------------------------------------------------------------------

    def _group(self, group: int, method: str) -> GroupRuns:
        groups = self.layout.groups
        if not _is_index(group, len(groups)):
            raise ContractError(
                f"{self._owner}.{method}: group {group!r} does not exist; the KV cache has {len(groups)} groups",
                connector=self._owner, method=method, value=group,
            )
        return groups[group]

    def _ids(self, runs: GroupRuns, block_ids: Sequence[int], method: str, *, unique: bool) -> torch.Tensor | None:
        """``block_ids`` as an index tensor, checked by the one block-id rule capkv has
        (:func:`capkv.contracts._block_ids.check_pool_ids`): exact ints in the pool; a gather may read
        a block twice, a scatter may not write one twice (two rows into one block race)."""
        if not block_ids:
            return None
        spec = self.layout.spec
        as_list: object = block_ids if isinstance(block_ids, list) else [*block_ids]
        ids = check_pool_ids(
            as_list,
            num_blocks=spec.num_blocks, repeatable=None, distinct=unique,
            group=runs.index, connector=self._owner, method=method,
        )
        return torch.tensor(ids, dtype=torch.int64)

    def _rows(self, runs: GroupRuns, rows: torch.Tensor, count: int, method: str) -> tuple[int, torch.Tensor]:
        """The widest word both sides allow, and ``rows`` viewed as ``(count, runs, run_words)``."""
        needed = runs.block_nbytes
        shape = rows.shape
        if (
            rows.dtype != torch.uint8
            or len(shape) != 2
            or rows.device.type != "cpu"
            or shape[0] != count
            or shape[1] < needed
            or (shape[1] > 1 and rows.stride(1) != 1)
        ):
            raise ContractError(
                f"{self._owner}.{method}: group {runs.index} needs host rows as a cpu uint8 tensor of shape "
                f"({count}, >= {needed}) with contiguous rows; got {rows.dtype} {tuple(shape)} "
                f"strides {rows.stride()} on {rows.device}",
                connector=self._owner, method=method, group=runs.index, value=tuple(shape),
            )
        offset = int(rows.storage_offset())
        row_stride = int(rows.stride(0))
        word = widest_word(runs.alignment, rows.data_ptr(), offset, row_stride, runs.run_nbytes)
        width = runs.run_nbytes // word
        if count == 1 or row_stride >= needed:  # rows apart: a view by dtype, no storage round trip
            view = rows[:, :needed].view(word_dtype(word)).view(count, runs.runs_per_block, width)
        else:
            view = storage_words(rows, word).as_strided(
                (count, runs.runs_per_block, width), (row_stride // word, width, 1), offset // word
            )
        return word, view


def _is_index(value: object, size: int) -> bool:
    return type(value) is int and 0 <= value < size


def _storage_memory(tensor: torch.Tensor) -> memoryview:
    """The whole CPU storage under ``tensor`` as writable bytes (the tensor must outlive the view)."""
    storage = tensor.untyped_storage()
    return memoryview((ctypes.c_char * storage.nbytes()).from_address(storage.data_ptr())).cast("B")


publish(__name__)
