"""vLLM's scheduler aborts a request while a capkv stack loads it asynchronously: its blocks are freed once.

vLLM keeps the blocks of a request aborted in ``WAITING_FOR_REMOTE_KVS`` until the load's receive, and frees
them then. The stack here is a host pool in front of a file store: the request's first block is the engine's
own prefix hit, the rest loads from the file store (held back by a gate), and at the abort the host pool
accepts a save of that first block. Before the fix the stack also answered ``delay_free=True``, so vLLM freed
the blocks at the first of two reports and failed on the second (``assert req_id in self.requests``). Now
the save is folded into the receive: vLLM sees one report, after the load and the save are over.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vllm is not installed (the `vllm` tox environment runs this)")

from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher  # noqa: E402
from vllm.v1.request import Request, RequestStatus  # noqa: E402

from tests.vllm.pd_harness import BLOCK, Node, node, prompt  # noqa: E402

WAIT_S = 30.0


def _config(root: Path) -> dict[str, Any]:
    front = {"kv_connector": "CPUOffloadConnector", "kv_connector_extra_config": {"capacity_blocks": 64}}
    back = {"kv_connector": "FileStoreConnector", "kv_connector_extra_config": {"root": str(root), "namespace": "abort"}}
    stack = {"kv_connector": "MultiConnector", "kv_connector_extra_config": {"connectors": [front, back]}}
    return {"kv_connector": "CapkvConnector", "kv_connector_module_path": "capkv.vllm", "kv_role": "kv_both",
            "kv_connector_extra_config": {"stack": stack}}


def _unwrapped(connector: Any) -> Any:
    stack = connector.stack
    return getattr(stack, "__wrapped__", stack)


def _gate_reads(n: Node) -> threading.Event:
    """Hold every read of the file store's backend until the returned event is set."""
    back = _unwrapped(n.worker).children[1]
    backend = getattr(back, "__wrapped__", back)._worker.backend
    gate = threading.Event()
    for name in ("get", "get_into", "get_into_parts"):
        real = getattr(backend, name, None)
        if real is None:
            continue

        def gated(*args: Any, _real: Any = real, **kwargs: Any) -> Any:
            if not gate.wait(WAIT_S):
                raise TimeoutError("the test never opened the gate")
            return _real(*args, **kwargs)

        setattr(backend, name, gated)
    return gate


def _run_until(n: Node, done: Any, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {WAIT_S} s; last steps: {n.steps[-3:]}")
        n.step()
        time.sleep(0.01)


def test_an_abort_mid_load_frees_its_blocks_once_and_saves_the_engines_own_prefix(
    model_dir: Path, tmp_path: Path
) -> None:
    n = node(model_dir, _config(tmp_path / "files"), groups=1)
    gate: threading.Event | None = None
    try:
        scheduler = n.scheduler
        pool = scheduler.kv_cache_manager.block_pool
        free_at_start = pool.get_num_free_blocks()
        text = prompt(4 * BLOCK + 1, seed=3)
        n.add("seed", text, max_tokens=1)  # both tiers save its four blocks
        _run_until(n, lambda: not scheduler.requests, "the seed request's saves")
        assert scheduler.reset_prefix_cache()
        n.add("warm", text[:BLOCK] + prompt(BLOCK + 1, seed=4), max_tokens=1)  # vLLM computes block 0 again
        _run_until(n, lambda: not scheduler.requests, "the warm request")
        front = _unwrapped(scheduler.connector).children[0]
        front.reset_cache()  # the host pool forgets: block 0 is vLLM's own hit, blocks 1-3 the file store's
        gate = _gate_reads(n)

        n.add("a", text, max_tokens=1)
        n.step()
        assert scheduler.requests["a"].status == RequestStatus.WAITING_FOR_REMOTE_KVS
        scheduler.finish_requests("a", RequestStatus.FINISHED_ABORTED)
        for _ in range(3):  # the load is held: vLLM keeps the blocks, nothing is reported
            record = n.step()
            assert "a" in scheduler.requests and not record["finished_recving"] and not record["finished_sending"]
        gate.set()
        _run_until(n, lambda: "a" not in scheduler.requests, "the aborted request's receive")
        for _ in range(5):  # nothing more is reported of it (a second report failed vLLM's assert)
            n.step()
            time.sleep(0.01)
        reports = [(step["finished_recving"], step["finished_sending"]) for step in n.steps]
        assert sum(recving.count("a") + sending.count("a") for recving, sending in reports) == 1
        assert pool.get_num_free_blocks() == free_at_start, "every block is back in vLLM's pool"
        probe = front.get_num_new_matched_tokens(_request("probe", text), 0)
        assert probe[0] == BLOCK, "the host pool's save of the engine's own prefix landed, and only it"
    finally:
        if gate is not None:
            gate.set()
        n.shutdown()



def _request(request_id: str, text: list[int]) -> Any:
    """A request vLLM never sees: what the host pool would offer it."""
    return Request(request_id=request_id, prompt_token_ids=list(text), sampling_params=SamplingParams(max_tokens=1),
                   pooling_params=None, block_hasher=get_request_block_hasher(BLOCK, sha256))
