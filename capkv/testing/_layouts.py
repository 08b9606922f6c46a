"""The model layouts and the workload the conformance kit serves a connector on.

Each differs in what connectors get wrong (group count, windows, block sizes, element size) and is small, so a
cold and a warm run of every layout take seconds on a laptop CPU.
"""

from __future__ import annotations

import torch

from capkv._homes import publish
from capkv.engine._model import ModelShape
from capkv.engine._workload import Workload

__all__ = ["DEFAULT_LAYOUTS", "DEFAULT_WORKLOAD", "describe_layout"]


def _small(
    pattern: str, num_layers: int, *, block_size: int, dtype: torch.dtype,
    sliding_window: int = 128, sliding_block_size: int | None = None,
) -> ModelShape:
    return ModelShape(
        num_layers=num_layers, pattern=pattern, block_size=block_size, sliding_block_size=sliding_block_size,
        sliding_window=sliding_window, num_kv_heads=2, head_dim=8, num_blocks=640, dtype=dtype,
    )


DEFAULT_LAYOUTS: tuple[ModelShape, ...] = (
    _small("F", 2, block_size=16, dtype=torch.bfloat16),
    _small("F", 1, block_size=32, dtype=torch.float16),
    _small("FS", 2, block_size=16, sliding_window=32, dtype=torch.float16),
    _small("FSS", 3, block_size=16, sliding_block_size=32, sliding_window=48, dtype=torch.float32),
    _small("FSSS", 4, block_size=8, sliding_window=20, dtype=torch.bfloat16),
)
"""1 group (full attention) twice: 16-token blocks in bfloat16, 32-token blocks in float16 (a connector
that is not HMA-capable is served on these); 2 groups (full + window 32); 3 groups with 16- and
32-token blocks (window 48, float32); 4 groups with 8-token blocks and a window
(20) that is not a multiple of the block size."""

DEFAULT_WORKLOAD = Workload(num_requests=6, num_prefixes=2, prefix_len=96, suffix_len=37, max_tokens=3, seed=12)
"""Six requests: two shared 96-token prefixes, 37 tokens of their own, 3 generated."""


def describe_layout(shape: ModelShape) -> str:
    """One line: groups, attention kinds, block sizes, window, dtype."""
    kinds = "+".join("full" if g.sliding_window is None else f"sw{g.sliding_window}" for g in shape.groups)
    blocks = "/".join(str(size) for size in sorted({g.block_size for g in shape.groups}))
    count = len(shape.groups)
    dtype = str(shape.dtype).removeprefix("torch.")
    return f"{count} group{'s' if count > 1 else ''} ({kinds}), blocks {blocks}, {dtype}"


publish(__name__)
