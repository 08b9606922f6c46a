"""Serving the tiny model with a real in-process vLLM engine, one fresh engine per call.

The offline ``LLM`` stops stepping once every output is final, but a connector
that saves at finish still has work: a served engine's busy loop would keep
stepping, so :func:`serve` does the same (bounded) until the scheduler holds no
request, then shuts the engine down — which shuts the connector down on both
sides (the file store's writes land then).

Every wait is bounded twice: the engine is stepped by hand, at most
:data:`MAX_STEPS` times per run (an engine that steps without progress fails the
test in seconds), and a watchdog (``SIGALRM``) turns any call that blocks for
:data:`WATCHDOG_SECONDS` into a ``TimeoutError`` — a failed test, never a hang.
"""

from __future__ import annotations

import gc
import os
import signal
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

BLOCK_SIZE = 32
NUM_BLOCKS = 512
MAX_DRAIN_STEPS = 200
MAX_STEPS = 2000
"""Steps one run may take: far more than the tests' prompts need, far fewer than a hang would."""
WATCHDOG_SECONDS = 300.0
"""The longest one engine may take, built, served and shut down."""


@contextmanager
def watchdog(seconds: float, what: str, *, error: type[Exception] = TimeoutError) -> Iterator[None]:
    """Raise ``error`` in the main thread when the body runs longer than ``seconds``."""
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("the watchdog needs the main thread (SIGALRM)")

    def expired(signum: int, frame: object) -> None:
        raise error(f"{what}: still running after {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@dataclass
class Run:
    """One ``generate`` over the prompts: per prompt, its tokens, their logprobs, and its cached prefix."""

    tokens: list[list[int]]
    logprobs: list[list[dict[int, float]]]
    cached: list[int]
    seconds: float
    finish_reasons: list[str | None] = field(default_factory=lambda: list[str | None]())


@dataclass
class Served:
    """What one engine did: its runs, its KV-cache group count, and the host's stats (if a host served)."""

    runs: list[Run]
    groups: int
    stats: dict[Any, Any] = field(default_factory=lambda: dict[Any, Any]())
    seconds: float = 0.0
    loaded_tokens: tuple[int, ...] = ()
    """Per child of the host's composite stack, the tokens loaded from it (``stack.loaded_tokens``)."""


def serve(
    model: Path,
    prompts: Sequence[Sequence[int]],
    *,
    max_tokens: int,
    runs: int = 1,
    kv_transfer_config: Mapping[str, Any] | None = None,
    disable_hybrid_kv_cache_manager: bool | None = None,
    block_size: int = BLOCK_SIZE,
    cache_salt: str | None = None,
    **llm_options: Any,
) -> Served:
    """A fresh engine serves ``prompts`` ``runs`` times (greedy), then is shut down (watched).

    ``cache_salt``: every prompt's (a tenant's); ``llm_options``: more of ``LLM``'s arguments
    (``tensor_parallel_size``, ``distributed_executor_backend``)."""
    with watchdog(WATCHDOG_SECONDS, "serving the tiny model"):
        return _serve(
            model, prompts, max_tokens=max_tokens, runs=runs, kv_transfer_config=kv_transfer_config,
            disable_hybrid_kv_cache_manager=disable_hybrid_kv_cache_manager, block_size=block_size,
            cache_salt=cache_salt, llm_options=llm_options,
        )


def _serve(
    model: Path,
    prompts: Sequence[Sequence[int]],
    *,
    max_tokens: int,
    runs: int,
    kv_transfer_config: Mapping[str, Any] | None,
    disable_hybrid_kv_cache_manager: bool | None,
    block_size: int,
    cache_salt: str | None,
    llm_options: Mapping[str, Any],
) -> Served:
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
        **llm_options,
    )
    core = llm.llm_engine.engine_core.engine_core
    scheduler = core.scheduler
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, logprobs=1, ignore_eos=True)
    done: list[Run] = []
    engine = llm.llm_engine
    try:
        for run in range(runs):
            began = time.perf_counter()
            ids = [f"run{run}-{index}" for index in range(len(prompts))]
            for request_id, prompt in zip(ids, prompts):
                inputs = (
                    TokensPrompt(prompt_token_ids=list(prompt)) if cache_salt is None
                    else TokensPrompt(prompt_token_ids=list(prompt), cache_salt=cache_salt)
                )
                engine.add_request(request_id, inputs, params)
            finished: dict[str, Any] = {}
            for _ in range(MAX_STEPS):
                finished.update((out.request_id, out) for out in engine.step() if out.finished)
                if len(finished) == len(ids):
                    break
            else:
                raise TimeoutError(f"run {run}: {len(ids) - len(finished)} request(s) unfinished after {MAX_STEPS} steps")
            outputs = [finished[request_id] for request_id in ids]
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
                finish_reasons=[o.outputs[0].finish_reason for o in outputs],
            ))
        connector = scheduler.connector
        stats = connector.stats_since_start() if hasattr(connector, "stats_since_start") else {}
        loaded_tokens = tuple(getattr(getattr(connector, "stack", None), "loaded_tokens", ()))
        groups = len(scheduler.kv_cache_config.kv_cache_groups)
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm, core, scheduler
        gc.collect()
    return Served(done, groups, stats, time.perf_counter() - start, loaded_tokens)


def file_store_host(root: Path, *, host: str = "CapkvHMAConnector") -> dict[str, Any]:
    """vLLM's ``kv_transfer_config`` for a capkv host over one ``FileStoreConnector`` in ``root``."""
    return {
        "kv_connector": host,
        "kv_connector_module_path": "capkv.vllm",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"stack": {
            "kv_connector": "FileStoreConnector",
            "kv_connector_extra_config": {"root": str(root), "namespace": "tiny"},
        }},
    }


def counter(stats: Mapping[Any, Any], name: str) -> float:
    """The sum of every counter called ``name`` in the host's stats (every child's)."""
    total = 0.0
    for key, value in stats.items():
        if isinstance(value, Mapping):
            total += counter(value, name)
        elif key == name and isinstance(value, (int, float)):
            total += value
    return total
