"""Serving the tiny model with a real in-process vLLM engine, one fresh engine per call.

The offline ``LLM`` stops stepping once every output is final, but a connector
that saves at finish still has work: a served engine's busy loop would keep
stepping, so :func:`serve` does the same (bounded) until the scheduler holds no
request, then shuts the engine down — which shuts the connector down on both
sides (the file store's writes land then).
"""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

BLOCK_SIZE = 32
NUM_BLOCKS = 512
MAX_DRAIN_STEPS = 200


@dataclass
class Run:
    """One ``generate`` over the prompts: per prompt, its tokens, their logprobs, and its cached prefix."""

    tokens: list[list[int]]
    logprobs: list[list[dict[int, float]]]
    cached: list[int]
    seconds: float


@dataclass
class Served:
    """What one engine did: its runs, its KV-cache group count, and the host's stats (if a host served)."""

    runs: list[Run]
    groups: int
    stats: dict[Any, Any] = field(default_factory=lambda: dict[Any, Any]())
    seconds: float = 0.0


def serve(
    model: Path,
    prompts: Sequence[Sequence[int]],
    *,
    max_tokens: int,
    runs: int = 1,
    kv_transfer_config: Mapping[str, Any] | None = None,
    disable_hybrid_kv_cache_manager: bool | None = None,
    block_size: int = BLOCK_SIZE,
) -> Served:
    """A fresh engine serves ``prompts`` ``runs`` times (greedy), then is shut down."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    start = time.perf_counter()
    llm = LLM(
        model=str(model),
        skip_tokenizer_init=True,
        enforce_eager=True,
        dtype="bfloat16",
        block_size=block_size,
        num_gpu_blocks_override=NUM_BLOCKS,
        max_model_len=2048,
        seed=0,
        kv_transfer_config=dict(kv_transfer_config) if kv_transfer_config is not None else None,
        disable_hybrid_kv_cache_manager=disable_hybrid_kv_cache_manager,
    )
    core = llm.llm_engine.engine_core.engine_core
    scheduler = core.scheduler
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, logprobs=1, ignore_eos=True)
    done: list[Run] = []
    try:
        for _ in range(runs):
            began = time.perf_counter()
            outputs = llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params, use_tqdm=False)
            for _ in range(MAX_DRAIN_STEPS):  # finish the connector's work, as a serving engine would
                if not scheduler.has_requests():
                    break
                core.step()
            else:
                raise TimeoutError(f"the engine still holds requests after {MAX_DRAIN_STEPS} steps")
            done.append(Run(
                tokens=[list(o.outputs[0].token_ids) for o in outputs],
                logprobs=[
                    [{token: lp.logprob for token, lp in step.items()} for step in (o.outputs[0].logprobs or [])]
                    for o in outputs
                ],
                cached=[o.num_cached_tokens or 0 for o in outputs],
                seconds=time.perf_counter() - began,
            ))
        connector = scheduler.connector
        stats = connector.stats_since_start() if hasattr(connector, "stats_since_start") else {}
        groups = len(scheduler.kv_cache_config.kv_cache_groups)
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm, core, scheduler
        gc.collect()
    return Served(done, groups, stats, time.perf_counter() - start)


def counter(stats: Mapping[Any, Any], name: str) -> float:
    """The sum of every counter called ``name`` in the host's stats (every child's)."""
    total = 0.0
    for key, value in stats.items():
        if isinstance(value, Mapping):
            total += counter(value, name)
        elif key == name and isinstance(value, (int, float)):
            total += value
    return total
