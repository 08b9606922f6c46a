"""The "model": KV as a deterministic function of (layer, position, token prefix).

So a recomputation reproduces the cached bits, and a block loaded for the wrong request, layer or offset
cannot pass the bit-exact check.
"""

from __future__ import annotations

import torch

from capkv.engine._model import ModelShape

__all__ = ["KVFunction"]



class KVFunction:
    """Computes the KV a layer holds for given positions, and the token "sampled" after a prefix.

    A real model's KV depends on every earlier token; this one does too, through
    the prefix hash of each position (see :mod:`capkv.engine._request`). Element ``e`` of layer ``l``'s KV at
    position ``p`` is the byte::

        (prefix_hash(p) + offset[l][e]) mod 256,   read as a signed integer (-128..127)

    with ``offset[l]`` a fixed pseudo-random byte pattern per layer, converted to the model's dtype. Small
    integers are exact in every float dtype, so a recomputation reproduces the cached bits; a different
    prefix, position or layer shifts every element of the position at once, so a block loaded for the wrong
    request, layer or offset cannot pass the bit-exact check (the chance that all of a 16-token block collides
    is 2**-128).
    """

    def __init__(self, shape: ModelShape, *, vocab_size: int = 32_000) -> None:
        self.shape = shape
        self.vocab_size = vocab_size
        self.device: torch.device = torch.device(shape.device)
        generator = torch.Generator().manual_seed(0x5EED)
        per_layer = (2, shape.num_kv_heads, shape.head_dim)
        self._offsets = {
            name: torch.randint(0, 256, per_layer, generator=generator, dtype=torch.uint8).unsqueeze(1).to(self.device)
            for name in shape.layer_names
        }

    def seeds(self, prefix_hashes: list[int]) -> torch.Tensor:
        """Per-position seed bytes from prefix hashes, on the model's device (shape ``[P]``)."""
        return torch.tensor([h & 255 for h in prefix_hashes], dtype=torch.uint8, device=self.device)

    def kv(self, layer_name: str, seeds: torch.Tensor) -> torch.Tensor:
        """The layer's keys and values at the seeded positions: shape ``[2, P, num_kv_heads, head_dim]``."""
        mixed = seeds.view(1, -1, 1, 1) + self._offsets[layer_name]  # uint8: wraps mod 256
        return mixed.view(torch.int8).to(self.shape.dtype)

    def sample(self, prefix_hash: int) -> int:
        """The next token after a prefix: a pure function of it, like greedy decoding."""
        return (prefix_hash >> 8) % self.vocab_size
