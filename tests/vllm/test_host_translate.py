"""The host's translations between vLLM's objects and capkv's, one by one (real vLLM classes, no engine)."""

from __future__ import annotations

import pytest

from capkv import MetadataError
from capkv.connectors import SaveReport


def test_a_load_reported_asynchronous_with_several_groups_is_finished_and_failed_by_request() -> None:
    """Several groups: vLLM hears every load as asynchronous; the worker reports it finished in the
    step it ran, failed when a block of it failed, and never a flat block id."""
    from capkv import KVGroupSpec, KVSpec
    from capkv.adapters.vllm._loads import LoadPlanner, LoadTracker

    spec = KVSpec(num_groups=2, num_blocks=64, groups=(KVGroupSpec(block_size=16),) * 2)
    planner, tracker = LoadPlanner(spec), LoadTracker(spec, owner="host")
    assert planner.answer("a", 0, 32, False) == (32, True)
    assert planner.answer("b", 16, 16, False) == (16, True)
    assert planner.answer("c", 0, 0, False) == (0, False)
    planner.allocated("a", ([1, 2, 3], [4, 5, 6]), 32)
    planner.allocated("b", ([7, 8], [9, 10]), 16)
    planner.allocated("c", ([11], [12]), 0)
    loads = planner.take()
    assert [(p.request_id, p.host_async) for p in loads] == [("a", True), ("b", True)]
    tracker.bind(loads)
    assert tracker.host_async_in_step
    settled = tracker.settle(None, {1: {5}})
    assert (settled.finished_recving, settled.failed_recving, settled.flat_errors) == ({"a", "b"}, {"a"}, set())
    assert (settled.landed, settled.failed, settled.errors) == (frozenset({"b"}), frozenset({"a"}), {1: {5}})
    # the scheduler side: the stack never expected these receives; "a" is never offered a load again
    assert planner.reported({"a", "b"}, settled.landed, settled.failed) == frozenset()
    assert planner.refuses("a") and not planner.refuses("b")
    # a late error (the load is over) is dropped and counted, never raised
    assert tracker.settle(None, {0: {1}}).errors == {} and tracker.dropped == 1


def test_a_request_finishing_before_its_load_is_confirmed_hands_over_no_loaded_block() -> None:
    from capkv import KVGroupSpec, KVSpec
    from capkv.adapters.vllm._loads import LoadPlanner

    spec = KVSpec(num_groups=2, num_blocks=64, groups=(KVGroupSpec(block_size=16),) * 2)
    planner = LoadPlanner(spec)
    planner.answer("a", 16, 32, False)
    planner.allocated("a", ([1, 2, 3], [4, 5, 6]), 32)
    planner.take()
    assert planner.finishing("a", ([1, 2, 3], [4, 5, 6])) == ([1, 0, 0], [4, 0, 0])
    planner.answer("b", 0, 16, False)
    planner.allocated("b", ([7, 8], [9, 10]), 16)
    planner.reported((), {"b"}, ())
    assert planner.finishing("b", ([7, 8], [9, 10])) == ([7, 8], [9, 10])  # confirmed: every block is real


def test_a_load_is_confirmed_once_every_worker_reported_it_landed() -> None:
    """Tensor parallelism: each worker loads its shard, and one may report a step after another; until the
    last one did, a request that ends hands the stack none of the load's blocks."""
    from capkv import KVGroupSpec, KVShard, KVSpec
    from capkv.adapters.vllm._loads import LoadPlanner

    spec = KVSpec(num_groups=1, num_blocks=64, groups=(KVGroupSpec(block_size=16),), shard=KVShard(tp_size=2))
    planner = LoadPlanner(spec)
    planner.answer("a", 16, 32, True)
    planner.allocated("a", ([1, 2, 3],), 32)
    planner.take()
    planner.reported((), {"a": 1}, ())  # rank 0's report; rank 1's load still runs
    assert planner.finishing("a", ([1, 2, 3],)) == ([1, 0, 0],)
    planner.answer("b", 16, 32, True)
    planner.allocated("b", ([4, 5, 6],), 32)
    planner.take()
    planner.reported((), {"b": 1}, ())
    planner.reported((), ["b"], ())  # a step later, rank 1's
    assert planner.finishing("b", ([4, 5, 6],)) == ([4, 5, 6],)


def test_one_group_reports_flat_block_ids_for_sync_and_async_loads() -> None:
    from capkv import KVGroupSpec, KVSpec
    from capkv.adapters.vllm._loads import LoadPlanner, LoadTracker

    spec = KVSpec(num_groups=1, num_blocks=64, groups=(KVGroupSpec(block_size=16),) * 1)
    planner, tracker = LoadPlanner(spec), LoadTracker(spec, owner="host")
    assert planner.answer("sync", 0, 32, False) == (32, False)
    assert planner.answer("async", 0, 32, True) == (32, True)
    planner.allocated("sync", ([1, 2],), 32)
    planner.allocated("async", ([3, 4],), 32)
    tracker.bind(planner.take())
    first = tracker.settle(None, {0: {2, 4}})
    assert (first.finished_recving, first.failed_recving, first.flat_errors) == (set(), set(), {2, 4})
    assert (first.landed, first.failed) == (frozenset(), frozenset({"sync"}))
    second = tracker.settle({"async"}, {})  # the asynchronous load ends a step later: failed then
    assert (second.finished_recving, second.failed) == ({"async"}, frozenset({"async"}))


def test_a_step_whose_loads_could_not_run_fails_every_one_of_them() -> None:
    """Every load of the step failed, and only the blocks each was loading: never the blocks of the
    request's local hit (another request may share them) nor blocks beyond the load."""
    from capkv import KVGroupSpec, KVSpec
    from capkv.adapters.vllm._loads import LoadPlanner, LoadTracker

    spec = KVSpec(num_groups=2, num_blocks=64, groups=(KVGroupSpec(block_size=16),) * 2)
    planner, tracker = LoadPlanner(spec), LoadTracker(spec, owner="host")
    planner.answer("a", 16, 16, False)  # the local hit is block 0 (shared, maybe); the load is block 1
    planner.allocated("a", ([7, 1, 9], [8, 2, 3]), 16)
    tracker.bind(planner.take())
    tracker.fail_step()
    settled = tracker.settle(None, {})
    assert (settled.failed_recving, settled.errors) == ({"a"}, {0: {1}, 1: {2}})
    one = KVSpec(num_groups=1, num_blocks=64, groups=(KVGroupSpec(block_size=16),))
    planner, tracker = LoadPlanner(one), LoadTracker(one, owner="host")
    planner.answer("c", 32, 32, False)
    planner.allocated("c", ([5, 6, 11, 12, 13],), 32)
    tracker.bind(planner.take())
    tracker.fail_step()
    assert tracker.settle(None, {}).flat_errors == {11, 12}  # vLLM's flat set: the loaded blocks only
    planner.answer("b", 0, 16, False)
    planner.allocated("b", ([4], [5]), 16, failed=True)  # a child failed planning it
    tracker.bind(planner.take())
    assert tracker.settle(None, {}).failed == frozenset({"b"})


def test_stats_travel_in_vllms_types_per_child_class() -> None:
    """vLLM's composite's shape: per child class, a vLLM child's own stats object, capkv's counters
    as CapkvStats (whose reduce is every counter), the host's own under "capkv"."""
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats
    from vllm.distributed.kv_transfer.kv_connector.v1.multi_connector import MultiKVConnectorStats

    from capkv.adapters.vllm._stats import CapkvStats, StatNode, host_stats, merge_counts, rebuild_stats, stats_data

    class Theirs(KVConnectorStats):
        def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
            return Theirs({"xfers": self.data["xfers"] + other.data["xfers"]})

        def reduce(self) -> dict[str, int | float]:
            return {"Num transfers": len(self.data["xfers"])}

    children = [StatNode("FileStoreConnector", False), StatNode("ExampleConnector", True), StatNode("FileStoreConnector", False)]
    stats = host_stats(
        children, {0: {"loaded_blocks": 2}, 1: Theirs({"xfers": [1.0]}), 2: {"loaded_blocks": 3, "hit_tokens": 64}},
        {"contained_errors": 1}, composite=True,
    )
    assert isinstance(stats, MultiKVConnectorStats)
    assert stats.reduce() == {
        "FileStoreConnector": {"loaded_blocks": 5, "hit_tokens": 64},
        "ExampleConnector": {"Num transfers": 1},
        "capkv": {"contained_errors": 1},
    }
    assert host_stats([StatNode("FileStoreConnector", False)], {"saved_blocks": 4}, {}, composite=False) is not None
    assert host_stats([StatNode("FileStoreConnector", False)], None, {}, composite=False) is None
    # across processes: rebuilt per key; capkv's connectors by capkv's registry, vLLM's by vLLM's
    rebuilt = rebuild_stats({"FileStoreConnector": {"loaded_blocks": 5}, "capkv": {"contained_errors": 1}})
    assert rebuilt.data == {"FileStoreConnector": CapkvStats({"loaded_blocks": 5}), "capkv": CapkvStats({"contained_errors": 1})}
    with pytest.raises(ValueError, match="Connector 'NoSuchConnector' is not registered"):
        rebuild_stats({"NoSuchConnector": {}})
    # a capkv child named as a vLLM connector is (MultiConnector), and a nested host's statistics, cross a process
    nested = host_stats([StatNode("MultiConnector", False)], {0: {1: {"loaded_blocks": 2}}}, {}, composite=True)
    outer = host_stats([StatNode("CapkvHMAConnector", True)], {0: nested}, {}, composite=True)
    assert outer is not None
    back = rebuild_stats(outer.to_dict())
    assert back.reduce() == outer.reduce() == {"CapkvHMAConnector": {"MultiConnector": {"#2.loaded_blocks": 2}}}
    assert stats_data({1: {"hit_tokens": 64}}) == {"#2": {"hit_tokens": 64}}
    assert merge_counts({"a": 1, "b": "x"}, {"a": 2, "b": "y", "c": True}) == {"a": 3, "b": "y", "c": True}
    # a vLLM connector inside a nested capkv composite reports at the top under its class, as in vLLM's composite
    tree = [StatNode("MultiConnector", False, (StatNode("ExampleConnector", True), StatNode("FileStoreConnector", False)))]
    lifted = host_stats(tree, {0: {0: Theirs({"xfers": [1.0, 2.0]}), 1: {"saved_blocks": 3}}}, {}, composite=True)
    assert lifted is not None and lifted.reduce() == {
        "MultiConnector": {"#2.saved_blocks": 3}, "ExampleConnector": {"Num transfers": 2},
    }
    only = host_stats(tree, {0: {0: Theirs({"xfers": [1.0]})}}, {}, composite=True)
    assert only is not None and only.reduce() == {"ExampleConnector": {"Num transfers": 1}}
    nested = CapkvStats({"#2": {"loaded_blocks": 4}})
    assert nested.reduce() == {"#2.loaded_blocks": 4} and not nested.is_empty()
    nested.reset()
    assert nested.is_empty()


def test_worker_metadata_travels_in_vllms_composite_envelope() -> None:
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorWorkerMetadata
    from vllm.distributed.kv_transfer.kv_connector.v1.multi_connector import MultiKVConnectorWorkerMetadata

    from capkv.adapters.vllm._translate import HostWorkerMetadata, host_worker_meta, stack_worker_meta
    from capkv.composite._metadata import MultiWorkerMetadata

    one = host_worker_meta(SaveReport(loaded_through=3), False, errors={0: frozenset({1})}, landed=frozenset({"a", "b"}))
    two = host_worker_meta(None, False, errors={0: frozenset({2}), 1: frozenset({3})}, landed=frozenset({"a"}),
                           failed=frozenset({"b"}))
    assert isinstance(one, MultiKVConnectorWorkerMetadata) and isinstance(one, KVConnectorWorkerMetadata)
    merged = one.aggregate(two)
    assert stack_worker_meta(merged, False) == SaveReport(loaded_through=3)
    assert merged.errors == {0: frozenset({1, 2}), 1: frozenset({3})}
    assert (merged.landed, merged.failed) == ({"a": 2}, frozenset({"b"}))  # failed on any worker: failed
    per_child = host_worker_meta(MultiWorkerMetadata((None, SaveReport(loaded_through=1))), True)
    assert per_child.metadata == (None, SaveReport(loaded_through=1))  # vLLM's composite's shape
    assert stack_worker_meta(per_child, True) == MultiWorkerMetadata((None, SaveReport(loaded_through=1)))

    class Foreign(KVConnectorWorkerMetadata):
        def aggregate(self, other: KVConnectorWorkerMetadata) -> KVConnectorWorkerMetadata:
            return self

    with pytest.raises(MetadataError, match="expected another HostWorkerMetadata"):
        one.aggregate(Foreign())
    assert isinstance(one.aggregate(MultiKVConnectorWorkerMetadata((None,))), HostWorkerMetadata)


def test_vllm_output_becomes_capkv_output() -> None:
    from vllm.v1.outputs import KVConnectorOutput

    from capkv import KVConnectorOutput as CapkvOutput
    from capkv import KVGroupSpec, KVSpec
    from capkv.adapters.vllm._loads import LoadPlanner
    from capkv.adapters.vllm._translate import host_worker_meta, to_capkv_output

    planner = LoadPlanner(KVSpec(num_groups=1, num_blocks=8, groups=(KVGroupSpec(block_size=16),)))
    report = SaveReport(loaded_through=1)
    vllm_output = KVConnectorOutput(
        finished_sending={"s"}, finished_recving=None,
        kv_connector_worker_meta=host_worker_meta(report, False, errors={0: frozenset({5})}, failed=frozenset({"r"})),
        invalid_block_ids={5},
    )
    got = to_capkv_output(vllm_output, planner, composite=False, owner="CapkvConnector")
    assert CapkvOutput(
        finished_sending=got.finished_sending, finished_recving=got.finished_recving, worker_meta=got.worker_meta,
        invalid_block_ids=got.invalid_block_ids,
    ) == CapkvOutput(
        finished_sending=frozenset({"s"}), finished_recving=frozenset(), worker_meta=report,
        invalid_block_ids={0: frozenset({5})},
    )
    assert planner.refuses("r")
    with pytest.raises(MetadataError, match="expected HostWorkerMetadata from the workers"):
        to_capkv_output(KVConnectorOutput(kv_connector_worker_meta=report), planner, composite=False, owner="CapkvConnector")  # type: ignore[arg-type]


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


def test_a_connector_vllm_checks_by_name_is_named_where_vllm_does_not_look(caplog: pytest.LogCaptureFixture) -> None:
    """vLLM's configuration checks find NixlConnector only at the top level or among a "MultiConnector"'s own
    entries: behind a host (or nested deeper in the drop-in) capkv says so, naming it."""
    from capkv.adapters.vllm._stack import load_hosted
    from capkv.adapters.vllm._visibility import warn_hidden

    nixl = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
    store = {"kv_connector": "CPUOffloadConnector", "kv_connector_extra_config": {"capacity_blocks": 8}}
    flat = load_hosted({"kv_connector": "MultiConnector", "kv_connector_extra_config": {"connectors": [nixl, store]}})
    assert warn_hidden("MultiConnector", flat, top_level_visible=True) == []
    with caplog.at_level("WARNING", logger="capkv.vllm"):
        assert warn_hidden("CapkvHMAConnector", flat, top_level_visible=False) == ["#1 NixlConnector"]
    assert "vLLM's configuration checks for #1 NixlConnector do not see it" in caplog.text
    deeper = load_hosted({"kv_connector": "MultiConnector", "kv_connector_extra_config": {"connectors": [
        {"kv_connector": "MultiConnector", "kv_connector_extra_config": {"connectors": [store, nixl]}}]}})
    assert warn_hidden("MultiConnector", deeper, top_level_visible=True) == ["#1.2 NixlConnector"]
