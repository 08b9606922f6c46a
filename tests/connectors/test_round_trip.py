"""Bit-exact round trips for every group, through each connector and through the stack."""

from __future__ import annotations

from pathlib import Path

import pytest

from capkv import KVSpec, supports_hma
from capkv.connectors import CPUOffloadConnector, FileStoreConnector
from capkv.stores._hits import GroupGeometry
from tests.connectors.conftest import CONNECTORS, flush, tokens
from tests.connectors.engine import MiniEngine
from tests.paged import LAYOUTS, Group, make_spec


def expected_hit(spec: KVSpec, saved_tokens: int, limit: int) -> int:
    """The longest prefix every group can restore after a request computed ``saved_tokens``."""
    geometry = [GroupGeometry(g.block_size or 1, g.sliding_window) for g in spec.groups]
    best = 0
    for end in range(1, limit + 1):
        if any(end % g.block_size for g in geometry) or end > saved_tokens:
            continue
        # Blocks the first request saved: its full blocks the engine still held at the end.
        if all(g.first_kept(end) >= g.first_kept(saved_tokens) for g in geometry):
            best = end
    return best


@pytest.mark.parametrize("name", sorted(CONNECTORS))
def test_a_repeated_prefix_is_restored_bit_exact_in_every_group(name: str, spec: KVSpec, tmp_path: Path) -> None:
    connector = CONNECTORS[name](spec, tmp_path)
    assert supports_hma(connector)
    engine = MiniEngine(spec, connector)
    prompt = tokens(1, 100)
    first = engine.run("first", prompt)
    assert first.hit_tokens == 0 and first.steps_until_freed == 1
    flush(connector)

    second = engine.run("second", prompt + tokens(2, 40))
    hit = expected_hit(spec, 100, 139)
    assert hit > 0 and second.hit_tokens == hit
    assert second.load_errors == {}
    # Every group got exactly the blocks it needs at the hit, each checked bit for bit by the engine.
    for group, described in enumerate(spec.groups):
        geometry = GroupGeometry(described.block_size or 1, described.sliding_window)
        assert len(second.loaded.get(group, [])) == len(geometry.needed(0, hit)), group
    assert engine.null_block_untouched()
    connector.shutdown()


@pytest.mark.parametrize("name", sorted(CONNECTORS))
def test_the_whole_prompt_is_never_offered(name: str, tmp_path: Path) -> None:
    spec = make_spec([Group(16), Group(16, layers=3)], num_blocks=64)
    connector = CONNECTORS[name](spec, tmp_path)
    engine = MiniEngine(spec, connector)
    prompt = tokens(3, 64)
    engine.run("first", prompt)
    flush(connector)
    again = engine.run("again", prompt)  # all 64 tokens stored, but the last one must be computed
    assert again.hit_tokens == 48
    connector.shutdown()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_layout_round_trips_through_the_stack(layout: str, tmp_path: Path) -> None:
    spec = make_spec([Group(16), Group(32, window=64)], num_blocks=48, layout=layout)
    connector = CONNECTORS["stack(cpu,file)"](spec, tmp_path)
    engine = MiniEngine(spec, connector, layout=layout)
    prompt = tokens(4, 130)
    engine.run("first", prompt)
    flush(connector)
    second = engine.run("second", prompt + [1, 2, 3])
    assert second.hit_tokens == 128 and second.load_errors == {}
    connector.shutdown()


def test_each_store_in_the_stack_holds_every_group(tmp_path: Path) -> None:
    """The stack saves to both children; each one alone restores every group."""
    spec = make_spec([Group(16), Group(16, window=32)], num_blocks=64)
    stack = CONNECTORS["stack(cpu,file)"](spec, tmp_path)
    engine = MiniEngine(spec, stack)
    prompt = tokens(5, 90)
    engine.run("first", prompt)
    flush(stack)
    stack.shutdown()
    # A fresh file store on the same directory, alone:
    files_only = MiniEngine(spec, FileStoreConnector(spec, root=tmp_path), seed=1)
    assert files_only.run("from-files", prompt).hit_tokens == 80
    # And the stack's CPU child, alone, through a fresh engine sharing nothing but the child:
    cpu_child = stack.children[0]
    assert isinstance(cpu_child, CPUOffloadConnector)
    cpu_engine = MiniEngine(spec, cpu_child, seed=2)
    assert cpu_engine.run("from-cpu", prompt).hit_tokens == 80


def test_a_different_prefix_shares_only_its_common_blocks(tmp_path: Path) -> None:
    spec = make_spec([Group(16)], num_blocks=64)
    connector = CPUOffloadConnector(spec, capacity_blocks=64)
    engine = MiniEngine(spec, connector)
    prompt = tokens(6, 100)
    engine.run("first", prompt)
    diverging = prompt[:40] + tokens(7, 60)
    assert engine.run("diverging", diverging).hit_tokens == 32  # blocks 0 and 1 are common; block 2 differs


def test_namespaces_keep_models_apart(tmp_path: Path) -> None:
    spec = make_spec([Group(16)], num_blocks=64)
    prompt = tokens(8, 80)
    writer = FileStoreConnector(spec, root=tmp_path, namespace="model-a")
    MiniEngine(spec, writer).run("first", prompt)
    writer.shutdown()
    other_model = FileStoreConnector(spec, root=tmp_path, namespace="model-b")
    assert MiniEngine(spec, other_model).run("other", prompt).hit_tokens == 0
    same_model = FileStoreConnector(spec, root=tmp_path, namespace="model-a")
    assert MiniEngine(spec, same_model).run("same", prompt).hit_tokens == 64
