"""``capkv demo``'s options, and what they become: the model shape, the workload, the stack's configuration
and defaults, and the store directory; refused (``ConfigError``) before anything is built."""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from collections.abc import Generator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from capkv.cli._demo_report import format_bytes
from capkv.cli._numbers import int_at_least
from capkv.engine import ModelShape, Workload
from capkv.errors import ConfigError

__all__ = [
    "DTYPES", "add_arguments", "cpu_blocks", "kv_cache_nbytes", "require_memory", "shape_of", "store_directory",
    "with_options", "workload_of",
]

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
_CPU_BLOCKS = 2048
_TIERED_PREFIXES = 16
_TIERED_CPU_BLOCKS = 1024


_POSITIVE = int_at_least(1)
_NATURAL = int_at_least(0)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    model = parser.add_argument_group("model shape")
    model.add_argument("--layers", type=_POSITIVE, default=6, help="attention layers (default: 6)")
    model.add_argument("--pattern", default="FSS",
                       help="attention kind per layer, repeated: F full, S sliding window (default: FSS)")
    model.add_argument("--window", type=_POSITIVE, default=64, help="sliding window in tokens (default: 64)")
    model.add_argument("--kv-heads", type=_POSITIVE, default=4, help="KV heads per layer (default: 4)")
    model.add_argument("--head-dim", type=_POSITIVE, default=64, help="(default: 64)")
    model.add_argument("--block-size", type=_POSITIVE, default=16, help="tokens per block (default: 16)")
    model.add_argument("--sliding-block-size", type=_POSITIVE, default=None,
                       help="tokens per block in sliding-window groups (default: --block-size)")
    model.add_argument("--num-blocks", type=int_at_least(2), default=1024,
                       help="blocks in the paged pool, the null block included (default: 1024)")
    model.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16", help="(default: bfloat16)")
    stack = parser.add_argument_group("stack")
    stack.add_argument("--stack", default="cpu,file",
                       help="connectors, first loads first: names joined by ',' ; '[...]' nests a stack. "
                            "Names resolve as in capkv check: capkv's (cpu, file, single: a connector for one "
                            "KV-cache group; or their class names), @register_connector names, 'module:Class'. "
                            "(default: cpu,file)")
    stack.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                       help="import MODULE first, so its @register_connector classes are known (repeatable)")
    stack.add_argument("--cpu-blocks", type=_POSITIVE, default=None,
                       help="capacity_blocks of connectors that declare it and are not given one: the host pool "
                            f"of cpu and single (default: {_CPU_BLOCKS}; with --tiered: {_TIERED_CPU_BLOCKS})")
    stack.add_argument("--promote", action="store_true",
                       help="the stack saves what a later tier loaded into the earlier tiers too, so the fast "
                            "tier warms up (MultiConnector(..., promote=True); off by default)")
    stack.add_argument("--store-dir", type=Path, default=None,
                       help="root of connectors that declare it: the file store's directory "
                            "(default: a temporary directory, removed afterwards)")
    stack.add_argument("--redis-url", default="redis://127.0.0.1:6379",
                       help="url of connectors that declare it: the redis store's server, or cluster nodes "
                            "separated by ',' (needs capkv[redis]; default: redis://127.0.0.1:6379)")
    work = parser.add_argument_group("workload")
    work.add_argument("--requests", type=_POSITIVE, default=32, help="requests per run (default: 32)")
    work.add_argument("--prefixes", type=_POSITIVE, default=None,
                      help=f"distinct shared prefixes (default: 4; with --tiered: {_TIERED_PREFIXES})")
    work.add_argument("--tiered", action="store_true",
                      help=f"a working set the front tier cannot hold: {_TIERED_PREFIXES} shared prefixes and a "
                           f"host pool of {_TIERED_CPU_BLOCKS} blocks (unless --prefixes, --cpu-blocks say "
                           "otherwise); the tiers behind it hold the rest, so the warm run computes no more "
                           "than over one large store")
    work.add_argument("--prefix-len", type=_NATURAL, default=384, help="tokens in each shared prefix (default: 384)")
    work.add_argument("--suffix-len", type=_NATURAL, default=65, help="tokens of each request's own (default: 65)")
    work.add_argument("--max-tokens", type=_POSITIVE, default=128,
                      help="tokens generated per request (default: 128, twice the default window: sliding-window "
                           "prefixes the warm run needs scrolled out of the window long before the cold run finished)")
    work.add_argument("--seed", type=int, default=0, help="workload seed (default: 0)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where the paged KV cache lives")
    parser.add_argument("--threads", type=_POSITIVE, default=1,
                        help="torch intra-op threads (default: 1; the demo's many small tensor ops "
                             "only lose time to thread hand-offs, badly so on a busy machine)")


def shape_of(args: argparse.Namespace) -> ModelShape:
    if args.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: torch.cuda.is_available() is False here", method="demo", value="cuda")
    return ModelShape(
        num_layers=args.layers, pattern=args.pattern, sliding_window=args.window, num_kv_heads=args.kv_heads,
        head_dim=args.head_dim, block_size=args.block_size, sliding_block_size=args.sliding_block_size,
        num_blocks=args.num_blocks, dtype=DTYPES[args.dtype], device=args.device,
    )


def kv_cache_nbytes(shape: ModelShape) -> int:
    """Bytes of the paged KV cache ``shape`` describes: every layer's tensor."""
    spec = shape.kv_spec()
    total = 0
    for group in spec.groups:
        elements = 1
        for size in group.kv_shape or ():
            elements *= size
        total += elements * len(group.layer_names)
    return total * shape.dtype.itemsize


def _available_nbytes(device: str) -> int | None:
    """Memory free for the KV cache on ``device``, when the platform says."""
    if device.startswith("cuda"):
        free, _ = torch.cuda.mem_get_info()
        return int(free)
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def require_memory(shape: ModelShape) -> None:
    """Refuse a KV cache that cannot fit, before allocating it (with overcommit, torch may not say)."""
    needed = kv_cache_nbytes(shape)
    available = _available_nbytes(shape.device)
    # The engine keeps a second copy's worth for verification and the stores' host rows: half is a fair bound.
    if available is not None and 2 * needed > available:
        raise ConfigError(
            f"the paged KV cache needs {format_bytes(needed)} on {shape.device} ({shape.num_blocks} blocks x "
            f"{shape.num_layers} layers), more than half of the {format_bytes(available)} available; "
            "lower --num-blocks, --layers, --kv-heads or --head-dim",
            method="demo", value=needed,
        )


def cpu_blocks(args: argparse.Namespace) -> int:
    given: int | None = args.cpu_blocks
    if given is not None:
        return given
    return _TIERED_CPU_BLOCKS if args.tiered else _CPU_BLOCKS


def with_options(config: dict[str, Any], *, promote: bool) -> dict[str, Any]:
    """The stack's configuration with the demo's stack options (``--promote``: the top stack promotes)."""
    if not promote:
        return config
    if config.get("kv_connector") != "MultiConnector":
        raise ConfigError(
            f"--promote needs a stack of tiers (e.g. --stack cpu,file), got {config.get('kv_connector')!r} alone",
            method="demo", value=config.get("kv_connector"),
        )
    extra = dict(config.get("kv_connector_extra_config", {}))
    extra["promote"] = True
    return {**config, "kv_connector_extra_config": extra}


def workload_of(args: argparse.Namespace) -> Workload:
    prefixes: int | None = args.prefixes
    if prefixes is None:
        prefixes = _TIERED_PREFIXES if args.tiered else 4
    return Workload(
        num_requests=args.requests, num_prefixes=prefixes, prefix_len=args.prefix_len,
        suffix_len=args.suffix_len, max_tokens=args.max_tokens, seed=args.seed,
    )


@contextmanager
def store_directory(given: Path | None) -> Generator[Path]:
    if given is not None:
        yield given  # the file store creates it, or says why it cannot
        return
    directory = Path(tempfile.mkdtemp(prefix="capkv-demo-"))
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)
