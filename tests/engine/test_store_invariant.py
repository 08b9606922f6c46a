"""The stores' invariant, over random workloads in the reference engine (bit-exact verification on).

Serve a workload (cold), forget the local prefix cache and poison the paged KV,
serve it again (warm):

- the warm run never computes more tokens than the cold one;
- with a store large enough for everything, each warm request computes at most
  its non-shared tail: what follows the longest prefix a hit can cover (whole
  blocks of every group, at least one prompt token left to compute), then one
  token per generated token after the first.

Workloads vary what used to hide lost saves: generation length (well past the
window), suffix lengths, prompts that are exact multiples of the block size,
windows smaller and larger than the prompt, one to three groups, different
block sizes for sliding-window groups, and the stack (host pool, files, both).
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from capkv import MultiConnector
from capkv.connectors import CPUOffloadConnector, FileStoreConnector
from capkv.engine import Engine, ModelShape, Workload
from capkv.engine._request import Request

STORE_BLOCKS = 1 << 14
"""Larger than any workload below needs, over every group."""


@st.composite
def cases(draw: st.DrawFn) -> tuple[ModelShape, Workload, str]:
    block = draw(st.sampled_from([4, 8, 16]))
    sliding_block = draw(st.sampled_from([None, block, 2 * block]))
    pattern = draw(st.sampled_from(["F", "S", "FS", "SF", "FSS", "FFS"]))
    window = draw(st.integers(1, 96))
    whole_blocks = draw(st.booleans())
    prefix = draw(st.integers(0, 8)) * block if whole_blocks else draw(st.integers(0, 100))
    suffix = draw(st.integers(0, 6)) * block if whole_blocks else draw(st.integers(0, 40))
    if prefix + suffix == 0:
        suffix = block
    shape = ModelShape(
        num_layers=len(pattern), pattern=pattern, sliding_window=window, num_kv_heads=1, head_dim=4,
        block_size=block, sliding_block_size=sliding_block, num_blocks=4096,
    )
    workload = Workload(
        num_requests=draw(st.integers(1, 5)), num_prefixes=draw(st.integers(1, 3)), prefix_len=prefix,
        suffix_len=suffix, max_tokens=draw(st.integers(1, 80)), seed=draw(st.integers(0, 3)),
    )
    return shape, workload, draw(st.sampled_from(["cpu", "file", "cpu,file", "file,cpu"]))


def _stack(kind: str, shape: ModelShape, root: Path) -> Any:
    spec = shape.kv_spec()
    made = [
        CPUOffloadConnector(spec, capacity_blocks=STORE_BLOCKS) if name == "cpu" else FileStoreConnector(spec, root=root)
        for name in kind.split(",")
    ]
    return made[0] if len(made) == 1 else MultiConnector(*made)


def _flush(stack: Any) -> None:
    for child in getattr(stack, "children", (stack,)):
        if isinstance(child, FileStoreConnector):
            child.flush()


def _tail_bound(shape: ModelShape, request: Request) -> int:
    """What a warm request computes at most when every block of its prompt is stored."""
    step = math.lcm(*(group.block_size for group in shape.groups))
    prompt = request.num_prompt_tokens
    hit = (prompt - 1) // step * step
    return prompt - hit + request.max_tokens - 1


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_warm_never_computes_more_than_cold_and_at_most_the_tail(case: tuple[ModelShape, Workload, str]) -> None:
    shape, workload, kind = case
    with tempfile.TemporaryDirectory(prefix="capkv-invariant-") as root:
        stack = _stack(kind, shape, Path(root))
        engine = Engine(shape, stack)
        try:
            engine.run(workload.requests("cold"))
            cold = engine.stats.computed_tokens
            _flush(stack)
            engine.reset_prefix_cache()
            engine.stats.reset()
            warm_requests = workload.requests("warm")
            engine.run(warm_requests)
            warm = engine.stats.computed_tokens
        finally:
            engine.shutdown()
    assert warm <= cold, (warm, cold)
    assert warm <= sum(_tail_bound(shape, r) for r in warm_requests), (warm, cold)
