"""The model's shape: which layers exist, how attention is split into KV-cache groups.

Everything the engine and the connectors need to know about the KV cache is then one :class:`~capkv.KVSpec`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch

from capkv._homes import publish
from capkv.contracts._arguments import argument_error, require_dtype, require_instance, require_int, require_optional_int
from capkv.contracts._spec import KVGroupSpec, KVSpec
from capkv.errors import ConfigError

__all__ = ["FULL", "KV_LAYOUT", "NULL_BLOCK_ID", "SLIDING", "GroupLayout", "ModelShape"]

FULL = "F"
"""Pattern letter of a full-attention layer."""
SLIDING = "S"
"""Pattern letter of a sliding-window layer."""

NULL_BLOCK_ID = 0
"""The block id that stands for "no block" in a table; the pool never hands it out."""

KV_LAYOUT = "NHD"
"""The paged layout: ``(2, num_blocks, block_size, num_kv_heads, head_dim)``, blocks in dimension 1."""


@dataclass(frozen=True)
class GroupLayout:
    """One KV-cache group: its layers and how its block table behaves."""

    index: int
    layer_names: tuple[str, ...]
    block_size: int
    sliding_window: int | None
    """``None`` for full attention."""


@dataclass(frozen=True, kw_only=True)
class ModelShape:
    """A model's attention layers and paged-cache geometry.

    A hybrid model mixes full-attention and sliding-window layers. Like vLLM's hybrid allocator, the engine
    gives each attention kind its own block tables, and splits a kind with many layers into several groups of
    equal size, so a model with one full layer for every two sliding layers has three groups: one full, two
    sliding. :meth:`kv_spec` is the resulting :class:`~capkv.KVSpec`.
    """

    num_layers: int = 6
    pattern: str = "FSS"
    """Attention kind per layer, repeated over the layers: ``F`` full, ``S`` sliding window."""
    sliding_window: int = 128
    """Tokens a sliding-window layer attends to (the current one included)."""
    num_kv_heads: int = 4
    head_dim: int = 64
    block_size: int = 16
    """Tokens per block in full-attention groups."""
    sliding_block_size: int | None = None
    """Tokens per block in sliding-window groups; ``None``: same as ``block_size``."""
    num_blocks: int = 1024
    """Blocks in the pool, the null block included."""
    dtype: torch.dtype = torch.bfloat16
    device: str = "cpu"

    def __post_init__(self) -> None:
        owner = "ModelShape"
        for name in ("num_layers", "sliding_window", "num_kv_heads", "head_dim", "block_size"):
            require_int(getattr(self, name), owner, name, minimum=1)
        require_optional_int(self.sliding_block_size, owner, "sliding_block_size", minimum=1)
        require_int(self.num_blocks, owner, "num_blocks", minimum=2)  # the null block and one more
        require_dtype(self.dtype, owner, optional=False)
        require_instance(self.device, str, owner, "device", '"cpu", "cuda" or "cuda:N"')
        if self.device not in ("cpu", "cuda") and not self.device.startswith("cuda:"):
            raise argument_error(owner, "device", self.device, '"cpu", "cuda" or "cuda:N"')
        require_instance(self.pattern, str, owner, "pattern", f"a str of {FULL!r} and {SLIDING!r}")
        if not self.pattern or set(self.pattern) - {FULL, SLIDING}:
            raise ConfigError(
                f"ModelShape: pattern must be a non-empty string of {FULL!r} (full) and {SLIDING!r} "
                f"(sliding window), got {self.pattern!r}",
                method="ModelShape", value=self.pattern,
            )

    @property
    def layer_kinds(self) -> tuple[str, ...]:
        """The attention kind of each layer, the pattern repeated."""
        return tuple(self.pattern[i % len(self.pattern)] for i in range(self.num_layers))

    @property
    def layer_names(self) -> tuple[str, ...]:
        return tuple(f"layers.{i}.attn" for i in range(self.num_layers))

    @cached_property
    def groups(self) -> tuple[GroupLayout, ...]:
        """The KV-cache groups: full attention first, each kind split into groups of equal size.

        The group size is the layer count of the rarest kind, so every group holds
        about as many layers as every other (as vLLM's hybrid allocator arranges).
        """
        by_kind = {
            kind: [name for name, k in zip(self.layer_names, self.layer_kinds, strict=True) if k == kind]
            for kind in (FULL, SLIDING)
        }
        present = {kind: names for kind, names in by_kind.items() if names}
        size = min(len(names) for names in present.values())
        groups: list[GroupLayout] = []
        for kind, names in present.items():
            for start in range(0, len(names), size):
                groups.append(
                    GroupLayout(
                        index=len(groups),
                        layer_names=tuple(names[start : start + size]),
                        block_size=self.block_size if kind == FULL else (self.sliding_block_size or self.block_size),
                        sliding_window=None if kind == FULL else self.sliding_window,
                    )
                )
        return tuple(groups)

    def kv_shape(self, group: GroupLayout) -> tuple[int, ...]:
        """One layer's paged KV tensor: ``(2, num_blocks, block_size, num_kv_heads, head_dim)``."""
        return (2, self.num_blocks, group.block_size, self.num_kv_heads, self.head_dim)

    def block_bytes(self, group: GroupLayout) -> int:
        """Bytes one block of one layer holds (keys and values)."""
        element = torch.empty((), dtype=self.dtype).element_size()
        return 2 * group.block_size * self.num_kv_heads * self.head_dim * element

    def kv_spec(self) -> KVSpec:
        """The KV-cache description handed to :func:`capkv.check_stack` and the connectors."""
        return KVSpec(
            num_groups=len(self.groups),
            num_blocks=self.num_blocks,
            null_block_id=NULL_BLOCK_ID,
            groups=tuple(
                KVGroupSpec(
                    layer_names=group.layer_names,
                    block_size=group.block_size,
                    sliding_window=group.sliding_window,
                    kv_shape=self.kv_shape(group),
                )
                for group in self.groups
            ),
            block_dim=1,
            dtype=self.dtype,
            device=torch.device(self.device),
        )


publish(__name__)
