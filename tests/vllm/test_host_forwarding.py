"""The host forwards what vLLM asks with vLLM's semantics, and keeps what wrapped vLLM children report.

Unit tests on real vLLM objects (no engine): the drop-in (``capkv.vllm.MultiConnector``)
over vLLM connectors defined here, and hosts over mixed stacks.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vllm is not installed (the `vllm` tox environment runs this)")

import torch  # noqa: E402
from vllm.config import KVTransferConfig, VllmConfig  # noqa: E402
from vllm.distributed.kv_events import KVCacheEvent, KVConnectorKVEvents  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # noqa: E402
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorTransferResults,
    SupportsHMA,
)
from vllm.v1.core.kv_cache_manager import KVCacheBlocks  # noqa: E402
from vllm.v1.core.kv_cache_utils import KVCacheBlock  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    SlidingWindowSpec,
)
from vllm.v1.metrics.cache_hit_source import CacheHitSource  # noqa: E402
from vllm.v1.outputs import KVConnectorOutput  # noqa: E402

import capkv  # noqa: E402
from capkv.vllm import CapkvConnector, MultiConnector  # noqa: E402

MODULE = "tests.vllm.test_host_forwarding"
CALLS: list[tuple[str, str]] = []
"""Every call the children below get, as (child name, member)."""
HANDSHAKES: list[dict[tuple[int, int], Any]] = []


class Events(KVConnectorKVEvents):
    def __init__(self, events: list[Any]) -> None:
        self.events = list(events)

    def add_events(self, events: list[KVCacheEvent]) -> None:
        self.events += events

    def aggregate(self) -> KVConnectorKVEvents:
        return self

    def increment_workers(self, count: int = 1) -> None:
        return None

    def get_all_events(self) -> list[KVCacheEvent]:
        return list(self.events)

    def get_number_of_workers(self) -> int:
        return 1

    def clear_events(self) -> None:
        self.events = []


class Child(KVConnectorBase_V1, SupportsHMA):
    """A vLLM connector: loads asynchronously what it is told to, reports it failed when told to."""

    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        extra = vllm_config.kv_transfer_config.kv_connector_extra_config if vllm_config.kv_transfer_config else {}
        self.name = str(extra.get("name", "child"))
        self.hit = int(extra.get("hit", 0))
        self.fail = bool(extra.get("fail", False))
        self.pool = bool(extra.get("pool", False))
        self.disk = bool(extra.get("disk", False))
        """Answer hit sources (disk) and loaded groups (the last group only) as a tiered vLLM connector."""
        self.blocks: list[KVCacheBlocks] = []
        self.loading: set[str] = set()
        self.late_errors: set[int] = set()

    def _call(self, member: str) -> None:
        CALLS.append((self.name, member))

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int | None, bool]:
        self._call("get_num_new_matched_tokens")
        return self.hit, self.hit > 0

    def update_state_after_alloc(self, request: Any, blocks: KVCacheBlocks, num_external_tokens: int) -> None:
        self._call("update_state_after_alloc")
        self.blocks.append(blocks)
        if num_external_tokens:
            self.loading.add(request.request_id)

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        self._call("build_connector_meta")
        return KVConnectorMetadata.__new__(KVConnectorMetadata)

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None: ...
    def wait_for_layer_load(self, layer_name: str) -> None: ...
    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any) -> None: ...
    def wait_for_save(self) -> None: ...

    def get_transfer_results(self, finished_req_ids: set[str]) -> KVConnectorTransferResults:
        done, self.loading = self.loading, set()
        return KVConnectorTransferResults(finished_recving=set(done), failed_recving=set(done) if self.fail else set())

    def get_block_ids_with_load_errors(self) -> set[int]:
        errors, self.late_errors = self.late_errors, set()
        return errors

    def get_finished_count(self) -> int | None:
        self._call("get_finished_count")
        return None

    def get_loaded_kv_cache_group_ids(self, request: Any) -> tuple[int, ...]:
        self._call("get_loaded_kv_cache_group_ids")
        return (1,) if self.disk else super().get_loaded_kv_cache_group_ids(request)

    def get_external_cache_hit_sources(self, request: Any, num_external_tokens: int) -> dict[CacheHitSource, int]:
        self._call("get_external_cache_hit_sources")
        if self.disk:
            return {CacheHitSource.DISK: num_external_tokens}
        return super().get_external_cache_hit_sources(request, num_external_tokens)

    def get_mem_pool_context(self) -> Any:
        return object() if self.pool else None

    def set_xfer_handshake_metadata_pp_aware(self, metadata: dict[tuple[int, int], Any]) -> None:
        HANDSHAKES.append(metadata)

    def build_connector_worker_meta(self) -> None:
        self._call("build_connector_worker_meta")

    def get_kv_connector_kv_cache_events(self) -> KVConnectorKVEvents | None:
        return Events([f"{self.name}-event"])

    def request_finished_all_groups(self, request: Any, block_ids: tuple[list[int], ...]) -> tuple[bool, None]:
        return False, None


class Request:
    def __init__(self, request_id: str, tokens: int = 64) -> None:
        self.request_id = request_id
        self.prompt_token_ids = list(range(3, 3 + tokens))
        self.all_token_ids = list(self.prompt_token_ids)
        self.num_computed_tokens = 0
        self.block_hashes: list[bytes] = []


def kv_cache_config(groups: int) -> KVCacheConfig:
    full = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=8, dtype=torch.bfloat16)
    window = SlidingWindowSpec(block_size=16, num_kv_heads=1, head_size=8, dtype=torch.bfloat16, sliding_window=32)
    specs = [KVCacheGroupSpec(["layer.0"], full), KVCacheGroupSpec(["layer.1"], window)][:groups]
    return KVCacheConfig(num_blocks=64, kv_cache_tensors=[], kv_cache_groups=specs)


def child(name: str, **extra: Any) -> dict[str, Any]:
    return {"kv_connector": "Child", "kv_connector_module_path": MODULE, "kv_role": "kv_both",
            "kv_connector_extra_config": {"name": name, **extra}}


def drop_in(*children: dict[str, Any], groups: int = 2, policy: str = "fail") -> MultiConnector:
    transfer = KVTransferConfig(
        kv_connector="MultiConnector", kv_connector_module_path="capkv.vllm", kv_role="kv_both",
        kv_load_failure_policy=policy, kv_connector_extra_config={"connectors": list(children)},
    )
    return MultiConnector(VllmConfig(kv_transfer_config=transfer), KVConnectorRole.SCHEDULER, kv_cache_config(groups))


def blocks(*groups: list[int]) -> KVCacheBlocks:
    return KVCacheBlocks(tuple([KVCacheBlock(i) for i in ids] for ids in groups))


def load_once(host: MultiConnector, request: Request, kv_blocks: KVCacheBlocks) -> KVConnectorTransferResults:
    """One request's load through both sides of ``host`` (one object plays both roles here)."""
    tokens, _ = host.get_num_new_matched_tokens(request, 0)
    assert tokens
    host.update_state_after_alloc(request, kv_blocks, tokens)
    host.bind_connector_metadata(host.build_connector_meta(object()))  # type: ignore[arg-type]
    host.start_load_kv(object())  # type: ignore[arg-type]
    return host.get_transfer_results(set())


def test_construction_asks_the_children_nothing_vllm_would_not() -> None:
    CALLS.clear()
    host = drop_in(child("a"), child("b"))
    assert CALLS == []  # no finished count, no worker metadata: vLLM asks those when it needs them
    assert host.get_finished_count() is None
    assert CALLS == [("a", "get_finished_count"), ("b", "get_finished_count")]
    assert [type(c).__name__ for c in host.sub_connectors] == ["Child", "Child"]


def test_a_childs_failed_receive_fails_that_request_with_several_groups() -> None:
    host = drop_in(child("a", hit=16, fail=True), child("b"))
    results = load_once(host, Request("r"), blocks([1, 2], [3, 4]))
    assert (results.finished_recving, results.failed_recving) == ({"r"}, {"r"})
    assert host.get_block_ids_with_load_errors() == set()  # vLLM refuses flat ids with several groups


def test_a_childs_failed_receive_passes_through_with_one_group_and_only_its_blocks_are_invalid() -> None:
    """vLLM's words at vLLM's precision: ``failed_recving`` passes through, and the invalid blocks are
    the ones the child reported (here: none), never the request's whole block table."""
    host = drop_in(child("a", hit=16, fail=True), groups=1)
    results = load_once(host, Request("r"), blocks([1, 2]))
    assert (results.finished_recving, results.failed_recving) == ({"r"}, {"r"})
    assert host.get_block_ids_with_load_errors() == set()
    reporting = drop_in(child("a", hit=16, fail=True), groups=1)
    sub: Any = reporting.sub_connectors[0]
    sub.late_errors = {2}  # the child names the block it was loading, as NIXL names its own
    results = load_once(reporting, Request("s"), blocks([1, 2]))
    assert results.failed_recving == {"s"} and reporting.get_block_ids_with_load_errors() == {2}


def test_wrapped_children_get_vllms_own_blocks() -> None:
    """The blocks vLLM allocated (vLLM's own ``KVCacheBlock`` objects, with their hashes) reach the children
    in a ``KVCacheBlocks`` (one whose ids were read once for all children)."""
    host = drop_in(child("a"), child("b"))
    given = blocks([1, 2], [3, 4])
    host.update_state_after_alloc(Request("r"), given, 0)
    for built in host.sub_connectors:
        assert isinstance(built, Child) and isinstance(built.blocks[-1], KVCacheBlocks)
        assert built.blocks[-1].blocks is given.blocks
        assert built.blocks[-1].get_block_ids() == ([1, 2], [3, 4])


def test_worker_side_kv_events_of_vllm_children_are_merged() -> None:
    host = drop_in(child("a"), child("b"))
    events = host.get_kv_connector_kv_cache_events()
    assert events is not None and events.get_all_events() == ["a-event", "b-event"]


def test_a_late_load_error_is_dropped_and_counted_not_raised() -> None:
    host = drop_in(child("a", hit=16), child("b"))
    load_once(host, Request("r"), blocks([1, 2], [3, 4]))  # landed: the load is over
    host.build_connector_worker_meta()
    vllm_child = host.sub_connectors[0]
    assert isinstance(vllm_child, Child)
    vllm_child.late_errors = {1, 3}  # reported for a load no longer in flight (its request was aborted, say)
    host.bind_connector_metadata(host.build_connector_meta(object()))  # type: ignore[arg-type]
    results = host.get_transfer_results(set())
    assert results.failed_recving == set() and host.get_block_ids_with_load_errors() == set()
    stats = host.get_kv_connector_stats()
    assert stats is not None and stats.data["capkv"].data == {"dropped_load_errors": 2}


def test_conflicts_keep_vllms_exception_types() -> None:
    host = drop_in(child("a", pool=True), child("b", pool=True))
    with pytest.raises(ValueError, match="Multiple connectors provide a KV cache memory pool") as caught:
        host.get_mem_pool_context()
    assert isinstance(caught.value, capkv.ConflictError) and caught.value.connector == "#1 Child, #2 Child"


def test_hma_turned_off_by_a_child_is_said_once_naming_it(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from capkv.adapters.vllm import _drop_in

    monkeypatch.setattr(_drop_in, "_said", set())  # what earlier tests said is said again here, once
    plain = {"kv_connector": "ExampleConnector", "kv_role": "kv_both",
             "kv_connector_extra_config": {"shared_storage_path": "/tmp/capkv-example-unused"}}
    with caplog.at_level(logging.WARNING, logger="capkv.vllm"):
        drop_in(child("a"), plain, groups=1)
        drop_in(child("a"), plain, groups=1)
    said = [r.getMessage() for r in caplog.records if "hybrid KV-cache allocator is off" in r.getMessage()]
    assert len(said) == 1 and '#2 "ExampleConnector"' in said[0], said
    with pytest.raises(capkv.CapabilityError):  # several groups need every child: refused, never truncated
        drop_in(child("a"), plain, groups=2)


def test_handshakes_reach_vllms_children_pipeline_aware_and_capkvs_by_rank() -> None:
    from capkv.adapters.vllm._carry import PPHandshakes

    HANDSHAKES.clear()
    host = drop_in(child("a"))
    host.set_xfer_handshake_metadata_pp_aware({(0, 0): "m0", (1, 0): "m1"})  # type: ignore[dict-item]
    host.set_xfer_handshake_metadata_pp_aware({})  # vLLM makes the call also without metadata
    assert HANDSHAKES == [{(0, 0): "m0", (1, 0): "m1"}, {}]
    assert dict(PPHandshakes.of({(0, 0): "m0", (1, 0): "m1"})) == {0: "m0"}


def test_a_mixed_stack_reports_capkvs_registration_at_handshake_without_asking_vllms_children() -> None:
    CALLS.clear()
    stack = {"kv_connector": "MultiConnector", "kv_connector_extra_config": {"connectors": [
        child("a"), {"kv_connector": "CPUOffloadConnector", "kv_connector_extra_config": {"capacity_blocks": 8}}]}}
    transfer = KVTransferConfig(kv_connector="CapkvConnector", kv_connector_module_path="capkv.vllm",
                                kv_role="kv_both", kv_connector_extra_config={"stack": stack})
    host = CapkvConnector(VllmConfig(kv_transfer_config=transfer), KVConnectorRole.WORKER, kv_cache_config(1))
    host.get_handshake_metadata()
    assert ("a", "build_connector_worker_meta") not in CALLS
    host.build_connector_worker_meta()
    assert ("a", "build_connector_worker_meta") in CALLS  # the step's report asks every child, as vLLM does
    output = KVConnectorOutput()
    host.update_connector_output(output)


def test_loaded_groups_and_hit_sources_come_from_the_child_loading_the_request_until_it_finishes() -> None:
    """vLLM asks for the loaded groups before the allocation and for the hit's sources after it."""
    host = drop_in(child("a"), child("b", hit=32, disk=True))
    request = Request("r")
    assert host.get_num_new_matched_tokens(request, 0) == (32, True)
    CALLS.clear()
    assert host.get_loaded_kv_cache_group_ids(request) == (1,)
    host.update_state_after_alloc(request, blocks([1, 2], [3, 4]), 32)
    assert host.get_external_cache_hit_sources(request, 32) == {CacheHitSource.DISK: 32}
    assert [name for name, member in CALLS if member.startswith("get_")] == ["b", "b"]
    assert host._requests_to_connector["r"] == 1  # vLLM's private map, as its composite keeps it
    host.request_finished_all_groups(request, ([1, 2], [3, 4]))  # type: ignore[arg-type]
    assert "r" not in host._requests_to_connector
    assert host.get_external_cache_hit_sources(request, 32) != {CacheHitSource.DISK: 32}  # nobody loads it now


def test_prometheus_metrics_count_capkvs_counters_and_hand_vllms_children_theirs() -> None:
    """``build_prom_metrics``: capkv's counters become one labelled Prometheus counter; a vLLM child's
    statistics go to the metrics its own class builds (none for this child: its data is counted too)."""
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

    registry = CollectorRegistry()

    def in_registry(kind: type[Any]) -> type[Any]:
        def init(self: Any, *args: Any, **kwargs: Any) -> None:
            kwargs.setdefault("registry", registry)
            kind.__init__(self, *args, **kwargs)

        return type(kind.__name__, (kind,), {"__init__": init})

    types: dict[type[Any], type[Any]] = {kind: in_registry(kind) for kind in (Counter, Gauge, Histogram)}
    transfer = KVTransferConfig(
        kv_connector="MultiConnector", kv_connector_module_path="capkv.vllm", kv_role="kv_both",
        kv_connector_extra_config={"connectors": [child("a")]},
    )
    metrics = MultiConnector.build_prom_metrics(VllmConfig(kv_transfer_config=transfer), types, ["engine"], {0: ["0"]})
    assert metrics is not None
    metrics.observe({"capkv": {"dropped_load_errors": 2}, "Child": {"loaded_blocks": 3, "skipped": 0}}, 0)
    metrics.observe({"capkv": {"dropped_load_errors": 1}}, 0)

    def sample(connector: str, counter: str) -> float | None:
        return registry.get_sample_value(
            "vllm:capkv_connector_events_total", {"engine": "0", "connector": connector, "counter": counter}
        )

    assert sample("capkv", "dropped_load_errors") == 3
    assert sample("Child", "loaded_blocks") == 3
    assert sample("Child", "skipped") is None  # zeros are not counted


def test_hit_sources_of_a_capkv_child_are_vllms_default_for_its_share() -> None:
    """A capkv connector serving the request: vLLM's base answer (every token under one source)."""
    from capkv.testing import HMANullConnector

    host = drop_in(child("a"))
    host._connectors = [HMANullConnector(), *host.sub_connectors]
    host._requests_to_connector["r"] = 0
    expected = KVConnectorBase_V1.get_external_cache_hit_sources(host, Request("r"), 32)  # type: ignore[arg-type]
    assert host.get_external_cache_hit_sources(Request("r"), 32) == expected  # type: ignore[arg-type]
    assert sum(expected.values()) == 32
