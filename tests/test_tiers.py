"""Tiers that add up: a stack composes its children's hits, each child loading its own slice.

Unit tests over null connectors; the reference engine serving real stores is in
``tests/engine/test_tiers_served.py``.
"""

from __future__ import annotations

import copy
import pickle
from dataclasses import dataclass

import pytest

from capkv import (
    ContractError,
    KVGroupSpec,
    KVSpec,
    MultiConnector,
    SubConnectorError,
    check_stack,
)
from capkv.composite import Drop
from capkv.errors import ArgumentError
from tests.fakes import HMA, Req
from tests.test_multi_connector import step

R = Req("r1")


@dataclass(frozen=True)
class Prompt:
    """A request that says how many tokens it has (as vLLM's does)."""

    request_id: str
    num_tokens: int


@dataclass(frozen=True)
class Hit:
    """A hit as a store holding tokens ``start..end`` answers it: everything from the asked position up to
    ``end`` (a plain count when ``start`` is None). Picklable, unlike a lambda."""

    end: int
    start: int | None = None

    def __call__(self, asked: int) -> int:
        if self.start is None:
            return self.end
        return self.end - asked if self.start <= asked < self.end else 0


def tiered(start: int, end: int) -> Hit:
    return Hit(end, start)


def spec(*block_sizes: int) -> KVSpec:
    return KVSpec(num_groups=len(block_sizes), num_blocks=64,
                  groups=tuple(KVGroupSpec(block_size=size) for size in block_sizes))


def allocated(child: HMA) -> int:
    _, args = next(call for call in reversed(child.calls) if call[0] == "update_state_after_alloc")
    return int(args[2])


def asked(child: HMA) -> int:
    _, args = next(call for call in reversed(child.calls) if call[0] == "get_num_new_matched_tokens")
    return int(args[1])


def foreign(child: HMA) -> list[tuple[int, int, bool]]:
    return [(call[1][1], call[1][2], call[1][3]) for call in child.calls if call[0] == "loaded_elsewhere"]




# ---- composed hits --------------------------------------------------------------------


def test_each_child_is_asked_beyond_what_the_earlier_ones_load() -> None:
    a = HMA("a", hit=tiered(0, 48), slices=True)
    b = HMA("b", hit=tiered(0, 96), slices=True)
    c = HMA("c", hit=tiered(0, 128), slices=True)
    stack = MultiConnector(a, b, c)
    assert stack.get_num_new_matched_tokens(R, 16) == (112, False)
    assert [asked(ch) for ch in (a, b, c)] == [16, 48, 96]
    stack.update_state_after_alloc(R, ([1, 2],), 112)
    assert [allocated(ch) for ch in (a, b, c)] == [32, 48, 32]
    assert stack.loaded_tokens == (32, 48, 32)
    assert foreign(a) == [(48, 128, False)], "later tiers' slices: not saved without promotion"
    assert foreign(b) == [(16, 48, False), (96, 128, False)]
    assert foreign(c) == [(16, 96, False)], "earlier tiers' slices are never saved again"


def test_a_miss_in_a_front_tier_passes_the_whole_hit_on() -> None:
    a, b = HMA("a", hit=0, slices=True), HMA("b", hit=tiered(0, 64), slices=True)
    stack = MultiConnector(a, b)
    assert stack.get_num_new_matched_tokens(R, 0) == (64, False)
    stack.update_state_after_alloc(R, ([1],), 64)
    assert [allocated(ch) for ch in (a, b)] == [0, 64]
    assert foreign(a) == [(0, 64, False)] and foreign(b) == []


def test_the_engine_may_take_fewer_tokens_than_offered_slices_are_cut_in_order() -> None:
    a, b, c = (HMA(n, hit=tiered(0, e), slices=True) for n, e in (("a", 32), ("b", 64), ("c", 96)))
    stack = MultiConnector(a, b, c)
    assert stack.get_num_new_matched_tokens(R, 0) == (96, False)
    stack.update_state_after_alloc(R, ([1],), 48)
    assert [allocated(ch) for ch in (a, b, c)] == [32, 16, 0]
    assert foreign(c) == [(0, 48, False)]


def test_more_tokens_than_offered_is_refused() -> None:
    a = HMA("a", hit=tiered(0, 32), slices=True)
    stack = MultiConnector(a)
    stack.get_num_new_matched_tokens(R, 0)
    with pytest.raises(ContractError, match=r"num_external_tokens=48 .* offered 32"):
        stack.update_state_after_alloc(R, ([1],), 48)


def test_a_child_that_does_not_load_slices_follows_the_first_hit_rule() -> None:
    plain = HMA("plain", hit=32)  # vLLM's own connectors: asked at the local hit, as vLLM asks them
    tier = HMA("tier", hit=tiered(0, 96), slices=True)
    stack = MultiConnector(tier, plain)
    assert stack.get_num_new_matched_tokens(R, 0) == (96, False)
    assert asked(plain) == 0, "asked at the local hit, never beyond"
    stack.update_state_after_alloc(R, ([1],), 96)
    assert [allocated(ch) for ch in (tier, plain)] == [96, 0]


def test_a_first_loader_that_cannot_load_slices_ends_the_composition() -> None:
    plain = HMA("plain", hit=32)
    tier = HMA("tier", hit=tiered(0, 96), slices=True)
    stack = MultiConnector(plain, tier)
    assert stack.get_num_new_matched_tokens(R, 0) == (32, False)
    assert asked(tier) == 0, "not asked beyond a slice whose loader may write past it"
    stack.update_state_after_alloc(R, ([1],), 32)
    assert [allocated(ch) for ch in (plain, tier)] == [32, 0]
    assert foreign(tier) == [(0, 32, False)]


def test_a_slice_that_ends_off_a_block_boundary_ends_the_composition() -> None:
    a, b = HMA("a", hit=40, slices=True), HMA("b", hit=tiered(0, 96), slices=True)
    stack = MultiConnector(a, b)
    stack.bind_kv_spec(spec(16))
    assert stack.get_num_new_matched_tokens(R, 0) == (40, False), "a hit from the local hit may end anywhere"
    assert asked(b) == 0


def test_nested_stacks_compose_too() -> None:
    a, b = HMA("a", hit=tiered(0, 32), slices=True), HMA("b", hit=tiered(0, 64), slices=True)
    c = HMA("c", hit=tiered(0, 128), slices=True)
    inner = MultiConnector(b, c)
    assert inner.loads_slices()
    stack = MultiConnector(a, inner)
    assert stack.get_num_new_matched_tokens(R, 0) == (128, False)
    stack.update_state_after_alloc(R, ([1],), 128)
    assert [allocated(ch) for ch in (a, b, c)] == [32, 32, 64]
    assert stack.loaded_tokens == (32, 96) and inner.loaded_tokens == (32, 64)
    assert sorted(foreign(c)) == [(0, 32, False), (32, 64, False)], "the outer stack's foreign loads reach the inner children"
    assert not MultiConnector(b, HMA("plain")).loads_slices(), "a stack loads slices only when every child does"


def test_promotion_asks_earlier_tiers_to_save_what_later_ones_loaded() -> None:
    a, b = HMA("a", hit=tiered(0, 32), slices=True), HMA("b", hit=tiered(0, 96), slices=True)
    stack = MultiConnector(a, b, promote=True)
    assert stack.promote
    stack.get_num_new_matched_tokens(R, 0)
    stack.update_state_after_alloc(R, ([1],), 96)
    assert foreign(a) == [(32, 96, True)]
    assert foreign(b) == [(0, 32, False)], "never saved downwards"
    assert stack.promoted_tokens == (64, 0)


def test_promotion_is_off_by_default_and_a_bool() -> None:
    assert not MultiConnector(HMA("a")).promote
    with pytest.raises(ArgumentError, match="promote"):
        MultiConnector(HMA("a"), promote="yes")  # type: ignore[call-overload]
    stack = MultiConnector(HMA("a"), HMA("b"), promote=True)
    assert stack.with_children(HMA("c")).promote and copy.deepcopy(stack).promote


# ---- answers a slice cannot be --------------------------------------------------------------


def test_a_slice_past_the_prompt_is_a_contract_error_naming_the_child() -> None:
    a, b = HMA("a", hit=tiered(0, 64), slices=True), HMA("b", hit=100, slices=True)
    with pytest.raises(SubConnectorError) as info:
        MultiConnector(a, b).get_num_new_matched_tokens(Prompt("p", 128), 0)
    (error,) = info.value.exceptions
    assert isinstance(error, ContractError) and error.connector == "#2 HMA" and error.value == (100, False)
    assert "ends at token 164, past the request's 128 tokens" in str(error)


def test_a_slice_asked_beyond_the_local_hit_must_end_on_a_block_boundary() -> None:
    a, b = HMA("a", hit=tiered(0, 64), slices=True), HMA("b", hit=Hit(20), slices=True)
    stack = MultiConnector(a, b)
    check_stack(stack, spec(16, 32))  # the engine's block sizes reach the stack (lcm: 32)
    with pytest.raises(SubConnectorError) as info:
        stack.get_num_new_matched_tokens(R, 0)
    (error,) = info.value.exceptions
    assert isinstance(error, ContractError) and error.connector == "#2 HMA"
    assert "ends at token 84, not on a block boundary (every group's blocks: a multiple of 32)" in str(error)
    again = pickle.loads(pickle.dumps(stack))
    with pytest.raises(SubConnectorError, match="not on a block boundary"):
        again.get_num_new_matched_tokens(R, 0)


@pytest.mark.parametrize("bad", [-16, 1.5, "16"])
def test_a_bad_slice_answer_is_named(bad: object) -> None:
    a, b = HMA("a", hit=tiered(0, 64), slices=True), HMA("b", hit=bad, slices=True)  # type: ignore[arg-type]
    with pytest.raises(SubConnectorError, match=r"#2 HMA.get_num_new_matched_tokens returned"):
        MultiConnector(a, b).get_num_new_matched_tokens(R, 0)


def test_a_loader_failing_at_allocation_keeps_the_slices_before_it() -> None:
    a, b = HMA("a", hit=tiered(0, 32), slices=True), HMA("b", hit=tiered(0, 96), slices=True, load_async=True)

    def refuse(*args: object) -> None:
        raise RuntimeError("no room")

    b.update_state_after_alloc = refuse  # type: ignore[method-assign]
    stack = MultiConnector(a, b)
    stack.get_num_new_matched_tokens(R, 0)
    with pytest.raises(SubConnectorError) as info:
        stack.update_state_after_alloc(R, ([1],), 96)
    assert info.value.partial == 32, "the engine recomputes from the failed slice on"
    assert stack.loaded_tokens == (32, 0)
    b.finished = (None, {"r1"})
    assert step(stack) == (None, None), "the failed slice's loader is not waited for"


# ---- loads are numbered; a request is ready when every loader finished ---------------------


def test_a_request_is_received_once_every_asynchronous_loader_reported() -> None:
    a = HMA("a", hit=tiered(0, 32), slices=True, load_async=True)
    b = HMA("b", hit=tiered(0, 64), slices=True)
    c = HMA("c", hit=tiered(0, 96), slices=True, load_async=True)
    stack = MultiConnector(a, b, c)
    assert stack.get_num_new_matched_tokens(R, 0) == (96, True)
    stack.update_state_after_alloc(R, ([1],), 96)
    c.finished = (None, {"r1"})
    assert step(stack) == (None, None), "a still loads its slice"
    b.finished = (None, {"r1"})
    assert step(stack) == (None, None), "b's slice is synchronous: its report is not awaited"
    a.finished = (None, {"r1"})
    assert step(stack) == (None, {"r1"})
    assert dict(stack.dropped_reports) == {("#2 HMA", Drop.RECV_NOT_LOADER): 1}


def test_a_late_report_counts_for_its_own_load_not_a_newer_one() -> None:
    """Two loads of one request id pending at once (an aborted load, the id reused): reports match loads."""
    a = HMA("a", hit=tiered(0, 32), slices=True, load_async=True)
    b = HMA("b", hit=tiered(0, 64), slices=True, load_async=True)
    stack = MultiConnector(a, b)
    stack.get_num_new_matched_tokens(R, 0)
    stack.update_state_after_alloc(R, ([1],), 32)  # load 1: a's slice only
    assert step(stack) == (None, None)
    stack.get_num_new_matched_tokens(R, 0)
    stack.update_state_after_alloc(R, ([1],), 64)  # load 2: a and b
    a.finished = (None, {"r1"})  # a's report of load 1
    assert step(stack) == (None, {"r1"}), "load 1 completes"
    b.finished = (None, {"r1"})
    assert step(stack) == (None, None), "load 2 still waits for a"
    a.finished = (None, {"r1"})
    assert step(stack) == (None, {"r1"}), "load 2 completes"


def test_an_old_report_repeated_after_a_reload_is_not_the_reload_s_completion() -> None:
    """Loaded (by a), preempted, reloaded (by a and b), a's old report repeated: the reload still waits."""
    a = HMA("a", hit=tiered(0, 32), slices=True, load_async=True)
    b = HMA("b", hit=tiered(0, 64), slices=True, load_async=True)
    stack = MultiConnector(a, b)
    b.hit = 0
    stack.get_num_new_matched_tokens(R, 0)
    stack.update_state_after_alloc(R, ([1],), 32)
    a.finished = (None, {"r1"})
    assert step(stack) == (None, {"r1"})
    a.finished = (None, {"r1"})  # repeated before the reload: nothing pending
    assert step(stack) == (None, None)
    b.hit = tiered(0, 64)
    a.hit = 0  # the reload comes from b alone
    stack.get_num_new_matched_tokens(R, 0)
    stack.update_state_after_alloc(R, ([1],), 64)
    a.finished = (None, {"r1"})  # the old report, once more
    assert step(stack) == (None, None), "a owes nothing of the reload"
    b.finished = (None, {"r1"})
    assert step(stack) == (None, {"r1"})
    assert dict(stack.dropped_reports) == {
        ("#1 HMA", Drop.RECV_NOT_PENDING): 1, ("#1 HMA", Drop.RECV_NOT_LOADER): 1,
    }


def _two_loads_owed_by_different_children() -> tuple[MultiConnector, HMA, HMA]:
    """Load 1 of r1 by a alone (r1 aborted meanwhile), the id reused, load 2 by b alone."""
    a = HMA("a", hit=tiered(0, 32), slices=True, load_async=True)
    b = HMA("b", hit=tiered(0, 64), slices=True, load_async=True)
    stack = MultiConnector(a, b)
    b.hit = 0
    stack.get_num_new_matched_tokens(R, 0)
    stack.update_state_after_alloc(R, ([1],), 32)  # load 1: a
    assert step(stack) == (None, None)
    a.hit, b.hit = 0, tiered(0, 64)
    stack.get_num_new_matched_tokens(R, 0)
    stack.update_state_after_alloc(R, ([1],), 64)  # load 2: b
    return stack, a, b


def test_two_loads_owed_by_different_children_completing_in_one_step_are_both_reported() -> None:
    stack, a, b = _two_loads_owed_by_different_children()
    a.finished = b.finished = (None, {"r1"})
    assert step(stack) == (None, {"r1"}), "one report per call: a request id is in a set once"
    assert step(stack) == (None, {"r1"}), "the second load, at the next call, not lost"
    assert step(stack) == (None, None)
    assert not dict(stack.dropped_reports)


def test_a_later_load_completing_first_is_reported_after_the_earlier_one_not_lost() -> None:
    stack, a, b = _two_loads_owed_by_different_children()
    b.finished = (None, {"r1"})
    assert step(stack) == (None, None), "load 2 is done, but loads of one id are reported in order"
    a.finished = (None, {"r1"})
    assert step(stack) == (None, {"r1"}), "load 1"
    assert step(stack) == (None, {"r1"}), "then load 2"
    assert step(stack) == (None, None)


def test_a_completed_load_waits_out_a_failed_get_finished() -> None:
    stack, a, b = _two_loads_owed_by_different_children()
    a.finished = b.finished = (None, {"r1"})
    assert step(stack) == (None, {"r1"})

    def broken(finished_req_ids: set[str], /) -> tuple[set[str] | None, set[str] | None]:
        raise RuntimeError("a fails in get_finished")

    a.get_finished = broken  # type: ignore[method-assign]
    with pytest.raises(SubConnectorError):
        step(stack)
    del a.get_finished
    assert step(stack) == (None, {"r1"}), "the second load, after the failed call"
    assert step(stack) == (None, None)


def test_numbered_loads_survive_copies() -> None:
    a = HMA("a", hit=tiered(0, 32), slices=True, load_async=True)
    b = HMA("b", hit=tiered(0, 64), slices=True, load_async=True)
    stack = MultiConnector(a, b)
    stack.get_num_new_matched_tokens(R, 0)
    stack.update_state_after_alloc(R, ([1],), 64)
    stack.bind_connector_metadata(stack.build_connector_meta(None))
    twin = pickle.loads(pickle.dumps(stack))
    twin.children[0].finished = (None, {"r1"})
    assert twin.get_finished(set()) == (None, None)
    twin.children[1].finished = (None, {"r1"})
    assert twin.get_finished(set()) == (None, {"r1"})


# ---- a failed load anywhere: nobody saves what the step computed on it -------------------------


def test_children_that_save_learn_of_a_failed_load_before_they_save() -> None:
    a, b = HMA("a", hit=tiered(0, 32), slices=True), HMA("b", hit=tiered(0, 64), slices=True)
    stack = MultiConnector(a, b)
    stack.get_num_new_matched_tokens(R, 0)
    stack.update_state_after_alloc(R, ([1, 2, 3, 4],), 64)
    stack.bind_connector_metadata(stack.build_connector_meta(None))
    stack.start_load_kv(None)
    b.load_errors = {0: {3}}
    stack.wait_for_save()
    assert ("loads_failed", ({"r1"},)) in a.calls and ("loads_failed", ({"r1"},)) in b.calls
    assert a.methods().index("loads_failed") < a.methods().index("wait_for_save"), "told before it saves"
    b.load_errors = {}
    assert stack.get_block_ids_with_load_errors() == {0: {3}}, "the errors reach the engine, once"
    assert stack.get_block_ids_with_load_errors() == {}
    stack.clear_connector_metadata()


def test_a_step_without_loads_asks_nobody_early() -> None:
    a, b = HMA("a"), HMA("b")
    stack = MultiConnector(a, b)
    b.load_errors = {0: {3}}  # a stray report: the engine refuses it, the stack does not act on it
    stack.bind_connector_metadata(stack.build_connector_meta(None))
    stack.wait_for_save()
    stack.clear_connector_metadata()
    assert "loads_failed" not in a.methods() and "loads_failed" not in b.methods()
    assert stack.get_block_ids_with_load_errors() == {0: {3}}


def test_two_pending_loads_of_one_request_id_are_each_reported() -> None:
    """An aborted request's load still pending when its id is reused and loaded again: one report per load
    (the first-hit rule alone, no slices: the numbering is what tells the loads apart)."""
    a, b = HMA("a", hit=32, load_async=True), HMA("b")
    stack = MultiConnector(a, b)
    for _ in range(2):
        assert stack.get_num_new_matched_tokens(R, 0) == (32, True)
        stack.update_state_after_alloc(R, ([1],), 32)
    a.finished = (None, {"r1"})
    assert step(stack) == (None, {"r1"}), "the first load"
    a.finished = (None, {"r1"})
    assert step(stack) == (None, {"r1"}), "the second load is reported too, not dropped"
    a.finished = (None, {"r1"})
    assert step(stack) == (None, None), "a third report has no load left"


def test_a_hit_cut_to_its_synchronous_slices_is_still_received() -> None:
    """The stack answered ``load_async`` (a later slice loads asynchronously) and the engine kept only the
    synchronous slice (vLLM cuts a hit to whole blocks, say): the engine parks the request all the same,
    so the stack reports its receive itself — once — or the request would wait forever."""
    a = HMA("a", hit=tiered(0, 32), slices=True)
    b = HMA("b", hit=tiered(0, 96), slices=True, load_async=True)
    stack = MultiConnector(a, b)
    assert stack.get_num_new_matched_tokens(R, 0) == (96, True)
    stack.update_state_after_alloc(R, ([1],), 32)
    assert step(stack) == (None, {"r1"})
    assert step(stack) == (None, None)
    b.finished = (None, {"r1"})  # b loaded nothing of it: a stray report, dropped
    assert step(stack) == (None, None)
