"""What dev mode costs, and what production pays (nothing).

Prints, for a connector that does nothing (so only the checks are measured):

- the production ratio: instrumented / bare call time with dev mode off, where
  ``instrument`` returns the very same object (goal 1.00);
- the dev-mode cost per block id of ``update_state_after_alloc`` for 1x16, 4x1024
  and 1x65536 ids — (instrumented - bare) / ids, everything included: the proxy,
  beartype's wrapper and the exhaustive validator (goal <= 15 ns per id) — with
  the validator alone and a plain Python loop doing the same checks (type, range,
  repeats), whose ratio to the total carries over to machines of other speeds;
- the KV tensor check cost per ``save_kv_layer`` call and per layer of ``register_kv_caches``.

Run from the repository root: ``python benchmarks/devmode_overhead.py``. It turns
dev mode on itself (``CAPKV_DEV=1``, before importing capkv), as an engine would.
Timings are the best of several repeats; on a shared machine, run it twice.
"""

from __future__ import annotations

import os
import random
import sys
import timeit
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

os.environ.setdefault("CAPKV_DEV", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import capkv  # noqa: E402
from capkv import KVConnectorBase, KVGroupSpec, KVSpec, devmode  # noqa: E402
from capkv.contracts._block_ids import check_block_groups  # noqa: E402

NUM_BLOCKS = 131_072
SHAPES = [(1, 16), (4, 1024), (1, 65_536)]
GOAL_NS_PER_ID = 15.0


class Bare(KVConnectorBase[Any]):
    """A connector whose calls do nothing, so that a measurement is the checks alone."""

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int, /) -> tuple[int | None, bool]:
        return 0, False

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int, /) -> None:
        return None

    def build_connector_meta(self, scheduler_output: Any, /) -> object:
        return None

    def start_load_kv(self, forward_context: Any, /, **kwargs: Any) -> None:
        return None

    def wait_for_layer_load(self, layer_name: str, /) -> None:
        return None

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, /, **kwargs: Any) -> None:
        return None

    def wait_for_save(self) -> None:
        return None

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor], /) -> None:
        return None


def calls_in(call: Callable[[], object], budget_s: float) -> int:
    """How many calls of ``call`` take about ``budget_s``."""
    call()
    return max(1, int(budget_s / max(timeit.timeit(call, number=10) / 10, 1e-9)))


def seconds_per_call(call: Callable[[], object], budget_s: float = 0.2, repeat: int = 7, number: int = 0) -> float:
    """Best-of-``repeat`` time of one call, each repeat ``number`` calls (or about ``budget_s``)."""
    number = number or calls_in(call, budget_s)
    return min(timeit.repeat(call, number=number, repeat=repeat)) / number


def naive_walk(groups: tuple[list[int], ...], num_blocks: int, null: int) -> None:
    """The same checks as a plain Python loop, for scale."""
    for group in groups:
        seen: set[int] = set()
        for block in group:
            if type(block) is not int or not 0 <= block < num_blocks:
                raise ValueError(block)
            if block != null:
                if block in seen:
                    raise ValueError(block)
                seen.add(block)


def production_ratio() -> None:
    spec = KVSpec(num_groups=1, num_blocks=NUM_BLOCKS)
    bare = Bare()
    blocks = (random.sample(range(1, NUM_BLOCKS), 1024),)
    with devmode.dev_mode(False):
        instrumented = capkv.devmode.instrument(bare, spec)
    def call(connector: Bare) -> None:
        connector.update_state_after_alloc(None, blocks, 0)

    bare_call, instrumented_call = partial(call, bare), partial(call, instrumented)  # one code path for both
    number = calls_in(bare_call, 0.02)
    best = {bare_call: float("inf"), instrumented_call: float("inf")}
    for round_ in range(10):  # interleaved, in alternating order, so drift hits both sides alike
        for call in (bare_call, instrumented_call) if round_ % 2 else (instrumented_call, bare_call):
            best[call] = min(best[call], seconds_per_call(call, number=number, repeat=3))
    print("production mode (dev mode off, as under python -O)")
    print(f"  instrument() returned the same object: {instrumented is bare}")
    print(f"  ratio instrumented / bare call: {best[instrumented_call] / best[bare_call]:.2f}  (goal 1.00)")


def block_id_cost() -> None:
    print("dev mode: update_state_after_alloc, cost per block id (ns)")
    print(f"  {'ids':>8}  {'total':>7}  {'validator':>9}  {'python loop':>11}  {'total/loop':>10}  goal <= {GOAL_NS_PER_ID:.0f}")
    for num_groups, per_group in SHAPES:
        spec = KVSpec(num_groups=num_groups, num_blocks=NUM_BLOCKS)
        blocks = tuple(random.sample(range(1, NUM_BLOCKS), per_group) for _ in range(num_groups))
        ids = num_groups * per_group
        bare = Bare()
        checked = capkv.devmode.instrument(bare, spec)
        t_bare = seconds_per_call(lambda: bare.update_state_after_alloc(None, blocks, 0))
        t_checked = seconds_per_call(lambda: checked.update_state_after_alloc(None, blocks, 0))
        t_validator = seconds_per_call(
            lambda: check_block_groups(spec, blocks, connector="Bare", method="update_state_after_alloc")
        )
        t_naive = seconds_per_call(lambda: naive_walk(blocks, NUM_BLOCKS, 0))
        total = (t_checked - t_bare) / ids * 1e9
        verdict = "met" if total <= GOAL_NS_PER_ID else "missed"
        naive = t_naive / ids * 1e9
        print(
            f"  {num_groups}x{per_group:<6}  {total:7.1f}  {t_validator / ids * 1e9:9.1f}  "
            f"{naive:11.1f}  {total / naive:10.2f}  {verdict}"
        )


def tensor_check_cost() -> None:
    num_layers = 32
    shape = (2, 4096, 16, 8, 128)
    groups = (KVGroupSpec(layer_names=tuple(f"layers.{i}.attn" for i in range(num_layers)), kv_shape=shape),)
    spec = KVSpec(num_groups=1, num_blocks=4096, groups=groups, block_dim=1, dtype=torch.bfloat16, device=torch.device("meta"))
    tensors = {name: torch.empty(shape, dtype=torch.bfloat16, device="meta") for name in groups[0].layer_names}
    layer, tensor = next(iter(tensors.items()))
    bare = Bare()
    checked = capkv.devmode.instrument(bare, spec)
    t_save = seconds_per_call(lambda: checked.save_kv_layer(layer, tensor, None)) - seconds_per_call(
        lambda: bare.save_kv_layer(layer, tensor, None)
    )
    t_register = seconds_per_call(lambda: checked.register_kv_caches(tensors)) - seconds_per_call(
        lambda: bare.register_kv_caches(tensors)
    )
    print("dev mode: KV tensor checks (shape, dtype, device; metadata only)")
    print(f"  save_kv_layer: {t_save * 1e6:.2f} us per call")
    print(f"  register_kv_caches: {t_register / num_layers * 1e6:.2f} us per layer ({num_layers} layers)")


def main() -> None:
    random.seed(0)
    torch.set_num_threads(1)
    print(f"dev mode: {devmode.enabled()}, capkv under beartype: {devmode.types_checked()}, python {sys.version.split()[0]}")
    production_ratio()
    block_id_cost()
    tensor_check_cost()


if __name__ == "__main__":
    main()
