"""Issue 11's composite defects, one test each: completions by child, faults mid fan-out, binding, answers.

Each test here failed on the main of 70028fb (before completion tracking by
child and all-or-nothing fan-outs) and passes now.
"""

from __future__ import annotations

import copy
import pickle
from typing import Any

import pytest

import capkv
from capkv import (
    CapabilityError,
    ContractError,
    KVConnectorOutput,
    MultiConnector,
    MultiWorkerMetadata,
    StackNode,
    check_stack,
    finish_request,
    supports_hma,
)
from tests.fakes import ReadsOutput, HMA, FakeWorkerMeta, Plain, Req

R = Req("r1")


def step(stack: Any, finished: set[str] | None = None) -> tuple[set[str] | None, set[str] | None]:
    """One engine step: metadata across, then completions back."""
    stack.bind_connector_metadata(stack.build_connector_meta(None))
    result: tuple[set[str] | None, set[str] | None] = stack.get_finished(finished or set())
    stack.clear_connector_metadata()
    return result


def raising(error: Exception) -> Any:
    def member(*args: object, **kwargs: object) -> Any:
        raise error

    return member


def savers(*flags: bool) -> tuple[Any, list[HMA]]:
    children = [HMA(f"c{i}") for i in range(len(flags))]
    for child, flag in zip(children, flags, strict=True):
        child.delay_free = flag
    return MultiConnector(*children), children


# ---- sends: tracked by child ---------------------------------------------------------


def test_a_childs_repeated_send_report_does_not_free_early_nor_twice() -> None:
    stack, (a, b) = savers(True, True)
    assert stack.request_finished_all_groups(R, ([1],)) == (True, None)
    a.finished = ({"r1"}, None)
    assert step(stack) == (None, None)
    a.finished = ({"r1"}, None)
    assert step(stack) == (None, None), "#2 is still copying: a repeat from #1 must not free the blocks"
    b.finished = ({"r1"}, None)
    assert step(stack) == ({"r1"}, None)
    b.finished = ({"r1"}, None)
    assert step(stack) == (None, None), "reported once"


def test_a_send_report_from_a_child_that_did_not_save_is_dropped() -> None:
    stack, (a, b) = savers(False, True)
    assert stack.request_finished_all_groups(R, ([1],)) == (True, None)
    a.finished = ({"r1"}, None)
    assert step(stack) == (None, None), "#1 returned delay_free=False: its report cannot free the blocks"
    b.finished = ({"r1"}, None)
    assert step(stack) == ({"r1"}, None)


def test_a_send_report_for_a_request_nobody_saves_is_dropped() -> None:
    stack, (a, _) = savers(False, False)
    assert stack.request_finished_all_groups(R, ([1],)) == (False, None)
    a.finished = ({"r1", "never-finished"}, None)
    assert step(stack) == (None, None)


def test_dropped_reports_are_counted_by_child_and_reason_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    from capkv.composite import Drop

    stack, (a, b) = savers(True, True)
    stack.request_finished_all_groups(R, ([1],))
    for _ in range(3):
        a.finished = ({"r1"}, None)
        step(stack)
    b.finished = ({"r1", "x"}, None)
    step(stack)
    assert dict(stack.dropped_reports) == {
        ("#1 HMA", Drop.SEND_REPEATED): 2,
        ("#2 HMA", Drop.SEND_NOT_PENDING): 1,
    }
    warnings = [r for r in caplog.records if r.name == "capkv.composite"]
    assert len(warnings) == 2 and "#1 HMA reported a finished send it had already reported" in warnings[0].message


# ---- receives: once per load, from its loader ------------------------------------------


def test_a_receive_repeated_after_its_request_finished_is_dropped() -> None:
    a, b = HMA("a", hit=32, load_async=True), HMA("b")
    stack = MultiConnector(a, b)
    tokens, _ = stack.get_num_new_matched_tokens(R, 0)
    stack.update_state_after_alloc(R, ([1, 2],), tokens)
    a.finished = (None, {"r1"})
    assert step(stack) == (None, {"r1"})
    stack.request_finished_all_groups(R, ([1, 2],))
    assert step(stack, {"r1"}) == (None, None)
    a.finished = (None, {"r1"})
    assert step(stack) == (None, None), "the load was reported; a repeat after finish is not a new one"


def test_a_pending_asynchronous_load_is_reported_after_its_request_was_aborted() -> None:
    a = HMA("a", hit=32, load_async=True)
    stack = MultiConnector(a, HMA("b"))
    tokens, _ = stack.get_num_new_matched_tokens(R, 0)
    stack.update_state_after_alloc(R, ([1, 2],), tokens)
    assert step(stack, {"r1"}) == (None, None)  # aborted while loading: the engine keeps its blocks
    a.finished = (None, {"r1"})
    assert step(stack) == (None, {"r1"}), "the engine frees an aborted request's blocks on this report"


# ---- faults mid fan-out: every child called, siblings' results kept ---------------------


def test_get_finished_keeps_a_siblings_completion_when_a_child_raises() -> None:
    stack, (a, b) = savers(True, False)
    stack.request_finished_all_groups(R, ([1],))
    stack.bind_connector_metadata(stack.build_connector_meta(None))
    a.finished = ({"r1"}, None)
    b.get_finished = raising(OSError("link down"))  # type: ignore[method-assign]
    with pytest.raises(Exception) as info:
        stack.get_finished(set())
    assert a.finished == (None, None), "#1's completion was taken"
    b.get_finished = lambda finished, /: (None, None)  # type: ignore[method-assign]
    assert stack.get_finished(set()) == ({"r1"}, None), "and is delivered by the next call"
    assert isinstance(info.value, capkv.SubConnectorError) and "#2 HMA raised OSError: link down" in str(info.value)


def test_load_errors_of_siblings_survive_a_raising_child() -> None:
    a, b, c = HMA("a"), HMA("b"), HMA("c")
    a.load_errors, c.load_errors = {0: {3}}, {1: {7}}
    b.get_block_ids_with_load_errors = raising(RuntimeError("boom"))  # type: ignore[method-assign]
    stack = MultiConnector(a, b, c)
    with pytest.raises(Exception):
        stack.get_block_ids_with_load_errors()
    b.get_block_ids_with_load_errors = lambda: {}  # type: ignore[method-assign]
    a.load_errors, c.load_errors = {}, {}
    assert stack.get_block_ids_with_load_errors() == {0: {3}, 1: {7}}


def test_build_connector_meta_keeps_siblings_metadata_when_a_child_raises() -> None:
    stack, (a, b, c) = savers(False, True, False)
    stack.request_finished_all_groups(R, ([1],))
    a.build_connector_meta = raising(ValueError("bad plan"))  # type: ignore[method-assign]
    with pytest.raises(Exception) as info:
        stack.build_connector_meta(None)
    assert [ch.methods()[-1] for ch in (b, c)] == ["build_connector_meta"] * 2, "later children were still asked"
    partial = info.value.partial  # type: ignore[attr-defined]
    stack.bind_connector_metadata(partial)
    assert b.calls[-1] == ("bind_connector_metadata", ("meta-c1",)), "#2's planned save reaches its worker side"
    assert "bind_connector_metadata" not in a.methods(), "#1 sits the step out"
    b.finished = ({"r1"}, None)
    assert stack.get_finished(set()) == ({"r1"}, None)


def test_the_stacks_own_bookkeeping_survives_a_failed_build_even_if_the_engine_drops_it() -> None:
    stack, (a, b) = savers(True, True)
    stack.request_finished_all_groups(R, ([1],))
    original = b.build_connector_meta
    b.build_connector_meta = raising(ValueError("bad plan"))  # type: ignore[method-assign]
    with pytest.raises(Exception):
        stack.build_connector_meta(None)  # the engine drops the step and its partial metadata
    b.build_connector_meta = original  # type: ignore[method-assign]
    a.finished = ({"r1"}, None)
    assert step(stack) == (None, None), "#2 still owes its report"
    b.finished = ({"r1"}, None)
    assert step(stack) == ({"r1"}, None)


def test_update_connector_output_reaches_every_child_when_one_raises() -> None:
    a, b, c = HMA("a"), ReadsOutput("b"), ReadsOutput("c")
    a.update_connector_output = raising(KeyError("x"))  # type: ignore[method-assign]
    stack = MultiConnector(a, b, c)
    meta = MultiWorkerMetadata((None, FakeWorkerMeta(("b",)), FakeWorkerMeta(("c",))))
    with pytest.raises(Exception):
        stack.update_connector_output(KVConnectorOutput(worker_meta=meta))
    assert [ch.seen_worker_meta[-1] for ch in (b, c)] == [FakeWorkerMeta(("b",)), FakeWorkerMeta(("c",))]
    with pytest.raises(capkv.CapkvError):
        stack.update_connector_output(KVConnectorOutput())
    assert [ch.methods().count("update_connector_output") for ch in (b, c)] == [2, 2]


@pytest.mark.parametrize("method", ["request_finished", "request_finished_all_groups"])
def test_finish_reaches_every_child_and_says_whether_to_keep_the_blocks(method: str) -> None:
    a, b, c = HMA("a"), HMA("b"), HMA("c")
    a.delay_free = c.delay_free = True
    setattr(b, method, raising(OSError("disk gone")))
    stack = MultiConnector(a, b, c)
    block_ids: object = [1] if method == "request_finished" else ([1],)
    with pytest.raises(Exception) as info:
        getattr(stack, method)(R, block_ids)
    assert c.methods()[-1] == method, "the child after the failing one was told"
    a.finished = ({"r1"}, None)
    assert step(stack) == (None, None)
    c.finished = ({"r1"}, None)
    assert step(stack) == ({"r1"}, None), "exactly the children that accepted are awaited"
    assert isinstance(info.value, capkv.FinishError) and info.value.delay_free is True


def test_worker_metadata_and_events_of_siblings_survive_a_raising_child() -> None:
    a, b = HMA("a"), HMA("b")
    a.worker_meta, a.events = FakeWorkerMeta(("a1",)), ["e1"]
    b.build_connector_worker_meta = raising(RuntimeError("x"))  # type: ignore[method-assign]
    b.take_events = raising(RuntimeError("y"))  # type: ignore[method-assign]
    stack = MultiConnector(a, b)
    with pytest.raises(Exception):
        stack.build_connector_worker_meta()
    with pytest.raises(Exception):
        stack.take_events()
    b.build_connector_worker_meta = lambda: None  # type: ignore[method-assign]
    b.take_events = lambda: []  # type: ignore[method-assign]
    a.worker_meta = FakeWorkerMeta(("a2",))
    assert stack.build_connector_worker_meta() == MultiWorkerMetadata((FakeWorkerMeta(("a1", "a2")), None))
    assert list(stack.take_events()) == ["e1"]


# ---- binding, answers ------------------------------------------------------------------


def test_binding_the_same_metadata_twice_counts_once() -> None:
    stack, (a, b) = savers(True, True)
    stack.request_finished_all_groups(R, ([1],))
    metadata = stack.build_connector_meta(None)
    stack.bind_connector_metadata(metadata)
    stack.bind_connector_metadata(metadata)
    a.finished = b.finished = ({"r1"}, None)
    assert stack.get_finished(set()) == ({"r1"}, None), "two savers, two reports: done"
    a.finished = ({"r1"}, None)
    assert stack.get_finished(set()) == (None, None), "nothing more is owed"


@pytest.mark.parametrize("answer", [None, 5, (None,), "ab", (1, 2, 3)])
def test_a_malformed_hit_answer_is_a_contract_error_naming_the_child(answer: object) -> None:
    a, b = HMA("a"), HMA("b")
    b.get_num_new_matched_tokens = lambda request, n, /: answer  # type: ignore[method-assign,assignment,return-value]
    with pytest.raises(capkv.CapkvError) as info:
        MultiConnector(a, b).get_num_new_matched_tokens(R, 0)
    errors = getattr(info.value, "exceptions", (info.value,))
    assert isinstance(errors[0], ContractError)
    assert (errors[0].connector, errors[0].method, errors[0].value) == ("#2 HMA", "get_num_new_matched_tokens", answer)
    assert "#2 HMA.get_num_new_matched_tokens returned" in str(info.value)


# ---- capability of a composite of one's own -------------------------------------------


class OwnComposite(StackNode, HMA):
    """A user's composite over HMA children whose own class lacks request_finished_all_groups."""

    request_finished_all_groups = None  # type: ignore[assignment]

    def __init__(self, *children: object) -> None:
        super().__init__("own")
        self._kids = children

    @property
    def children(self) -> tuple[object, ...]:
        return self._kids


def test_a_composite_without_its_own_hma_method_is_not_hma_capable() -> None:
    own = OwnComposite(HMA("a"), HMA("b"))
    assert not supports_hma(own)
    with pytest.raises(CapabilityError, match=r'connector "OwnComposite" does not implement SupportsHMA'):
        check_stack(own, 2)
    with pytest.raises(CapabilityError):
        finish_request(own, R, ([1], [2]))
    assert not supports_hma(MultiConnector(HMA("x"), own)), "nor is a stack holding it"
    assert supports_hma(MultiConnector(HMA("x"), HMA("y"))), "MultiConnector finishes all groups by its children"


# ---- subclasses, copies, pickles --------------------------------------------------------


class Tiered(MultiConnector[*tuple[Any, ...]]):
    """A stack with an option of its own."""

    def __init__(self, *children: capkv.KVConnector, threshold: int = 3) -> None:
        self.threshold = threshold


def test_a_subclass_takes_keyword_arguments() -> None:
    stack = Tiered(HMA("a"), HMA("b"), threshold=7)
    assert stack.threshold == 7 and supports_hma(stack) and isinstance(stack, Tiered)
    again = stack.with_children(HMA("c"), Plain("d"))
    assert isinstance(again, Tiered) and again.threshold == 7 and not supports_hma(again)
    with pytest.raises(capkv.ConfigError, match=r"MultiConnector\(\) takes sub-connectors and promote= only"):
        MultiConnector(HMA("a"), threshold=1)  # type: ignore[call-overload]


def test_a_stack_can_be_copied_and_pickled_with_its_state() -> None:
    stack, (a, b) = savers(True, True)
    stack.request_finished_all_groups(R, ([1],))
    stack.bind_connector_metadata(stack.build_connector_meta(None))
    a.finished = ({"r1"}, None)
    assert stack.get_finished(set()) == (None, None)
    for clone in (copy.copy(stack), copy.deepcopy(stack), pickle.loads(pickle.dumps(stack))):
        assert type(clone) is type(stack) and len(clone.children) == 2
        second = clone.children[1]
        second.finished = ({"r1"}, None)
        assert clone.get_finished(set()) == ({"r1"}, None), "the copy still waits for #2 only"
    assert stack.get_finished(set()) == (None, None), "copies do not share bookkeeping"
    sub = Tiered(HMA("a"), HMA("b"), threshold=5)
    for clone in (copy.deepcopy(sub), pickle.loads(pickle.dumps(sub))):
        assert isinstance(clone, Tiered) and clone.threshold == 5 and supports_hma(clone)


# ---- nested stacks ----------------------------------------------------------------------


def test_a_nested_stacks_accepted_saves_keep_the_blocks_when_its_sibling_raises() -> None:
    inner_saver, inner_broken, outer_plain = HMA("a"), HMA("b"), HMA("c")
    inner_saver.delay_free = True
    inner_broken.request_finished_all_groups = raising(OSError("disk gone"))  # type: ignore[method-assign]
    inner = MultiConnector(inner_saver, inner_broken)
    stack = MultiConnector(inner, outer_plain)
    with pytest.raises(capkv.FinishError) as info:
        stack.request_finished_all_groups(R, ([1],))
    assert info.value.delay_free is True, "#1.1 accepted a save: the engine must keep the blocks"
    inner_saver.finished = ({"r1"}, None)
    assert step(stack) == ({"r1"}, None), "reported by the nested stack, which the outer one waits for"


def test_a_nested_stacks_partial_metadata_is_kept_by_the_outer_one() -> None:
    a, b, c = HMA("a"), HMA("b"), HMA("c")
    a.delay_free = True
    b.build_connector_meta = raising(ValueError("bad plan"))  # type: ignore[method-assign]
    stack = MultiConnector(MultiConnector(a, b), c)
    stack.request_finished_all_groups(R, ([1],))
    with pytest.raises(capkv.SubConnectorError) as info:
        stack.build_connector_meta(None)
    stack.bind_connector_metadata(info.value.partial)
    assert a.calls[-1] == ("bind_connector_metadata", ("meta-a",)), "#1.1's planned save reaches its worker side"
    a.finished = ({"r1"}, None)
    assert stack.get_finished(set()) == ({"r1"}, None)
