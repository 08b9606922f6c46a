"""A request aborted while the engine waits for its asynchronous load: the engine keeps its blocks, never the stack.

vLLM keeps such a request's blocks until the load's receive is reported and frees them then; a stack that
also answered ``delay_free=True`` (a front tier accepting a save of the prefix the engine computed itself)
made vLLM 0.32 free the blocks twice and assert. The stack answers ``delay_free=False`` and folds those
saves into the receive: it is reported once the load is over and every save reported, never as a send.
Each test here failed before the fold. ``tests/vllm/test_abort_mid_load.py`` runs the same on vLLM's own
scheduler with real tiers.
"""

from __future__ import annotations

import copy
import pickle
from typing import Any

from capkv import KVConnectorOutput, MultiConnector
from tests.fakes import HMA
from tests.fakes import Req as Id
from tests.test_tiers import spec, tiered

BLOCKS = [5, 1, 2, 3]
"""Block 5 holds the engine's own prefix hit (16 tokens); 1 to 3 are the back tier's load."""


def _stack() -> tuple[Any, HMA, HMA]:
    front = HMA("front", slices=True)
    front.delay_free = True  # accepts an asynchronous save of whatever it is handed
    back = HMA("back", hit=tiered(16, 64), slices=True, load_async=True)
    stack = MultiConnector(front, back)
    stack.bind_kv_spec(spec(16))
    return stack, front, back


def _step(stack: Any, *, output: bool = True) -> tuple[set[str] | None, set[str] | None]:
    """One engine step; its output is handed back unless ``output`` is False (the step is in flight)."""
    stack.bind_connector_metadata(stack.build_connector_meta(None))
    sending, recving = stack.get_finished(set())
    stack.clear_connector_metadata()
    if output:
        stack.update_connector_output(
            KVConnectorOutput(finished_sending=frozenset(sending or ()), finished_recving=frozenset(recving or ()))
        )
    return sending, recving


def _loading(stack: Any, request_id: str = "a") -> Id:
    request = Id(request_id)
    assert stack.get_num_new_matched_tokens(request, 16) == (48, True)
    stack.update_state_after_alloc(request, ([*BLOCKS],), 48)
    assert _step(stack) == (None, None)  # the load ships; the engine waits for its receive
    return request


def _front_saw(front: HMA) -> list[Any]:
    return [args[1] for method, args in front.calls if method == "request_finished_all_groups"]


def test_an_abort_mid_load_is_not_kept_by_the_stack_and_its_receive_waits_for_the_save() -> None:
    stack, front, back = _stack()
    request = _loading(stack)
    delay_free, _ = stack.request_finished_all_groups(request, ([*BLOCKS],))
    assert delay_free is False, "the engine keeps the blocks until the receive; the stack keeping them too is a double free"
    assert _front_saw(front) == [([5, 0, 0, 0],)], "the engine's own prefix is saved, the unfinished load is not"
    back.finished = (None, {"a"})
    assert _step(stack) == (None, None), "the front tier still reads block 5: the receive would free it"
    front.finished = ({"a"}, None)
    assert _step(stack) == (None, {"a"}), "the save is over: the receive frees the blocks, and no send is reported"
    for _ in range(2):
        assert _step(stack) == (None, None)
    assert stack.dropped_reports == {}


def test_a_save_over_before_the_load_is_folded_too() -> None:
    stack, front, back = _stack()
    request = _loading(stack)
    assert stack.request_finished_all_groups(request, ([*BLOCKS],))[0] is False
    front.finished = ({"a"}, None)
    assert _step(stack) == (None, None), "no send: the engine is not keeping the blocks for one"
    back.finished = (None, {"a"})
    assert _step(stack) == (None, {"a"})


def test_an_abort_mid_load_with_a_step_in_flight_hands_every_child_the_null_block() -> None:
    """The step in flight may have reported the receive already: a save folded into it could come too late."""
    stack, front, back = _stack()
    request = _loading(stack)
    back.finished = (None, {"a"})
    assert _step(stack, output=False) == (None, {"a"})
    assert stack.request_finished_all_groups(request, ([*BLOCKS],))[0] is False
    assert _front_saw(front) == [([0, 0, 0, 0],)], "block 5 is freed at that receive: nothing of it may be saved"
    stack.update_connector_output(KVConnectorOutput(finished_recving=frozenset({"a"})))
    front.finished = ({"a"}, None)
    assert _step(stack) == (None, None), "a save of the null block ends in nothing the engine waits for"


def test_a_fold_into_a_load_over_but_not_reported_holds_it_and_the_ids_later_loads() -> None:
    """Two loads of a reused id over at once are reported one per call; a fold takes the waiting one back."""
    front = HMA("front", slices=True)
    x = HMA("x", slices=True, load_async=True)
    y = HMA("y", hit=tiered(16, 64), slices=True, load_async=True)
    stack = MultiConnector(front, x, y)
    stack.bind_kv_spec(spec(16))
    first = _loading(stack)  # load 1: y's
    assert stack.request_finished_all_groups(first, ([*BLOCKS],))[0] is False  # aborted; nobody saves
    x.hit, y.hit = tiered(16, 64), 0
    second = _loading(stack)  # the id reused while load 1 runs; load 2: x's
    x.finished = (None, {"a"})
    assert _step(stack) == (None, None), "load 2 is over, but load 1 of the id is reported first"
    y.finished = (None, {"a"})
    assert _step(stack) == (None, {"a"}), "load 1; load 2 waits for the next call"
    front.delay_free = True
    assert stack.request_finished_all_groups(second, ([*BLOCKS],))[0] is False  # aborted mid-load 2
    assert _step(stack) == (None, None), "the front tier still reads block 5: load 2's receive waits for it"
    front.finished = ({"a"}, None)
    assert _step(stack) == (None, {"a"})
    assert _step(stack) == (None, None)
    assert stack.dropped_reports == {}


def test_a_stack_copied_or_pickled_mid_fold_keeps_it() -> None:
    stack, front, back = _stack()
    request = _loading(stack)
    stack.request_finished_all_groups(request, ([*BLOCKS],))
    for twin in (copy.deepcopy(stack), pickle.loads(pickle.dumps(stack))):
        twin_front, twin_back = twin.children
        twin_back.finished = (None, {"a"})
        assert _step(twin) == (None, None)
        twin_front.finished = ({"a"}, None)
        assert _step(twin) == (None, {"a"})
