"""A stack of wrapped vLLM connectors takes vLLM's own objects once per call, not once per child.

The host carries vLLM's ``KVCacheBlocks`` and ``KVConnectorOutput`` inside capkv's objects; a stack whose
every child is a wrapped vLLM connector unwraps them once and calls each connector's own member, as vLLM's
composite does — same calls, same arguments, fewer frames. Runs where vLLM is installed.
"""

from __future__ import annotations

import pytest

pytest.importorskip("vllm", reason="vllm is not installed (the `vllm` tox environment runs this)")

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1  # noqa: E402
from vllm.v1.core.kv_cache_manager import KVCacheBlocks  # noqa: E402
from vllm.v1.core.kv_cache_utils import KVCacheBlock  # noqa: E402
from vllm.v1.outputs import KVConnectorOutput as VllmOutput  # noqa: E402

import capkv  # noqa: E402
from capkv.adapters.vllm._carry import VllmOutputCarrier, block_ids_from_vllm  # noqa: E402
from capkv.devmode import dev_mode, instrument  # noqa: E402
from capkv.vllm import wrap  # noqa: E402
from tests.vllm.test_child import HMARecorder, WorkerMeta, build, request  # noqa: E402


def stack_of_two() -> tuple[capkv.MultiConnector, list[HMARecorder]]:  # type: ignore[type-arg]
    inner = [build(HMARecorder), build(HMARecorder)]
    return capkv.MultiConnector(*(wrap(c) for c in inner)), inner


def test_a_stack_of_vllm_children_passes_vllms_own_blocks_once() -> None:
    stack, inner = stack_of_two()
    original = KVCacheBlocks(([KVCacheBlock(3)], [KVCacheBlock(4)]))
    stack.update_state_after_alloc(request(), block_ids_from_vllm(original), 0)
    for connector in inner:
        (kind, (blocks, external)), = connector.calls
        assert kind == "alloc" and external == 0 and blocks.blocks is original.blocks
    stack.update_state_after_alloc(request(), ([3], [4]), 0)  # plain ids: each wrapper builds vLLM's blocks
    assert all(c.calls[-1][1][0].get_block_ids() == ([3], [4]) for c in inner)


def test_each_vllm_child_sees_its_own_worker_metadata_in_vllms_output() -> None:
    stack, inner = stack_of_two()
    theirs = VllmOutput(finished_sending={"r1"})
    shares = (WorkerMeta(), None)
    output = VllmOutputCarrier(
        finished_sending=frozenset({"r1"}), worker_meta=capkv.MultiWorkerMetadata(shares), vllm_output=theirs,
    )
    stack.update_connector_output(output)
    for connector, share in zip(inner, shares, strict=True):
        assert connector.calls[0] == ("output", theirs) and connector.calls[1] == ("output.worker_meta", share)
    assert theirs.kv_connector_worker_meta is None, "vLLM's output is as it was after the call"

    def boom(_: object) -> None:
        raise RuntimeError("boom")

    inner[0].update_connector_output = boom  # type: ignore[method-assign]
    stack, inner = capkv.MultiConnector(*(wrap(c) for c in inner)), inner
    with pytest.raises(capkv.SubConnectorError, match="boom"):
        stack.update_connector_output(output)
    assert inner[1].calls[-1] == ("output.worker_meta", None) and theirs.kv_connector_worker_meta is None


def test_dev_mode_proxies_see_every_call() -> None:
    from capkv.composite._native import native_calls

    stack, _ = stack_of_two()
    assert native_calls(stack.children) is not None
    with dev_mode(True):
        checked = instrument(stack, capkv.KVSpec(num_groups=2, num_blocks=64))
    assert native_calls(checked.children) is None, "checked children are called through their proxies"
    assert native_calls((*stack.children, capkv.testing.HMANullConnector())) is None, "every child, or none"


class Quiet(HMARecorder):
    """Keeps vLLM's base ``update_connector_output`` (a no-op): a stack skips the call."""

    update_connector_output = KVConnectorBase_V1.update_connector_output


class Refuses(HMARecorder):
    def update_connector_output(self, connector_output: VllmOutput) -> None:
        super().update_connector_output(connector_output)
        raise RuntimeError("refused")


@pytest.mark.parametrize("carried", [True, False], ids=["vllm's output carried", "capkv's output only"])
def test_children_keeping_vllms_no_op_output_member_are_skipped_and_the_others_keep_their_shares(carried: bool) -> None:
    here = {"module": __name__}  # vLLM's factory finds these classes by module
    inner = [build(Quiet, **here), build(HMARecorder), build(Quiet, **here), build(Refuses, **here)]
    stack = capkv.MultiConnector(*(wrap(c) for c in inner))
    shares = (WorkerMeta(), WorkerMeta(), WorkerMeta(), WorkerMeta())
    theirs = VllmOutput(finished_sending={"r1"})
    output = VllmOutputCarrier(
        finished_sending=frozenset({"r1"}), worker_meta=capkv.MultiWorkerMetadata(shares),
        vllm_output=theirs if carried else None,
    )
    with pytest.raises(capkv.SubConnectorError, match="refused") as raised:
        stack.update_connector_output(output)
    assert "Refuses" in str(raised.value) and "HMARecorder" not in str(raised.value), "the child that raised, by name"
    for connector, share in zip(inner, shares, strict=True):
        if isinstance(connector, Quiet):
            assert connector.calls == []
        else:
            assert connector.calls[1] == ("output.worker_meta", share), "its own share, not a neighbour's"
    assert theirs.kv_connector_worker_meta is None, "vLLM's output is as it was after the call"
    from capkv.composite._native import native_calls

    offered = native_calls(stack.children)
    assert offered is not None and [n.update_connector_output is None for n in offered] == [True, False, True, False]
    with pytest.raises(capkv.MetadataError, match="expected MultiWorkerMetadata with 2 children"):
        capkv.MultiConnector(wrap(build(Quiet, **here)), wrap(build(Quiet, **here))).update_connector_output(
            VllmOutputCarrier(worker_meta=WorkerMeta(), vllm_output=theirs)
        )
