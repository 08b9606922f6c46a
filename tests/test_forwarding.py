"""Every member of the contract is forwarded by the composite to every child.

vLLM's composite once forgot new base-class members (handshake, preemption,
finished count) and released KV early. This test walks the protocol's members:
adding a member to ``KVConnector`` without deciding how the composite forwards
it fails here (and the typing cases prove the composite still satisfies the
protocol statically).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from capkv import HMAMultiConnector, KVConnectorOutput, MultiConnector, MultiConnectorMetadata
from capkv.composite._runtime import StackRuntime
from capkv.contracts._connector import KV_CONNECTOR_MEMBERS
from tests.fakes import Req

DEFAULTS: dict[str, object] = {
    "get_num_new_matched_tokens": (0, False),
    "request_finished": (False, None),
    "request_finished_all_groups": (False, None),
    "take_events": (),
    "requires_piecewise_for_cudagraph": False,
    "get_finished": (None, None),
    "get_block_ids_with_load_errors": {},
}

ARGS: dict[str, tuple[Any, ...]] = {
    "get_num_new_matched_tokens": (Req("r"), 0),
    "update_state_after_alloc": (Req("r"), ([1],), 0),
    "build_connector_meta": ("scheduler-output",),
    "update_connector_output": (KVConnectorOutput(),),
    "request_finished": (Req("r"), [1]),
    "take_events": (),
    "get_required_kvcache_layout": (),
    "get_finished_count": (),
    "requires_piecewise_for_cudagraph": (),
    "set_xfer_handshake_metadata": ({0: "peer"},),
    "register_kv_caches": ({"layer": torch.zeros(1)},),
    "bind_connector_metadata": (MultiConnectorMetadata(("m", "m")),),
    "handle_preemptions": (MultiConnectorMetadata(("m", "m")),),
    "start_load_kv": ("forward-context",),
    "wait_for_layer_load": ("layer",),
    "save_kv_layer": ("layer", torch.zeros(1), "attn"),
    "wait_for_save": (),
    "get_finished": (set[str](),),
    "get_block_ids_with_load_errors": (),
    "build_connector_worker_meta": (),
    "clear_connector_metadata": (),
    "get_handshake_metadata": (),
    "get_mem_pool_context": (),
    "get_kv_connector_stats": (),
    "shutdown": (),
}


class Spy:
    """A connector made of nothing but the contract's members, each recording its calls."""

    def __init__(self) -> None:
        self.called: list[str] = []

    def __getattr__(self, name: str) -> Any:
        if name not in KV_CONNECTOR_MEMBERS and name != "request_finished_all_groups":
            raise AttributeError(name)

        def member(*args: object, **kwargs: object) -> object:
            self.called.append(name)
            return DEFAULTS.get(name)

        return member


class HMASpy(Spy):
    def request_finished_all_groups(self, request: object, block_ids: object, /) -> object:
        self.called.append("request_finished_all_groups")
        return DEFAULTS["request_finished_all_groups"]


def test_the_walk_covers_the_whole_contract() -> None:
    assert set(ARGS) == set(KV_CONNECTOR_MEMBERS)


@pytest.mark.parametrize("member", KV_CONNECTOR_MEMBERS)
def test_member_is_the_composites_own_and_reaches_every_child(member: str) -> None:
    owner = next(cls for cls in MultiConnector.__mro__ if member in vars(cls))
    assert issubclass(StackRuntime, owner) or owner is MultiConnector, f"MultiConnector does not define {member} itself"
    assert owner.__module__.startswith("capkv.composite."), f"{member} comes from {owner.__module__}"
    children = (Spy(), Spy())
    getattr(MultiConnector(*children), member)(*ARGS[member])  # type: ignore[call-overload]
    assert [child.called for child in children] == [[member], [member]]


def test_the_hma_member_reaches_every_child() -> None:
    children = (HMASpy(), HMASpy())
    stack = MultiConnector(*children)  # type: ignore[call-overload]
    assert isinstance(stack, HMAMultiConnector)
    stack.request_finished_all_groups(Req("r"), ([1], [2]))
    assert [child.called for child in children] == [["request_finished_all_groups"]] * 2
