"""Per-call cost of MultiConnector's hot methods (2 children), next to calling the children directly.

For each method an engine calls per request or per step, this prints the
composite's ns/call, the cost of calling the two children's own methods
directly (the cheapest thing an engine could do without a composite), and the
ratio. Two kinds of children:

- *empty*: every method returns at once. The figure is the composite's bare
  overhead, the worst case for the ratio (the composite's own Python call costs
  about as much as one empty child's).
- *bookkeeping*: each method does what a store connector does with a request of
  2 KV-cache groups x 16 blocks (records block ids, skips null blocks, hands
  planned work over in its metadata).

vLLM's own MultiConnector is measured beside capkv's by the vLLM test
environment; this script needs capkv only.

Run: python -m benchmarks.multi_overhead [--quick]
"""

from __future__ import annotations

import sys
import time
import timeit
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from capkv import BlockIds, KVConnectorBase, KVConnectorOutput, KVTransferParams, MultiConnector, MultiWorkerMetadata, Request


@dataclass(frozen=True)
class Req:
    request_id: str


@dataclass(frozen=True)
class WorkerReport:
    """A child's worker metadata (what a store reports it saved)."""

    stored: tuple[int, ...] = ()

    def aggregate(self, other: Any, /) -> WorkerReport:
        return WorkerReport(self.stored + other.stored)


class Leaf(KVConnectorBase[Request]):
    """An HMA connector whose every method returns at once."""

    def __init__(self, delay_free: bool = False) -> None:
        self.delay_free = delay_free
        self.pending: dict[str, list[list[int]]] = {}
        self.allocated: dict[str, BlockIds] = {}
        self.seen: object = None

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int, /) -> tuple[int | None, bool]:
        return 0, False

    def update_state_after_alloc(self, request: Request, blocks: BlockIds, num_external_tokens: int, /) -> None: ...
    def build_connector_meta(self, scheduler_output: Any, /) -> object: return None
    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None: ...
    def wait_for_layer_load(self, layer_name: str, /) -> None: ...
    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any) -> None: ...
    def wait_for_save(self) -> None: ...
    def update_connector_output(self, connector_output: KVConnectorOutput, /) -> None: ...

    def get_finished(self, finished_req_ids: set[str], /) -> tuple[set[str] | None, set[str] | None]:
        return None, None

    def request_finished(self, request: Request, block_ids: list[int], /) -> tuple[bool, KVTransferParams | None]:
        return self.delay_free, None

    def request_finished_all_groups(self, request: Request, block_ids: BlockIds, /) -> tuple[bool, KVTransferParams | None]:
        return self.delay_free, None


class Bookkeeper(Leaf):
    """Does a store connector's bookkeeping: which blocks to save and load, handed over per step."""

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int, /) -> tuple[int | None, bool]:
        return (0, False) if request.request_id in self.pending else (0, False)

    def update_state_after_alloc(self, request: Request, blocks: BlockIds, num_external_tokens: int, /) -> None:
        self.allocated[request.request_id] = blocks

    def build_connector_meta(self, scheduler_output: Any, /) -> object:
        planned, self.pending = self.pending, {}
        return planned

    def update_connector_output(self, connector_output: KVConnectorOutput, /) -> None:
        self.seen = connector_output.worker_meta

    def request_finished(self, request: Request, block_ids: list[int], /) -> tuple[bool, KVTransferParams | None]:
        self.pending[request.request_id] = [[b for b in block_ids if b]]
        return self.delay_free, None

    def request_finished_all_groups(self, request: Request, block_ids: BlockIds, /) -> tuple[bool, KVTransferParams | None]:
        self.pending[request.request_id] = [[b for b in group if b] for group in block_ids]
        return self.delay_free, None


def best_ns(stmt: Callable[[], object], number: int, repeat: int) -> float:
    """Per-call CPU time in nanoseconds: the best of ``repeat`` runs (the least disturbed one).

    CPU time of this process, not wall time: on a shared machine a run that is
    descheduled would otherwise count other processes' work.
    """
    timer = timeit.Timer(stmt, timer=time.process_time)
    return min(timer.repeat(number=number, repeat=repeat)) / number * 1e9


def cases(a: Leaf, b: Leaf, stack: Any) -> dict[str, tuple[Callable[[], object], Callable[[], object]]]:
    """Method -> (direct call of both children, the composite's call)."""
    request = Req("r")
    groups = (list(range(1, 17)), [0] * 12 + list(range(17, 21)))
    flat = groups[0]
    finished: set[str] = set()
    metas = (WorkerReport((1,)), WorkerReport((2,)))
    plain_output = KVConnectorOutput()
    with_meta = KVConnectorOutput(worker_meta=MultiWorkerMetadata(metas))
    a_meta, b_meta = KVConnectorOutput(worker_meta=metas[0]), KVConnectorOutput(worker_meta=metas[1])

    def pair(method: str, *args: Any) -> tuple[Callable[[], object], Callable[[], object]]:
        fa, fb, fs = getattr(a, method), getattr(b, method), getattr(stack, method)

        def direct() -> None:
            fa(*args)
            fb(*args)

        def composite() -> None:
            fs(*args)

        return direct, composite

    table = {
        "request_finished_all_groups": pair("request_finished_all_groups", request, groups),
        "request_finished": pair("request_finished", request, flat),
        "get_num_new_matched_tokens": pair("get_num_new_matched_tokens", request, 0),
        "update_state_after_alloc": pair("update_state_after_alloc", request, groups, 0),
        "build_connector_meta": pair("build_connector_meta", None),
        "get_finished": pair("get_finished", finished),
        "update_connector_output": pair("update_connector_output", plain_output),
    }
    ua, ub, us = a.update_connector_output, b.update_connector_output, stack.update_connector_output

    def direct_meta() -> None:
        ua(a_meta)
        ub(b_meta)

    def composite_meta() -> None:
        us(with_meta)

    table["update_connector_output+worker_meta"] = (direct_meta, composite_meta)
    return table


def main() -> None:
    quick = "--quick" in sys.argv
    number, repeat = (5_000, 3) if quick else (50_000, 9)
    empty = best_ns(lambda: None, number, repeat)
    print(f"{'method':38} {'children':12} {'direct ns':>10} {'capkv ns':>10} {'ratio':>7}")
    for label, kind in (("empty", Leaf), ("bookkeeping", Bookkeeper)):
        a, b = kind(), kind(delay_free=True)
        stack = MultiConnector(a, b)
        for method, (direct, composite) in cases(a, b, stack).items():
            direct_ns = best_ns(direct, number, repeat) - empty
            stack_ns = best_ns(composite, number, repeat) - empty
            print(f"{method:38} {label:12} {direct_ns:10.1f} {stack_ns:10.1f} {stack_ns / direct_ns:6.2f}x")


if __name__ == "__main__":
    main()
