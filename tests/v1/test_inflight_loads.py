"""A capkv stack's slow tier on vLLM 0.34's scheduler with ``max_num_inflight_kv_loads`` (no engine).

vLLM's own ``Scheduler`` and a worker-role ``CapkvConnector`` over a real CPU KV cache, stepped by hand as
vLLM's CPU runner steps them (the "model" writes a value per token and position). A request whose prefix
the file store holds is queued in ``async_kv_waiting`` (the host's ``may_load_async``), starts its load
while the running batch is full, and runs with the loaded tokens: its blocks hold what the first request
computed. Needs vLLM 0.34's scheduler (``vllm34``); vLLM's test helpers come from its tests (``fetch.py``).
"""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vllm is not installed (the `vllm34` tox environment runs this)")

import torch  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec  # noqa: E402
from vllm.v1.outputs import KVConnectorOutput  # noqa: E402
from vllm.v1.request import RequestStatus  # noqa: E402

from capkv.vllm import CapkvConnector  # noqa: E402

pytestmark = pytest.mark.skipif(
    not hasattr(Scheduler, "_admits_inflight_kv_load"), reason="max_num_inflight_kv_loads is vLLM 0.34's"
)

BLOCK = 16
BLOCKS = 64
LAYER = "layer.0"
PREFIX = 3 * BLOCK
WAIT_SECONDS = 30.0


class Rig:
    """vLLM's scheduler, the worker-role host and the KV cache, stepped as vLLM's CPU runner steps them."""

    def __init__(self, root: Path) -> None:
        from tests.v1.kv_connector.unit.utils import create_scheduler, create_vllm_config

        stack = {"kv_connector": "MultiConnector", "kv_connector_extra_config": {"connectors": [
            {"kv_connector": "CPUOffloadConnector", "kv_connector_extra_config": {"capacity_blocks": 4}},
            {"kv_connector": "FileStoreConnector", "kv_connector_extra_config": {"root": str(root)}},
        ]}}
        config = create_vllm_config(
            max_num_seqs=1, block_size=BLOCK, kv_connector="CapkvConnector", kv_connector_module_path="capkv.vllm",
            kv_role="kv_both", kv_connector_extra_config={"stack": stack}, disable_hybrid_kv_cache_manager=True,
        )
        config.scheduler_config.max_num_inflight_kv_loads = 1
        config.cache_config.enable_prefix_caching = False  # every hit is the connector's
        spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=8, dtype=torch.float16)
        kv_cache_config = KVCacheConfig(num_blocks=BLOCKS, kv_cache_tensors=[],
                                        kv_cache_groups=[KVCacheGroupSpec([LAYER], spec)])
        self.scheduler: Any = create_scheduler(config, num_blocks=BLOCKS, kv_cache_config=kv_cache_config)
        self.worker = CapkvConnector(config, KVConnectorRole.WORKER, kv_cache_config)
        assert self.worker.spec is not None
        self.kv = torch.zeros(self.worker.spec.groups[0].kv_shape or (), dtype=torch.float16)
        self.worker.register_kv_caches({LAYER: self.kv})
        self.scheduler.connector.set_xfer_handshake_metadata({0: self.worker.get_handshake_metadata()})
        self.received: set[str] = set()

    def step(self, *, eos: bool = False) -> Any:
        """One step: schedule, load, "compute" the scheduled tokens, save, report (``eos``: every scheduled
        request samples its end)."""
        from tests.v1.kv_connector.unit.utils import create_model_runner_output

        out = self.scheduler.schedule()
        worker = self.worker
        worker.handle_preemptions(out.kv_connector_metadata)
        worker.bind_connector_metadata(out.kv_connector_metadata)
        worker.start_load_kv(SimpleNamespace(attn_metadata={}))
        for request_id, count in out.num_scheduled_tokens.items():
            request = self.scheduler.requests[request_id]
            blocks = self.scheduler.kv_cache_manager.get_block_ids(request_id)[0]
            end = request.num_computed_tokens  # the scheduler counted them computed when it scheduled them
            for position in range(end - count, end):
                self.block_of(blocks[position // BLOCK])[:, position % BLOCK, :] = value(request, position)
        worker.save_kv_layer(LAYER, self.kv, None)
        worker.wait_for_save()
        results = worker.get_transfer_results(out.finished_req_ids)
        self.received |= set(results.finished_recving or ())
        output = KVConnectorOutput(
            finished_sending=results.finished_sending or None, finished_recving=results.finished_recving or None,
            failed_recving=results.failed_recving, invalid_block_ids=worker.get_block_ids_with_load_errors(),
            kv_connector_worker_meta=worker.build_connector_worker_meta(),
        )
        worker.clear_connector_metadata()
        scheduled = [self.scheduler.requests[request_id] for request_id in out.num_scheduled_tokens]
        runner = create_model_runner_output(scheduled, use_eos=eos)
        runner.kv_connector_output = output
        self.scheduler.update_from_output(out, runner)
        return out

    def close(self) -> None:
        self.worker.shutdown()
        self.scheduler.connector.shutdown()

    def block_of(self, block_id: int) -> torch.Tensor:
        return self.kv[block_id]


def value(request: Any, position: int) -> float:
    """What the "model" writes for a token: a function of the token and its position (exact in float16)."""
    return float((request.all_token_ids[position] * 7 + position) % 2048)


def test_a_slow_tier_starts_its_load_while_the_running_batch_is_full(tmp_path: Path) -> None:
    from tests.v1.kv_connector.unit.utils import create_request

    seeder = Rig(tmp_path)  # another engine sharing the file store (its CPU tier is its own)
    seed = create_request(num_tokens=PREFIX + 2, common_prefix_len=PREFIX, block_size=BLOCK, max_tokens=1)
    seeder.scheduler.add_request(seed)
    seeder.step(eos=True)  # prefilled, sampled its one token: finished, its blocks saved
    probe = create_request(num_tokens=PREFIX + 2, common_prefix_len=PREFIX, block_size=BLOCK)
    deadline = time.monotonic() + WAIT_SECONDS
    while not seeder.scheduler.connector.may_load_async(probe):  # the file store has the prefix once it lands
        assert time.monotonic() < deadline, "the file store never held the seed's prefix"
        seeder.step()
        time.sleep(0.05)
    seeder.close()

    rig = Rig(tmp_path)  # this engine's CPU tier is empty: only the slow tier holds the prefix
    local = create_request(num_tokens=BLOCK, block_size=BLOCK, max_tokens=1000)
    rig.scheduler.add_request(local)
    rig.step()
    assert rig.scheduler.running == [local]  # the batch (max_num_seqs=1) is full

    again = create_request(num_tokens=PREFIX + 2, common_prefix_len=PREFIX, block_size=BLOCK)
    rig.scheduler.add_request(again)
    assert list(rig.scheduler.async_kv_waiting) == [again]  # the host's may_load_async: the slow tier may load it
    rig.step()
    assert rig.scheduler.running == [local]
    assert again.status == RequestStatus.WAITING_FOR_REMOTE_KVS  # its load started while the batch was full
    assert not rig.scheduler.async_kv_waiting

    deadline = time.monotonic() + WAIT_SECONDS
    while again.request_id not in rig.received:
        assert time.monotonic() < deadline, "the load never finished"
        rig.step()
        assert rig.scheduler.running == [local]
        time.sleep(0.01)
    rig.step(eos=True)  # the local request finishes: a slot frees
    out = rig.step()
    assert rig.scheduler.running == [again]
    assert out.num_scheduled_tokens == {again.request_id: 2}  # it runs with the loaded tokens: only 2 computed
    blocks = rig.scheduler.kv_cache_manager.get_block_ids(again.request_id)[0]
    for position in range(PREFIX):
        held = rig.block_of(blocks[position // BLOCK])[:, position % BLOCK, :]
        assert torch.all(held == value(again, position)), f"token {position}: the loaded KV differs"
    rig.close()
