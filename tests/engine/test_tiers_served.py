"""Tiers that add up, served by the reference engine over real stores (every loaded byte verified).

Y holds the first part of every prefix, X all of it: a stack over both loads Y's part from Y and the
rest from X — as much as X alone would load, bit for bit — where the first-hit rule loaded Y's part only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from capkv import MultiConnector
from capkv.connectors import CPUOffloadConnector, FileStoreConnector
from capkv.engine import Engine, ModelShape, Workload
from capkv.engine._stats import EngineStats

# A window (32) shorter than the front tier's part (64): the front tier's sliding-window blocks are
# outside the window at the end of the composed hit, so the engine holds the null block in their
# places and only the full-attention group loads from the front tier.
SHAPE = ModelShape(
    num_layers=3, pattern="FSS", block_size=16, sliding_window=32, num_kv_heads=2, head_dim=8, num_blocks=640
)
WORKLOAD = Workload(num_requests=6, num_prefixes=2, prefix_len=128, suffix_len=40, max_tokens=3, seed=7)
HEAD = 64


@pytest.fixture(autouse=True)
def one_thread() -> Any:
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


def serve(connector: Any, requests: list[Any]) -> tuple[EngineStats, Any]:
    """The engine's statistics, and the stack it served through (in dev mode, rebuilt over checked children)."""
    engine = Engine(SHAPE, connector, scrub_released_blocks=True)
    engine.run(requests)
    stats = engine.stats.snapshot()
    engine.shutdown()
    return stats, engine.connector


def seed(root: Path, requests: list[Any]) -> None:
    """A file store under ``root`` holding what serving ``requests`` saves (the store survives its engine)."""
    with FileStoreConnector(SHAPE.kv_spec(), root=str(root)) as store:
        serve(store, requests)


def test_a_stack_loads_the_front_tiers_part_and_the_rest_from_behind(tmp_path: Path) -> None:
    spec = SHAPE.kv_spec()
    seed(tmp_path / "y", WORKLOAD.prefix_heads(HEAD))
    seed(tmp_path / "x", WORKLOAD.requests("cold"))

    with FileStoreConnector(spec, root=str(tmp_path / "x")) as x_alone:
        alone, _ = serve(x_alone, WORKLOAD.requests("warm"))

    y, x = FileStoreConnector(spec, root=str(tmp_path / "y")), FileStoreConnector(spec, root=str(tmp_path / "x"))
    tiered, stack = serve(MultiConnector(y, x), WORKLOAD.requests("warm"))  # verified bit for bit by the engine

    assert tiered.computed_tokens == alone.computed_tokens, "as little computed as with the complete store alone"
    assert [g.loaded_tokens for g in tiered.groups] == [g.loaded_tokens for g in alone.groups]
    from_y, from_x = stack.loaded_tokens
    hit = 160  # each warm request's block-aligned prompt, less the token the engine must compute
    assert from_y + from_x == tiered.external_hit_tokens and from_y > 0
    assert from_y * (hit - HEAD) == from_x * HEAD, "each load: the first part from Y, the rest from X"


def test_without_promotion_a_front_tier_saves_nothing_another_tier_loaded(tmp_path: Path) -> None:
    spec = SHAPE.kv_spec()
    seed(tmp_path / "x", WORKLOAD.requests("cold"))
    front = CPUOffloadConnector(spec, capacity_blocks=2048)
    engine = Engine(SHAPE, MultiConnector(front, FileStoreConnector(spec, root=str(tmp_path / "x"))),
                    scrub_released_blocks=True)
    stack = engine.connector
    engine.run(WORKLOAD.requests("warm"))
    first = engine.stats.snapshot()
    engine.reset_prefix_cache()
    engine.stats.reset()
    engine.run(WORKLOAD.requests("again"))
    second = engine.stats.snapshot()
    engine.shutdown()
    assert stack.loaded_tokens[0] == 0, "the front tier only holds what the engine computed"
    assert second.computed_tokens == first.computed_tokens
    assert stack.promoted_tokens == (0, 0)


def test_promotion_warms_the_front_tier(tmp_path: Path) -> None:
    spec = SHAPE.kv_spec()
    seed(tmp_path / "x", WORKLOAD.requests("cold"))
    front = CPUOffloadConnector(spec, capacity_blocks=2048)
    back = FileStoreConnector(spec, root=str(tmp_path / "x"))
    engine = Engine(SHAPE, MultiConnector(front, back, promote=True), scrub_released_blocks=True)
    stack = engine.connector
    engine.run(WORKLOAD.requests("warm"))
    loaded_first = stack.loaded_tokens
    assert loaded_first[0] == 0 and loaded_first[1] > 0 and stack.promoted_tokens[0] == loaded_first[1]
    for _ in range(3):
        engine.step()  # the front tier's save reports reach its scheduler side
    engine.reset_prefix_cache()
    engine.stats.reset()
    engine.run(WORKLOAD.requests("again"))  # every byte the front tier promoted is verified as it loads
    engine.shutdown()
    from_front = stack.loaded_tokens[0]
    from_back = stack.loaded_tokens[1] - loaded_first[1]
    assert from_front == loaded_first[1] and from_back == 0, "the second run loads from the front tier only"


def test_a_front_tier_too_small_for_the_working_set_computes_no_more_than_one_large_store(tmp_path: Path) -> None:
    spec = SHAPE.kv_spec()
    workload = Workload(num_requests=12, num_prefixes=6, prefix_len=128, suffix_len=40, max_tokens=3, seed=3)

    def cold_warm(connector: Any) -> tuple[EngineStats, Any]:
        engine = Engine(SHAPE, connector, scrub_released_blocks=True)
        engine.run(workload.requests("cold"))
        for child in getattr(connector, "children", (connector,)):
            flush = getattr(child, "flush", None)
            if flush is not None:
                flush()
        for _ in range(3):
            engine.step()
        engine.reset_prefix_cache()
        engine.stats.reset()
        engine.run(workload.requests("warm"))
        engine.shutdown()
        return engine.stats.snapshot(), engine.connector

    large, _ = cold_warm(FileStoreConnector(spec, root=str(tmp_path / "large")))
    small_front = CPUOffloadConnector(spec, capacity_blocks=24)  # a fraction of one prefix set
    tiered, stack = cold_warm(MultiConnector(small_front, FileStoreConnector(spec, root=str(tmp_path / "tiered"))))
    assert tiered.computed_tokens <= large.computed_tokens
    assert stack.loaded_tokens[0] > 0 and stack.loaded_tokens[1] > 0, "both tiers served parts of the hits"
