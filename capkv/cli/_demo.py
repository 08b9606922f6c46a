"""``capkv demo``: serve a hybrid model through a connector stack, twice, and verify every byte.

The first (cold) run computes every prompt and saves KV through the stack; then
the engine forgets its local prefix cache and poisons its paged KV, and the
second (warm) run gets its prefixes back through the stack. The reference engine
checks each loaded block, and each request's KV at finish, bit for bit against
recomputation. Exit status: 0 verified, 1 a mismatch, 2 a stack or option the
engine refuses (before serving) or a failure while serving — one line, never a
traceback.

``--stack`` is a shorthand for a stack file (:mod:`capkv.cli._stack_spec`): its
names resolve through the registry ``capkv check`` uses, and the stack is built
and printed by the same code (:mod:`capkv.cli._stack_tree`), with the engine's
KV spec and the demo's options (``--cpu-blocks`` for ``capacity_blocks``, the
store directory for ``root``) filling options a connector declares and the
stack leaves out. ``--import MODULE`` brings a user's connectors in.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Generator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch

from capkv.capabilities._hma import StackNode, describe
from capkv.cli._check import import_user_module
from capkv.cli._numbers import int_at_least
from capkv.cli._progress import Progress, TextStream
from capkv.cli._stack_spec import parse_stack
from capkv.cli._stack_tree import Findings, Inspected, inspect_stack, tree_lines
from capkv.config._build import BuildContext
from capkv.config._loader import load_stack
from capkv.config._registry import default_registry
from capkv.connectors import CPUOffloadConnector, FileStoreConnector
from capkv.engine import Engine, ModelShape, VerificationError, Workload
from capkv.engine._stats import EngineStats
from capkv.errors import CapkvError, ConfigError

__all__ = ["add_arguments", "run"]

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


def run(args: argparse.Namespace) -> int:
    out = sys.stdout
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # "module:Class" paths resolve like ``python -m``, as in capkv check
    try:
        shape, workload = _shape(args), _workload(args)
        _require_memory(shape)
        for module in args.imports:
            import_user_module(module)
        configured = load_stack(_with_options(parse_stack(args.stack), promote=args.promote), registry=default_registry)
    except CapkvError as error:
        return _fail(error)
    torch.set_num_threads(args.threads)
    with _store_directory(args.store_dir) as directory:
        context = BuildContext(
            spec=shape.kv_spec(),
            defaults={"capacity_blocks": _cpu_blocks(args), "root": str(directory), "url": args.redis_url},
        )
        findings = Findings()
        try:
            root = inspect_stack(configured, context=context, findings=findings)
        except ImportError as error:  # an optional dependency, e.g. the redis store without capkv[redis]
            return _fail_line(f"refused before serving: {error}")
        stack = root.built
        if findings.problems or findings.errors or stack is None:
            _print_setup(out, shape, workload, root)
            reasons = [*findings.problems, *findings.errors, *root.unbuilt_because]
            return _fail_line(f"refused before serving: {reasons[0] if reasons else 'the stack was not built'}")
        _print_setup(out, shape, workload, root)
        try:
            engine = Engine(shape, stack)
        except CapkvError as error:
            out.write("\n")
            _shut_down(stack)
            return _fail(error, "refused before serving")
        except (RuntimeError, MemoryError) as error:  # torch could not allocate the paged KV cache
            out.write("\n")
            _shut_down(stack)
            return _fail_line(f"refused before serving: cannot allocate the KV cache: {type(error).__name__}: {error}")
        out.write(f"check_stack: ok, the stack serves all {len(shape.groups)} KV-cache groups\n\n")
        try:
            return _serve(out, engine, workload, stack)
        except (CapkvError, OSError) as error:
            out.write("\n")
            return _fail(error, "stopped while serving")


def _shut_down(stack: object) -> None:
    """Stop a stack the engine never took (its stores' writer threads)."""
    try:
        shutdown = getattr(stack, "shutdown", None)
        if callable(shutdown):
            shutdown()
    except Exception:  # noqa: BLE001 - the refusal already being reported is what matters
        pass


# ---- serving ---------------------------------------------------------------------------


@dataclass(frozen=True)
class RunSummary:
    label: str
    wall_seconds: float
    stats: EngineStats
    loaded: tuple[int, ...] = ()
    """Tokens loaded from each of the stack's children in this run (empty when the stack is one connector)."""
    promoted: tuple[int, ...] = ()
    """Tokens loaded from later children that each child was asked to save in this run."""


@runtime_checkable
class Tiered(Protocol):
    """A stack that counts, per child, the tokens loaded from it and promoted into it (``MultiConnector``)."""

    @property
    def loaded_tokens(self) -> tuple[int, ...]: ...

    @property
    def promoted_tokens(self) -> tuple[int, ...]: ...

    @property
    def promote(self) -> bool: ...


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
            tiers = engine.connector if isinstance(engine.connector, Tiered) else None
            before = (tiers.loaded_tokens, tiers.promoted_tokens) if tiers is not None else ((), ())
            started = time.perf_counter()
            finished = engine.run(workload.requests(label), progress)
            progress.close(len(finished))
            loaded, promoted = (tiers.loaded_tokens, tiers.promoted_tokens) if tiers is not None else ((), ())
            runs.append(RunSummary(
                label, time.perf_counter() - started, engine.stats.snapshot(),
                tuple(b - a for a, b in zip(before[0], loaded, strict=True)),
                tuple(b - a for a, b in zip(before[1], promoted, strict=True)),
            ))
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


def _print_setup(out: TextStream, shape: ModelShape, workload: Workload, root: Inspected) -> None:
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
    for line in tree_lines(root, _leaf_detail):
        out.write(f"  {line}\n")


def _leaf_detail(node: Inspected) -> str:
    leaf = node.built
    if isinstance(leaf, FileStoreConnector):
        return str(leaf.root)
    if isinstance(leaf, CPUOffloadConnector):
        return f"{leaf.pool.capacity} blocks"
    if type(leaf).__name__ == "RedisStoreConnector":  # not imported here: it is optional
        url, kv = getattr(leaf, "url", ""), getattr(leaf, "kv", None)
        reachable = getattr(kv, "ping", lambda: True)()
        return f"{url}{'' if reachable else '  (not answering: every lookup a miss)'}"
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
    tiers = engine.connector if isinstance(engine.connector, Tiered) else None
    if tiers is not None:
        labels = [f"#{i} {describe(child)}" for i, child in enumerate(getattr(tiers, "children", ()), start=1)]
        rows += [(f"tokens loaded from {label}", [f"{r.loaded[i]:,}" for r in runs]) for i, label in enumerate(labels)]
        if tiers.promote:
            rows += [
                (f"tokens promoted into {label}", [f"{r.promoted[i]:,}" for r in runs])
                for i, label in enumerate(labels[:-1])
            ]
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
    if tiers is not None:
        out.write("  (tokens loaded from each tier: its slices of the composed hits; each tier loads past the ones before it)\n")
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


def _require_memory(shape: ModelShape) -> None:
    """Refuse a KV cache that cannot fit, before allocating it (with overcommit, torch may not say)."""
    needed = kv_cache_nbytes(shape)
    available = _available_nbytes(shape.device)
    # The engine keeps a second copy's worth for verification and the stores' host rows: half is a fair bound.
    if available is not None and 2 * needed > available:
        raise ConfigError(
            f"the paged KV cache needs {_bytes(needed)} on {shape.device} ({shape.num_blocks} blocks x "
            f"{shape.num_layers} layers), more than half of the {_bytes(available)} available; "
            "lower --num-blocks, --layers, --kv-heads or --head-dim",
            method="demo", value=needed,
        )


def _cpu_blocks(args: argparse.Namespace) -> int:
    given: int | None = args.cpu_blocks
    if given is not None:
        return given
    return _TIERED_CPU_BLOCKS if args.tiered else _CPU_BLOCKS


def _with_options(config: dict[str, Any], *, promote: bool) -> dict[str, Any]:
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


def _workload(args: argparse.Namespace) -> Workload:
    prefixes: int | None = args.prefixes
    if prefixes is None:
        prefixes = _TIERED_PREFIXES if args.tiered else 4
    return Workload(
        num_requests=args.requests, num_prefixes=prefixes, prefix_len=args.prefix_len,
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
    return _fail_line(f"{context}: {type(error).__name__}: {error}")


def _fail_line(message: str) -> int:
    """One line on stderr (whatever a connector's message held), exit status 2."""
    sys.stdout.flush()
    print(f"capkv demo: {' '.join(message.split())}", file=sys.stderr)
    return 2
