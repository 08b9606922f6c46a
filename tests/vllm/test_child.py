"""vLLM's own connectors as capkv children (capkv.vllm.wrap), against real vLLM objects.

Runs where vLLM is installed (the ``vllm`` tox environment); elsewhere it is skipped, saying so.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vllm is not installed (the `vllm` tox environment runs this)")

from vllm.config import KVTransferConfig, VllmConfig  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # noqa: E402
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorTransferResults,
    KVConnectorWorkerMetadata,
    SupportsHMA,
)
from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import ExampleConnector  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.multi_connector import (  # noqa: E402
    MultiConnector as VllmMultiConnector,
)
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.v1.core.kv_cache_manager import KVCacheBlocks  # noqa: E402
from vllm.v1.core.kv_cache_utils import KVCacheBlock  # noqa: E402
from vllm.v1.kv_cache_interface import KVCacheConfig  # noqa: E402
from vllm.v1.outputs import KVConnectorOutput as VllmOutput  # noqa: E402
from vllm.v1.request import Request  # noqa: E402

import capkv  # noqa: E402
from capkv.adapters.vllm._carry import VllmOutputCarrier, block_ids_from_vllm  # noqa: E402
from capkv.adapters.vllm._child import ChildMetadata  # noqa: E402
from capkv.config import load_stack  # noqa: E402
from capkv.vllm import HMAVllmChild, VllmChild, wrap  # noqa: E402

MODULE = "tests.vllm.test_child"
EXAMPLE = "vllm.distributed.kv_transfer.kv_connector.v1.example_connector"
KV_CACHE = KVCacheConfig(num_blocks=64, kv_cache_tensors=[], kv_cache_groups=[])


class WorkerMeta(KVConnectorWorkerMetadata):
    def aggregate(self, other: KVConnectorWorkerMetadata) -> KVConnectorWorkerMetadata:
        return self


class Recorder(KVConnectorBase_V1):
    """A vLLM connector that records what vLLM-side calls it got (single group)."""

    layout_configs: list[VllmConfig] = []
    piecewise_extras: list[dict[str, Any]] = []

    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        self.calls: list[tuple[str, Any]] = []
        self.load_errors: set[int] = set()

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None: ...
    def wait_for_layer_load(self, layer_name: str) -> None: ...
    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any) -> None: ...
    def wait_for_save(self) -> None: ...

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int | None, bool]:
        return 32, False

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int) -> None:
        self.calls.append(("alloc", (blocks, num_external_tokens)))

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        return KVConnectorMetadata.__new__(KVConnectorMetadata)

    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        self.calls.append(("bind", connector_metadata))

    def update_connector_output(self, connector_output: VllmOutput) -> None:
        self.calls.append(("output", connector_output))
        self.calls.append(("output.worker_meta", connector_output.kv_connector_worker_meta))

    def set_xfer_handshake_metadata(self, metadata: dict[int, Any]) -> None:
        self.calls.append(("handshake", metadata))

    def get_block_ids_with_load_errors(self) -> set[int]:
        return set(self.load_errors)

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        return {"sent"}, None

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config: VllmConfig) -> str | None:
        cls.layout_configs.append(vllm_config)
        return "HND"

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: dict[str, Any]) -> bool:
        cls.piecewise_extras.append(extra_config)
        return bool(extra_config.get("layerwise"))


class HMARecorder(Recorder, SupportsHMA):
    """The same, HMA-capable by vLLM's nominal rule."""

    def request_finished_all_groups(
        self, request: Request, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]:
        self.calls.append(("finish_all", block_ids))
        return True, {"hma": True}


class ResultsOnly(Recorder):
    """Reports completions only through get_transfer_results (as NIXL does)."""

    def get_transfer_results(self, finished_req_ids: set[str]) -> KVConnectorTransferResults:
        return KVConnectorTransferResults(finished_recving={"loaded"}, failed_recving={"loaded"})


class LooksHMA(Recorder):
    """Has request_finished_all_groups, but does not derive from vLLM's SupportsHMA."""

    def request_finished_all_groups(self, request: Any, block_ids: Any) -> tuple[bool, None]:
        return False, None


def config(name: str, module: str = MODULE, **extra: Any) -> VllmConfig:
    return VllmConfig(kv_transfer_config=KVTransferConfig(
        kv_connector=name, kv_connector_module_path=module, kv_role="kv_both", kv_connector_extra_config=extra))


def build(cls: type[KVConnectorBase_V1], **extra: Any) -> Any:
    return cls(config(cls.__name__, **extra), KVConnectorRole.SCHEDULER, KV_CACHE)


def request(request_id: str = "r1") -> Request:
    return Request(request_id, list(range(64)), SamplingParams(), None)


def example() -> ExampleConnector:
    path = tempfile.mkdtemp(prefix="capkv-example-")
    return ExampleConnector(
        config("ExampleConnector", EXAMPLE, shared_storage_path=path), KVConnectorRole.SCHEDULER, KV_CACHE
    )


# ---- HMA capability: vLLM's nominal rule, at run time ---------------------------------------------


def test_a_non_hma_class_is_wrapped_as_a_plain_child() -> None:
    child = wrap(example())
    assert type(child) is VllmChild
    assert isinstance(child, capkv.KVConnector)
    assert not capkv.supports_hma(child) and not hasattr(child, "request_finished_all_groups")


def test_a_supports_hma_class_is_wrapped_as_an_hma_child() -> None:
    child = wrap(build(HMARecorder))
    assert type(child) is HMAVllmChild
    assert isinstance(child, capkv.HMAConnector) and capkv.supports_hma(child)
    assert child.request_finished_all_groups(request(), ([1, 2], [3])) == (True, {"hma": True})
    assert child.wrapped.calls[-1] == ("finish_all", ([1, 2], [3]))


def test_a_structural_match_is_not_hma() -> None:
    """vLLM decides HMA nominally; a class with the method but not the base is not HMA there, nor here."""
    assert type(wrap(build(LooksHMA))) is VllmChild


def test_the_hma_wrapper_refuses_a_non_hma_class() -> None:
    with pytest.raises(capkv.CapabilityError, match='"ExampleConnector" does not derive') as info:
        HMAVllmChild(example())  # type: ignore[type-var]
    assert info.value.connector == "ExampleConnector" and info.value.method == "__init__"


def test_something_else_is_refused() -> None:
    with pytest.raises(capkv.ContractError, match="expected a vLLM connector") as info:
        wrap(object())  # type: ignore[call-overload]
    assert info.value.connector == "object"


def vllm_multi(*children: str) -> VllmMultiConnector:
    entries = [{"kv_connector": c, "kv_connector_module_path": MODULE, "kv_role": "kv_both"} for c in children]
    vllm_config = VllmConfig(kv_transfer_config=KVTransferConfig(
        kv_connector="MultiConnector", kv_role="kv_both", kv_connector_extra_config={"connectors": entries}))
    return VllmMultiConnector(vllm_config, KVConnectorRole.SCHEDULER, KV_CACHE)


def test_vllm_multiconnector_is_as_hma_as_its_sub_connectors() -> None:
    assert type(wrap(vllm_multi("HMARecorder", "HMARecorder"))) is HMAVllmChild
    assert type(wrap(vllm_multi("HMARecorder", "Recorder"))) is VllmChild


def test_a_stack_with_a_wrapped_example_connector_is_refused_naming_it() -> None:
    stack = capkv.MultiConnector(wrap(build(HMARecorder)), wrap(example()))
    assert type(stack) is capkv.MultiConnector
    with pytest.raises(capkv.CapabilityError) as info:
        capkv.check_stack(stack, 2)
    assert 'sub-connector #2 "ExampleConnector" does not implement SupportsHMA' in str(info.value)
    capkv.check_stack(stack, 1)
    hma = capkv.MultiConnector(wrap(build(HMARecorder)), wrap(build(HMARecorder)))
    assert type(hma) is capkv.HMAMultiConnector
    capkv.check_stack(hma, 2)


# ---- translation ------------------------------------------------------------------------------------------


def test_block_ids_become_kv_cache_blocks_and_carried_blocks_pass_through() -> None:
    child = wrap(build(Recorder))
    child.update_state_after_alloc(request(), ([0, 5], [7]), 0)
    blocks, external = child.wrapped.calls[-1][1]
    assert isinstance(blocks, KVCacheBlocks) and external == 0
    assert blocks.get_block_ids() == ([0, 5], [7])
    assert [b.is_null for b in blocks.blocks[0]] == [True, False]  # vLLM's null block is 0

    original = KVCacheBlocks(([KVCacheBlock(3)], [KVCacheBlock(4)]))
    carried = block_ids_from_vllm(original)
    assert carried == ([3], [4])
    child.update_state_after_alloc(request(), carried, 16)
    passed = child.wrapped.calls[-1][1][0]
    assert isinstance(passed, KVCacheBlocks) and passed.blocks is original.blocks, "the engine's own blocks"
    first, second = passed.get_block_ids(), passed.get_block_ids()
    assert first == second == ([3], [4]) and first[0] is not second[0], "ids read once, handed out as fresh lists"
    assert passed.get_block_ids(group_ids=[1]) == ([4],)


def test_update_connector_output_translates_capkv_output() -> None:
    child = wrap(build(Recorder))
    meta = WorkerMeta()
    child.update_connector_output(capkv.KVConnectorOutput(
        finished_sending=frozenset({"a"}), worker_meta=meta,
        invalid_block_ids={0: frozenset({3}), 1: frozenset({9})},
    ))
    out = child.wrapped.calls[-2][1]
    assert isinstance(out, VllmOutput)
    assert out.finished_sending == {"a"} and out.finished_recving is None
    assert out.invalid_block_ids == {3, 9} and out.kv_connector_worker_meta is meta


def test_a_carried_vllm_output_is_passed_with_the_childs_worker_meta_then_restored() -> None:
    child = wrap(build(Recorder))
    original = VllmOutput(finished_recving={"b"}, kv_connector_worker_meta=None)
    mine = WorkerMeta()
    child.update_connector_output(VllmOutputCarrier(worker_meta=mine, vllm_output=original))
    assert child.wrapped.calls[-2][1] is original
    assert child.wrapped.calls[-1][1] is mine
    assert original.kv_connector_worker_meta is None


def test_class_level_calls_get_the_connectors_own_config() -> None:
    connector = build(Recorder, layerwise=True)
    child = wrap(connector)
    assert child.get_required_kvcache_layout() == "HND"
    assert Recorder.layout_configs[-1] is connector._vllm_config
    assert child.requires_piecewise_for_cudagraph() is True
    assert Recorder.piecewise_extras[-1] == {"layerwise": True}
    other = config("Recorder")
    wrap(connector, vllm_config=other).get_required_kvcache_layout()
    assert Recorder.layout_configs[-1] is other


def test_handshake_metadata_is_a_dict_for_vllm() -> None:
    child = wrap(build(Recorder))
    from types import MappingProxyType

    child.set_xfer_handshake_metadata(MappingProxyType({0: "peer"}))
    assert child.wrapped.calls[-1] == ("handshake", {0: "peer"})
    assert type(child.wrapped.calls[-1][1]) is dict


def test_finished_comes_from_get_finished_or_get_transfer_results() -> None:
    assert wrap(build(Recorder)).get_finished(set()) == ({"sent"}, None)
    assert wrap(build(ResultsOnly)).get_finished(set()) == (None, {"loaded"})


# ---- load errors: vLLM's flat set, attributed per group ----------------------------------------------------


def test_load_errors_are_attributed_from_the_planned_loads_block_tables() -> None:
    scheduler, worker = wrap(build(HMARecorder)), wrap(build(HMARecorder))
    scheduler.update_state_after_alloc(request("r1"), ([0, 4, 5], [6, 7]), 48)  # 0: the null block
    scheduler.update_state_after_alloc(request("r2"), ([8], [9]), 0)  # no load: not recorded
    meta = scheduler.build_connector_meta(None)
    assert isinstance(meta, ChildMetadata) and set(meta.loads) == {"r1"}
    assert not isinstance(scheduler.build_connector_meta(None), ChildMetadata)  # loads ship once

    worker.bind_connector_metadata(meta)
    assert worker.wrapped.calls[-1] == ("bind", meta.inner)  # the child gets its own metadata
    worker.wrapped.load_errors = {5, 7}
    assert worker.get_block_ids_with_load_errors() == {0: {5}, 1: {7}}
    worker.wrapped.load_errors = set()
    assert worker.get_block_ids_with_load_errors() == {}


def test_a_load_error_no_planned_load_holds_is_refused_not_guessed() -> None:
    worker = wrap(build(Recorder))
    worker.bind_connector_metadata(ChildMetadata(None, {"r1": ([4],)}))
    worker.wrapped.load_errors = {4, 9}
    with pytest.raises(capkv.ContractError, match="block 9") as info:
        worker.get_block_ids_with_load_errors()
    assert (info.value.connector, info.value.method, info.value.value) == (
        "Recorder", "get_block_ids_with_load_errors", 9)


def test_a_reallocated_block_belongs_to_its_latest_load() -> None:
    worker = wrap(build(HMARecorder))
    worker.bind_connector_metadata(ChildMetadata(None, {"r1": ([4], [])}))
    worker.bind_connector_metadata(ChildMetadata(None, {"r2": ([], [4])}))
    worker.wrapped.load_errors = {4}
    assert worker.get_block_ids_with_load_errors() == {1: {4}}


def test_a_capkv_stack_reports_a_wrapped_childs_load_errors_per_group() -> None:
    s1, s2 = wrap(build(HMARecorder)), wrap(build(HMARecorder))
    w1, w2 = wrap(build(HMARecorder)), wrap(build(HMARecorder))
    scheduler, worker = capkv.MultiConnector(s1, s2), capkv.MultiConnector(w1, w2)
    req = request("r1")
    assert scheduler.get_num_new_matched_tokens(req, 0) == (32, False)  # the first child loads
    scheduler.update_state_after_alloc(req, ([3], [11]), 32)
    worker.bind_connector_metadata(scheduler.build_connector_meta(None))
    w1.wrapped.load_errors = {11}
    assert worker.get_block_ids_with_load_errors() == {1: {11}}


# ---- configuration: vLLM's connectors named next to capkv's -----------------------------------------------


def test_capkv_check_reports_vllm_connectors_with_their_hma_verdicts(capsys: pytest.CaptureFixture[str]) -> None:
    from capkv.cli._main import main

    stack = {"kv_connector": "MultiConnector", "kv_connector_extra_config": {"connectors": [
        {"kv_connector": "CPUOffloadConnector", "kv_connector_extra_config": {"capacity_blocks": 64}},
        {"kv_connector": "ExampleConnector", "kv_connector_module_path": EXAMPLE},
        {"kv_connector": f"{MODULE}:HMARecorder"},
    ]}}
    node = load_stack(stack)
    assert [c.name for c in capkv.non_hma_children(node)] == ["ExampleConnector"]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "stack.json"
        path.write_text(json.dumps(stack))
        assert main(["check", str(path), "--groups", "2", "--classes-only"]) == 1
        captured = capsys.readouterr()
        out = captured.out + captured.err
        assert 'sub-connector #2 "ExampleConnector" does not implement SupportsHMA' in out
        assert "HMARecorder" in out
        assert main(["check", str(path), "--groups", "1", "--classes-only"]) == 0


def test_vllm_connectors_are_named_as_vllm_names_them() -> None:
    from capkv.config import ConnectorRegistry

    registry = ConnectorRegistry(entry_point_group=None)
    assert registry.resolve("ExampleConnector") is ExampleConnector
    assert registry.resolve("MultiConnector") is capkv.MultiConnector  # capkv's own names win
    node = load_stack({"kv_connector": "MultiConnector", "kv_connector_extra_config": {"connectors": [
        {"kv_connector": "OffloadingConnector"}, {"kv_connector": "SimpleCPUOffloadConnector"},
        {"kv_connector": "FileStoreConnector"},
    ]}}, registry=registry)
    assert capkv.supports_hma(node) and capkv.non_hma_children(node) == []
    node = load_stack({"kv_connector": "MultiConnector", "kv_connector_extra_config": {"connectors": [
        {"kv_connector": "OffloadingConnector"}, {"kv_connector": "ExampleConnector"},
    ]}}, registry=registry)
    assert [(c.position, c.name) for c in capkv.non_hma_children(node)] == [("#2", "ExampleConnector")]


def test_the_wrapped_vllm_connectors_of_a_stack_are_found_for_vllm_only_calls() -> None:
    a, b = build(HMARecorder), build(HMARecorder)
    stack = capkv.MultiConnector(wrap(a), capkv.MultiConnector(wrap(b)))
    from capkv.adapters.vllm._vllm_calls import vllm_connectors

    assert vllm_connectors(stack) == [a, b]
    assert vllm_connectors(capkv.devmode.instrument(stack, capkv.KVSpec(num_groups=2, num_blocks=64, null_block_id=0))) == [a, b]


def test_outside_a_host_a_failed_receive_fails_every_block_of_its_load() -> None:
    """capkv's contract has no request-level failure: a stack run by another engine hears of a failed receive
    as load errors for its load's blocks; a host takes it in vLLM's words instead (tests/vllm/test_host_forwarding)."""
    from capkv.adapters.vllm._receives import FailedReceives

    receives = FailedReceives(0)
    receives.planned({"r": ([0, 4, 5], [6]), "s": ([7],)})
    receives.reported({"r"}, ["r", "s"])
    assert receives.errors() == {0: {4, 5}, 1: {6}}
    assert receives.errors() == {}
    hosted = FailedReceives(0)
    assert hosted.take() == set()
    hosted.planned({"r": ([4],)})
    hosted.reported({"r"}, ["r"])
    assert hosted.errors() == {} and hosted.take() == {"r"}
