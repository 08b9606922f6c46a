"""vLLM's Request read as capkv keys it: salt, LoRA adapter, multimodal items, prompt embeddings; the worker's shard."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from capkv import ConfigError, KeyInputs, KVShard, MultimodalItem
from capkv.contracts._key_inputs import request_key_inputs


def _request(**inputs: object) -> object:
    from vllm import SamplingParams
    from vllm.v1.request import Request

    return Request("r", list(range(64)), SamplingParams(max_tokens=1), None, **inputs)  # type: ignore[arg-type]


def test_a_plain_vllm_request_has_no_key_inputs() -> None:
    from capkv.adapters.vllm._request import read_vllm_requests

    read_vllm_requests()
    assert request_key_inputs(_request(), connector="test", method="test") is None
    assert request_key_inputs(_request(cache_salt=""), connector="test", method="test") is None  # vLLM: no salt


def test_every_input_vllm_folds_into_its_block_hashes_is_read() -> None:
    from vllm.lora.request import LoRARequest
    from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange

    from capkv.adapters.vllm._request import read_vllm_requests

    read_vllm_requests()
    feature = MultiModalFeatureSpec(
        data=None, modality="image", identifier="img-hash", mm_position=PlaceholderRange(offset=3, length=10)
    )
    embeds = torch.arange(64 * 8, dtype=torch.bfloat16).view(64, 8)
    request = _request(
        cache_salt="tenant-a", lora_request=LoRARequest("sql", 1, "/adapters/sql"), mm_features=[feature],
        prompt_embeds=embeds,
    )
    inputs = request_key_inputs(request, connector="test", method="test")
    assert isinstance(inputs, KeyInputs)
    assert inputs.cache_salt == "tenant-a" and inputs.adapter == repr(("sql", "/adapters/sql"))
    assert inputs.multimodal == (MultimodalItem("img-hash", 3, 10),)
    assert len(inputs.prompt_embeds) == 64 and len(set(inputs.prompt_embeds)) == 64
    other = _request(prompt_embeds=embeds.clone().index_fill_(0, torch.tensor([5]), 1.0))
    changed = request_key_inputs(other, connector="test", method="test")
    assert changed is not None
    assert [a == b for a, b in zip(inputs.prompt_embeds, changed.prompt_embeds, strict=True)].count(False) == 1
    repointed = _request(lora_request=LoRARequest("sql", 1, "/adapters/sql-v2"))
    assert request_key_inputs(repointed, connector="test", method="test").adapter != inputs.adapter  # type: ignore[union-attr]


def _parallel(tp: int = 1, pp: int = 1, dcp: int = 1) -> SimpleNamespace:
    return SimpleNamespace(
        tensor_parallel_size=tp, pipeline_parallel_size=pp, decode_context_parallel_size=dcp,
        prefill_context_parallel_size=1,
    )


def test_the_scheduler_side_gets_the_sizes_and_rank_zero() -> None:
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

    from capkv.adapters.vllm._spec import engine_shard

    shard = engine_shard(_parallel(tp=4, pp=2), KVConnectorRole.SCHEDULER, owner="CapkvHMAConnector")
    assert shard == KVShard(tp_size=4, pp_size=2) and shard.count == 8


def test_a_worker_without_parallel_groups_or_with_context_parallelism_is_refused() -> None:
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

    from capkv.adapters.vllm._spec import engine_shard

    with pytest.raises(ConfigError, match="parallel groups"):
        engine_shard(_parallel(tp=2), KVConnectorRole.WORKER, owner="CapkvHMAConnector")
    with pytest.raises(ConfigError, match="decode_context_parallel_size=2"):
        engine_shard(_parallel(tp=2, dcp=2), KVConnectorRole.SCHEDULER, owner="CapkvHMAConnector")
    assert engine_shard(_parallel(), KVConnectorRole.WORKER, owner="CapkvHMAConnector") == KVShard()
