"""The fault campaign's engine: one in-process vLLM engine, stepped by hand, every wait bounded.

Serving, aborting a request while its load is under way, reloading a prompt under the id of a request just
aborted (vLLM leaves request ids as given: ``VLLM_DISABLE_REQUEST_ID_RANDOMIZATION``, set by the campaign),
waiting for a store's saves to land, and reading the stack's counters.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import _fault_tier as faults
from tests.vllm.model import prompts as random_prompts

BLOCK = 32
PROMPT_LEN = 3 * BLOCK + 5
MAX_TOKENS = 4
MAX_STEPS = 20_000
"""Steps one serve may take (a prompt computes in about MAX_TOKENS + 2; the others wait for a load in the
background, each after a pause of IDLE_S)."""
IDLE_S = 0.002
"""A step that produced nothing is followed by this pause: a load on a store's reader thread gets the CPU (and
the interpreter) instead of an engine spinning through empty steps."""
REQUEST_TIMEOUT_S = 60.0
"""Wall time one serve may take before it counts as a hang."""
SAVE_WAIT_S = 10.0
"""How long a round waits for the first serve's saves to land (then it goes on: a miss is a fault too)."""


class Hang(Exception):
    """A request not finished within its bounds."""


@dataclass
class Output:
    tokens: list[int]
    reason: str | None
    cached: int


class Engine:
    """One in-process vLLM engine, stepped by hand with bounds."""

    def __init__(self, model: Path, kv_transfer_config: Mapping[str, Any] | None) -> None:
        from vllm import LLM, SamplingParams

        self.llm = LLM(
            model=str(model), skip_tokenizer_init=True, enforce_eager=True, dtype="bfloat16", block_size=BLOCK,
            num_gpu_blocks_override=512, max_model_len=2048, seed=0,
            kv_transfer_config=dict(kv_transfer_config) if kv_transfer_config is not None else None,
        )
        self.params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
        self.filler_params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
        self.fillers = iter(random_prompts(10_000, BLOCK // 2, seed=99))
        self.engine = self.llm.llm_engine
        self.core = self.engine.engine_core.engine_core
        self.count = 0

    def add(self, prompt: Sequence[int], params: Any = None, *, request_id: str | None = None) -> str:
        from vllm.inputs import TokensPrompt

        if request_id is None:
            self.count += 1
            request_id = f"r{self.count}"
        self.engine.add_request(request_id, TokensPrompt(prompt_token_ids=list(prompt)), params or self.params)
        return request_id

    def serve(self, prompt: Sequence[int], *, filler: bool = False) -> Output:
        """Serve ``prompt`` to its end, then drain the connector's work; :class:`Hang` past the bounds."""
        return self.finish(self.add(prompt, self.filler_params if filler else self.params))

    def finish(self, request_id: str) -> Output:
        """Step until ``request_id`` finished, then drain the connector's work; :class:`Hang` past the bounds."""
        deadline = time.monotonic() + REQUEST_TIMEOUT_S
        for _ in range(MAX_STEPS):
            outputs = self.engine.step()
            for out in outputs:
                if out.request_id == request_id and out.finished:
                    self.drain()
                    return Output(list(out.outputs[0].token_ids), out.outputs[0].finish_reason, out.num_cached_tokens or 0)
            if time.monotonic() > deadline:
                break
            if not outputs:
                time.sleep(IDLE_S)
        self.engine.abort_request([request_id])
        raise Hang(f"request {request_id} unfinished after {MAX_STEPS} steps or {REQUEST_TIMEOUT_S:.0f} s")

    def _scheduled_with_hit(self, prompt: Sequence[int]) -> tuple[str, bool]:
        """Add ``prompt`` and step once: its id, and whether it was scheduled with a hit (its load under way)."""
        request_id = self.add(prompt)
        self.engine.step()
        held = list(self.core.scheduler.requests.values())
        return request_id, any(r.num_computed_tokens > 0 or r.status.name == "WAITING_FOR_REMOTE_KVS" for r in held)

    def abort_loading(self, prompt: Sequence[int]) -> bool:
        """Add ``prompt``, step once (it is scheduled, its load under way), abort it, drain; whether it was
        scheduled with a hit."""
        request_id, hit = self._scheduled_with_hit(prompt)
        self.engine.abort_request([request_id])
        self.drain()
        return hit

    def abort_and_reload(self, prompt: Sequence[int]) -> tuple[Output, bool]:
        """Add ``prompt`` and step once (its load under way), abort it, and add it again under the same request
        id as soon as vLLM lets go of that id (vLLM 0.32 holds an aborted request until its load is reported:
        a second load of one id then starts while the store may still hold the first's state), and serve that
        to its end: its output, and whether the first was scheduled with a hit."""
        request_id, hit = self._scheduled_with_hit(prompt)
        self.engine.abort_request([request_id])
        deadline = time.monotonic() + REQUEST_TIMEOUT_S
        while request_id in self.core.scheduler.requests:
            if time.monotonic() > deadline:
                raise Hang(f"vLLM still holds the aborted request {request_id} after {REQUEST_TIMEOUT_S:.0f} s")
            self.core.step()
            time.sleep(IDLE_S)
        self.add(prompt, request_id=request_id)
        return self.finish(request_id), hit

    def drain(self) -> None:
        scheduler = self.core.scheduler
        deadline = time.monotonic() + REQUEST_TIMEOUT_S
        for _ in range(MAX_STEPS):
            if not scheduler.has_requests():
                return
            self.core.step()
            if time.monotonic() > deadline:
                break
            time.sleep(IDLE_S)
        raise Hang(f"the engine still holds requests after {MAX_STEPS} steps or {REQUEST_TIMEOUT_S:.0f} s")

    def saved(self, before: int) -> None:
        """Wait (bounded) for the saves the last serve queued: ``put`` calls past ``before``, none under way,
        and no new one for a while. A store gathers a finished request's blocks in a later step, and an
        engine with no request does not step: short filler prompts (no full block: nothing to save) step it."""
        deadline = time.monotonic() + SAVE_WAIT_S
        last, quiet = -1, 0
        while time.monotonic() < deadline:
            done, running = faults.puts()
            if done > before and running == 0:
                quiet = quiet + 1 if done == last else 0
                if quiet >= 3:
                    return
            last = done
            self.serve(next(self.fillers), filler=True)
            time.sleep(0.02)

    def forget_local(self) -> None:
        self.llm.reset_prefix_cache()

    def counter(self, name: str) -> float:
        connector = self.core.scheduler.connector
        stats = connector.stats_since_start() if hasattr(connector, "stats_since_start") else {}
        return _counted(stats, name)

    def close(self) -> None:
        """Shut the engine down. When the connector's shutdown raises (a store raises the failures it kept),
        vLLM leaves its worker-side connector registered, and the next engine in this process would reuse
        it: it is forgotten here, whatever happened."""
        try:
            self.engine.engine_core.shutdown()
        finally:
            from vllm.distributed.kv_transfer import kv_transfer_state

            kv_transfer_state._KV_CONNECTOR_AGENT = None  # noqa: SLF001
            del self.llm, self.engine, self.core
            gc.collect()


def _counted(stats: object, name: str) -> float:
    if not isinstance(stats, Mapping):
        return 0.0
    total = 0.0
    for key, value in stats.items():
        if isinstance(value, Mapping):
            total += _counted(value, name)
        elif key == name and isinstance(value, (int, float)):
            total += value
    return total
