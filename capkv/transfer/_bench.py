"""Gather/scatter throughput against a plain contiguous copy of the same bytes.

The contiguous copy is the devices' physical limit, so the ratio says how much of it the block copy ops keep.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from capkv.contracts._spec import KVGroupSpec, KVSpec
from capkv.transfer._copier import BlockCopier

__all__ = ["Timing", "TransferFigures", "measure_transfer"]


@dataclass(frozen=True)
class Timing:
    """Seconds per call of one operation: the best round and the median round."""

    best: float
    median: float


@dataclass(frozen=True)
class TransferFigures:
    """Timings of each operation over the same bytes."""

    block_size: int
    num_blocks: int
    nbytes: int
    contiguous_out: Timing
    """Contiguous copy in the gather direction (device -> host)."""
    contiguous_in: Timing
    """Contiguous copy in the scatter direction (host -> device)."""
    gather: Timing
    scatter: Timing

    @property
    def gather_ratio(self) -> float:
        """Best gather against best contiguous copy (the capability, least disturbed by other load)."""
        return self.contiguous_out.best / self.gather.best

    @property
    def scatter_ratio(self) -> float:
        return self.contiguous_in.best / self.scatter.best

    @property
    def median_ratios(self) -> tuple[float, float]:
        """Gather and scatter ratios of the median rounds."""
        return self.contiguous_out.median / self.gather.median, self.contiguous_in.median / self.scatter.median

    def gbps(self, timing: Timing) -> float:
        return self.nbytes / timing.best / 1e9


def measure_transfer(
    block_size: int,
    *,
    device: torch.device,
    layers: int = 8,
    kv_heads: int = 8,
    head_dim: int = 128,
    dtype: torch.dtype = torch.float16,
    nbytes: int = 128 << 20,
    rounds: int = 15,
    seed: int = 0,
) -> TransferFigures:
    """Time gather, scatter and the two contiguous copies, interleaved round by round.

    The cache uses vLLM's flash-attention layout, ``(2, num_blocks, block_size,
    kv_heads, head_dim)`` per layer (K and V runs per block), and has twice as
    many blocks as are moved, so the ids are a random half of the pool.
    """
    itemsize = dtype.itemsize
    block_nbytes = layers * 2 * block_size * kv_heads * head_dim * itemsize
    moved = max(1, nbytes // block_nbytes)
    pool = 2 * moved
    shape = (2, pool, block_size, kv_heads, head_dim)
    names = tuple(f"layer.{i}" for i in range(layers))
    spec = KVSpec(
        num_groups=1, num_blocks=pool, block_dim=1, dtype=dtype, device=device,
        groups=(KVGroupSpec(layer_names=names, block_size=block_size, kv_shape=shape),),
    )
    generator = torch.Generator().manual_seed(seed)
    caches = {name: _random(shape, dtype, generator).to(device) for name in names}
    copier = BlockCopier(spec, caches, owner="bench")
    rows = copier.host_rows(moved, block_nbytes)
    rows.fill_(1)
    ids = [int(i) for i in torch.randperm(pool, generator=generator)[:moved]]
    host = copier.host_rows(1, moved * block_nbytes)[0]
    host.fill_(2)
    on_device = torch.full((moved * block_nbytes,), 3, dtype=torch.uint8, device=device)
    sync = torch.cuda.synchronize if device.type == "cuda" else _nothing

    operations: dict[str, Callable[[], object]] = {
        "contiguous_out": lambda: host.copy_(on_device, non_blocking=True),
        "contiguous_in": lambda: on_device.copy_(host, non_blocking=True),
        "gather": lambda: copier.gather(0, ids, rows).wait(),
        "scatter": lambda: copier.scatter(0, ids, rows).wait(),
    }
    if device.type == "cpu":
        # Host to host, both directions are the same copy; keep two sources so neither is cache-warm.
        operations["contiguous_out"] = lambda: host.copy_(on_device)
        operations["contiguous_in"] = lambda: on_device.copy_(host)
    times: dict[str, list[float]] = {name: [] for name in operations}
    for round_index in range(rounds + 1):
        for name, operation in operations.items():
            sync()
            start = time.perf_counter()
            operation()
            sync()
            if round_index:  # the first round warms up (page faults, kernels, pinned pages)
                times[name].append(time.perf_counter() - start)
    timings = {name: Timing(min(values), statistics.median(values)) for name, values in times.items()}
    return TransferFigures(
        block_size=block_size,
        num_blocks=moved,
        nbytes=moved * block_nbytes,
        contiguous_out=timings["contiguous_out"],
        contiguous_in=timings["contiguous_in"],
        gather=timings["gather"],
        scatter=timings["scatter"],
    )


def _random(shape: tuple[int, ...], dtype: torch.dtype, generator: torch.Generator) -> torch.Tensor:
    """Random bits (NaN patterns included): copies must not care what the bytes mean."""
    raw = torch.randint(0, 256, (*shape[:-1], shape[-1] * dtype.itemsize), dtype=torch.uint8, generator=generator)
    return raw.view(dtype)


def _nothing() -> None:
    return None
