"""The host's translations between vLLM's objects and capkv's, one by one (real vLLM classes, no engine)."""

from __future__ import annotations

import pytest

from capkv import ContractError, MetadataError
from capkv.connectors import SaveReport


def test_load_errors_flatten_losslessly() -> None:
    from capkv.adapters.vllm._translate import flat_load_errors

    assert flat_load_errors({0: {3, 4}, 1: {7}}) == {3, 4, 7}
    assert flat_load_errors({}) == set()


def test_flat_load_errors_are_attributed_from_loading_block_tables() -> None:
    from capkv.adapters.vllm._translate import LoadingBlocks

    loading = LoadingBlocks("CapkvHMAConnector")
    loading.record("a", ([1, 2], [0, 5]), null_block_id=0)
    assert loading.attribute({2, 5}, method="m") == {0: frozenset({2}), 1: frozenset({5})}
    with pytest.raises(ContractError, match="block 9, which no request with a planned load holds") as caught:
        loading.attribute({9}, method="update_connector_output")
    assert (caught.value.connector, caught.value.method, caught.value.value) == (
        "CapkvHMAConnector", "update_connector_output", 9,
    )
    with pytest.raises(ContractError):
        loading.attribute({0}, method="m")  # the null block is never loaded: it belongs to no group
    loading.record("b", ([], [2]), null_block_id=0)  # block 2 freed by "a" (preempted) and reused in group 1
    assert loading.attribute({2}, method="m") == {1: frozenset({2})}
    loading.forget("a")  # "a" finishing does not take "b"'s block away
    assert loading.attribute({2}, method="m") == {1: frozenset({2})}
    loading.forget("b")
    with pytest.raises(ContractError):
        loading.attribute({2}, method="m")


def test_stats_merge_per_child_and_reduce() -> None:
    from capkv.adapters.vllm._translate import CapkvStats, merge_counts, stats_data

    scheduler = stats_data({1: {"hit_tokens": 64}})
    worker = stats_data({1: {"loaded_blocks": 2}, 0: {"saved_blocks": 3}})
    assert scheduler == {"#2": {"hit_tokens": 64}}
    merged = CapkvStats(worker).aggregate(CapkvStats(scheduler)).aggregate(CapkvStats(worker))
    assert merged.data == {"#2": {"loaded_blocks": 4, "hit_tokens": 64}, "#1": {"saved_blocks": 6}}
    assert merged.reduce() == {"#2.loaded_blocks": 4, "#2.hit_tokens": 64, "#1.saved_blocks": 6}
    assert stats_data("opaque") == {"stack": "opaque"}
    assert merge_counts({"a": 1, "b": "x"}, {"a": 2, "b": "y", "c": True}) == {"a": 3, "b": "y", "c": True}
    assert not merged.is_empty()
    merged.reset()
    assert merged.is_empty()


def test_worker_metadata_travels_in_a_vllm_envelope() -> None:
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorWorkerMetadata

    from capkv.adapters.vllm._translate import HostWorkerMetadata

    one = HostWorkerMetadata(SaveReport(loaded_through=3))
    two = HostWorkerMetadata(SaveReport(loaded_through=5))
    assert isinstance(one, KVConnectorWorkerMetadata)
    assert one.aggregate(two).inner == SaveReport(loaded_through=3)

    class Foreign(KVConnectorWorkerMetadata):
        def aggregate(self, other: KVConnectorWorkerMetadata) -> KVConnectorWorkerMetadata:
            return self

    with pytest.raises(MetadataError, match="expected another HostWorkerMetadata"):
        one.aggregate(Foreign())


def test_vllm_output_becomes_capkv_output() -> None:
    from vllm.v1.outputs import KVConnectorOutput

    from capkv import KVConnectorOutput as CapkvOutput
    from capkv.adapters.vllm._translate import HostWorkerMetadata, LoadingBlocks, to_capkv_output

    loading = LoadingBlocks("CapkvConnector")
    loading.record("r", ([4, 5],), null_block_id=0)
    report = SaveReport(loaded_through=1)
    vllm_output = KVConnectorOutput(
        finished_sending={"s"}, finished_recving=None, kv_connector_worker_meta=HostWorkerMetadata(report),
        invalid_block_ids={5},
    )
    assert to_capkv_output(vllm_output, loading, owner="CapkvConnector") == CapkvOutput(
        finished_sending=frozenset({"s"}), finished_recving=frozenset(), worker_meta=report,
        invalid_block_ids={0: frozenset({5})},
    )
    with pytest.raises(MetadataError, match="expected HostWorkerMetadata from the workers"):
        to_capkv_output(KVConnectorOutput(kv_connector_worker_meta=report), loading, owner="CapkvConnector")  # type: ignore[arg-type]


def test_class_level_facts_answer_from_the_configured_classes() -> None:
    """vLLM's class-level calls: capkv's classes answer by themselves, vLLM's with vLLM's arguments."""
    from capkv.adapters.vllm._stack import configured_fact, load_hosted
    from capkv.capabilities._facts import NEEDS_INSTANCE
    from capkv.vllm import CapkvConnector

    stack = {"kv_connector": "MultiConnector", "kv_connector_extra_config": {"connectors": [
        {"kv_connector": "CPUOffloadConnector"}, {"kv_connector": "ExampleConnector"}]}}
    configured = load_hosted(stack)
    # ExampleConnector's layout needs a vllm_config: without one the stack's answer waits for instances
    assert configured_fact(configured, "get_required_kvcache_layout", vllm_config=None) is NEEDS_INSTANCE
    assert configured_fact(configured, "requires_piecewise_for_cudagraph", vllm_config=None) is False
    assert CapkvConnector.requires_piecewise_for_cudagraph({"stack": stack}) is False
    assert configured_fact(load_hosted({"kv_connector": "CPUOffloadConnector"}), "get_required_kvcache_layout",
                           vllm_config=None) is None
