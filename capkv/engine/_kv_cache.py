"""The paged KV cache: one tensor per layer, addressed through a group's block table.

Fresh and reset caches hold a poison value, so a block a connector claimed to load but never wrote is caught.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
import torch

from capkv.engine._model import NULL_BLOCK_ID, GroupLayout, ModelShape

__all__ = ["PagedKVCache", "Slots"]


@dataclass(frozen=True)
class Slots:
    """Where some token positions live in one group: block ids and in-block offsets (on the device)."""

    positions: list[int]
    block_indices: list[int]
    """Index of each position's block in the table."""
    block_ids: list[int]
    slots: torch.Tensor
    """``block_id * block_size + offset`` of each position, on the device."""

    def __len__(self) -> int:
        return len(self.positions)

    @staticmethod
    def concat(parts: list[Slots]) -> Slots:
        return Slots(
            [p for part in parts for p in part.positions],
            [i for part in parts for i in part.block_indices],
            [b for part in parts for b in part.block_ids],
            torch.cat([part.slots for part in parts]),
        )


class PagedKVCache:
    """Every layer's paged KV tensor, allocated from the model shape.

    Each layer's tensor is ``(2, num_blocks, block_size, num_kv_heads, head_dim)`` (keys and values first,
    blocks in dimension 1, as :meth:`ModelShape.kv_spec` declares). A token position ``p`` of a request lives
    in block ``table[p // block_size]`` at offset ``p % block_size`` — its *slot*.
    """

    def __init__(self, shape: ModelShape, *, mem_pool: AbstractContextManager[object] | None = None) -> None:
        self.shape = shape
        self.device: torch.device = torch.device(shape.device)
        self.null_block_id = NULL_BLOCK_ID
        self.group_of_layer: dict[str, GroupLayout] = {name: group for group in shape.groups for name in group.layer_names}
        with mem_pool if mem_pool is not None else nullcontext():
            self.tensors: dict[str, torch.Tensor] = {
                name: torch.empty(shape.kv_shape(group), dtype=shape.dtype, device=self.device)
                for name, group in self.group_of_layer.items()
            }
        self.poison()

    def poison(self) -> None:
        """Fill every block with a value the model never produces."""
        for tensor in self.tensors.values():
            tensor.fill_(self._poison_value(tensor))

    def poison_blocks(self, group: GroupLayout, block_ids: list[int]) -> None:
        """Poison some of a group's blocks, in every layer of the group.

        Freshly allocated blocks are poisoned, so one that a connector claims to
        load but never writes cannot pass for loaded with what an earlier owner left.
        """
        if not block_ids:
            return
        index = torch.tensor(block_ids, dtype=torch.int64, device=self.device)
        for name in group.layer_names:
            tensor = self.tensors[name]
            tensor.index_fill_(1, index, self._poison_value(tensor))

    def null_block_written(self) -> tuple[GroupLayout, str] | None:
        """The first group and layer whose null block no longer holds the poison: someone wrote it.

        The engine never writes the null block (it stands in for blocks outside a sliding window), so
        a connector that copied into it wrote a block the engine did not allocate.
        """
        for name, group in self.group_of_layer.items():
            block = self.tensors[name].select(1, self.null_block_id)
            poison = self._poison_value(block)
            intact = torch.isnan(block).all() if poison != poison else (block == poison).all()
            if not bool(intact):
                return group, name
        return None

    @staticmethod
    def _poison_value(tensor: torch.Tensor) -> float:
        """NaN for float dtypes, else the minimum integer."""
        return float("nan") if tensor.dtype.is_floating_point else float(torch.iinfo(tensor.dtype).min)

    def slots(self, group: GroupLayout, table: list[int], positions: Iterable[int], *, skip_null: bool = False) -> Slots:
        """The slots of ``positions`` (the table must cover them); ``skip_null`` leaves out null blocks."""
        size = group.block_size
        kept = [p for p in positions if not (skip_null and table[p // size] == self.null_block_id)]
        indices = [p // size for p in kept]
        blocks = [table[i] for i in indices]
        slots = [b * size + p % size for b, p in zip(blocks, kept, strict=True)]
        return Slots(kept, indices, blocks, torch.tensor(slots, dtype=torch.int64, device=self.device))

    def write(self, layer: str, slots: Slots, kv: torch.Tensor) -> None:
        """Store ``kv`` (``[2, P, heads, head_dim]``) at the slots."""
        self._by_slot(layer).index_copy_(1, slots.slots, kv)

    def read(self, layer: str, slots: Slots) -> torch.Tensor:
        """The KV at the slots, ``[2, P, heads, head_dim]``."""
        return self._by_slot(layer).index_select(1, slots.slots)

    def _by_slot(self, layer: str) -> torch.Tensor:
        """The layer's tensor with blocks and in-block offsets merged into one slot dimension."""
        tensor = self.tensors[layer]
        return tensor.view(tensor.shape[0], -1, *tensor.shape[3:])  # a view: writes land in the cache
