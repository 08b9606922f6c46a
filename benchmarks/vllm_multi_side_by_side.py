"""capkv's MultiConnector next to vLLM's, over the same two children, method by method.

The children are vLLM connectors (``KVConnectorBase_V1`` + ``SupportsHMA``) defined here.
vLLM's ``MultiConnector`` builds its two from its ``kv_transfer_config`` (through this module's
path, as vLLM does); capkv's stacks two instances built the same way, each wrapped with
``capkv.vllm.wrap`` — so capkv's figure includes the adapter's translation, which is what a
vLLM connector in a capkv stack costs. Inputs are vLLM's own objects (``Request``,
``KVCacheBlocks``, ``KVConnectorOutput``); capkv's side gets them as the vLLM host hands them
over (block ids carrying the ``KVCacheBlocks``; capkv's output carrying vLLM's), built once,
outside the timed loop.

Two kinds of children: *empty* (every member returns at once: the composites' bare cost) and
*bookkeeping* (a 1,024-token request's blocks in each KV-cache group of the ``--model`` presets — 1 group for
the Llama shapes, 3 for the demo model, 6 for Gemma-3-12B —: the blocks are recorded at allocation, looked up
at finish, metadata lists them, finished sets are reported).

Run in an environment with vLLM: ``python benchmarks/vllm_multi_side_by_side.py [--model demo llama-8b gemma3-12b]``.
Prints ns/call for both and capkv/vLLM (goal: <= 1.0 on every method, stretch 0.8), and, to tell the composite's
cost from the adapter's, capkv's MultiConnector over the same bookkeeping written to capkv's contract
(children that load slices: the composition rule at work). vLLM's connectors do not load slices, so a stack
of them composes by the first-hit rule; the host hands the stack vLLM's blocks and output inside capkv's
(``block_ids_from_vllm``, ``VllmOutputCarrier``), and the stack passes them to the wrapped children once.
The shared machine is noisy: run it several times and compare medians.
"""

from __future__ import annotations

import argparse
import os
import sys
import timeit
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

if __package__ in (None, ""):  # run as a script: this module must be importable by vLLM's factory
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from vllm.config import KVTransferConfig, VllmConfig
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorWorkerMetadata,
    SupportsHMA,
)
from vllm.distributed.kv_transfer.kv_connector.v1.multi_connector import (
    MultiConnector as VllmMultiConnector,
    MultiKVConnectorWorkerMetadata,
)
from vllm.sampling_params import SamplingParams
from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.core.kv_cache_utils import KVCacheBlock
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.kv_cache_interface import KVCacheConfig
from vllm.v1.outputs import KVConnectorOutput as VllmOutput
from vllm.v1.request import Request

import capkv
from benchmarks._models import add_model_argument, chosen_models
from capkv.adapters.vllm._carry import VllmOutputCarrier, block_ids_from_vllm
from capkv.vllm import wrap

MODULE = "benchmarks.vllm_multi_side_by_side"
TOKENS = 1024
"""Tokens of the timed request: its blocks (per group) are what the bookkeeping children record and list."""


@dataclass
class Meta(KVConnectorMetadata):
    requests: list[str]


@dataclass
class WorkerMeta(KVConnectorWorkerMetadata):
    stored: int

    def aggregate(self, other: KVConnectorWorkerMetadata) -> KVConnectorWorkerMetadata:
        return WorkerMeta(self.stored + getattr(other, "stored", 0))


class EmptyChild(KVConnectorBase_V1, SupportsHMA):
    """Every member returns at once."""

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None: ...
    def wait_for_layer_load(self, layer_name: str) -> None: ...
    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any) -> None: ...
    def wait_for_save(self) -> None: ...

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int | None, bool]:
        return 0, False

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int) -> None:
        return None

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        return EMPTY_META

    def request_finished_all_groups(
        self, request: Request, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]:
        return False, None


EMPTY_META = Meta([])


class BookkeepingChild(EmptyChild):
    """Records blocks per request (2 groups x 16), saves asynchronously, reports what finished."""

    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        self.blocks: dict[str, tuple[list[int], ...]] = {}
        self.saving: dict[str, int] = {}
        self.stored = 0

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int | None, bool]:
        known = self.blocks.get(request.request_id)
        return (0 if known is None else 0 * len(known)), False

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int) -> None:
        self.blocks[request.request_id] = blocks.get_block_ids()

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        return Meta(list(self.saving))

    def update_connector_output(self, connector_output: VllmOutput) -> None:
        for request_id in connector_output.finished_sending or ():
            self.saving.pop(request_id, None)
        meta = connector_output.kv_connector_worker_meta
        if isinstance(meta, WorkerMeta):
            self.stored += meta.stored

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        self.saving[request.request_id] = len(block_ids)
        return True, None

    def request_finished_all_groups(
        self, request: Request, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]:
        self.saving[request.request_id] = sum(map(len, block_ids))
        return True, None

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        # Looks its saves up; reports none done (a send reported again and again is not the protocol:
        # capkv's composite drops a send it holds no save for, so reports would time a different path).
        done = {request_id for request_id, blocks in self.saving.items() if blocks < 0}
        return done or None, None

    def build_connector_worker_meta(self) -> KVConnectorWorkerMetadata | None:
        return WorkerMeta(1)


class NativeEmpty(capkv.KVConnectorBase[Any]):
    """EmptyChild written to capkv's contract: what the composite costs without the adapter. It loads
    slices (``loads_slices``), so the stack asks it beyond what earlier children load: composition on."""

    @capkv.class_level
    def loads_slices(cls) -> bool:
        return True

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int, /) -> tuple[int | None, bool]:
        return 0, False

    def update_state_after_alloc(self, request: Any, blocks: capkv.BlockIds, num_external_tokens: int, /) -> None:
        return None

    def build_connector_meta(self, scheduler_output: Any, /) -> object:
        return EMPTY_META

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None: ...
    def wait_for_layer_load(self, layer_name: str, /) -> None: ...
    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any) -> None: ...
    def wait_for_save(self) -> None: ...

    def request_finished_all_groups(self, request: Any, block_ids: capkv.BlockIds, /) -> tuple[bool, None]:
        return False, None


class NativeBookkeeping(NativeEmpty):
    """BookkeepingChild written to capkv's contract (block ids arrive as ids: no KVCacheBlocks to read)."""

    def __init__(self) -> None:
        self.blocks: dict[str, capkv.BlockIds] = {}
        self.saving: dict[str, int] = {}
        self.stored = 0

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int, /) -> tuple[int | None, bool]:
        known = self.blocks.get(request.request_id)
        return (0 if known is None else 0 * len(known)), False

    def update_state_after_alloc(self, request: Any, blocks: capkv.BlockIds, num_external_tokens: int, /) -> None:
        self.blocks[request.request_id] = blocks

    def build_connector_meta(self, scheduler_output: Any, /) -> object:
        return Meta(list(self.saving))

    def update_connector_output(self, connector_output: capkv.KVConnectorOutput, /) -> None:
        for request_id in connector_output.finished_sending:
            self.saving.pop(request_id, None)
        meta = connector_output.worker_meta
        if isinstance(meta, WorkerMeta):
            self.stored += meta.stored

    def request_finished(self, request: Any, block_ids: list[int], /) -> tuple[bool, None]:
        self.saving[request.request_id] = len(block_ids)
        return True, None

    def request_finished_all_groups(self, request: Any, block_ids: capkv.BlockIds, /) -> tuple[bool, None]:
        self.saving[request.request_id] = sum(map(len, block_ids))
        return True, None

    def get_finished(self, finished_req_ids: set[str], /) -> tuple[set[str] | None, set[str] | None]:
        done = {request_id for request_id, blocks in self.saving.items() if blocks < 0}
        return done or None, None

    def build_connector_worker_meta(self) -> Any:
        return WorkerMeta(1)


NATIVE = {"EmptyChild": NativeEmpty, "BookkeepingChild": NativeBookkeeping}


def vllm_config(child: str) -> VllmConfig:
    entry = {"kv_connector": child, "kv_connector_module_path": MODULE, "kv_role": "kv_both"}
    return VllmConfig(kv_transfer_config=KVTransferConfig(
        kv_connector="MultiConnector", kv_role="kv_both",
        kv_connector_extra_config={"connectors": [entry, dict(entry)]},
    ))


def child_config(child: str) -> VllmConfig:
    return VllmConfig(kv_transfer_config=KVTransferConfig(
        kv_connector=child, kv_connector_module_path=MODULE, kv_role="kv_both"))


ROUNDS = 21


def ns_per_call(*fns: Callable[[], object], number: int) -> list[float]:
    """Best of :data:`ROUNDS` short rounds each, the calls timed alternately (so load on a shared machine hits
    all alike, and a round short enough to run undisturbed comes up for each)."""
    best = [float("inf")] * len(fns)
    for _ in range(ROUNDS):
        for index, fn in enumerate(fns):
            best[index] = min(best[index], timeit.timeit(fn, number=number))
    return [b / number * 1e9 for b in best]


def measure(child: str, number: int, groups: int, blocks: int) -> list[tuple[str, float, float, float]]:
    """ns/call of every member (capkv wrapped, vLLM, capkv native) for a request of ``blocks`` blocks in each of
    ``groups`` KV-cache groups."""
    kv_cache_config = KVCacheConfig(num_blocks=4096, kv_cache_tensors=[], kv_cache_groups=[])
    role = KVConnectorRole.SCHEDULER
    theirs = VllmMultiConnector(vllm_config(child), role, kv_cache_config)
    cls = type(theirs.sub_connectors[0])
    ours = capkv.MultiConnector(*(wrap(cls(child_config(child), role, kv_cache_config)) for _ in range(2)))
    native = capkv.MultiConnector(NATIVE[child](), NATIVE[child]())

    request = Request("req-0", list(range(TOKENS)), SamplingParams(), None)
    block_ids = tuple(list(range(1 + g * blocks, 1 + (g + 1) * blocks)) for g in range(groups))
    blocks = KVCacheBlocks(tuple([KVCacheBlock(i) for i in ids] for ids in block_ids))
    carried_ids = block_ids_from_vllm(blocks)
    scheduler_output = SchedulerOutput.make_empty()
    finished = {"req-0"}

    plain_vllm = VllmOutput(finished_sending={"req-0"})
    plain_capkv = VllmOutputCarrier(finished_sending=frozenset({"req-0"}), vllm_output=plain_vllm)
    meta_vllm = VllmOutput(
        finished_sending={"req-0"}, kv_connector_worker_meta=MultiKVConnectorWorkerMetadata((WorkerMeta(1), WorkerMeta(1)))
    )
    plain_native = capkv.KVConnectorOutput(finished_sending=frozenset({"req-0"}))
    meta_native = capkv.KVConnectorOutput(
        finished_sending=frozenset({"req-0"}), worker_meta=capkv.MultiWorkerMetadata((WorkerMeta(1), WorkerMeta(1)))
    )
    meta_capkv = VllmOutputCarrier(
        finished_sending=frozenset({"req-0"}),
        worker_meta=capkv.MultiWorkerMetadata((WorkerMeta(1), WorkerMeta(1))),
        vllm_output=VllmOutput(finished_sending={"req-0"}),
    )

    cases: list[tuple[str, Callable[[], object], Callable[[], object], Callable[[], object]]] = [
        ("request_finished_all_groups",
         lambda: ours.request_finished_all_groups(request, block_ids),  # type: ignore[attr-defined]
         lambda: theirs.request_finished_all_groups(request, block_ids),
         lambda: native.request_finished_all_groups(request, block_ids)),  # type: ignore[attr-defined]
        ("request_finished",
         lambda: ours.request_finished(request, block_ids[0]),
         lambda: theirs.request_finished(request, block_ids[0]),
         lambda: native.request_finished(request, block_ids[0])),
        ("get_num_new_matched_tokens",
         lambda: ours.get_num_new_matched_tokens(request, 0),
         lambda: theirs.get_num_new_matched_tokens(request, 0),
         lambda: native.get_num_new_matched_tokens(request, 0)),
        ("update_state_after_alloc",
         lambda: ours.update_state_after_alloc(request, carried_ids, 0),
         lambda: theirs.update_state_after_alloc(request, blocks, 0),
         lambda: native.update_state_after_alloc(request, block_ids, 0)),
        ("build_connector_meta",
         lambda: ours.build_connector_meta(scheduler_output),
         lambda: theirs.build_connector_meta(scheduler_output),
         lambda: native.build_connector_meta(scheduler_output)),
        ("get_finished",
         lambda: ours.get_finished(finished),
         lambda: theirs.get_finished(finished),
         lambda: native.get_finished(finished)),
        ("get_finished / get_transfer_results",
         lambda: ours.get_finished(finished),
         lambda: theirs.get_transfer_results(finished),
         lambda: native.get_finished(finished)),
        ("update_connector_output",
         lambda: ours.update_connector_output(plain_capkv),
         lambda: theirs.update_connector_output(plain_vllm),
         lambda: native.update_connector_output(plain_native)),
        ("update_connector_output + worker meta",
         lambda: ours.update_connector_output(meta_capkv),
         lambda: theirs.update_connector_output(meta_vllm),
         lambda: native.update_connector_output(meta_native)),
    ]
    rows = []
    for name, capkv_call, vllm_call, native_call in cases:
        capkv_call(), vllm_call(), native_call()  # all work before they are timed
        wrapped, theirs_ns, native_ns = ns_per_call(capkv_call, vllm_call, native_call, number=number)
        rows.append((name, wrapped, theirs_ns, native_ns))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_argument(parser, default=["demo", "llama-8b", "gemma3-12b"])
    parser.add_argument("--block-size", type=int, default=16, help="tokens per block (default: 16)")
    args = parser.parse_args()
    number = int(os.environ.get("CAPKV_BENCH_NUMBER", "4000"))
    blocks = TOKENS // args.block_size
    # Bookkeeping depends on a preset's groups and a request's blocks, not on the bytes of a block: presets
    # of as many groups are one measurement.
    shapes: dict[int, list[str]] = {}
    for preset in chosen_models(args):
        shapes.setdefault(len(preset.layout().groups), []).append(preset.name)
    print("capkv MultiConnector vs vLLM MultiConnector, 2 children (vLLM connectors; capkv's wrapped), ns/call")
    print(f"best of {ROUNDS} alternating rounds x {number} calls; goal: capkv/vLLM <= 1.0 on every method (stretch 0.8)\n")
    worst = 0.0
    for groups, names in shapes.items():
        for child in ("EmptyChild", "BookkeepingChild"):
            what = ("every member returns at once" if child == "EmptyChild"
                    else f"a {TOKENS}-token request: {groups} group(s) x {blocks} blocks of bookkeeping")
            print(f"{', '.join(names)} ({groups} KV-cache group{'s' if groups > 1 else ''}): {child} ({what})")
            print(f"  {'method':40} {'capkv':>9} {'vLLM':>9} {'ratio':>7}   {'capkv, native children':>22} {'ratio':>6}")
            for name, ours, theirs, native in measure(child, number, groups, blocks):
                ratio = ours / theirs
                worst = max(worst, ratio)
                flag = "" if ratio <= 1.0 else " >1.0"
                print(f"  {name:40} {ours:9.0f} {theirs:9.0f} {ratio:7.2f}{flag:5} {native:18.0f} {native / theirs:6.2f}")
            print()
    print(f"worst ratio: {worst:.2f} ({'meets' if worst <= 1.0 else 'misses'} the 1.0 goal; "
          f"{'meets' if worst <= 0.8 else 'misses'} the 0.8 stretch)")
    print("(capkv: the two vLLM children wrapped with capkv.vllm.wrap; 'native children': the same bookkeeping")
    print(" written to capkv's contract, to tell the composite's cost from the adapter's; ratios against vLLM)")


if __name__ == "__main__":
    main()
