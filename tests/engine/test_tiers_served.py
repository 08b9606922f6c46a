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


def serve(connector: Any, requests: list[Any], shape: ModelShape = SHAPE) -> tuple[EngineStats, Any]:
    """The engine's statistics, and the stack it served through (in dev mode, rebuilt over checked children)."""
    engine = Engine(shape, connector, scrub_released_blocks=True)
    engine.run(requests)
    stats = engine.stats.snapshot()
    engine.shutdown()
    return stats, engine.connector


def seed(root: Path, requests: list[Any], shape: ModelShape = SHAPE) -> None:
    """A file store under ``root`` holding what serving ``requests`` saves (the store survives its engine)."""
    with FileStoreConnector(shape.kv_spec(), root=str(root)) as store:
        serve(store, requests, shape)


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


def test_a_sliding_window_across_the_tiers_boundary_loads_from_both(tmp_path: Path) -> None:
    """A window (64 tokens: blocks 6-9 of a 160-token hit) that starts in the front tier's part (blocks 0-7):
    the sliding-window groups load blocks 6-7 from the front tier and 8-9 from behind, bit for bit."""
    shape = ModelShape(
        num_layers=3, pattern="FSS", block_size=16, sliding_window=64, num_kv_heads=2, head_dim=8, num_blocks=640
    )
    head = 128
    spec = shape.kv_spec()
    seed(tmp_path / "y", WORKLOAD.prefix_heads(head), shape)
    seed(tmp_path / "x", WORKLOAD.requests("cold"), shape)
    with FileStoreConnector(spec, root=str(tmp_path / "x")) as x_alone:
        alone, _ = serve(x_alone, WORKLOAD.requests("warm"), shape)

    y, x = FileStoreConnector(spec, root=str(tmp_path / "y")), FileStoreConnector(spec, root=str(tmp_path / "x"))
    tiered, stack = serve(MultiConnector(y, x), WORKLOAD.requests("warm"), shape)  # verified bit for bit

    assert tiered.computed_tokens == alone.computed_tokens
    assert [g.loaded_tokens for g in tiered.groups] == [g.loaded_tokens for g in alone.groups]
    from_y, from_x = stack.loaded_tokens
    assert from_y * (160 - head) == from_x * head > 0, "each load: the first 128 tokens from Y, the rest from X"
    # X's slice starts at token 128: the window's blocks 6-7 (as much as X alone loads of it) came from Y
    assert all(g.loaded_tokens > 0 for g in tiered.groups[1:]), "the sliding-window groups load their window"
    y.shutdown()
    x.shutdown()


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


class BrokenReads(CPUOffloadConnector):
    """A host pool whose reads go bad on demand: the last block of each load is left as garbage and
    reported failed (as a disk or network read error would), or it offers nothing at all."""

    def __init__(self, spec: Any, **options: Any) -> None:
        super().__init__(spec, **options)
        self.breaks = False
        self.silent = False
        self._caches: dict[str, torch.Tensor] = {}
        self._failed: dict[int, set[int]] = {}

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor], /) -> None:
        super().register_kv_caches(kv_caches)
        self._caches = kv_caches

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int, /) -> tuple[int | None, bool]:
        if self.silent:
            return 0, False
        return super().get_num_new_matched_tokens(request, num_computed_tokens)

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        super().start_load_kv(forward_context, **kwargs)
        if not self.breaks:
            return
        for move in self._bound().loads:
            block = move.block_ids[-1]
            for layer in self.spec.groups[move.group].layer_names:
                self._caches[layer].select(self.spec.block_dim or 0, block).fill_(float("nan"))
            self._failed.setdefault(move.group, set()).add(block)

    def get_block_ids_with_load_errors(self) -> Any:
        errors = super().get_block_ids_with_load_errors()
        for group, blocks in self._failed.items():
            errors.setdefault(group, set()).update(blocks)
        self._failed = {}
        return errors


def test_a_failed_load_is_never_promoted_nor_saved_by_another_tier() -> None:
    """A later tier's load fails: the engine recomputes from the failed block, and no tier stores the garbage
    (neither the failed block promoted, nor blocks computed on it) — the next run loads only good bytes."""
    spec = SHAPE.kv_spec()
    back = BrokenReads(spec, capacity_blocks=2048)
    serve(back, WORKLOAD.requests("cold"))  # back holds everything
    front = CPUOffloadConnector(spec, capacity_blocks=2048)
    engine = Engine(SHAPE, MultiConnector(front, back, promote=True), scrub_released_blocks=True)
    back.breaks = True
    engine.run(WORKLOAD.requests("broken"))  # every load loses a block; the engine recomputes from it
    assert engine.stats.load_error_blocks > 0
    for _ in range(3):
        engine.step()
    back.breaks, back.silent = False, True
    engine.reset_prefix_cache()
    engine.stats.reset()
    engine.run(WORKLOAD.requests("after"))  # whatever loads now comes from the front tier: verified
    engine.shutdown()
    assert engine.connector.loaded_tokens[0] > 0, "the front tier still serves what it got right"
