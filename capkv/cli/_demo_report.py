"""What ``capkv demo`` prints: the model, workload and stack it serves, and each run's figures side by side."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from capkv.capabilities._hma import describe
from capkv.cli._progress import TextStream
from capkv.cli._stack_tree import Inspected, tree_lines
from capkv.connectors import CPUOffloadConnector, FileStoreConnector
from capkv.engine import Engine, ModelShape, Workload
from capkv.engine._stats import EngineStats

__all__ = ["RunSummary", "Tiered", "format_bytes", "print_setup", "print_summary"]


@dataclass(frozen=True)
class RunSummary:
    """What one run (cold or warm) measured: the figures the summary prints."""

    label: str
    wall_seconds: float
    stats: EngineStats
    loaded: tuple[int, ...] = ()
    """Tokens loaded from each of the stack's children in this run that the engine kept (``landed_tokens``;
    empty when the stack is one connector)."""
    promoted: tuple[int, ...] = ()
    """Tokens loaded from later children that each child was asked to save in this run."""
    first_cause: str = ""
    """The first warning logged during this run (a store says why a load failed)."""


@runtime_checkable
class Tiered(Protocol):
    """A stack that counts, per child, the tokens loaded from it and promoted into it (``MultiConnector``)."""

    @property
    def landed_tokens(self) -> tuple[int, ...]: ...

    @property
    def promoted_tokens(self) -> tuple[int, ...]: ...

    @property
    def promote(self) -> bool: ...


def print_setup(out: TextStream, shape: ModelShape, workload: Workload, root: Inspected) -> None:
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


def print_summary(out: TextStream, engine: Engine, runs: list[RunSummary]) -> None:
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
        ("hit tokens offered / possible", [
            f"{r.stats.local_hit_tokens + r.stats.external_hit_tokens:,} / {r.stats.hit_limit_tokens:,}" for r in runs
        ]),
        ("load errors: blocks / tokens", [f"{r.stats.load_error_blocks:,} / {r.stats.failed_load_tokens:,}" for r in runs]),
    ]
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
        ("bytes saved", [format_bytes(_saved(r.stats)) for r in runs]),
        ("bytes loaded", [format_bytes(r.stats.loaded_bytes) for r in runs]),
        ("copy throughput", [_rate((_saved(r.stats) or 0) + r.stats.loaded_bytes, r.stats.transfer_seconds) for r in runs]),
        ("wall time", [f"{r.wall_seconds:.2f} s" for r in runs]),
    ]
    label_width = max(len(label) for label, _ in rows)
    widths = [max(len(r.label), *(len(values[i]) for _, values in rows)) for i, r in enumerate(runs)]
    out.write(f"summary  {'':<{label_width - 7}}" + "".join(f"  {r.label:>{w}}" for r, w in zip(runs, widths, strict=True)) + "\n")
    for label, values in rows:
        out.write(f"  {label:<{label_width}}" + "".join(f"  {v:>{w}}" for v, w in zip(values, widths, strict=True)) + "\n")
    out.write("  (prefix-hit tokens: local prefix cache + loaded through the stack, loads that landed only)\n")
    out.write(
        "  (hit tokens offered / possible: local and offered by the stack / what one store holding every block "
        "would let the engine skip)\n"
    )
    if any(r.stats.load_error_blocks or r.stats.failed_load_tokens for r in runs):
        out.write("  (load errors: blocks the stack reported failed / offered tokens the engine then recomputed)\n")
    if tiers is not None:
        out.write("  (tokens loaded from each tier: its slices of the composed hits that landed; each tier loads past "
                  "the ones before it)\n")
        if any(r.stats.failed_load_tokens for r in runs):
            out.write("  (a failed block costs its tier the rest of its slice, and every later tier its slice: the "
                      "engine recomputes from there)\n")
    if any(_saved(r.stats) is None for r in runs):
        out.write("  (bytes saved: n/a when the stack's connectors report no get_kv_connector_stats)\n")


def _saved(stats: EngineStats) -> int | None:
    """Bytes the stack reports saving (its connectors' ``saved_bytes`` statistics); the engine cannot see saves."""
    return stats.connector_total("saved_bytes")


def format_bytes(count: int | None) -> str:
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
