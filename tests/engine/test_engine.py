"""The reference engine: hybrid groups, the connector call order, bit-exact round trips, refusals."""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch

import capkv
from capkv.connectors import CPUOffloadConnector, FileStoreConnector, SingleGroupOffloadConnector
from capkv.engine import Engine, ModelShape, VerificationError, Workload
from capkv.engine._request import Request
from capkv.testing import NullConnector
from tests.engine.connectors import BlockStore, FailingLoads, Group0Only, OffByOne

SHAPE = ModelShape(
    num_layers=6, pattern="FSS", sliding_window=48, num_kv_heads=2, head_dim=8, block_size=16, num_blocks=512
)
WORKLOAD = Workload(num_requests=8, num_prefixes=2, prefix_len=70, suffix_len=20, max_tokens=4)


def cold_then_warm(shape: ModelShape, store: Any, workload: Workload = WORKLOAD, **engine: Any) -> Engine:
    """Serve the workload, forget the local cache (poisoning the paged KV), serve it again."""
    e = Engine(shape, store, **engine)
    e.run(workload.requests("cold"))
    e.reset_prefix_cache()
    e.stats.reset()
    e.run(workload.requests("warm"))
    return e


def test_hybrid_model_has_full_and_sliding_groups() -> None:
    groups = SHAPE.groups
    assert [g.sliding_window for g in groups] == [None, 48, 48]
    assert [g.layer_names for g in groups] == [
        ("layers.0.attn", "layers.3.attn"),
        ("layers.1.attn", "layers.2.attn"),
        ("layers.4.attn", "layers.5.attn"),
    ]
    spec = SHAPE.kv_spec()
    assert spec.num_groups == 3 and spec.null_block_id == 0 and spec.block_dim == 1
    assert spec.groups[1].kv_shape == (2, 512, 16, 2, 8)


@pytest.mark.parametrize("save", ["layer", "finish"])
@pytest.mark.parametrize("load_async", [False, True])
def test_round_trip_through_a_store_is_bit_exact(save: str, load_async: bool) -> None:
    store = BlockStore(SHAPE.kv_spec(), save=save, load_async=load_async)
    engine = cold_then_warm(SHAPE, store)
    stats = engine.stats
    assert stats.requests_finished == WORKLOAD.num_requests
    assert store.loaded_blocks > 0
    # Every request loads its whole block-aligned prompt; nothing came from the poisoned local cache.
    assert stats.local_hit_tokens == 0
    assert stats.external_hit_tokens == WORKLOAD.num_requests * 80
    full, sliding = stats.groups[0], stats.groups[1]
    assert full.loaded_tokens == WORKLOAD.num_requests * 80
    # A sliding group only loads the blocks its window still reads: the 47 tokens before position 80.
    assert sliding.loaded_tokens == WORKLOAD.num_requests * 48
    assert engine.pool.num_used == 0


@pytest.mark.parametrize(
    "shape",
    [
        ModelShape(num_layers=4, pattern="FS", sliding_window=33, num_kv_heads=1, head_dim=4, block_size=8, num_blocks=600),
        ModelShape(num_layers=3, pattern="SSF", sliding_window=17, num_kv_heads=2, head_dim=4, block_size=16,
                   sliding_block_size=8, num_blocks=600, dtype=torch.float16),
        ModelShape(num_layers=2, pattern="F", num_kv_heads=1, head_dim=4, block_size=4, num_blocks=600, dtype=torch.float32),
        ModelShape(num_layers=2, pattern="S", sliding_window=5, num_kv_heads=1, head_dim=4, block_size=4, num_blocks=600),
    ],
    ids=["window-not-block-aligned", "mixed-block-sizes", "full-only", "tiny-window"],
)
def test_other_shapes_round_trip(shape: ModelShape) -> None:
    store = BlockStore(shape.kv_spec())
    engine = cold_then_warm(shape, store)
    assert engine.stats.requests_finished == WORKLOAD.num_requests
    assert engine.stats.external_hit_tokens > 0


def test_later_requests_reuse_the_local_prefix_cache() -> None:
    store = BlockStore(SHAPE.kv_spec())
    engine = Engine(SHAPE, store, max_num_seqs=1)
    engine.run(WORKLOAD.requests())
    stats = engine.stats
    # One request at a time: the 2nd request of each prefix finds the first one's blocks locally.
    assert stats.local_hit_tokens > 0
    assert stats.groups[0].local_hit_tokens > stats.groups[1].local_hit_tokens > 0
    assert stats.external_hit_tokens == 0


def test_connector_calls_follow_vllms_order() -> None:
    store = BlockStore(SHAPE.kv_spec())
    Engine(SHAPE, store, max_num_seqs=2).run(WORKLOAD.requests())
    calls = " ".join(store.calls)
    every_layer = "(wait_for_layer_load save_kv_layer ){6}"
    step = (
        "(get_num_new_matched_tokens update_state_after_alloc )*build_connector_meta bind_connector_metadata "
        f"start_load_kv ({every_layer})?wait_for_save get_finished clear_connector_metadata "
        "(request_finished_all_groups )*update_connector_output"
    )
    assert re.fullmatch(f"register_kv_caches( {step})+", calls), calls
    assert calls.count("request_finished_all_groups") == WORKLOAD.num_requests


def test_finished_requests_hand_over_every_group_with_null_blocks_for_the_window() -> None:
    store = BlockStore(SHAPE.kv_spec())
    Engine(SHAPE, store).run(WORKLOAD.requests())
    for block_ids in store.finished_with.values():
        full, *sliding = block_ids
        computed = 70 + 20 + 4 - 1
        assert len(full) == -(-computed // 16) and 0 not in full
        for table in sliding:
            assert len(table) == len(full)
            # Positions before 93 - 48 + 1 = 46 are out of the window: blocks 0 and 1 are null.
            assert table[:2] == [0, 0] and 0 not in table[2:]
        real = [b for table in block_ids for b in table if b != 0]
        assert len(real) == len(set(real)), "a real block id is in two places"


def test_blocks_stay_allocated_until_the_save_is_reported() -> None:
    store = BlockStore(SHAPE.kv_spec(), save="finish")
    engine = Engine(SHAPE, store)
    for request in Workload(num_requests=1, prefix_len=40, suffix_len=0, max_tokens=1).requests():
        engine.add_request(request)
    _, finished = engine.step()
    assert [f.request.request_id for f in finished] == ["req-0"]
    assert finished[0].kv_transfer_params == {"saved_blocks": 6}
    assert engine.pool.num_used > 0
    engine.step()  # the store copies, then reports the request in finished_sending
    assert engine.pool.num_used == 0


class NeverFinishesSaving(BlockStore):
    def get_finished(self, finished_req_ids: set[str], /) -> tuple[set[str] | None, set[str] | None]:
        return None, None


class ReportsUnknownSends(BlockStore):
    def get_finished(self, finished_req_ids: set[str], /) -> tuple[set[str] | None, set[str] | None]:
        return {"nobody"}, None


def test_a_save_that_never_completes_is_reported_not_waited_on_forever() -> None:
    engine = Engine(SHAPE, NeverFinishesSaving(SHAPE.kv_spec(), save="finish"), transfer_timeout_s=0.05)
    with pytest.raises(capkv.ContractError, match="NeverFinishesSaving.*made no progress"):
        engine.run(WORKLOAD.requests())


def test_a_stray_finished_sending_is_a_contract_error() -> None:
    engine = Engine(SHAPE, ReportsUnknownSends(SHAPE.kv_spec()))
    with pytest.raises(capkv.ContractError, match="finished_sending for request 'nobody'") as caught:
        engine.run(WORKLOAD.requests())
    assert caught.value.method == "get_finished"


class AsksAgain(BlockStore):
    """Answers ``None`` (still looking) twice per request before answering."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.asked: dict[str, int] = {}

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int, /) -> tuple[int | None, bool]:
        self.asked[request.request_id] = self.asked.get(request.request_id, 0) + 1
        if self.asked[request.request_id] <= 2:
            return None, False
        return super().get_num_new_matched_tokens(request, num_computed_tokens)


def test_none_means_ask_again_next_step() -> None:
    store = AsksAgain(SHAPE.kv_spec())
    engine = cold_then_warm(SHAPE, store)
    assert set(store.asked.values()) == {3}
    assert engine.stats.external_hit_tokens > 0


def test_a_single_group_connector_is_refused_before_serving() -> None:
    store = BlockStore(SHAPE.kv_spec())
    with pytest.raises(capkv.CapabilityError, match='sub-connector #2 "NullConnector" does not implement SupportsHMA'):
        Engine(SHAPE, capkv.MultiConnector(store, NullConnector()))
    assert store.calls == []  # refused before anything was registered or served


def test_a_single_group_connector_serves_a_single_group_model() -> None:
    shape = ModelShape(num_layers=2, pattern="F", num_kv_heads=1, head_dim=4, block_size=4, num_blocks=300)
    engine = Engine(shape, NullConnector())
    engine.run(WORKLOAD.requests())
    assert engine.stats.requests_finished == WORKLOAD.num_requests


@pytest.mark.parametrize("load_async", [False, True])
def test_loading_through_group_0s_table_is_caught(load_async: bool) -> None:
    with pytest.raises(VerificationError) as caught:
        cold_then_warm(SHAPE, Group0Only(SHAPE.kv_spec(), load_async=load_async))
    mismatch = caught.value.mismatch
    assert mismatch.group == 1 and mismatch.when == "after load"
    assert mismatch.request_id == "warm-0"


def test_a_wrong_prefix_load_is_caught_at_its_first_wrong_position() -> None:
    with pytest.raises(VerificationError, match=r"request warm-0, group 0, layer layers\.0\.attn, .*token position 16"):
        cold_then_warm(SHAPE, OffByOne(SHAPE.kv_spec()))


@pytest.mark.parametrize("load_async", [False, True])
def test_reported_load_errors_are_recomputed_not_flagged(load_async: bool) -> None:
    engine = cold_then_warm(SHAPE, FailingLoads(SHAPE.kv_spec(), load_async=load_async))
    assert engine.stats.load_error_blocks == WORKLOAD.num_requests * 3
    assert engine.stats.requests_finished == WORKLOAD.num_requests


@pytest.mark.parametrize("load_async", [False, True])
def test_loads_count_only_where_they_landed(load_async: bool) -> None:
    """A load reported failed is recomputed: counted as failed, in tokens, blocks and bytes, never as loaded."""
    clean = cold_then_warm(SHAPE, BlockStore(SHAPE.kv_spec(), load_async=load_async)).stats
    failing = cold_then_warm(SHAPE, FailingLoads(SHAPE.kv_spec(), load_async=load_async)).stats
    assert failing.external_hit_tokens == clean.external_hit_tokens == WORKLOAD.num_requests * 80  # offered alike
    # Each warm request's last loaded block (tokens 64..80) fails in every group: it resumes from token 64.
    assert failing.failed_load_tokens == WORKLOAD.num_requests * 16
    assert failing.loaded_hit_tokens == WORKLOAD.num_requests * 64
    assert [g.load_error_blocks for g in failing.groups] == [WORKLOAD.num_requests] * 3
    for ok, bad, group in zip(clean.groups, failing.groups, SHAPE.groups, strict=True):
        assert bad.failed_load_tokens == WORKLOAD.num_requests * 16
        assert bad.loaded_tokens == ok.loaded_tokens - bad.failed_load_tokens
        assert bad.loaded_blocks == ok.loaded_blocks - WORKLOAD.num_requests
        assert bad.loaded_bytes == bad.loaded_blocks * SHAPE.block_bytes(group) * len(group.layer_names)
    assert clean.failed_load_tokens == clean.load_error_blocks == 0
    assert clean.hit_limit_tokens == WORKLOAD.num_requests * 80  # 90-token prompts: 5 whole blocks of 16


def test_corruption_after_loading_is_caught_when_the_request_finishes() -> None:
    class ScribblesOnFinish(BlockStore):
        def request_finished_all_groups(self, request: Request, block_ids: Any, /) -> Any:
            raise AssertionError("verification must run before the connector sees the blocks")

    engine = Engine(SHAPE, ScribblesOnFinish(SHAPE.kv_spec()))
    original = engine.worker._forward  # pyright: ignore[reportPrivateUsage]

    def forward_then_scribble(*args: Any) -> None:
        original(*args)
        engine.cache.tensors["layers.4.attn"][0, 1:, 0, 0, 0] = 99  # a value the model never writes

    engine.worker._forward = forward_then_scribble  # type: ignore[method-assign]
    with pytest.raises(VerificationError, match=r"group 2, layer layers\.4\.attn, .*checked at finish"):
        engine.run(WORKLOAD.requests())


def test_a_request_too_large_for_the_pool_is_refused_when_added() -> None:
    shape = ModelShape(num_layers=2, pattern="FS", sliding_window=16, num_kv_heads=1, head_dim=4, block_size=4, num_blocks=20)
    engine = Engine(shape, BlockStore(shape.kv_spec()))
    with pytest.raises(capkv.ConfigError, match="needs up to 51 blocks; the pool has 19"):
        engine.add_request(Request("big", list(range(100)), max_tokens=1))


def test_a_required_layout_the_engine_does_not_use_is_refused() -> None:
    class WantsHND(BlockStore):
        def get_required_kvcache_layout(self) -> str | None:
            return "HND"

    with pytest.raises(capkv.CapabilityError, match="needs KV-cache layout 'HND'"):
        Engine(SHAPE, WantsHND(SHAPE.kv_spec()))


def test_a_window_of_one_needs_no_past_kv() -> None:
    shape = ModelShape(num_layers=2, pattern="S", sliding_window=1, num_kv_heads=1, head_dim=4, block_size=4, num_blocks=100)
    engine = Engine(shape, BlockStore(shape.kv_spec()))
    engine.run(Workload(num_requests=2, num_prefixes=1, prefix_len=30, suffix_len=0, max_tokens=3).requests())
    # Each prompt is a "hit" of 28 tokens (7 null blocks): only the last 2 prompt tokens and 2 decodes are computed.
    assert engine.stats.local_hit_tokens == 2 * 28
    assert engine.stats.computed_tokens == 2 * (2 + 2)


def test_a_pool_with_room_for_one_request_serves_them_one_at_a_time() -> None:
    # Each request may hold 6 blocks per group (94 tokens / 16), 18 in all; the pool has 19 to give.
    shape = ModelShape(num_layers=6, pattern="FSS", sliding_window=48, num_kv_heads=2, head_dim=8, block_size=16, num_blocks=20)
    store = BlockStore(shape.kv_spec(), save="finish")
    engine = cold_then_warm(shape, store)
    assert engine.stats.requests_finished == WORKLOAD.num_requests
    assert engine.stats.external_hit_tokens > 0


TWO_GROUPS = ModelShape(num_layers=4, pattern="FS", sliding_window=40, num_kv_heads=2, head_dim=8, block_size=16, num_blocks=512)
PROMPTS = Workload(num_requests=6, num_prefixes=2, prefix_len=64, suffix_len=17, max_tokens=3)


def test_the_reference_stack_round_trips_bit_exact(tmp_path: Any) -> None:
    spec = TWO_GROUPS.kv_spec()
    stack = capkv.MultiConnector(
        CPUOffloadConnector(spec, capacity_blocks=256), FileStoreConnector(spec, root=tmp_path)
    )
    engine = cold_then_warm(TWO_GROUPS, stack, PROMPTS)
    assert engine.stats.external_hit_tokens == PROMPTS.num_requests * 80
    assert engine.stats.groups[1].loaded_tokens == PROMPTS.num_requests * 48  # the window's 3 blocks before 80


def test_a_single_group_reference_connector_is_refused_on_two_groups() -> None:
    spec = TWO_GROUPS.kv_spec()
    offload = CPUOffloadConnector(spec, capacity_blocks=16)
    stack = capkv.MultiConnector(offload, SingleGroupOffloadConnector(spec, capacity_blocks=16))
    with pytest.raises(capkv.CapabilityError, match="cannot serve 2 KV-cache groups") as caught:
        Engine(TWO_GROUPS, stack)
    assert caught.value.method == "check_stack"
    assert caught.value.connector == "#2 SingleGroupOffloadConnector"


def test_blocks_a_connector_loads_into_are_poisoned_first() -> None:
    """A load target never holds what an earlier owner left there, so a skipped write cannot pass."""

    class ChecksTargets(BlockStore):
        stale_targets = 0
        targets = 0

        def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
            for _, copies in self.connector_metadata.loads:  # type: ignore[attr-defined]
                for copy in copies:
                    for layer in self._layers(copy.group):
                        self.targets += 1
                        self.stale_targets += not bool(torch.isnan(self.caches[layer][:, copy.block_id]).all())
            super().start_load_kv(forward_context, **kwargs)

    # Room for one request at a time, so every block has held some request's KV before the warm run.
    shape = ModelShape(num_layers=3, pattern="FS", sliding_window=48, num_kv_heads=1, head_dim=4, block_size=16, num_blocks=20)
    store = ChecksTargets(shape.kv_spec())
    engine = Engine(shape, store)
    engine.run(WORKLOAD.requests("cold"))
    engine.pool.reset_prefix_cache()  # forget the local cache, but leave its KV in place
    engine.run(WORKLOAD.requests("warm"))
    assert store.targets > 0 and store.stale_targets == 0
