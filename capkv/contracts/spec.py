"""The engine's KV-cache shape, as the contracts check it and the copy ops walk it.

One :class:`KVSpec` describes the whole paged cache: how many KV-cache groups
(one per attention kind under the hybrid allocator), how many blocks the pool
has, which id is the null block, and — optionally — each group's layers, block
size, sliding window and per-layer tensor shape. Everything optional is checked
only when given, so a spec can be as coarse as the engine knows.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch

from capkv.errors import ConfigError

__all__ = ["KVGroupSpec", "KVSpec"]


@dataclass(frozen=True, kw_only=True)
class KVGroupSpec:
    """One KV-cache group: layers sharing a block table."""

    layer_names: tuple[str, ...] = ()
    block_size: int | None = None
    """Tokens per block."""
    sliding_window: int | None = None
    """Window in tokens; ``None`` for full attention."""
    kv_shape: tuple[int, ...] | None = None
    """Shape of each layer's paged KV tensor, the block dimension included."""


@dataclass(frozen=True, kw_only=True)
class KVSpec:
    """The paged KV cache an engine serves from."""

    num_groups: int
    num_blocks: int
    null_block_id: int = 0
    groups: tuple[KVGroupSpec, ...] = ()
    """Empty, or one entry per group."""
    block_dim: int = 0
    """Which dimension of a layer's KV tensor indexes blocks."""
    dtype: torch.dtype | None = None
    device: torch.device | None = None

    def __post_init__(self) -> None:
        if self.num_groups < 1:
            raise ConfigError(
                f"KVSpec: num_groups must be at least 1, got {self.num_groups!r}",
                method="KVSpec", value=self.num_groups,
            )
        if self.num_blocks < 1:
            raise ConfigError(
                f"KVSpec: num_blocks must be at least 1, got {self.num_blocks!r}",
                method="KVSpec", value=self.num_blocks,
            )
        if not 0 <= self.null_block_id < self.num_blocks:
            raise ConfigError(
                f"KVSpec: null_block_id {self.null_block_id!r} is outside the pool "
                f"[0, {self.num_blocks})",
                method="KVSpec", value=self.null_block_id,
            )
        if self.groups and len(self.groups) != self.num_groups:
            raise ConfigError(
                f"KVSpec: {len(self.groups)} group specs given for num_groups={self.num_groups}",
                method="KVSpec", value=len(self.groups),
            )
        seen: dict[str, int] = {}
        for index, group in enumerate(self.groups):
            for name in group.layer_names:
                if name in seen:
                    raise ConfigError(
                        f"KVSpec: layer {name!r} is in group {seen[name]} and group {index}",
                        method="KVSpec", group=index, value=name,
                    )
                seen[name] = index
            shape = group.kv_shape
            if shape is None:
                continue
            if not 0 <= self.block_dim < len(shape):
                raise ConfigError(
                    f"KVSpec: block_dim {self.block_dim} is not a dimension of group {index}'s "
                    f"kv_shape {shape}",
                    method="KVSpec", group=index, value=shape,
                )
            if shape[self.block_dim] != self.num_blocks:
                raise ConfigError(
                    f"KVSpec: group {index}'s kv_shape {shape} has {shape[self.block_dim]} blocks "
                    f"in dimension {self.block_dim}, expected num_blocks={self.num_blocks}",
                    method="KVSpec", group=index, value=shape,
                )

    @cached_property
    def _layer_groups(self) -> dict[str, int]:
        return {name: i for i, group in enumerate(self.groups) for name in group.layer_names}

    def group_of_layer(self, layer_name: str) -> int | None:
        """The group holding ``layer_name``, or ``None`` when the spec does not say."""
        return self._layer_groups.get(layer_name)
