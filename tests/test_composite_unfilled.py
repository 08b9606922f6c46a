"""A tier never stores or offers KV it did not receive or compute: the composite's rule, for any host.

From the first token of a load the engine has not heard the end of (asynchronous: not reported in
``finished_recving`` yet; synchronous: its step's output not back yet), every child is handed the null
block at finish: abort, preemption, failed load, partial load. The first test reproduces the defect with
real stores (a host pool promoted into from an asynchronous back tier); the others pin the rule's edges
over null connectors.
"""

from __future__ import annotations

import pickle
from typing import Any

from capkv import KVConnectorOutput, MultiConnector, finish_request
from capkv.connectors import CPUOffloadConnector
from tests.connectors.conftest import tokens
from tests.connectors.engine import MiniEngine, Req
from tests.fakes import HMA
from tests.fakes import Req as Id
from tests.paged import Group, make_spec
from tests.test_tiers import spec, tiered

PROMPT = tokens(7, 64)  # four full blocks of 16


def _front_saw(child: HMA) -> list[Any]:
    return [args[1] for method, args in child.calls if method == "request_finished_all_groups"]


def _step(stack: Any, recving: frozenset[str] = frozenset()) -> None:
    """One engine step: metadata across and back, the engine's output (``recving``) handed over."""
    stack.bind_connector_metadata(stack.build_connector_meta(None))
    stack.get_finished(set())
    stack.clear_connector_metadata()
    stack.update_connector_output(KVConnectorOutput(finished_recving=recving))


def test_an_abort_during_an_async_back_tier_load_promotes_nothing_into_a_real_host_pool() -> None:
    """The defect: the front tier's finish-time save took the never-filled blocks and offered them again."""
    kv_spec = make_spec([Group(16)], num_blocks=32)
    front = CPUOffloadConnector(kv_spec, capacity_blocks=16)
    back = HMA("back", hit=tiered(0, 64), slices=True, load_async=True)  # loads, never reports
    stack = MultiConnector(front, back, promote=True)
    stack.bind_kv_spec(kv_spec)
    engine = MiniEngine(kv_spec, stack)
    request = Req("a", list(PROMPT))
    assert stack.get_num_new_matched_tokens(request, 0) == (64, True)
    blocks = engine._allocate(len(PROMPT), 64)
    stack.update_state_after_alloc(request, blocks, 64)
    request.num_computed_tokens = 64  # as vLLM counts a request waiting for its remote KV
    engine.step()
    delay_free, _ = finish_request(stack, request, blocks)  # aborted while the back tier still loads
    if delay_free:
        engine.held[request.request_id] = blocks
    for _ in range(3):
        engine.step()
    back.hit = 0
    assert front.get_num_new_matched_tokens(Req("b", list(PROMPT)), 0) == (0, False), (
        "the host pool offers blocks that never held the prompt's KV"
    )


def test_a_settled_async_load_is_promoted_whole() -> None:
    front = HMA("front", slices=True)
    back = HMA("back", hit=tiered(0, 64), slices=True, load_async=True)
    stack = MultiConnector(front, back, promote=True)
    stack.bind_kv_spec(spec(16))
    request = Id("a")
    stack.get_num_new_matched_tokens(request, 0)
    stack.update_state_after_alloc(request, ([1, 2, 3, 4],), 64)
    back.finished = (None, {"a"})
    _step(stack, frozenset({"a"}))
    stack.request_finished_all_groups(request, ([1, 2, 3, 4],))
    assert _front_saw(front) == [([1, 2, 3, 4],)]


def test_an_unsettled_async_load_hands_the_null_block_from_its_first_token_on() -> None:
    front = HMA("front", hit=tiered(0, 16), slices=True)
    back = HMA("back", hit=tiered(16, 64), slices=True, load_async=True)
    stack = MultiConnector(front, back, promote=True)
    stack.bind_kv_spec(spec(16, 32))
    request = Id("a")
    stack.get_num_new_matched_tokens(request, 16)  # a local hit of one block
    stack.update_state_after_alloc(request, ([5, 1, 2, 3], [6, 7]), 48)
    _step(stack)
    stack.request_finished_all_groups(request, ([5, 1, 2, 3], [6, 7]))
    assert _front_saw(front) == [([5, 0, 0, 0], [0, 0])], "the local hit stays, the load's blocks do not"
    assert _front_saw(back) == _front_saw(front), "every child, the loader too"


def test_without_a_spec_a_request_with_an_unsettled_load_hands_over_no_blocks() -> None:
    front, back = HMA("front", slices=True), HMA("back", hit=tiered(0, 32), slices=True, load_async=True)
    stack = MultiConnector(front, back, promote=True)
    request = Id("a")
    stack.get_num_new_matched_tokens(request, 0)
    stack.update_state_after_alloc(request, ([1, 2],), 32)
    stack.request_finished_all_groups(request, ([1, 2],))
    assert _front_saw(front) == [([],)]


def test_a_sync_load_settles_with_its_steps_output_not_before() -> None:
    """The engine fails a request in the step its load failed, before the connector hears the output."""
    front, back = HMA("front", slices=True), HMA("back", hit=tiered(0, 32), slices=True)
    stack = MultiConnector(front, back, promote=True)
    stack.bind_kv_spec(spec(16))
    stack.update_connector_output(KVConnectorOutput())  # a report before any step (a handshake's)
    for name, outputs in (("early", 0), ("late", 2)):  # late: the early step's output, then its own
        request = Id(name)
        stack.get_num_new_matched_tokens(request, 0)
        stack.update_state_after_alloc(request, ([1, 2],), 32)
        stack.bind_connector_metadata(stack.build_connector_meta(None))
        stack.get_finished(set())
        stack.clear_connector_metadata()
        for _ in range(outputs):
            stack.update_connector_output(KVConnectorOutput())
        stack.request_finished_all_groups(request, ([1, 2],))
    assert _front_saw(front) == [([0, 0],), ([1, 2],)]


def test_a_failed_build_resends_the_load_and_it_settles_with_the_later_step() -> None:
    front, back = HMA("front", slices=True), HMA("back", hit=tiered(0, 32), slices=True)
    stack = MultiConnector(front, back, promote=True)
    stack.bind_kv_spec(spec(16))
    request = Id("a")
    stack.get_num_new_matched_tokens(request, 0)
    stack.update_state_after_alloc(request, ([1, 2],), 32)
    front.build_connector_meta = _raising  # type: ignore[method-assign]
    try:
        stack.build_connector_meta(None)
    except Exception:
        pass
    del front.build_connector_meta
    stack.update_connector_output(KVConnectorOutput())  # the failed step's output
    stack.build_connector_meta(None)  # the load ships now
    twin = pickle.loads(pickle.dumps(stack))
    for connector in (stack, twin):
        assert connector._settling.unsettled("a") == 1
    stack.update_connector_output(KVConnectorOutput())
    assert stack._settling.unsettled("a") == 0


def test_an_aborted_requests_late_report_is_not_taken_for_its_reused_ids_load() -> None:
    front = HMA("front", slices=True)
    back = HMA("back", hit=tiered(0, 32), slices=True, load_async=True)
    stack = MultiConnector(front, back, promote=True)
    stack.bind_kv_spec(spec(16))
    first = Id("a")
    stack.get_num_new_matched_tokens(first, 0)
    stack.update_state_after_alloc(first, ([1, 2],), 32)
    _step(stack)
    stack.request_finished_all_groups(first, ([1, 2],))  # aborted mid-load
    again = Id("a")
    stack.get_num_new_matched_tokens(again, 0)
    stack.update_state_after_alloc(again, ([3, 4],), 32)  # the id reused, loaded again
    back.finished = (None, {"a"})
    _step(stack, frozenset({"a"}))  # the first load's report
    stack.request_finished_all_groups(again, ([3, 4],))
    assert _front_saw(front) == [([0, 0],), ([0, 0],)], "the reused id's load had not been reported"


def _raising(scheduler_output: object, /) -> object:
    raise RuntimeError("front fails in build_connector_meta")
