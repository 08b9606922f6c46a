"""Stores save a block in the step that fills it, read from the scheduler output (vLLM's fields).

Through capkv's reference engine (bit-exact verification) and through
hand-built vLLM-shaped scheduler outputs, for what the reference engine never
does: preemption (a resumed request's table replaced, ``num_computed_tokens``
back to 0), and a failed load in the step that computes on it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from capkv import ContractError, KVConnectorOutput
from capkv.connectors import CPUOffloadConnector, FileStoreConnector, StoreMetadata
from capkv.engine import Engine, ModelShape
from capkv.engine._request import Request
from tests.connectors.conftest import tokens
from tests.connectors.engine import Req
from tests.paged import Group, make_spec

SHAPE = ModelShape(
    num_layers=3, pattern="FS", sliding_window=32, num_kv_heads=1, head_dim=8, block_size=8, num_blocks=256
)


def _computed(engine: Engine, requests: list[Request]) -> int:
    engine.stats.reset()
    engine.run(requests)
    return engine.stats.computed_tokens


def test_a_sliding_window_prefix_generated_past_the_window_is_stored() -> None:
    """Finish-time saves would find the window's early blocks null: the generated sequence's
    sliding-window blocks are stored while they were in the window."""
    store = CPUOffloadConnector(SHAPE.kv_spec(), capacity_blocks=512)
    engine = Engine(SHAPE, store)
    first = Request("gen", tokens(1, 20), max_tokens=100)  # 120 tokens, window 32
    engine.run([first])
    sequence = list(first.all_token_ids)
    engine.reset_prefix_cache()
    again = Request("again", sequence, max_tokens=1)
    computed = _computed(engine, [again])
    # Every full block but the one holding the last token is loaded, in both groups.
    assert computed == len(sequence) - (len(sequence) - 1) // 8 * 8
    assert engine.stats.groups[1].loaded_tokens > 0


def test_a_prefix_is_loadable_while_the_request_that_computed_it_still_runs() -> None:
    spec = SHAPE.kv_spec()
    store = CPUOffloadConnector(spec, capacity_blocks=512)
    engine = Engine(SHAPE, store)
    prompt = tokens(2, 64)
    running = Request("running", prompt, max_tokens=50)
    engine.add_request(running)
    engine.step()  # the prefill step
    engine.step()  # its report reached the scheduler side
    assert running.num_output_tokens < running.max_tokens
    matched, _ = store.get_num_new_matched_tokens(Req("probe", prompt + [5]), 0)
    assert matched == 64


def test_two_engines_share_a_file_store_while_the_first_runs(tmp_path: Path) -> None:
    """A second engine (another process, in production) loads what the first computed a step ago."""
    with FileStoreConnector(SHAPE.kv_spec(), root=tmp_path) as one, FileStoreConnector(
        SHAPE.kv_spec(), root=tmp_path
    ) as two:
        first, second = Engine(SHAPE, one), Engine(SHAPE, two)
        prompt = tokens(3, 72)
        first.add_request(Request("a", prompt, max_tokens=40))
        first.step()
        one.flush()
        computed = _computed(second, [Request("b", prompt + [7, 8], max_tokens=2)])
        assert second.stats.external_hit_tokens == 72
        assert computed == 2 + 1  # two prompt tokens, then one generated step
        while first.scheduler.has_unfinished:
            first.step()


# ---- vLLM-shaped scheduler outputs ---------------------------------------------------


@dataclass
class New:
    req_id: str
    block_ids: tuple[list[int], ...]
    num_computed_tokens: int


@dataclass
class Cached:
    req_ids: list[str] = field(default_factory=list)
    resumed_req_ids: set[str] = field(default_factory=set)
    new_block_ids: list[tuple[list[int], ...] | None] = field(default_factory=list)
    num_computed_tokens: list[int] = field(default_factory=list)


@dataclass
class Output:
    scheduled_new_reqs: list[New] = field(default_factory=list)
    scheduled_cached_reqs: Cached = field(default_factory=Cached)
    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)


GROUPS = [Group(4), Group(4, window=8)]


def _store() -> CPUOffloadConnector:
    from tests.paged import empty_caches

    spec = make_spec(GROUPS, num_blocks=64)
    store = CPUOffloadConnector(spec, capacity_blocks=64)
    store.register_kv_caches(empty_caches(spec, "flash", "cpu"))
    return store


def _step(store: CPUOffloadConnector, output: Output | None) -> StoreMetadata:
    metadata = store.build_connector_meta(output)
    store.bind_connector_metadata(metadata)
    store.start_load_kv(None)
    store.wait_for_save()
    store.update_connector_output(KVConnectorOutput(worker_meta=store.build_connector_worker_meta()))
    store.clear_connector_metadata()
    return metadata


def _saved(metadata: StoreMetadata) -> dict[int, list[int]]:
    saved: dict[int, list[int]] = {}
    for move in metadata.step_saves:
        saved.setdefault(move.group, []).extend(move.block_ids)
    return saved


def test_each_step_saves_the_blocks_it_fills_once_and_a_resumed_request_saves_what_is_new() -> None:
    store = _store()
    request = Req("r", tokens(4, 20))
    store.get_num_new_matched_tokens(request, 0)
    table = ([1, 2, 3, 4, 5], [11, 12, 13, 14, 15])
    store.update_state_after_alloc(request, table, 0)
    # Step 1: a chunk of 10 tokens fills blocks 0 and 1 of both groups.
    first = _step(store, Output([New("r", table, 0)], num_scheduled_tokens={"r": 10}))
    assert _saved(first) == {0: [1, 2], 1: [11, 12]}
    # Step 2: tokens 10..20 fill blocks 2..4; the window (8) no longer needs block 0 of group 1.
    second = _step(store, Output(scheduled_cached_reqs=Cached(["r"], set(), [None], [10]), num_scheduled_tokens={"r": 10}))
    assert _saved(second) == {0: [3, 4, 5], 1: [13, 14, 15]}
    # Preempted, then resumed with new blocks from 0: the same content is not saved twice.
    request.num_computed_tokens = 0
    store.update_state_after_alloc(request, ([21, 22, 23, 24, 25], [31, 32, 33, 34, 35]), 0)
    resumed = Cached(["r"], {"r"}, [([21, 22, 23, 24, 25], [31, 32, 33, 34, 35])], [0])
    third = _step(store, Output(scheduled_cached_reqs=resumed, num_scheduled_tokens={"r": 20}))
    assert third.step_saves == ()
    # The request grows: its new block is appended to the resumed table, and saved when full.
    request.all_token_ids.extend(tokens(5, 4))
    grown = Cached(["r"], set(), [([26], [36])], [20])
    fourth = _step(store, Output(scheduled_cached_reqs=grown, num_scheduled_tokens={"r": 4}))
    assert _saved(fourth) == {0: [26], 1: [36]}


def test_a_block_two_requests_fill_in_the_same_step_is_saved_once() -> None:
    store = _store()
    prompt = tokens(6, 8)
    for rid, table in (("a", ([1, 2], [11, 12])), ("b", ([3, 4], [13, 14]))):
        request = Req(rid, prompt + [rid == "a"])
        store.get_num_new_matched_tokens(request, 0)
        store.update_state_after_alloc(request, table, 0)
    output = Output(
        [New("a", ([1, 2, 5], [11, 12, 15]), 0), New("b", ([3, 4, 6], [13, 14, 16]), 0)],
        num_scheduled_tokens={"a": 9, "b": 9},
    )
    assert _saved(_step(store, output)) == {0: [1, 2], 1: [11, 12]}


def test_a_request_whose_load_is_unavailable_saves_nothing_that_step() -> None:
    store = _store()
    prompt = tokens(7, 12)
    writer = Req("w", prompt)
    store.get_num_new_matched_tokens(writer, 0)
    store.update_state_after_alloc(writer, ([1, 2, 3], [11, 12, 13]), 0)
    _step(store, Output([New("w", ([1, 2, 3], [11, 12, 13]), 0)], num_scheduled_tokens={"w": 12}))
    reader = Req("x", prompt[:8] + tokens(8, 8))
    assert store.get_num_new_matched_tokens(reader, 0) == (8, False)
    # Group 0's blocks vanish between the offer and the allocation: the load cannot be planned.
    for key in [k for k in store.pool._ready if k.group == 0]:  # noqa: SLF001 - the test's lever
        store.pool._ready.pop(key)  # noqa: SLF001
    table = ([4, 5, 6, 7], [14, 15, 16, 17])
    store.update_state_after_alloc(reader, table, 8)
    metadata = _step(store, Output([New("x", table, 8)], num_scheduled_tokens={"x": 8}))
    assert metadata.unavailable and metadata.step_saves == ()


def test_a_malformed_scheduler_output_is_refused_by_name() -> None:
    store = _store()
    with pytest.raises(ContractError, match="no 'num_scheduled_tokens'") as caught:
        store.build_connector_meta(object())
    assert caught.value.connector == "CPUOffloadConnector" and caught.value.method == "build_connector_meta"
    with pytest.raises(ContractError, match="num_computed_tokens of 'r'"):
        store.build_connector_meta(Output([New("r", ([1], [2]), -1)], num_scheduled_tokens={"r": 1}))


# ---- host pool eviction -----------------------------------------------------------------------


def _hits(store: CPUOffloadConnector, prompt: list[int], runs: int, *, max_tokens: int) -> list[int]:
    shape = ModelShape(num_layers=1, pattern="F", num_kv_heads=1, head_dim=8, block_size=16, num_blocks=64)
    engine = Engine(shape, store)
    hits: list[int] = []
    for index in range(runs):
        engine.reset_prefix_cache()
        engine.stats.reset()
        engine.run([Request(f"r{index}", prompt, max_tokens=max_tokens)])
        hits.append(engine.stats.external_hit_tokens)
    return hits


@pytest.mark.parametrize("max_tokens", [1, 40])
def test_a_4_slot_pool_serving_a_6_block_prompt_keeps_the_first_4_blocks(max_tokens: int) -> None:
    """Defect 3: the pool evicted the chain's head first and hit 0, 64, 0, 64 ... tokens.

    Six blocks cannot fit in four slots, so no pool can serve more than the first four (64 tokens):
    after the first run every run hits exactly that, also when generation fills more blocks later.
    """
    shape_spec = ModelShape(num_layers=1, pattern="F", num_kv_heads=1, head_dim=8, block_size=16, num_blocks=64)
    store = CPUOffloadConnector(shape_spec.kv_spec(), capacity_blocks=4)
    prompt = tokens(9, 6 * 16 + 1)  # six full blocks and one more token
    assert _hits(store, prompt, 6, max_tokens=max_tokens) == [0, 64, 64, 64, 64, 64]


def test_eviction_takes_the_tail_of_the_chain_used_longest_ago() -> None:
    shape = ModelShape(num_layers=1, pattern="F", num_kv_heads=1, head_dim=8, block_size=16, num_blocks=64)
    store = CPUOffloadConnector(shape.kv_spec(), capacity_blocks=6)
    one, two = tokens(10, 4 * 16 + 1), tokens(11, 4 * 16 + 1)
    assert _hits(store, one, 1, max_tokens=1) == [0]
    assert _hits(store, two, 1, max_tokens=1) == [0]  # needs 4 slots: evicts the last 2 blocks of one
    # Eight blocks in six slots: each prompt, served in turn, finds its head (2 blocks) and saves its
    # tail again over the tail of the other one — never a head, so no run starts from nothing.
    for _ in range(3):
        assert _hits(store, one, 1, max_tokens=1) == [32]
        assert _hits(store, two, 1, max_tokens=1) == [32]
