"""Small in-test connectors for the engine: an HMA block store and its broken variants.

``BlockStore`` keeps copies of blocks keyed by (group, token prefix up to the
block's end), in a dict. It saves either layer by layer as the engine computes
(``save="layer"``) or when a request finishes, asynchronously (``save="finish"``:
``delay_free``, copied in the next step, reported in ``finished_sending``). It
loads synchronously or asynchronously (``load_async``). The broken variants
reproduce field failures the engine must catch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from capkv import BlockIds, KVConnectorBase, KVSpec, KVTransferParams, LoadErrors
from capkv.config import ConnectorOptions, Option
from capkv.engine._outputs import SchedulerOutput
from capkv.engine._request import Request

Key = tuple[int, tuple[int, ...]]


@dataclass
class Copy:
    key: Key
    group: int
    block_id: int


@dataclass
class Meta:
    loads: list[tuple[str, list[Copy]]] = field(default_factory=list)
    saves: list[tuple[str, list[Copy]]] = field(default_factory=list)
    layer_saves: list[Copy] = field(default_factory=list)


class BlockStore(KVConnectorBase[Request]):
    extra_config_options = ConnectorOptions(takes_spec=True, save=Option(str, choices=("layer", "finish")),
                                            load_async=Option(bool))
    """An HMA-capable store of blocks in host memory."""

    def __init__(self, spec: KVSpec, *, save: str = "layer", load_async: bool = False) -> None:
        self.spec = spec
        self.save = save
        self.load_async = load_async
        self.store: dict[Key, dict[str, torch.Tensor]] = {}
        self.caches: dict[str, torch.Tensor] = {}
        self.computed: dict[str, int] = {}
        self.pending_loads: list[tuple[str, list[Copy]]] = []
        self.pending_saves: list[tuple[str, list[Copy]]] = []
        self.sending: set[str] = set()
        self.recving: set[str] = set()
        self.calls: list[str] = []
        self.loaded_blocks = 0
        self.saved_blocks = 0
        self.finished_with: dict[str, BlockIds] = {}

    # ---- helpers ---------------------------------------------------------------

    def key(self, request: Request, group: int, index: int) -> Key:
        size = self.spec.groups[group].block_size or 1
        return group, tuple(request.all_token_ids[: (index + 1) * size])

    def _stored_hit(self, request: Request, tokens: int) -> bool:
        for g, group in enumerate(self.spec.groups):
            size = group.block_size or 1
            first = 0 if group.sliding_window is None else max(0, tokens - group.sliding_window + 1) // size
            if any(self.key(request, g, i) not in self.store for i in range(first, tokens // size)):
                return False
        return True

    # ---- scheduler side --------------------------------------------------------

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int, /) -> tuple[int | None, bool]:
        self.calls.append("get_num_new_matched_tokens")
        self.computed[request.request_id] = num_computed_tokens
        align = math.lcm(*(g.block_size or 1 for g in self.spec.groups))
        tokens = len(request.all_token_ids) - len(request.all_token_ids) % align
        while tokens > num_computed_tokens and not self._stored_hit(request, tokens):
            tokens -= align
        hit = max(0, tokens - num_computed_tokens)
        return hit, self.load_async and hit > 0

    def update_state_after_alloc(self, request: Request, blocks: BlockIds, num_external_tokens: int, /) -> None:
        self.calls.append("update_state_after_alloc")
        if num_external_tokens == 0:
            return
        start = self.computed[request.request_id]
        copies = []
        for g, table in enumerate(blocks):
            size = self.spec.groups[g].block_size or 1
            for index in range(start // size, math.ceil((start + num_external_tokens) / size)):
                if table[index] != self.spec.null_block_id:
                    copies.append(Copy(self.key(request, g, index), g, table[index]))
        self.pending_loads.append((request.request_id, copies))

    def build_connector_meta(self, scheduler_output: Any, /) -> object:
        self.calls.append("build_connector_meta")
        meta = Meta(self.pending_loads, self.pending_saves)
        self.pending_loads, self.pending_saves = [], []
        if self.save == "layer":
            assert isinstance(scheduler_output, SchedulerOutput)
            for s in scheduler_output.scheduled:
                for g, table in enumerate(s.block_ids):
                    size = self.spec.groups[g].block_size or 1
                    for index in range(s.start // size, s.stop // size):
                        meta.layer_saves.append(Copy(self.key(s.request, g, index), g, table[index]))
        return meta

    def request_finished_all_groups(self, request: Request, block_ids: BlockIds, /) -> tuple[bool, KVTransferParams | None]:
        self.calls.append("request_finished_all_groups")
        self.finished_with[request.request_id] = tuple(list(t) for t in block_ids)
        if self.save != "finish":
            return False, None
        copies = []
        computed = len(request.all_token_ids) - 1
        for g, table in enumerate(block_ids):
            size = self.spec.groups[g].block_size or 1
            for index in range(min(len(table), computed // size)):
                if table[index] != self.spec.null_block_id:
                    copies.append(Copy(self.key(request, g, index), g, table[index]))
        self.pending_saves.append((request.request_id, copies))
        return True, {"saved_blocks": len(copies)}

    # ---- worker side -----------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor], /) -> None:
        self.calls.append("register_kv_caches")
        self.caches = kv_caches

    def _layers(self, group: int) -> tuple[str, ...]:
        return self.spec.groups[group].layer_names

    def load_block(self, copy: Copy, layer: str) -> None:
        self.caches[layer][:, copy.block_id] = self.store[copy.key][layer]

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        self.calls.append("start_load_kv")
        meta = self.connector_metadata
        assert isinstance(meta, Meta)
        for request_id, copies in meta.saves:
            for copy in copies:
                self.store[copy.key] = {layer: self.caches[layer][:, copy.block_id].clone() for layer in self._layers(copy.group)}
                self.saved_blocks += 1
            self.sending.add(request_id)
        for request_id, copies in meta.loads:
            for copy in copies:
                for layer in self._layers(copy.group):
                    self.load_block(copy, layer)
                self.loaded_blocks += 1
            if self.load_async:
                self.recving.add(request_id)

    def wait_for_layer_load(self, layer_name: str, /) -> None:
        self.calls.append("wait_for_layer_load")

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any) -> None:
        self.calls.append("save_kv_layer")
        meta = self.connector_metadata
        assert isinstance(meta, Meta)
        for copy in meta.layer_saves:
            if layer_name in self._layers(copy.group):
                self.store.setdefault(copy.key, {})[layer_name] = kv_layer[:, copy.block_id].clone()
                self.saved_blocks += 1

    def wait_for_save(self) -> None:
        self.calls.append("wait_for_save")

    def get_finished(self, finished_req_ids: set[str], /) -> tuple[set[str] | None, set[str] | None]:
        self.calls.append("get_finished")
        sending, recving = self.sending, self.recving
        self.sending, self.recving = set(), set()
        return sending or None, recving or None

    def bind_connector_metadata(self, connector_metadata: Any, /) -> None:
        self.calls.append("bind_connector_metadata")
        super().bind_connector_metadata(connector_metadata)

    def clear_connector_metadata(self) -> None:
        self.calls.append("clear_connector_metadata")
        super().clear_connector_metadata()

    def update_connector_output(self, connector_output: Any, /) -> None:
        self.calls.append("update_connector_output")


class Group0Only(BlockStore):
    """The field bug: every group's loads go through group 0's block table."""

    def update_state_after_alloc(self, request: Request, blocks: BlockIds, num_external_tokens: int, /) -> None:
        super().update_state_after_alloc(request, tuple(blocks[0] for _ in blocks), num_external_tokens)


class OffByOne(BlockStore):
    """Loads each block but the first from the store entry of the block before it (a wrong-prefix load)."""

    shifted_loads = 0

    def load_block(self, copy: Copy, layer: str) -> None:
        group, tokens = copy.key
        size = self.spec.groups[group].block_size or 1
        source = (group, tokens[:-size]) if len(tokens) > size else copy.key
        self.shifted_loads += source != copy.key
        self.caches[layer][:, copy.block_id] = self.store[source][layer]


class FailingLoads(BlockStore):
    """Reports the last block of every load as failed, without writing it."""

    def __init__(self, spec: KVSpec, **kwargs: Any) -> None:
        super().__init__(spec, **kwargs)
        self.errors: LoadErrors = {}

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        meta = self.connector_metadata
        assert isinstance(meta, Meta)
        for _, copies in meta.loads:
            for group in {c.group for c in copies}:
                last = [c for c in copies if c.group == group][-1]
                copies.remove(last)
                self.errors.setdefault(group, set()).add(last.block_id)
        super().start_load_kv(forward_context, **kwargs)

    def get_block_ids_with_load_errors(self) -> LoadErrors:
        errors, self.errors = self.errors, {}
        return errors
