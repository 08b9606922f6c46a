"""The null connector: every member present, nothing moved, every call recorded.

One connector for unit tests of engines, composites and wrappers: a test sets its answers and reads its calls.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Set as AbstractSet
from contextlib import AbstractContextManager
from typing import Any

import torch

from capkv._homes import publish
from capkv.contracts._base import KVConnectorBase
from capkv.contracts._engine import (
    AttentionMetadata,
    BlockIds,
    ConnectorMetadata,
    ForwardContext,
    HandshakeMetadata,
    KVConnectorOutput,
    KVTransferParams,
    LoadErrors,
    Request,
    SchedulerOutput,
    WorkerMetadata,
)

__all__ = ["HMANullConnector", "NullConnector"]


class NullConnector(KVConnectorBase[Request]):
    """A single-group connector that loads and saves nothing and records every call.

    Set its answers before the call that returns them: ``hit`` and
    ``load_async`` (``get_num_new_matched_tokens``; a callable ``hit`` is called with
    ``num_computed_tokens``), ``slices`` (``loads_slices``: may a stack ask it beyond the
    local hit), ``delay_free`` and ``params``
    (finishes), ``finished`` (the next ``get_finished``, then reset),
    ``load_errors``, ``events`` (the next ``take_events``, then reset),
    ``layout``, ``finished_count``, ``piecewise``, ``handshake``, ``pool``,
    ``stats``, ``worker_meta``, and ``shutdown_error`` (raised by ``shutdown``).
    """

    def __init__(
        self, name: str = "", *, hit: int | None | Callable[[int], int | None] = 0, load_async: bool = False,
        slices: bool = False,
    ) -> None:
        self.name = name
        self.hit = hit
        self.load_async = load_async
        self.slices = slices
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        """``(method, arguments)`` of every recorded call, in order."""
        self.delay_free = False
        self.params: KVTransferParams | None = None
        self.finished: tuple[set[str] | None, set[str] | None] = (None, None)
        self.load_errors: LoadErrors = {}
        self.events: list[object] = []
        self.layout: str | None = None
        self.finished_count: int | None = None
        self.piecewise = False
        self.handshake: object = None
        self.pool: AbstractContextManager[object] | None = None
        self.stats: object = None
        self.worker_meta: WorkerMetadata | None = None
        self.shutdown_error: BaseException | None = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    def _record(self, method: str, *args: Any) -> None:
        self.calls.append((method, args))

    def methods(self) -> list[str]:
        """The names of the recorded calls, in order."""
        return [method for method, _ in self.calls]

    # ---- scheduler side ----------------------------------------------------------------

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int, /) -> tuple[int | None, bool]:
        self._record("get_num_new_matched_tokens", request, num_computed_tokens)
        hit = self.hit
        return (hit(num_computed_tokens) if callable(hit) else hit), self.load_async

    def update_state_after_alloc(self, request: Request, blocks: BlockIds, num_external_tokens: int, /) -> None:
        self._record("update_state_after_alloc", request, blocks, num_external_tokens)

    def loads_slices(self) -> bool:
        return self.slices

    def loaded_elsewhere(self, request: Request, start: int, end: int, save: bool, /) -> None:
        self._record("loaded_elsewhere", request, start, end, save)

    def loads_failed(self, request_ids: AbstractSet[str], /) -> None:
        self._record("loads_failed", set(request_ids))

    def build_connector_meta(self, scheduler_output: SchedulerOutput, /) -> object:
        self._record("build_connector_meta", scheduler_output)
        return f"meta-{self.name}"

    def update_connector_output(self, connector_output: KVConnectorOutput, /) -> None:
        self._record("update_connector_output", connector_output)

    def request_finished(self, request: Request, block_ids: list[int], /) -> tuple[bool, KVTransferParams | None]:
        self._record("request_finished", request, block_ids)
        return self.delay_free, self.params

    def take_events(self) -> Iterable[object]:
        events, self.events = self.events, []
        return iter(events)

    def get_required_kvcache_layout(self) -> str | None:
        return self.layout

    def get_finished_count(self) -> int | None:
        return self.finished_count

    def requires_piecewise_for_cudagraph(self) -> bool:
        return self.piecewise

    def set_xfer_handshake_metadata(self, metadata: Mapping[int, HandshakeMetadata], /) -> None:
        self._record("set_xfer_handshake_metadata", metadata)

    # ---- worker side ---------------------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor], /) -> None:
        self._record("register_kv_caches", kv_caches)

    def bind_connector_metadata(self, connector_metadata: ConnectorMetadata, /) -> None:
        self._record("bind_connector_metadata", connector_metadata)
        super().bind_connector_metadata(connector_metadata)

    def handle_preemptions(self, connector_metadata: ConnectorMetadata, /) -> None:
        self._record("handle_preemptions", connector_metadata)

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        self._record("start_load_kv", forward_context, kwargs)

    def wait_for_layer_load(self, layer_name: str, /) -> None:
        self._record("wait_for_layer_load", layer_name)

    def save_kv_layer(
        self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: AttentionMetadata, **kwargs: Any
    ) -> None:
        self._record("save_kv_layer", layer_name, kv_layer, attn_metadata, kwargs)

    def wait_for_save(self) -> None:
        self._record("wait_for_save")

    def get_finished(self, finished_req_ids: set[str], /) -> tuple[set[str] | None, set[str] | None]:
        self._record("get_finished", set(finished_req_ids))
        result, self.finished = self.finished, (None, None)
        return result

    def get_block_ids_with_load_errors(self) -> LoadErrors:
        return self.load_errors

    def build_connector_worker_meta(self) -> WorkerMetadata | None:
        return self.worker_meta

    def clear_connector_metadata(self) -> None:
        self._record("clear_connector_metadata")
        super().clear_connector_metadata()

    def get_handshake_metadata(self) -> object:
        return self.handshake

    def get_mem_pool_context(self) -> AbstractContextManager[object] | None:
        return self.pool

    def get_kv_connector_stats(self) -> object:
        return self.stats

    def shutdown(self) -> None:
        self._record("shutdown")
        if self.shutdown_error is not None:
            raise self.shutdown_error


class HMANullConnector(NullConnector):
    """The null connector, HMA-capable: finishes with every group's blocks."""

    def request_finished_all_groups(
        self, request: Request, block_ids: BlockIds, /
    ) -> tuple[bool, KVTransferParams | None]:
        self._record("request_finished_all_groups", request, block_ids)
        return self.delay_free, self.params


publish(__name__)
