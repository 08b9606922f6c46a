"""``capkv demo``: serve a hybrid model through a connector stack, twice, and verify every byte.

The first (cold) run computes every prompt and saves KV through the stack; then
the engine forgets its local prefix cache and poisons its paged KV, and the
second (warm) run gets its prefixes back through the stack. The reference engine
checks each loaded block, and each request's KV at finish, bit for bit against
recomputation. Exit status: 0 verified, 1 a mismatch, 2 a stack or option the
engine refuses (before serving).
"""

from __future__ import annotations

import argparse
import functools
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Generator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch

from capkv.capabilities._hma import StackNode
from capkv.cli._progress import Progress, TextStream
from capkv.cli._stack_spec import build_stack, parse_stack, render_stack
from capkv.connectors import CPUOffloadConnector, FileStoreConnector, SingleGroupOffloadConnector
from capkv.contracts._connector import KVConnector
from capkv.contracts._spec import KVSpec
from capkv.engine import Engine, ModelShape, VerificationError, Workload
from capkv.engine._stats import EngineStats
from capkv.errors import CapkvError, ConfigError

__all__ = ["add_arguments", "run"]

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    model = parser.add_argument_group("model shape")
    model.add_argument("--layers", type=int, default=6, help="attention layers (default: 6)")
    model.add_argument("--pattern", default="FSS",
                       help="attention kind per layer, repeated: F full, S sliding window (default: FSS)")
    model.add_argument("--window", type=int, default=128, help="sliding window in tokens (default: 128)")
    model.add_argument("--kv-heads", type=int, default=4, help="KV heads per layer (default: 4)")
    model.add_argument("--head-dim", type=int, default=64, help="(default: 64)")
    model.add_argument("--block-size", type=int, default=16, help="tokens per block (default: 16)")
    model.add_argument("--sliding-block-size", type=int, default=None,
                       help="tokens per block in sliding-window groups (default: --block-size)")
    model.add_argument("--num-blocks", type=int, default=1024, help="blocks in the paged pool (default: 1024)")
    model.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16", help="(default: bfloat16)")
    stack = parser.add_argument_group("stack")
    stack.add_argument("--stack", default="cpu,file",
                       help="connectors, first loads first: names joined by ',' ; '[...]' nests a stack. "
                            f"Names: {', '.join(CONNECTORS)} (single: a connector for one KV-cache group). "
                            "(default: cpu,file)")
    stack.add_argument("--cpu-blocks", type=int, default=2048,
                       help="blocks the host pool of cpu (and single) holds (default: 2048)")
    stack.add_argument("--store-dir", type=Path, default=None,
                       help="directory of the file store (default: a temporary directory, removed afterwards)")
    work = parser.add_argument_group("workload")
    work.add_argument("--requests", type=int, default=32, help="requests per run (default: 32)")
    work.add_argument("--prefixes", type=int, default=4, help="distinct shared prefixes (default: 4)")
    work.add_argument("--prefix-len", type=int, default=384, help="tokens in each shared prefix (default: 384)")
    work.add_argument("--suffix-len", type=int, default=65, help="tokens of each request's own (default: 65)")
    work.add_argument("--max-tokens", type=int, default=8, help="tokens generated per request (default: 8)")
    work.add_argument("--seed", type=int, default=0, help="workload seed (default: 0)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where the paged KV cache lives")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads (default: 1; the demo's many small tensor ops "
                             "only lose time to thread hand-offs, badly so on a busy machine)")


def run(args: argparse.Namespace) -> int:
    out = sys.stdout
    if args.threads < 1:
        return _fail(ConfigError(f"--threads must be at least 1, got {args.threads}", method="demo", value=args.threads))
    torch.set_num_threads(args.threads)
    try:
        shape, workload = _shape(args), _workload(args)
        tree = parse_stack(args.stack)
    except CapkvError as error:
        return _fail(error)
    with _store_directory(args.store_dir) as directory:
        try:
            settings = StackSettings(shape.kv_spec(), directory, args.cpu_blocks)
            stack = build_stack(tree, {name: functools.partial(make, settings) for name, make in CONNECTORS.items()})
        except CapkvError as error:
            return _fail(error)
        _print_setup(out, shape, workload, stack)
        try:
            engine = Engine(shape, stack)
        except CapkvError as error:
            out.write("\n")
            return _fail(error, "refused before serving")
        out.write(f"check_stack: ok, the stack serves all {len(shape.groups)} KV-cache groups\n\n")
        try:
            return _serve(out, engine, workload, stack)
        except (CapkvError, OSError) as error:
            out.write("\n")
            return _fail(error, "stopped while serving")


@dataclass(frozen=True)
class StackSettings:
    """What a connector factory gets: the engine's KV spec and the demo's options for stores."""

    spec: KVSpec
    store_dir: Path
    cpu_blocks: int


ConnectorFactory = Callable[[StackSettings], KVConnector[Any]]


def _cpu(settings: StackSettings) -> KVConnector[Any]:
    return CPUOffloadConnector(settings.spec, capacity_blocks=settings.cpu_blocks)


def _file(settings: StackSettings) -> KVConnector[Any]:
    return FileStoreConnector(settings.spec, root=settings.store_dir)


def _single(settings: StackSettings) -> KVConnector[Any]:
    return SingleGroupOffloadConnector(settings.spec, capacity_blocks=settings.cpu_blocks)


CONNECTORS: dict[str, ConnectorFactory] = {"cpu": _cpu, "file": _file, "single": _single}
"""The names ``--stack`` knows. Add your own to try your connector in the demo."""


# ---- serving ---------------------------------------------------------------------------


@dataclass(frozen=True)
class RunSummary:
    label: str
    wall_seconds: float
    stats: EngineStats


@runtime_checkable
class Flushable(Protocol):
    """A store that finishes writes in the background, and can wait for them (``FileStoreConnector``)."""

    def flush(self) -> None: ...


def _flush(node: object) -> None:
    """Wait until every store in the stack holds what it was asked to save.

    Between the runs only: the demo measures reuse, not how fast a disk catches up
    (a block still being written is, rightly, not a hit).
    """
    if isinstance(node, StackNode):
        for child in node.children:
            _flush(child)
    elif isinstance(node, Flushable):
        node.flush()


def _serve(out: TextStream, engine: Engine, workload: Workload, stack: object) -> int:
    runs: list[RunSummary] = []
    out.write("serving\n")
    try:
        for label in ("cold", "warm"):
            if runs:
                _flush(stack)
                engine.reset_prefix_cache()
            engine.stats.reset()
            progress = Progress(label, workload.num_requests, out)
            started = time.perf_counter()
            finished = engine.run(workload.requests(label), progress)
            progress.close(len(finished))
            runs.append(RunSummary(label, time.perf_counter() - started, engine.stats.snapshot()))
    except VerificationError as error:
        out.write("\n")
        _print_summary(out, engine, runs)
        out.write(f"verified: MISMATCH: {error.mismatch.describe()}\n")
        return 1
    finally:
        engine.shutdown()
    out.write("\n")
    _print_summary(out, engine, runs)
    out.write("verified: bit-exact (every loaded block, and every request's KV at finish, against recomputation)\n")
    return 0


# ---- presentation -------------------------------------------------------------------------


def _print_setup(out: TextStream, shape: ModelShape, workload: Workload, stack: object) -> None:
    dtype = str(shape.dtype).removeprefix("torch.")
    out.write(
        f"model     {shape.num_layers} layers, pattern {shape.pattern}, {shape.num_kv_heads} KV heads x "
        f"{shape.head_dim}, {dtype}, {shape.num_blocks} blocks on {shape.device}\n"
    )
    for group in shape.groups:
        kind = "full attention" if group.sliding_window is None else f"sliding window {group.sliding_window}"
        layers = ",".join(name.split(".")[1] for name in group.layer_names)
        out.write(f"  group {group.index}  {kind:<22} layers {layers:<10} block {group.block_size}\n")
    out.write(
        f"workload  {workload.num_requests} requests: {workload.num_prefixes} shared prefixes of "
        f"{workload.prefix_len} tokens + {workload.suffix_len} of their own, {workload.max_tokens} generated\n"
    )
    out.write("stack\n")
    for line in render_stack(stack, _leaf_detail):
        out.write(f"  {line}\n")


def _leaf_detail(leaf: object) -> str:
    if isinstance(leaf, FileStoreConnector):
        return str(leaf.root)
    if isinstance(leaf, CPUOffloadConnector):
        return f"{leaf.pool.capacity} blocks"
    return ""


def _print_summary(out: TextStream, engine: Engine, runs: list[RunSummary]) -> None:
    if not runs:
        return
    rows: list[tuple[str, list[str]]] = [
        ("requests", [f"{r.stats.requests_finished:,}" for r in runs]),
        ("prompt tokens", [f"{r.stats.prompt_tokens:,}" for r in runs]),
        ("tokens computed", [f"{r.stats.computed_tokens:,}" for r in runs]),
    ]
    for group in engine.shape.groups:
        kind = "full" if group.sliding_window is None else f"sw {group.sliding_window}"
        rows.append((
            f"prefix-hit tokens, group {group.index} ({kind})",
            [f"{r.stats.groups[group.index].local_hit_tokens:,} + {r.stats.groups[group.index].loaded_tokens:,}" for r in runs],
        ))
    rows += [
        ("bytes saved", [_bytes(_saved(r.stats)) for r in runs]),
        ("bytes loaded", [_bytes(r.stats.loaded_bytes) for r in runs]),
        ("copy throughput", [_rate((_saved(r.stats) or 0) + r.stats.loaded_bytes, r.stats.transfer_seconds) for r in runs]),
        ("wall time", [f"{r.wall_seconds:.2f} s" for r in runs]),
    ]
    label_width = max(len(label) for label, _ in rows)
    widths = [max(len(r.label), *(len(values[i]) for _, values in rows)) for i, r in enumerate(runs)]
    out.write(f"summary  {'':<{label_width - 7}}" + "".join(f"  {r.label:>{w}}" for r, w in zip(runs, widths, strict=True)) + "\n")
    for label, values in rows:
        out.write(f"  {label:<{label_width}}" + "".join(f"  {v:>{w}}" for v, w in zip(values, widths, strict=True)) + "\n")
    out.write("  (prefix-hit tokens: local prefix cache + loaded through the stack)\n")
    if any(_saved(r.stats) is None for r in runs):
        out.write("  (bytes saved: n/a when the stack's connectors report no get_kv_connector_stats)\n")


def _saved(stats: EngineStats) -> int | None:
    """Bytes the stack reports saving (its connectors' ``saved_bytes`` statistics); the engine cannot see saves."""
    return stats.connector_total("saved_bytes")


def _bytes(count: int | None) -> str:
    if count is None:
        return "n/a"
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= size:
            return f"{count / size:.1f} {unit}"
    return f"{count} B"


def _rate(count: int, seconds: float) -> str:
    if not count or seconds <= 0:
        return "-"
    return f"{count / seconds / 1e9:.2f} GB/s"


# ---- options ----------------------------------------------------------------------------------


def _shape(args: argparse.Namespace) -> ModelShape:
    if args.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: torch.cuda.is_available() is False here", method="demo", value="cuda")
    return ModelShape(
        num_layers=args.layers, pattern=args.pattern, sliding_window=args.window, num_kv_heads=args.kv_heads,
        head_dim=args.head_dim, block_size=args.block_size, sliding_block_size=args.sliding_block_size,
        num_blocks=args.num_blocks, dtype=DTYPES[args.dtype], device=args.device,
    )


def _workload(args: argparse.Namespace) -> Workload:
    return Workload(
        num_requests=args.requests, num_prefixes=args.prefixes, prefix_len=args.prefix_len,
        suffix_len=args.suffix_len, max_tokens=args.max_tokens, seed=args.seed,
    )


@contextmanager
def _store_directory(given: Path | None) -> Generator[Path]:
    if given is not None:
        yield given  # the file store creates it, or says why it cannot
        return
    directory = Path(tempfile.mkdtemp(prefix="capkv-demo-"))
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _fail(error: CapkvError | OSError, context: str = "error") -> int:
    sys.stdout.flush()
    print(f"capkv demo: {context}: {type(error).__name__}: {error}", file=sys.stderr)
    return 2
