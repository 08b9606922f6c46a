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

__all__ = ["Timing", "TransferCase", "TransferFigures", "measure_transfer", "transfer_case"]


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


@dataclass(frozen=True, eq=False)
class TransferCase:
    """One measurement's buffers and operations: a paged cache of twice the blocks moved, the ids moved (a
    random half), host rows, and a contiguous buffer on each side for the baseline copies."""

    copier: BlockCopier
    ids: list[int]
    rows: torch.Tensor
    host: torch.Tensor
    """Contiguous, on the host (pinned on CUDA): the baseline copies' host side."""
    on_device: torch.Tensor
    """Contiguous, on the KV cache's device: the baseline copies' other side."""
    block_nbytes: int
    operations: dict[str, Callable[[], object]]
    """``contiguous_out`` (device -> host), ``contiguous_in``, ``gather``, ``scatter``: each runs once, finished."""


def transfer_case(
    block_size: int,
    *,
    device: torch.device,
    layers: int = 8,
    kv_heads: int = 8,
    head_dim: int = 128,
    dtype: torch.dtype = torch.float16,
    nbytes: int = 128 << 20,
    seed: int = 0,
) -> TransferCase:
    """The buffers and operations :func:`measure_transfer` times.

    The cache uses vLLM's flash-attention layout, ``(2, num_blocks, block_size,
    kv_heads, head_dim)`` per layer (K and V runs per block), and has twice as
    many blocks as are moved (2 at least: a real model's large blocks are fewer, never smaller).
    """
    itemsize = dtype.itemsize
    block_nbytes = layers * 2 * block_size * kv_heads * head_dim * itemsize
    moved = max(2, nbytes // block_nbytes)
    pool = 2 * moved
    shape = (2, pool, block_size, kv_heads, head_dim)
    names = tuple(f"layer.{i}" for i in range(layers))
    spec = KVSpec(
        num_groups=1, num_blocks=pool, block_dim=1, dtype=dtype, device=device,
        groups=(KVGroupSpec(layer_names=names, block_size=block_size, kv_shape=shape),),
    )
    generator = torch.Generator().manual_seed(seed)
    where = torch.Generator(device=device).manual_seed(seed)  # a GB-sized cache is made where it lives
    caches = {name: _random(shape, dtype, where, device) for name in names}
    copier = BlockCopier(spec, caches, owner="bench")
    rows = copier.host_rows(moved, block_nbytes)
    rows.fill_(1)
    ids = [int(i) for i in torch.randperm(pool, generator=generator)[:moved]]
    host = copier.host_rows(1, moved * block_nbytes)[0]
    host.fill_(2)
    contiguous = torch.full((moved * block_nbytes,), 3, dtype=torch.uint8, device=device)
    synchronize = torch.cuda.synchronize if device.type == "cuda" else _nothing

    def finished(operation: Callable[[], object]) -> Callable[[], object]:
        return lambda: (operation(), synchronize())

    operations: dict[str, Callable[[], object]] = {
        # Host to host (CPU), both directions are the same copy; two buffers, so neither is cache-warm.
        "contiguous_out": finished(lambda: host.copy_(contiguous, non_blocking=device.type == "cuda")),
        "contiguous_in": finished(lambda: contiguous.copy_(host, non_blocking=device.type == "cuda")),
        "gather": finished(lambda: copier.gather(0, ids, rows).wait()),
        "scatter": finished(lambda: copier.scatter(0, ids, rows).wait()),
    }
    return TransferCase(copier, ids, rows, host, contiguous, block_nbytes, operations)


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
    """Time gather, scatter and the two contiguous copies of :func:`transfer_case`, interleaved round by round
    (the first round warms up: page faults, kernels, pinned pages)."""
    case = transfer_case(
        block_size, device=device, layers=layers, kv_heads=kv_heads, head_dim=head_dim, dtype=dtype,
        nbytes=nbytes, seed=seed,
    )
    synchronize = torch.cuda.synchronize if device.type == "cuda" else _nothing
    times: dict[str, list[float]] = {name: [] for name in case.operations}
    for round_index in range(rounds + 1):
        for name, operation in case.operations.items():
            synchronize()
            start = time.perf_counter()
            operation()
            if round_index:
                times[name].append(time.perf_counter() - start)
    timings = {name: Timing(min(values), statistics.median(values)) for name, values in times.items()}
    moved = len(case.ids)
    return TransferFigures(
        block_size=block_size,
        num_blocks=moved,
        nbytes=moved * case.block_nbytes,
        contiguous_out=timings["contiguous_out"],
        contiguous_in=timings["contiguous_in"],
        gather=timings["gather"],
        scatter=timings["scatter"],
    )


def _random(shape: tuple[int, ...], dtype: torch.dtype, generator: torch.Generator, device: torch.device) -> torch.Tensor:
    """Random bits (NaN patterns included): copies must not care what the bytes mean."""
    raw = torch.randint(
        0, 256, (*shape[:-1], shape[-1] * dtype.itemsize), dtype=torch.uint8, generator=generator, device=device
    )
    return raw.view(dtype)


def _nothing() -> None:
    return None
