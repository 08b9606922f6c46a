"""Where one block's bytes live inside a paged KV tensor.

Any layout is dense runs per block, copied as raw words: one row gather per plane, bit-exact for every dtype
(docs/internals.md, "Copy ops").
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

from capkv.errors import ConfigError

if TYPE_CHECKING:
    import torch
else:  # torch loads with the first tensor operation, not with this module
    from capkv._torch import torch

__all__ = ["WORD_SIZES", "LayerRuns", "layer_runs", "storage_words", "widest_word", "word_dtype"]

WORD_SIZES = (16, 8, 4, 2, 1)
"""The word sizes copies use, in bytes, widest first."""

_WORD_DTYPE_NAMES = {16: "complex128", 8: "int64", 4: "int32", 2: "int16", 1: "uint8"}


def word_dtype(word: int) -> torch.dtype:
    """A dtype ``word`` bytes wide (a copy moves raw words: the dtype only sets the width)."""
    dtype: torch.dtype = getattr(torch, _WORD_DTYPE_NAMES[word])
    return dtype


def widest_word(*byte_quantities: int) -> int:
    """The widest word size that divides every quantity (addresses, strides, lengths)."""
    common = 0
    for quantity in byte_quantities:
        common = math.gcd(common, quantity)
    return next((word for word in WORD_SIZES if common % word == 0), 1)


def storage_words(tensor: torch.Tensor, word: int) -> torch.Tensor:
    """The whole storage under ``tensor`` as a 1-D tensor of ``word``-byte elements."""
    raw = torch.empty(0, dtype=torch.uint8, device=tensor.device)
    raw.set_(tensor.untyped_storage())
    return raw[: raw.numel() // word * word].view(word_dtype(word))


@dataclass(frozen=True, eq=False)
class LayerRuns:
    """The memory runs of one paged layer tensor, in bytes from its storage's start."""

    tensor: torch.Tensor
    num_blocks: int
    block_stride: int
    """Bytes from one block to the next."""
    run_nbytes: int
    """Bytes of one block's run for one index of the outer dimensions."""
    run_offsets: tuple[int, ...]
    """Where block 0's runs start, one per outer index, in logical order."""
    inner_dims: tuple[tuple[int, int], ...] = ()
    """``(dimension, size)`` inside a run, slowest-varying first: the byte order of a run."""
    outer_dims: tuple[tuple[int, int], ...] = ()
    """``(dimension, size)`` enumerating the runs of a block, in logical order."""

    @property
    def block_nbytes(self) -> int:
        """Bytes of one block of this layer."""
        return self.run_nbytes * len(self.run_offsets)

    @cached_property
    def alignment(self) -> int:
        """The widest word every plane of this layer can be read in."""
        base = self.tensor.untyped_storage().data_ptr()
        return widest_word(base, self.block_stride, self.run_nbytes, *self.run_offsets)

    def planes(self, word: int) -> tuple[torch.Tensor, ...]:
        """One ``(num_blocks, run_nbytes // word)`` view per run; ``word`` must divide :attr:`alignment`."""
        words = storage_words(self.tensor, word)
        shape = (self.num_blocks, self.run_nbytes // word)
        stride = (self.block_stride // word, 1)
        return tuple(words.as_strided(shape, stride, offset // word) for offset in self.run_offsets)

    def slab(self, word: int) -> torch.Tensor | None:
        """All planes as one ``(runs, num_blocks, run_nbytes // word)`` view, when evenly spaced.

        Dense layouts always are (their outer dimensions nest); one indexed
        write per layer then replaces one per run.
        """
        offsets = self.run_offsets
        gaps = {after - before for before, after in zip(offsets, offsets[1:])}
        if len(gaps) > 1:
            return None
        step = gaps.pop() if gaps else 0
        return storage_words(self.tensor, word).as_strided(
            (len(offsets), self.num_blocks, self.run_nbytes // word),
            (step // word, self.block_stride // word, 1),
            self.run_offsets[0] // word,
        )


def layer_runs(tensor: torch.Tensor, block_dim: int, *, layer: str, group: int, owner: str) -> LayerRuns:
    """Describe how ``tensor`` lays out its blocks along ``block_dim``.

    Raises :class:`~capkv.ConfigError` when a block's data for one outer index is
    not one dense run (a padded or overlapping tensor): then no batched copy can
    move it without touching its neighbours.
    """
    if not 0 <= block_dim < tensor.dim():
        raise ConfigError(
            f"{owner}: layer {layer!r} of group {group} has shape {tuple(tensor.shape)}, "
            f"which has no block dimension {block_dim}",
            connector=owner, method="register_kv_caches", group=group, value=tuple(tensor.shape),
        )
    itemsize = tensor.element_size()
    sizes, strides = tensor.shape, tensor.stride()
    block_stride = strides[block_dim]
    dims = [d for d in range(tensor.dim()) if d != block_dim and sizes[d] > 1]
    inner = sorted((d for d in dims if strides[d] < block_stride), key=lambda d: strides[d])
    outer = [d for d in dims if strides[d] >= block_stride]

    def refuse(why: str) -> ConfigError:
        return ConfigError(
            f"{owner}: layer {layer!r} of group {group} (shape {tuple(sizes)}, strides {strides}, "
            f"block_dim {block_dim}) cannot be copied block by block: {why}",
            connector=owner, method="register_kv_caches", group=group, value=strides,
        )

    run = 1
    for d in inner:
        if strides[d] != run:
            raise refuse(f"dimension {d} is not dense inside a block")
        run *= sizes[d]
    by_stride = sorted(
        [(block_stride, sizes[block_dim]), *((strides[d], sizes[d]) for d in outer)]
    )
    extent = run
    for stride, size in by_stride:
        if size > 1 and stride < extent:
            raise refuse("blocks overlap each other or the dimensions inside them")
        extent = max(extent, stride * size)
    base = int(tensor.storage_offset())
    offsets = tuple(
        (base + sum(i * strides[d] for i, d in zip(index, outer, strict=True))) * itemsize
        for index in itertools.product(*(range(sizes[d]) for d in outer))
    )
    return LayerRuns(
        tensor=tensor,
        num_blocks=sizes[block_dim],
        block_stride=block_stride * itemsize,
        run_nbytes=run * itemsize,
        run_offsets=offsets,
        inner_dims=tuple((d, sizes[d]) for d in reversed(inner)),
        outer_dims=tuple((d, sizes[d]) for d in outer),
    )
