"""Per-call overhead of MultiConnector.request_finished_all_groups (2 children).

Compares ``stack.request_finished_all_groups(request, block_ids)`` with calling
the two children's ``request_finished_all_groups`` directly — the cheapest
thing an engine could do without a composite. Two kinds of children:

- *empty*: return at once. The figure is the composite's bare overhead, the
  worst case for the ratio. Note the floor: the composite's own Python call costs
  about as much as one empty child's, so no Python-level composite gets below
  ~1.5x here.
- *bookkeeping*: record the request's block ids for a later save, as a store
  connector does (2 groups x 16 blocks, a 256-token request with 16-token blocks).

Run: python -m benchmarks.multi_overhead
"""

from __future__ import annotations

import timeit
from dataclasses import dataclass
from collections.abc import Callable
from typing import Any

from capkv import BlockIds, KVConnectorBase, KVTransferParams, MultiConnector, Request


@dataclass(frozen=True)
class Req:
    request_id: str


class Leaf(KVConnectorBase[Request]):
    """An HMA connector whose finish does nothing, like a store with nothing to save."""

    def __init__(self, delay_free: bool = False) -> None:
        self.delay_free = delay_free
        self.pending: dict[str, list[list[int]]] = {}

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int, /) -> tuple[int | None, bool]:
        return 0, False

    def update_state_after_alloc(self, request: Request, blocks: BlockIds, num_external_tokens: int, /) -> None: ...
    def build_connector_meta(self, scheduler_output: Any, /) -> object: return None
    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None: ...
    def wait_for_layer_load(self, layer_name: str, /) -> None: ...
    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any) -> None: ...
    def wait_for_save(self) -> None: ...

    def request_finished_all_groups(self, request: Request, block_ids: BlockIds, /) -> tuple[bool, KVTransferParams | None]:
        return self.delay_free, None


class Bookkeeper(Leaf):
    """Remembers which blocks to save, skipping the null block, as a store connector does."""

    def request_finished_all_groups(self, request: Request, block_ids: BlockIds, /) -> tuple[bool, KVTransferParams | None]:
        self.pending[request.request_id] = [[b for b in group if b] for group in block_ids]
        return self.delay_free, None


def best_ns(stmt: Callable[[], None], number: int, repeat: int) -> float:
    """Per-call time in nanoseconds: the best of ``repeat`` runs (the least disturbed one)."""
    return min(timeit.repeat(stmt, number=number, repeat=repeat)) / number * 1e9


def main() -> None:
    request = Req("r")
    small = ([1, 2, 3, 4], [0, 0, 5, 6])
    full = (list(range(1, 17)), [0] * 12 + list(range(17, 21)))
    number, repeat = 100_000, 15
    for label, kind, block_ids in (("empty children", Leaf, small), ("bookkeeping children", Bookkeeper, full)):
        a, b = kind(), kind(delay_free=True)
        stack = MultiConnector(a, b)
        fa, fb, fs = a.request_finished_all_groups, b.request_finished_all_groups, stack.request_finished_all_groups

        def direct() -> None:
            fa(request, block_ids)
            fb(request, block_ids)

        def composite() -> None:
            fs(request, block_ids)

        def baseline() -> None:
            pass

        empty = best_ns(baseline, number, repeat)
        direct_ns = best_ns(direct, number, repeat) - empty
        stack_ns = best_ns(composite, number, repeat) - empty
        print(f"[{label:20}] direct: {direct_ns:6.1f} ns/call   MultiConnector: {stack_ns:6.1f} ns/call   "
              f"overhead {stack_ns - direct_ns:5.1f} ns   ratio {stack_ns / direct_ns:.2f}x (goal <= 1.3x)")


if __name__ == "__main__":
    main()
