"""Paged KV caches for tests: specs in several layouts, filled with random bits."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from capkv import KVGroupSpec, KVSpec

LAYOUTS = ("flash", "blocks_first", "hnd", "tokens_first")
"""Per-layer tensor layouts:

- ``flash``: ``(2, N, block, heads, dim)``, blocks in dimension 1 (vLLM's flash-attention layout);
- ``blocks_first``: ``(N, 2, block, heads, dim)``, blocks in dimension 0;
- ``hnd``: logical ``(2, N, block, heads, dim)`` over memory ordered ``(2, N, heads, block, dim)``;
- ``tokens_first``: ``(2, block, N, heads, dim)``, blocks in dimension 2 (many small runs).
"""


@dataclass(frozen=True)
class Group:
    block_size: int
    layers: int = 2
    window: int | None = None


def block_dim(layout: str) -> int:
    return {"flash": 1, "blocks_first": 0, "hnd": 1, "tokens_first": 2}[layout]


def kv_shape(layout: str, num_blocks: int, block_size: int, heads: int, dim: int) -> tuple[int, ...]:
    if layout == "blocks_first":
        return (num_blocks, 2, block_size, heads, dim)
    if layout == "tokens_first":
        return (2, block_size, num_blocks, heads, dim)
    return (2, num_blocks, block_size, heads, dim)


def make_spec(
    groups: Sequence[Group],
    *,
    num_blocks: int = 32,
    layout: str = "flash",
    dtype: torch.dtype = torch.float16,
    heads: int = 2,
    dim: int = 8,
) -> KVSpec:
    return KVSpec(
        num_groups=len(groups),
        num_blocks=num_blocks,
        block_dim=block_dim(layout),
        dtype=dtype,
        groups=tuple(
            KVGroupSpec(
                layer_names=tuple(f"g{g}.layer{i}" for i in range(group.layers)),
                block_size=group.block_size,
                sliding_window=group.window,
                kv_shape=kv_shape(layout, num_blocks, group.block_size, heads, dim),
            )
            for g, group in enumerate(groups)
        ),
    )


def empty_caches(spec: KVSpec, layout: str = "flash", device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """Zeroed per-layer tensors with ``layout``'s memory order."""
    caches: dict[str, torch.Tensor] = {}
    dtype = spec.dtype or torch.float16
    for group in spec.groups:
        shape = group.kv_shape
        if shape is None:
            raise ValueError("make_spec gives every group a kv_shape")
        for name in group.layer_names:
            if layout == "hnd":
                two, n, block, heads, dim = shape
                caches[name] = torch.zeros((two, n, heads, block, dim), dtype=dtype, device=device).permute(0, 1, 3, 2, 4)
            else:
                caches[name] = torch.zeros(shape, dtype=dtype, device=device)
    return caches


def randomize(caches: dict[str, torch.Tensor], seed: int) -> None:
    """Fill every tensor with random bytes (NaN and infinity patterns included)."""
    generator = torch.Generator().manual_seed(seed)
    for tensor in caches.values():
        memory = torch.empty(0, dtype=torch.uint8, device=tensor.device).set_(tensor.untyped_storage())
        memory.copy_(torch.randint(0, 256, memory.shape, dtype=torch.uint8, generator=generator))


def block_bytes(tensor: torch.Tensor, dim: int, block: int) -> torch.Tensor:
    """The bytes of one block, in logical order: what a dense layout stores per block."""
    return tensor.select(dim, block).contiguous().view(torch.uint8).flatten()


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality (NaN == NaN when the bits agree)."""
    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))
