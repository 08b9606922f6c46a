"""A miniature engine that drives a connector the way vLLM's scheduler and workers do.

It owns real paged KV tensors and a block allocator per KV-cache group, gives
sliding-window groups the null block for blocks outside the window, and runs
the connector protocol step by step. Its "model" writes, for every layer and
token position, bytes derived from the layer name and the whole token prefix:
so any KV found in a block can be checked bit for bit against what the engine
would have computed. Freed blocks are scribbled over, so a connector that
reads a block after the engine freed it loads garbage and is caught.

No ``assert`` here (``python -O`` strips them outside test modules): checks
raise ``AssertionError`` explicitly or return what the tests assert on.
"""

from __future__ import annotations

import hashlib
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from capkv import KVConnectorOutput, KVSpec, finish_request
from tests.paged import block_dim, empty_caches

_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


@dataclass
class Req:
    """What vLLM's Request offers that capkv's store connectors read."""

    request_id: str
    all_token_ids: list[int]
    num_computed_tokens: int = 0


@dataclass
class Run:
    """What happened to one request."""

    request: Req
    hit_tokens: int
    blocks: tuple[list[int], ...] = ()
    """The request's block ids, per group (for finishing it by hand after ``run(finish=False)``)."""
    loaded: dict[int, list[int]] = field(default_factory=dict)
    """Engine block ids that were loaded into, per group (checked bit-exact)."""
    load_errors: dict[int, set[int]] = field(default_factory=dict)
    steps_until_freed: int = 0


class MiniEngine:
    def __init__(
        self, spec: KVSpec, connector: Any, *, layout: str = "flash", seed: int = 0, device: str = "cpu"
    ) -> None:
        self.spec = spec
        self.connector = connector
        self.layout = layout
        self.caches = empty_caches(spec, layout, device)
        dtype = spec.dtype or torch.float16
        self._ints = {name: t.view(_INT_OF_SIZE[dtype.itemsize]) for name, t in self.caches.items()}
        self._rng = random.Random(seed)
        null = spec.null_block_id
        self.free: list[list[int]] = []
        for _ in range(spec.num_groups):
            ids = [b for b in range(spec.num_blocks) if b != null]
            self._rng.shuffle(ids)
            self.free.append(ids)
        self.held: dict[str, tuple[list[int], ...]] = {}
        self.received: set[str] = set()
        """Requests the connector reported received (asynchronous loads), not yet taken."""
        self.receipts: Counter[str] = Counter()
        """How many times each request was reported received (one per load), all along."""
        self._scribble(range(spec.num_blocks), groups=range(spec.num_groups))
        self.null_snapshot = {name: self._block(name, null).clone() for name in self.caches}
        connector.register_kv_caches(self.caches)

    # ---- the model -------------------------------------------------------------------

    def token_kv(self, layer: str, tokens: list[int], position: int) -> torch.Tensor:
        """The KV (K and V for every head) of ``tokens[position]`` in ``layer``, given its whole prefix."""
        prefix = hashlib.blake2b(repr((layer, tokens[: position + 1])).encode()).digest()
        sample = self._ints[layer].select(block_dim(self.layout), 0)[:, 0]
        nbytes = sample.numel() * sample.element_size()
        data = bytearray(hashlib.shake_128(prefix).digest(nbytes))
        return torch.frombuffer(data, dtype=sample.dtype).view(sample.shape)

    def _block(self, layer: str, block_id: int) -> torch.Tensor:
        """``(2, block_size, heads, dim)``: K and V of every slot of one block."""
        return self._ints[layer].select(block_dim(self.layout), block_id)

    def compute(self, request: Req, blocks: tuple[list[int], ...], start: int, end: int) -> None:
        """The forward pass: write the KV of positions ``[start, end)`` into the request's blocks."""
        for group, described in enumerate(self.spec.groups):
            size = described.block_size or 1
            for position in range(start, end):
                block_id = blocks[group][position // size]
                if block_id == self.spec.null_block_id and described.sliding_window is not None:
                    continue  # recomputing behind the window: the engine keeps nothing there
                if block_id == self.spec.null_block_id:
                    raise AssertionError(f"computing position {position} of group {group} into the null block")
                for layer in described.layer_names:
                    self._block(layer, block_id)[:, position % size].copy_(
                        self.token_kv(layer, request.all_token_ids, position)
                    )

    def wrong_positions(self, request: Req, group: int, block_index: int, block_id: int) -> list[int]:
        """Positions of one block whose KV differs from what the model computes, in any layer."""
        described = self.spec.groups[group]
        size = described.block_size or 1
        wrong: list[int] = []
        for offset in range(size):
            position = block_index * size + offset
            for layer in described.layer_names:
                if not torch.equal(self._block(layer, block_id)[:, offset].cpu(), self.token_kv(layer, request.all_token_ids, position)):
                    wrong.append(position)
                    break
        return wrong

    def null_block_untouched(self) -> bool:
        null = self.spec.null_block_id
        return all(torch.equal(self._block(name, null), snapshot) for name, snapshot in self.null_snapshot.items())

    # ---- blocks ----------------------------------------------------------------------

    def _allocate(self, num_tokens: int, hit_end: int) -> tuple[list[int], ...]:
        blocks: list[list[int]] = []
        for group, described in enumerate(self.spec.groups):
            size = described.block_size or 1
            count = -(-num_tokens // size)
            first_kept = _first_kept(described.sliding_window, size, hit_end)
            ids = [self.spec.null_block_id] * first_kept
            ids += [self.free[group].pop() for _ in range(count - first_kept)]
            blocks.append(ids)
        return tuple(blocks)

    def _drop_outside_window(self, blocks: tuple[list[int], ...], computed: int) -> None:
        for group, described in enumerate(self.spec.groups):
            size = described.block_size or 1
            for index in range(_first_kept(described.sliding_window, size, computed)):
                if blocks[group][index] != self.spec.null_block_id:
                    self._free_one(group, blocks[group][index])
                    blocks[group][index] = self.spec.null_block_id

    def _free(self, blocks: tuple[list[int], ...]) -> None:
        for group, ids in enumerate(blocks):
            for block_id in ids:
                if block_id != self.spec.null_block_id:
                    self._free_one(group, block_id)

    def _free_one(self, group: int, block_id: int) -> None:
        self._scribble([block_id], groups=[group])
        self.free[group].insert(self._rng.randrange(len(self.free[group]) + 1), block_id)

    def _scribble(self, block_ids: range | list[int], *, groups: range | list[int]) -> None:
        generator = torch.Generator().manual_seed(self._rng.randrange(2**31))
        for group in groups:
            for layer in self.spec.groups[group].layer_names:
                for block_id in block_ids:
                    target = self._block(layer, block_id)
                    target.copy_(torch.randint(-100, 100, target.shape, dtype=target.dtype, generator=generator).to(target.device))

    # ---- the protocol ----------------------------------------------------------------

    def step(self, on_loaded: Callable[[dict[int, set[int]]], None] | None = None, forward: Callable[[], None] | None = None) -> None:
        """One engine step: metadata to the worker side, loads, forward, saves, reports back."""
        connector = self.connector
        metadata = connector.build_connector_meta(None)
        connector.bind_connector_metadata(metadata)
        connector.start_load_kv(None)
        for described in self.spec.groups:
            for layer in described.layer_names:
                connector.wait_for_layer_load(layer)
        errors: dict[int, set[int]] = connector.get_block_ids_with_load_errors()
        if on_loaded is not None:
            on_loaded(errors)
        if forward is not None:
            forward()
        for described in self.spec.groups:
            for layer in described.layer_names:
                connector.save_kv_layer(layer, self.caches[layer], None)
        connector.wait_for_save()
        sending, recving = connector.get_finished(set())
        worker_meta = connector.build_connector_worker_meta()
        connector.clear_connector_metadata()
        connector.update_connector_output(
            KVConnectorOutput(
                finished_sending=frozenset(sending or ()), finished_recving=frozenset(recving or ()),
                worker_meta=worker_meta,
            )
        )
        self.received |= recving or set()
        self.receipts.update(recving or ())
        for request_id in sending or ():
            self._free(self.held.pop(request_id))

    def _receive(self, request_id: str, timeout_s: float = 30.0) -> dict[int, set[int]]:
        """Step (the request parked, as vLLM's ``WAITING_FOR_REMOTE_KVS``) until the connector reports
        ``request_id`` received, within ``timeout_s``; the load errors reported meanwhile."""
        errors: dict[int, set[int]] = {}

        def collect(found: dict[int, set[int]]) -> None:
            for group, failed in found.items():
                errors.setdefault(group, set()).update(failed)

        deadline = time.monotonic() + timeout_s
        while request_id not in self.received:
            if time.monotonic() > deadline:
                raise AssertionError(f"request {request_id} was never reported received")
            self.step(collect)
            if request_id not in self.received:
                time.sleep(0.001)
        collect(self.connector.get_block_ids_with_load_errors())  # reported with the receive, after it
        self.received.discard(request_id)
        return errors

    def finish(self, run: Run) -> bool:
        """Hand a prefilled request to the connector; ``True`` when the engine now holds its blocks."""
        delay_free, _ = finish_request(self.connector, run.request, run.blocks)
        if delay_free:
            self.held[run.request.request_id] = run.blocks
        else:
            self._free(run.blocks)
        return delay_free

    def run(self, request_id: str, prompt: list[int], *, finish: bool = True, max_drain_steps: int = 10) -> Run:
        """Prefill ``prompt`` (loading what the connector offers), sample one token, finish."""
        request = Req(request_id, list(prompt))
        offered, load_async = self.connector.get_num_new_matched_tokens(request, 0)
        if offered is None or (load_async and not offered):
            raise AssertionError(f"unexpected offer {(offered, load_async)}")
        blocks = self._allocate(len(prompt), offered)
        self.connector.update_state_after_alloc(request, blocks, offered)
        run = Run(request, offered, blocks)
        restart = [offered]  # like vLLM, recompute from the first block that failed to load
        early_errors = self._receive(request_id) if load_async else {}

        def check_loaded(errors: dict[int, set[int]]) -> None:
            for group, failed in early_errors.items():
                errors = {**errors, group: errors.get(group, set()) | failed}
            run.load_errors = errors
            for group, described in enumerate(self.spec.groups):
                size = described.block_size or 1
                for index in range(offered // size):
                    block_id = blocks[group][index]
                    if block_id == self.spec.null_block_id:
                        continue
                    if block_id in errors.get(group, set()):
                        restart[0] = min(restart[0], index * size)
                        continue
                    wrong = self.wrong_positions(request, group, index, block_id)
                    if wrong:
                        raise AssertionError(f"group {group} block {index} (id {block_id}) has wrong KV at positions {wrong}")
                    run.loaded.setdefault(group, []).append(block_id)

        self.step(check_loaded, lambda: self.compute(request, blocks, restart[0], len(prompt)))
        request.num_computed_tokens = len(prompt)
        request.all_token_ids.append(len(prompt) % 97)  # the sampled token: its KV is never computed
        self._drop_outside_window(blocks, request.num_computed_tokens)
        if not finish:
            return run
        if not self.finish(run):
            return run
        for steps in range(1, max_drain_steps + 1):
            self.step()
            if request_id not in self.held:
                run.steps_until_freed = steps
                return run
        raise AssertionError(f"request {request_id} was never reported finished sending")


def _first_kept(window: int | None, size: int, end: int) -> int:
    if window is None:
        return 0
    return max(0, (end - window + 1) // size)
