"""``capkv bench``: measure what capkv's connectors cost.

``capkv bench transfer`` prints the block copy ops' throughput as a ratio to a contiguous copy of the same
bytes, the physical limit.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from capkv.cli._numbers import int_at_least
from capkv.engine._presets import MODEL_PRESETS, model_presets
from capkv.transfer._bench import TransferFigures, measure_transfer

__all__ = ["add_arguments", "run"]

_POSITIVE = int_at_least(1)
_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    benches = parser.add_subparsers(dest="bench", metavar="BENCH", required=True)
    transfer = benches.add_parser(
        "transfer",
        help="block gather/scatter throughput against a contiguous copy of the same bytes",
        description="Block gather/scatter throughput against a contiguous copy of the same bytes "
        "(on CUDA: device <-> pinned host).",
    )
    transfer.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                          help="where the paged KV cache lives (default: cuda when available, else cpu)")
    transfer.add_argument("--block-sizes", type=_POSITIVE, nargs="+", default=[16, 32, 64, 128, 256], metavar="TOKENS")
    transfer.add_argument("--model", nargs="+", choices=[*MODEL_PRESETS, "all"], default=None, metavar="MODEL",
                          help=f"model shapes ({', '.join(MODEL_PRESETS)} or all): one table each, a group's layers, "
                          "heads, head size and dtype from the preset (default: the shape the flags below give)")
    transfer.add_argument("--layers", type=_POSITIVE, default=8)
    transfer.add_argument("--kv-heads", type=_POSITIVE, default=8)
    transfer.add_argument("--head-dim", type=_POSITIVE, default=128)
    transfer.add_argument("--dtype", choices=sorted(_DTYPES), default="float16")
    transfer.add_argument("--mib", type=_POSITIVE, default=128, help="MiB moved per call (default: 128)")
    transfer.add_argument("--rounds", type=_POSITIVE, default=15, help="timed rounds; the median is reported")
    transfer.add_argument("--threads", type=_POSITIVE, default=None,
                          help="torch intra-op threads (default: torch's, one per core); on a shared machine "
                          "one thread shows the copy kernels' own speed, free of waits for a descheduled thread")


def run(args: argparse.Namespace) -> int:
    try:
        device = torch.device(args.device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("torch.cuda.is_available() is False here")
    except RuntimeError as exc:
        print(f"capkv bench transfer: error: --device {args.device}: {exc}", file=sys.stderr)
        return 2
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    shapes = (
        [_Shape(p.describe(), len(p.layout().groups[0].layer_names), p.num_kv_heads, p.head_dim, p.dtype)
         for p in model_presets(args.model)]
        if args.model else
        [_Shape(f"{args.layers} layers x (K, V) x {args.kv_heads} heads x {args.head_dim} dims, {args.dtype}",
                args.layers, args.kv_heads, args.head_dim, _DTYPES[args.dtype])]
    )
    print(
        f"capkv bench transfer: {device}, {args.mib} MiB per call (2 blocks at least), random block ids, "
        f"{args.rounds} rounds, {torch.get_num_threads()} CPU threads"
    )
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    if load > 0.5 * (os.cpu_count() or 1):
        print(f"note: load average {load:.1f} on {os.cpu_count()} CPUs; other processes skew these figures")
    for shape in shapes:
        print(shape.title if args.model else f"one group of {shape.title}")
        for row in transfer_rows(shape, device, args.block_sizes, args.mib << 20, args.rounds):
            print(row)
    print("throughput and ratios from each operation's best round; median-round ratios on the right")
    return 0


@dataclass(frozen=True)
class _Shape:
    title: str
    layers: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype


def transfer_rows(
    shape: _Shape, device: torch.device, block_sizes: list[int], nbytes: int, rounds: int
) -> Iterator[str]:
    """The table of one shape: a header, then one row per block size, each measured as it is asked for."""
    direction = ("device->host", "host->device") if device.type == "cuda" else ("host", "host")
    yield (f"{'block':>6} {'blocks':>7} {'contiguous':>12} {'gather':>11} {'ratio':>6}  "
           f"{'contiguous':>12} {'scatter':>11} {'ratio':>6}   {'median ratios':>14}")
    yield (f"{'tokens':>6} {'moved':>7} {direction[0]:>12} {'':>11} {'':>6}  {direction[1]:>12} {'':>11} {'':>6}"
           f"   {'gather scatter':>14}")
    for block_size in block_sizes:
        yield _row(measure_transfer(
            block_size, device=device, layers=shape.layers, kv_heads=shape.kv_heads,
            head_dim=shape.head_dim, dtype=shape.dtype, nbytes=nbytes, rounds=rounds,
        ))


def _row(f: TransferFigures) -> str:
    median_gather, median_scatter = f.median_ratios
    return (
        f"{f.block_size:>6} {f.num_blocks:>7} {f.gbps(f.contiguous_out):>7.1f} GB/s {f.gbps(f.gather):>6.1f} GB/s "
        f"{f.gather_ratio:>5.2f}x  {f.gbps(f.contiguous_in):>7.1f} GB/s {f.gbps(f.scatter):>6.1f} GB/s "
        f"{f.scatter_ratio:>5.2f}x   {median_gather:>5.2f}x {median_scatter:>6.2f}x"
    )
