"""MultiConnector's composite semantics, child by child."""

from __future__ import annotations

from contextlib import nullcontext

import pytest
import torch

from capkv import (
    ConflictError,
    ContractError,
    FinishError,
    SubConnectorError,
    KVConnectorOutput,
    MetadataError,
    MultiConnector,
    MultiConnectorMetadata,
    MultiWorkerMetadata,
)
from tests.fakes import HMA, FakeWorkerMeta, Plain, Req

R = Req("r1")


def allocated(child: HMA) -> tuple[object, int]:
    """The blocks and external token count of the child's last ``update_state_after_alloc``."""
    _, args = next(call for call in reversed(child.calls) if call[0] == "update_state_after_alloc")
    return args[1], args[2]


def step(stack: MultiConnector, finished: set[str] | None = None) -> tuple[set[str] | None, set[str] | None]:  # type: ignore[type-arg]
    """One engine step's worth of composite calls: metadata across, then completions back."""
    stack.bind_connector_metadata(stack.build_connector_meta(None))
    result = stack.get_finished(finished or set())
    stack.clear_connector_metadata()
    return result


# ---- loading ---------------------------------------------------------------------


def test_the_first_child_with_a_hit_loads_and_the_others_get_zero() -> None:
    a, b, c = HMA("a", hit=0), HMA("b", hit=32, load_async=True), HMA("c", hit=64)
    stack = MultiConnector(a, b, c)
    assert stack.get_num_new_matched_tokens(R, 16) == (32, True)
    assert all(ch.methods() == ["get_num_new_matched_tokens"] for ch in (a, b, c)), "every child is asked"
    stack.update_state_after_alloc(R, ([1, 2], [3]), 32)
    assert [allocated(ch)[1] for ch in (a, b, c)] == [0, 32, 0]
    assert all(allocated(ch)[0] == ([1, 2], [3]) for ch in (a, b, c)), "everyone gets the real blocks"
    assert ("loaded_elsewhere", (R, 16, 48, False)) in a.calls, "a child that saves learns who loaded what"


def test_no_hit_means_zero_tokens_for_everyone() -> None:
    a, b = HMA("a"), HMA("b")
    stack = MultiConnector(a, b)
    assert stack.get_num_new_matched_tokens(R, 0) == (0, False)
    stack.update_state_after_alloc(R, ([1],), 0)
    assert [allocated(ch)[1] for ch in (a, b)] == [0, 0]


def test_none_from_any_child_means_ask_again_and_forgets_the_choice() -> None:
    a, b = HMA("a", hit=16), HMA("b", hit=None)
    stack = MultiConnector(a, b)
    assert stack.get_num_new_matched_tokens(R, 0) == (None, False)
    with pytest.raises(ContractError, match="offered 0"):
        stack.update_state_after_alloc(R, ([1],), 16)
    stack.update_state_after_alloc(R, ([1],), 0)
    assert [allocated(ch)[1] for ch in (a, b)] == [0, 0], "no child was chosen while a child was still looking"
    b.hit = 0
    assert stack.get_num_new_matched_tokens(R, 0) == (16, False)


@pytest.mark.parametrize("bad", [-1, 1.5, "16", True, False])
def test_a_childs_hit_must_be_a_token_count(bad: object) -> None:
    a, b = HMA("a"), HMA("b", hit=bad)  # type: ignore[arg-type]
    with pytest.raises(SubConnectorError, match=r"#2 HMA.get_num_new_matched_tokens returned tuple") as info:
        MultiConnector(a, b).get_num_new_matched_tokens(R, 0)
    (error,) = info.value.exceptions
    assert isinstance(error, ContractError)
    assert (error.connector, error.method, error.value) == ("#2 HMA", "get_num_new_matched_tokens", (bad, False))


def test_finish_errors_say_whether_to_keep_the_blocks() -> None:
    a, b = HMA("a"), HMA("b")
    a.delay_free = True
    a.params, b.params = {"host": "x"}, {"host": "y"}
    with pytest.raises(FinishError) as clash:
        MultiConnector(a, b).request_finished_all_groups(R, ([1],))
    assert clash.value.delay_free is True
    assert isinstance(clash.value.exceptions[0], ConflictError)
    assert clash.value.kv_transfer_params == {"host": "x"}, "the first child's params are kept"

    c, d = HMA("c"), HMA("d")
    c.delay_free = True

    def broken(request: object, block_ids: object, /) -> tuple[bool, None]:
        raise OSError("disk gone")

    d.request_finished_all_groups = broken  # type: ignore[method-assign]
    with pytest.raises(FinishError, match=r"keep its blocks \(delay_free=True\): #1 HMA accepted") as failure:
        MultiConnector(c, d).request_finished_all_groups(R, ([1],))
    assert failure.value.delay_free is True
    assert isinstance(failure.value.exceptions[0], OSError) and failure.value.connector == "#2 HMA"
    c.delay_free = False
    d2 = HMA("d2")
    d2.request_finished_all_groups = broken  # type: ignore[method-assign]
    with pytest.raises(FinishError, match=r"its blocks may be freed \(delay_free=False\)") as nobody:
        MultiConnector(c, d2).request_finished_all_groups(R, ([1],))
    assert nobody.value.delay_free is False


def test_one_connector_cannot_sit_at_two_places() -> None:
    from capkv import ConfigError

    a = HMA("a")
    with pytest.raises(ConfigError, match=r'sub-connector #2.2 "HMA" is the same object as #1'):
        MultiConnector(a, MultiConnector(HMA("b"), a))


# ---- saving and finishing ----------------------------------------------------------


def test_saves_reach_every_child() -> None:
    a, b = HMA("a"), Plain("b")
    stack = MultiConnector(a, b)
    kv = torch.zeros(2)
    stack.start_load_kv("ctx", step=1)
    stack.wait_for_layer_load("layer.0")
    stack.save_kv_layer("layer.0", kv, "attn", step=1)
    stack.wait_for_save()
    for child in (a, b):
        assert child.methods() == ["start_load_kv", "wait_for_layer_load", "save_kv_layer", "wait_for_save"]
        assert child.calls[2][1] == ("layer.0", kv, "attn", {"step": 1})
        assert child.calls[0][1] == ("ctx", {"step": 1})


@pytest.mark.parametrize("method", ["request_finished", "request_finished_all_groups"])
def test_send_finishes_only_after_every_async_saver_reports(method: str) -> None:
    a, b, c = HMA("a"), HMA("b"), HMA("c")
    a.delay_free = c.delay_free = True
    stack = MultiConnector(a, b, c)
    block_ids = [1, 2] if method == "request_finished" else ([1, 2], [3])
    assert getattr(stack, method)(R, block_ids) == (True, None)
    assert [ch.methods()[-1] for ch in (a, b, c)] == [method] * 3
    a.finished = ({"r1"}, None)
    assert step(stack) == (None, None), "one of two savers is not enough"
    assert step(stack) == (None, None)
    c.finished = ({"r1"}, None)
    assert step(stack) == ({"r1"}, None)
    c.finished = ({"r1"}, None)
    assert step(stack) == (None, None), "a report after the stack reported r1 is dropped"


def test_two_savers_reporting_in_the_same_step_finish_once() -> None:
    a, b = HMA("a"), HMA("b")
    a.delay_free = b.delay_free = True
    stack = MultiConnector(a, b)
    stack.request_finished_all_groups(R, ([1],))
    a.finished = b.finished = ({"r1"}, None)
    assert step(stack) == ({"r1"}, None)


def test_a_single_async_saver_finishes_at_its_first_report() -> None:
    a, b = HMA("a"), HMA("b")
    b.delay_free = True
    stack = MultiConnector(a, b)
    assert stack.request_finished_all_groups(R, ([1],)) == (True, None)
    b.finished = ({"r1"}, None)
    assert step(stack) == ({"r1"}, None)


def test_no_async_saver_frees_immediately() -> None:
    stack = MultiConnector(HMA("a"), HMA("b"))
    assert stack.request_finished_all_groups(R, ([1],)) == (False, None)


def test_transfer_params_are_merged() -> None:
    a, b = HMA("a"), HMA("b")
    a.params, b.params = {"host": "x"}, {"port": 1}
    stack = MultiConnector(a, b)
    assert stack.request_finished_all_groups(R, ([1],)) == (False, {"host": "x", "port": 1})
    assert a.params == {"host": "x"}, "children's dicts are not mutated"


def test_a_transfer_params_key_clash_is_an_error_that_keeps_the_save_count() -> None:
    a, b = HMA("a"), HMA("b")
    a.params, b.params = {"host": "x"}, {"host": "y"}
    a.delay_free = b.delay_free = True
    stack = MultiConnector(a, b)
    with pytest.raises(FinishError, match=r"#2 HMA.request_finished_all_groups returned kv_transfer_params key 'host', already returned by #1 HMA") as info:
        stack.request_finished_all_groups(R, ([1],))
    (clash,) = info.value.exceptions
    assert isinstance(clash, ConflictError)
    assert clash.value == "host" and clash.method == "request_finished_all_groups"
    assert info.value.delay_free is True
    a.finished = ({"r1"}, None)
    assert step(stack) == (None, None), "blocks are still held for the second saver"
    b.finished = ({"r1"}, None)
    assert step(stack) == ({"r1"}, None)


# ---- receiving, errors, events -----------------------------------------------------


def load_through(stack: MultiConnector, request: Req = R) -> None:  # type: ignore[type-arg]
    """Schedule a load of ``request`` the way the engine does (the first child with a hit loads)."""
    tokens, _ = stack.get_num_new_matched_tokens(request, 0)
    assert tokens
    stack.update_state_after_alloc(request, ([1, 2],), tokens)


def test_a_receive_is_reported_once_in_the_same_step() -> None:
    a, b = HMA("a", hit=32, load_async=True), HMA("b", hit=32, load_async=True)
    stack = MultiConnector(a, b)
    load_through(stack)
    a.finished = b.finished = (None, {"r1"})
    assert step(stack) == (None, {"r1"})


def test_only_the_loading_childs_receive_counts_across_steps() -> None:
    a, b = HMA("a", hit=0), HMA("b", hit=32, load_async=True)
    stack = MultiConnector(a, b)
    load_through(stack)
    a.finished = (None, {"r1"})
    assert step(stack) == (None, None), "child #1 did not load r1: its report is a duplicate"
    b.finished = (None, {"r1"})
    assert step(stack) == (None, {"r1"})
    a.finished = (None, {"r1"})
    assert step(stack) == (None, None), "a late duplicate after the real report is dropped too"


def test_a_request_loaded_again_after_preemption_is_reported_again() -> None:
    a, b = HMA("a", hit=32, load_async=True), HMA("b", hit=32, load_async=True)
    stack = MultiConnector(a, b)
    load_through(stack)
    a.finished = (None, {"r1"})
    assert step(stack) == (None, {"r1"})
    load_through(stack)  # preempted, then loaded again
    a.finished = b.finished = (None, {"r1"})
    assert step(stack) == (None, {"r1"})


def test_an_unannounced_receive_is_dropped_and_counted() -> None:
    from capkv.composite import Drop

    a, b = HMA("a"), HMA("b")
    stack = MultiConnector(a, b)
    a.finished = b.finished = (None, {"r9"})
    assert step(stack) == (None, None), "no child was loading r9: the engine is not waiting for it"
    assert dict(stack.dropped_reports) == {("#1 HMA", Drop.RECV_NOT_PENDING): 1, ("#2 HMA", Drop.RECV_NOT_PENDING): 1}


@pytest.mark.parametrize("bad", [["r1"], "r1", ("r1",)])
def test_request_ids_must_come_as_sets(bad: object) -> None:
    a = HMA("a")
    a.finished = (None, bad)  # type: ignore[assignment]
    with pytest.raises(SubConnectorError, match=r"#1 HMA.get_finished returned tuple") as info:
        step(MultiConnector(a))
    assert isinstance(info.value.exceptions[0], ContractError)


def test_a_flat_set_of_load_errors_is_refused_with_the_per_group_shape() -> None:
    a = HMA("a")
    a.load_errors = {3, 4}  # type: ignore[assignment]
    with pytest.raises(SubConnectorError, match=r"#1 HMA.get_block_ids_with_load_errors returned set .*per KV-cache group") as info:
        MultiConnector(a).get_block_ids_with_load_errors()
    assert isinstance(info.value.exceptions[0], ContractError)


def test_load_errors_are_kept_per_group() -> None:
    a, b = HMA("a"), HMA("b")
    a.load_errors = {0: {3}, 1: {3}}
    b.load_errors = {1: {4}, 2: set()}
    assert MultiConnector(a, b).get_block_ids_with_load_errors() == {0: {3}, 1: {3, 4}}


def test_events_of_every_child_in_order() -> None:
    a, b = HMA("a"), HMA("b")
    a.events, b.events = ["a1", "a2"], ["b1"]
    stack = MultiConnector(a, b)
    assert list(stack.take_events()) == ["a1", "a2", "b1"]
    assert list(stack.take_events()) == []


# ---- metadata ---------------------------------------------------------------------


def test_connector_metadata_goes_to_each_child_in_order() -> None:
    a, b = HMA("a"), HMA("b")
    stack = MultiConnector(a, b)
    metadata = stack.build_connector_meta("sched")
    assert metadata == MultiConnectorMetadata(("meta-a", "meta-b"))
    stack.bind_connector_metadata(metadata)
    stack.handle_preemptions(metadata)
    stack.clear_connector_metadata()
    assert a.calls[-3:] == [("bind_connector_metadata", ("meta-a",)), ("handle_preemptions", ("meta-a",)), ("clear_connector_metadata", ())]
    assert b.calls[-3][1] == ("meta-b",)


@pytest.mark.parametrize("bad", ["meta", MultiConnectorMetadata(("only-one",))])
def test_foreign_metadata_is_refused(bad: object) -> None:
    stack = MultiConnector(HMA("a"), HMA("b"))
    with pytest.raises(MetadataError, match="expected MultiConnectorMetadata with 2 children"):
        stack.bind_connector_metadata(bad)
    with pytest.raises(MetadataError):
        stack.handle_preemptions(bad)


def test_worker_metadata_is_aggregated_child_by_child() -> None:
    a, b, c = HMA("a"), HMA("b"), HMA("c")
    stack = MultiConnector(a, b, c)
    assert stack.build_connector_worker_meta() is None
    a.worker_meta, c.worker_meta = FakeWorkerMeta(("a1",)), FakeWorkerMeta(("c1",))
    first = stack.build_connector_worker_meta()
    assert first == MultiWorkerMetadata((FakeWorkerMeta(("a1",)), None, FakeWorkerMeta(("c1",))))
    a.worker_meta, b.worker_meta, c.worker_meta = None, FakeWorkerMeta(("b2",)), FakeWorkerMeta(("c2",))
    second = stack.build_connector_worker_meta()
    assert first is not None and second is not None
    merged = first.aggregate(second)
    assert merged == MultiWorkerMetadata((FakeWorkerMeta(("a1",)), FakeWorkerMeta(("b2",)), FakeWorkerMeta(("c1", "c2"))))
    with pytest.raises(MetadataError):
        first.aggregate(MultiWorkerMetadata((None,)))

    seen: list[tuple[object, frozenset[str]]] = []

    class Reads(HMA):
        def update_connector_output(self, connector_output: KVConnectorOutput, /) -> None:
            seen.append((connector_output.worker_meta, connector_output.finished_sending))

    readers = MultiConnector(Reads("a"), Reads("b"), Reads("c"))
    output = KVConnectorOutput(finished_sending=frozenset({"r"}), worker_meta=merged)
    readers.update_connector_output(output)
    assert [meta for meta, _ in seen] == list(merged.children), "each child reads its own share during its call"
    assert all(sending == {"r"} for _, sending in seen)
    assert output.worker_meta is merged, "the engine's worker metadata is back after the call"

    class Raises(Reads):
        def update_connector_output(self, connector_output: KVConnectorOutput, /) -> None:
            super().update_connector_output(connector_output)
            raise RuntimeError("boom")

    with pytest.raises(SubConnectorError):
        MultiConnector(Raises("a"), Reads("b"), Reads("c")).update_connector_output(output)
    assert output.worker_meta is merged, "... also when a child raised"


def test_output_without_worker_metadata_reaches_every_child() -> None:
    a, b = HMA("a"), HMA("b")
    output = KVConnectorOutput(finished_recving=frozenset({"r"}))
    MultiConnector(a, b).update_connector_output(output)
    assert a.calls[-1][1][0] is output and b.calls[-1][1][0] is output


def test_foreign_worker_metadata_is_refused() -> None:
    with pytest.raises(MetadataError, match="update_connector_output"):
        MultiConnector(HMA("a")).update_connector_output(KVConnectorOutput(worker_meta=FakeWorkerMeta(())))


# ---- consistency members -------------------------------------------------------------


def test_each_child_gets_back_its_own_handshake_at_any_depth_and_a_foreign_one_reaches_everyone() -> None:
    a, b, c, d = HMA("a"), HMA("b"), HMA("c"), HMA("d")
    b.handshake, c.handshake, d.handshake = "hs-b", "hs-c", "hs-d"
    inner = MultiConnector(c, a)
    stack = MultiConnector(d, inner, b)
    by_rank = {rank: stack.get_handshake_metadata() for rank in (0, 1)}  # every worker's, as the engine collects
    stack.set_xfer_handshake_metadata(by_rank)
    assert b.calls[-1] == ("set_xfer_handshake_metadata", ({0: "hs-b", 1: "hs-b"},))
    assert c.calls[-1] == ("set_xfer_handshake_metadata", ({0: "hs-c", 1: "hs-c"},))
    assert d.calls[-1] == ("set_xfer_handshake_metadata", ({0: "hs-d", 1: "hs-d"},))
    assert a.calls[-1] == ("set_xfer_handshake_metadata", ({},))  # it produced none: it gets none
    stack.set_xfer_handshake_metadata({0: "peer"})  # not made per child (a peer's): every child learns it
    assert all(ch.calls[-1] == ("set_xfer_handshake_metadata", ({0: "peer"},)) for ch in (a, b, c, d))
    assert MultiConnector(a).get_handshake_metadata() is None


def test_layouts_must_agree() -> None:
    a, b, c = HMA("a"), HMA("b"), HMA("c")
    a.layout, c.layout = "HND", "HND"
    assert MultiConnector(a, b, c).get_required_kvcache_layout() == "HND"
    assert MultiConnector(b).get_required_kvcache_layout() is None
    c.layout = "NHD"
    with pytest.raises(ConflictError, match=r"get_required_kvcache_layout: sub-connectors disagree \(#1 HMA -> 'HND', #3 HMA -> 'NHD'\)"):
        MultiConnector(a, b, c).get_required_kvcache_layout()


def test_finished_counts_must_agree() -> None:
    a, b = HMA("a"), HMA("b")
    assert MultiConnector(a, b).get_finished_count() is None
    a.finished_count = b.finished_count = 1
    assert MultiConnector(a, b).get_finished_count() == 1
    b.finished_count = 2
    with pytest.raises(ConflictError, match="get_finished_count"):
        MultiConnector(a, b).get_finished_count()
    b.finished_count = None
    with pytest.raises(ConflictError, match=r"#2 HMA -> None"):
        MultiConnector(a, b).get_finished_count()


def test_at_most_one_memory_pool() -> None:
    a, b, c = HMA("a"), HMA("b"), HMA("c")
    b.pool = nullcontext()
    assert MultiConnector(a, b, c).get_mem_pool_context() is b.pool
    c.pool = nullcontext()
    with pytest.raises(ConflictError, match=r"several sub-connectors provide a KV-cache memory pool \(#2 HMA, #3 HMA\)"):
        MultiConnector(a, b, c).get_mem_pool_context()


def test_piecewise_cudagraph_if_any_child_needs_it() -> None:
    a, b = HMA("a"), HMA("b")
    assert not MultiConnector(a, b).requires_piecewise_for_cudagraph()
    b.piecewise = True
    assert MultiConnector(a, b).requires_piecewise_for_cudagraph()


def test_stats_are_kept_per_child() -> None:
    a, b, c = HMA("a"), HMA("b"), HMA("c")
    assert MultiConnector(a, b).get_kv_connector_stats() is None
    a.stats, c.stats = {"loaded": 1}, {"loaded": 2}
    assert MultiConnector(a, b, c).get_kv_connector_stats() == {0: {"loaded": 1}, 2: {"loaded": 2}}


def test_registering_kv_caches_reaches_every_child() -> None:
    a, b = HMA("a"), HMA("b")
    caches = {"layer.0": torch.zeros(1)}
    MultiConnector(a, b).register_kv_caches(caches)
    assert a.calls == b.calls == [("register_kv_caches", (caches,))]


# ---- shutdown ------------------------------------------------------------------------


def test_shutdown_reaches_every_child_and_reraises_the_failure() -> None:
    a, b, c = HMA("a"), HMA("b"), HMA("c")
    boom = RuntimeError("disk gone")
    b.shutdown_error = boom
    with pytest.raises(SubConnectorError, match="#2 HMA raised RuntimeError: disk gone") as info:
        MultiConnector(a, b, c).shutdown()
    assert info.value.exceptions == (boom,) and info.value.__cause__ is boom
    assert all(ch.methods() == ["shutdown"] for ch in (a, b, c))


def test_several_shutdown_failures_are_grouped() -> None:
    a, b = HMA("a"), HMA("b")
    a.shutdown_error, b.shutdown_error = RuntimeError("a"), ValueError("b")
    with pytest.raises(SubConnectorError) as info:
        MultiConnector(a, b).shutdown()
    assert [type(e) for e in info.value.exceptions] == [RuntimeError, ValueError]
