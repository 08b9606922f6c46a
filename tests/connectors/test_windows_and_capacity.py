"""Sliding windows and null blocks, LRU eviction under a small capacity, holding blocks until saved."""

from __future__ import annotations

from pathlib import Path

import pytest

from capkv import ContractError
from capkv.connectors import CPUOffloadConnector
from capkv.transfer import BlockCopier
from capkv.transfer._handle import CopyHandle
from tests.connectors.conftest import CONNECTORS, flush, tokens
from tests.connectors.engine import MiniEngine, Req
from tests.paged import Group, make_spec

WINDOWED = [Group(16), Group(16, window=32)]


@pytest.mark.parametrize("name", sorted(CONNECTORS))
def test_windowed_groups_store_only_blocks_inside_the_window_and_never_touch_the_null_block(name: str, tmp_path: Path) -> None:
    spec = make_spec(WINDOWED, num_blocks=64)
    connector = CONNECTORS[name](spec, tmp_path)
    engine = MiniEngine(spec, connector)
    prompt = tokens(10, 150)  # the window group's table ends up as [0, 0, 0, 0, 0, 0, 0, b7, b8, b9]
    engine.run("long", prompt)
    flush(connector)
    resumed = engine.run("resumed", prompt + tokens(11, 10))
    assert resumed.hit_tokens == 144
    assert len(resumed.loaded[0]) == 9  # every full-attention block
    assert len(resumed.loaded[1]) == 2  # only the window's blocks: 7 and 8
    assert engine.null_block_untouched()
    connector.shutdown()


@pytest.mark.parametrize("name", sorted(CONNECTORS))
def test_a_prefix_whose_window_blocks_were_never_stored_is_not_a_hit(name: str, tmp_path: Path) -> None:
    """Full attention has the first 64 tokens, the window group does not: no partial-group load."""
    spec = make_spec(WINDOWED, num_blocks=64)
    connector = CONNECTORS[name](spec, tmp_path)
    engine = MiniEngine(spec, connector)
    prompt = tokens(12, 150)
    engine.run("long", prompt)
    flush(connector)
    diverging = prompt[:70] + tokens(13, 30)
    assert engine.run("diverging", diverging).hit_tokens == 0
    connector.shutdown()


def test_repeated_null_ids_are_legal_and_a_repeated_real_id_is_not() -> None:
    spec = make_spec(WINDOWED, num_blocks=64)
    connector = CPUOffloadConnector(spec, capacity_blocks=8)
    request = Req("r", tokens(14, 64), num_computed_tokens=64)
    assert connector.request_finished_all_groups(request, ([1, 2, 3, 4], [0, 0, 5, 6])) == (True, None)
    with pytest.raises(ContractError, match="block_ids group 1, position 2: 5 repeats the id at position 1") as caught:
        connector.request_finished_all_groups(Req("s", tokens(15, 64), 64), ([7, 8, 9, 10], [0, 5, 5, 11]))
    assert caught.value.group == 1 and caught.value.value == 5


def test_lru_eviction_under_a_small_capacity() -> None:
    spec = make_spec([Group(16)], num_blocks=64)
    connector = CPUOffloadConnector(spec, capacity_blocks=8)
    engine = MiniEngine(spec, connector)
    a, b, c = tokens(20, 65), tokens(21, 65), tokens(22, 65)  # 4 blocks each
    engine.run("a", a)
    engine.run("b", b)
    assert connector.pool.evictions == 0 and len(connector.pool) == 8
    assert engine.run("a-again", a).hit_tokens == 64  # a becomes most recently used
    engine.run("c", c)  # needs 4 slots: b's blocks are the least recently used
    assert connector.pool.evictions == 4
    assert engine.run("c-again", c).hit_tokens == 64
    assert engine.run("a-last", a).hit_tokens == 64  # now c is the least recently used
    assert engine.run("b-again", b).hit_tokens == 0  # gone; finishing stores it again, evicting c
    assert connector.pool.evictions == 8
    assert engine.run("c-last", c).hit_tokens == 0


def test_a_pool_smaller_than_a_request_keeps_its_leading_blocks() -> None:
    spec = make_spec(WINDOWED, num_blocks=64)
    connector = CPUOffloadConnector(spec, capacity_blocks=5)
    engine = MiniEngine(spec, connector)
    prompt = tokens(23, 100)  # 6 + 2 blocks to store, room for 5: saved in token order
    engine.run("big", prompt)
    assert len(connector.pool) == 5
    # The full group's blocks 0-4 are in (the window group's 4 and 5 were not reached): no hit can be complete.
    assert engine.run("big-again", prompt).hit_tokens == 0


def test_blocks_being_loaded_or_saved_are_never_evicted() -> None:
    spec = make_spec([Group(16)], num_blocks=64)
    connector = CPUOffloadConnector(spec, capacity_blocks=4)
    engine = MiniEngine(spec, connector)
    prompt = tokens(24, 65)
    engine.run("stored", prompt)  # fills the pool
    # A second request hits; its blocks are pinned from allocation until its step has run.
    loader = Req("loader", list(prompt) + [7])
    offered, _ = connector.get_num_new_matched_tokens(loader, 0)
    assert offered == 64
    blocks = ([engine.free[0].pop() for _ in range(5)],)
    connector.update_state_after_alloc(loader, blocks, offered)
    # Meanwhile another request finishes: every slot is pinned, so it saves nothing (and holds nothing).
    other = Req("other", tokens(25, 65), num_computed_tokens=65)
    assert connector.request_finished_all_groups(other, ([engine.free[0].pop() for _ in range(5)],)) == (False, None)
    assert connector.pool.evictions == 0
    loaded: list[int] = []
    engine.step(lambda errors: loaded.extend(b for b in blocks[0][:4] if not engine.wrong_positions(loader, 0, blocks[0].index(b), b)))
    assert loaded == blocks[0][:4]
    # After the step the pins are gone: the next save may evict.
    assert connector.request_finished_all_groups(Req("later", tokens(26, 65), 65), ([engine.free[0].pop() for _ in range(5)],)) == (True, None)
    assert connector.pool.evictions == 4


class _Gate:
    """Copies that complete only when the test opens the gate."""

    def __init__(self) -> None:
        self.open = False

    def wrap(self, handle: CopyHandle) -> CopyHandle:
        gate = self

        class Gated:
            def done(self) -> bool:
                return gate.open and handle.done()

            def wait(self) -> None:
                handle.wait()

            def stream_wait(self) -> None:
                handle.stream_wait()

        return Gated()


def test_a_save_holds_the_blocks_until_the_copy_completes(monkeypatch: pytest.MonkeyPatch) -> None:
    gate = _Gate()
    gather = BlockCopier.gather
    monkeypatch.setattr(BlockCopier, "gather", lambda self, *a: gate.wrap(gather(self, *a)))
    spec = make_spec(WINDOWED, num_blocks=64)
    connector = CPUOffloadConnector(spec, capacity_blocks=32)
    engine = MiniEngine(spec, connector)
    prompt = tokens(27, 80)
    with pytest.raises(AssertionError, match="never reported finished sending"):
        engine.run("slow", prompt, max_drain_steps=3)
    assert "slow" in engine.held  # the engine still holds every block
    # Not loadable while being written:
    assert connector.get_num_new_matched_tokens(Req("peek", list(prompt)), 0) == (0, False)
    gate.open = True
    engine.step()
    assert "slow" not in engine.held
    assert engine.run("after", prompt + [1]).hit_tokens == 80


def test_finished_sending_is_reported_once_per_request() -> None:
    spec = make_spec([Group(16)], num_blocks=64)
    connector = CPUOffloadConnector(spec, capacity_blocks=32)
    run = MiniEngine(spec, connector).run("a", tokens(28, 40))
    assert run.steps_until_freed == 1  # reported by the step that saved it...
    assert connector.get_finished(set()) == (None, None)  # ...and never again


def test_statistics_cover_the_time_since_the_last_call() -> None:
    spec = make_spec(WINDOWED, num_blocks=64)
    connector = CPUOffloadConnector(spec, capacity_blocks=32)
    engine = MiniEngine(spec, connector)
    prompt = tokens(29, 80)
    engine.run("first", prompt)
    block_nbytes = [BlockCopier(spec, engine.caches).block_nbytes(g) for g in range(2)]
    assert connector.get_kv_connector_stats() == {
        "saved_blocks": 5 + 2, "saved_bytes": 5 * block_nbytes[0] + 2 * block_nbytes[1],
    }
    assert connector.get_kv_connector_stats() is None
    engine.run("second", prompt + [1])
    stats = connector.get_kv_connector_stats()
    assert stats is not None and stats["hit_tokens"] == 80 and stats["loaded_blocks"] == 5 + 2
    assert stats["loaded_bytes"] == 5 * block_nbytes[0] + 2 * block_nbytes[1]
