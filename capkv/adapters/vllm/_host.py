"""vLLM hosts a capkv stack: ``CapkvConnector`` and ``CapkvHMAConnector``.

vLLM builds its connector as ``cls(vllm_config, role, kv_cache_config)``, once
per role. The host reads the stack from ``kv_connector_extra_config["stack"]``
(the shape ``capkv check`` reads), refuses what it cannot serve *before building
anything*, builds the stack for its role over the engine's :class:`~capkv.KVSpec`,
runs :func:`capkv.check_stack`, and puts it under dev-mode contracts
(:func:`capkv.devmode.instrument`: the very same object in production).

Every member vLLM calls is translated: ``KVCacheBlocks`` → one list of block ids
per group; vLLM's ``KVConnectorOutput`` → capkv's (frozen sets, the stack's
worker metadata, load errors per group); capkv's per-group load errors → vLLM's
flat set; metadata, worker metadata and statistics travel in vLLM-typed
envelopes; the class-level members vLLM calls with arguments
(``get_required_kvcache_layout(vllm_config)``,
``requires_piecewise_for_cudagraph(extra_config)``) answer from the configured
classes. Finishing goes through :func:`capkv.finish_request`, never truncating
to group 0.

vLLM decides its hybrid allocator from the host *class* (``issubclass`` of its
``SupportsHMA``), so there are two: ``CapkvHMAConnector`` is one and takes only
an HMA-capable stack (a :class:`~capkv.CapabilityError` naming each non-HMA
child, at construction — never an ``assert``); ``CapkvConnector`` is not, so
vLLM turns HMA off (one group) and any stack serves.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from contextlib import AbstractContextManager
from typing import Any, ClassVar, cast

import torch
from vllm.config import VllmConfig
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorTransferResults,
    SupportsHMA,
)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats
from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.kv_cache_interface import KVCacheConfig
from vllm.v1.outputs import KVConnectorOutput
from vllm.v1.request import Request

from capkv._homes import publish
from capkv.capabilities._facts import LAYOUT, NEEDS_INSTANCE, PIECEWISE
from capkv.capabilities._serving import check_stack, finish_request
from capkv.config._hosts import HMA_HOST, PLAIN_HOST, require_host_capability, stack_config
from capkv.adapters.vllm._child import vllm_connectors
from capkv.adapters.vllm._spec import engine_spec, registered_caches
from capkv.adapters.vllm._stack import Engine, build_hosted, configured_fact, load_hosted
from capkv.config._build import closed_on_error
from capkv.adapters.vllm._translate import (
    CapkvStats,
    HostHandshake,
    HostMetadata,
    HostWorkerMetadata,
    LoadingBlocks,
    flat_load_errors,
    merge_counts,
    stats_data,
    to_capkv_output,
)
from capkv.contracts._connector import KVConnector
from capkv.contracts._engine import AttentionMetadata, BlockIds, ForwardContext, KVTransferParams, WorkerMetadata
from capkv.contracts._engine import KVConnectorOutput as CapkvKVConnectorOutput
from capkv.contracts._spec import KVSpec
from capkv.devmode._instrument import instrument
from capkv.errors import ConflictError, MetadataError

__all__ = ["CapkvConnector", "CapkvHMAConnector"]


class CapkvConnector(KVConnectorBase_V1):
    """A capkv stack inside vLLM, without HMA: vLLM turns its hybrid allocator off, so any stack serves."""

    HOST: ClassVar[str] = PLAIN_HOST
    """The host class's name in diagnostics and configurations."""

    stack: KVConnector
    """The hosted stack, built for this role (instrumented in dev mode)."""
    spec: KVSpec
    """The engine's KV cache as the stack sees it."""

    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        host = self.HOST
        transfer = vllm_config.kv_transfer_config
        extra = None if transfer is None else transfer.kv_connector_extra_config
        configured = load_hosted(stack_config(extra, host=host))
        require_host_capability(host, configured)  # from the classes, before anything is built
        self.spec = engine_spec(kv_cache_config, owner=host)
        built = build_hosted(configured, Engine(vllm_config, role, kv_cache_config, self.spec))
        with closed_on_error([built]):  # a stack refused here leaves no writer thread behind
            require_host_capability(host, built)  # the built children have the last word
            check_stack(built, self.spec)
            told = configured_fact(configured, LAYOUT, vllm_config=vllm_config)
            needed = cast("KVConnector", built).get_required_kvcache_layout()
            if needed is not None and needed != told:
                raise ConflictError(
                    f"{host}: the stack needs the {needed!r} KV-cache layout, but its classes told vLLM "
                    f"{'nothing' if told in (None, NEEDS_INSTANCE) else repr(told)} when vLLM chose its layout; "
                    "declare the layout class-level (@capkv.class_level) in the child that needs it",
                    connector=host, method="get_required_kvcache_layout", value=needed,
                )
        self.stack = instrument(cast("KVConnector", built), self.spec)
        self._vllm_children = vllm_connectors(built)
        """vLLM's connectors in the stack: the calls capkv's contract has no member for go to them."""
        self._loading = LoadingBlocks(host)
        self._totals: dict[str, Any] = {}

    # ---- class level: vLLM asks before building -------------------------------------

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config: VllmConfig) -> str | None:
        """The layout the stack's classes agree on (``None``: no preference, or only instances know)."""
        transfer = vllm_config.kv_transfer_config
        extra = None if transfer is None else transfer.kv_connector_extra_config
        answer = configured_fact(load_hosted(stack_config(extra, host=cls.HOST)), LAYOUT, vllm_config=vllm_config)
        return None if answer is NEEDS_INSTANCE else cast("str | None", answer)

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: dict[str, Any]) -> bool:
        """Whether any child needs piecewise CUDA graphs; yes when a class cannot say (always safe)."""
        answer = configured_fact(load_hosted(stack_config(extra_config, host=cls.HOST)), PIECEWISE, vllm_config=None)
        return True if answer is NEEDS_INSTANCE else bool(answer)

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> KVConnectorStats | None:
        return CapkvStats(dict(data or {}))

    # ---- scheduler side ---------------------------------------------------------------

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int | None, bool]:
        return self.stack.get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int) -> None:
        block_ids = tuple(blocks.get_block_ids())
        if num_external_tokens > 0:
            self._loading.record(request.request_id, block_ids, self.spec.null_block_id)
        self.stack.update_state_after_alloc(request, block_ids, num_external_tokens)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        return HostMetadata(self.stack.build_connector_meta(scheduler_output))

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        stats = connector_output.kv_connector_stats
        if isinstance(stats, CapkvStats):
            self._totals = merge_counts(self._totals, stats.data)
        self.stack.update_connector_output(to_capkv_output(connector_output, self._loading, owner=self.HOST))

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        """One group (vLLM's hybrid allocator off): the stack gets it as the only group."""
        self._loading.forget(request.request_id)
        return finish_request(self.stack, request, (list(block_ids),))

    def take_events(self) -> Iterable[Any]:
        return list(self.stack.take_events())

    def set_xfer_handshake_metadata(self, metadata: dict[int, Any]) -> None:
        """The workers' handshakes: the stack's own part to the stack; their registration reports
        to the stack as a step's worker metadata, before any request is scheduled."""
        inner: dict[int, Any] = {}
        reports: list[WorkerMetadata] = []
        for rank, shake in metadata.items():
            if not isinstance(shake, HostHandshake):
                raise MetadataError(
                    f"{self.HOST}.set_xfer_handshake_metadata: expected HostHandshake from worker {rank}, got {shake!r}",
                    connector=self.HOST, method="set_xfer_handshake_metadata", value=shake,
                )
            if shake.inner is not None:
                inner[rank] = shake.inner
            if shake.worker_meta is not None:
                reports.append(shake.worker_meta)
        if inner:
            self.stack.set_xfer_handshake_metadata(inner)
        if reports:
            merged = functools.reduce(lambda a, b: a.aggregate(b), reports)
            self.stack.update_connector_output(CapkvKVConnectorOutput(worker_meta=merged))

    def get_finished_count(self) -> int | None:
        return self.stack.get_finished_count()

    # ---- worker side ------------------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        self.stack.register_kv_caches(registered_caches(self.spec, kv_caches, owner=self.HOST))

    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        super().bind_connector_metadata(connector_metadata)
        self.stack.bind_connector_metadata(self._inner(connector_metadata, "bind_connector_metadata"))

    def clear_connector_metadata(self) -> None:
        super().clear_connector_metadata()
        self.stack.clear_connector_metadata()

    def handle_preemptions(self, kv_connector_metadata: KVConnectorMetadata) -> None:
        self.stack.handle_preemptions(self._inner(kv_connector_metadata, "handle_preemptions"))

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        self.stack.start_load_kv(forward_context, **kwargs)

    def wait_for_layer_load(self, layer_name: str) -> None:
        self.stack.wait_for_layer_load(layer_name)

    def save_kv_layer(
        self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: AttentionMetadata, **kwargs: Any
    ) -> None:
        self.stack.save_kv_layer(layer_name, kv_layer, attn_metadata, **kwargs)

    def wait_for_save(self) -> None:
        self.stack.wait_for_save()

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        return self.stack.get_finished(finished_req_ids)

    def get_transfer_results(self, finished_req_ids: set[str]) -> KVConnectorTransferResults:
        """capkv's stacks report no per-request receive failures: a failed block is a load error."""
        sending, recving = self.stack.get_finished(finished_req_ids)
        return KVConnectorTransferResults(finished_sending=set(sending or ()), finished_recving=set(recving or ()))

    def get_block_ids_with_load_errors(self) -> set[int]:
        return flat_load_errors(self.stack.get_block_ids_with_load_errors())

    def build_connector_worker_meta(self) -> HostWorkerMetadata | None:
        meta = self.stack.build_connector_worker_meta()
        return None if meta is None else HostWorkerMetadata(meta)

    def get_handshake_metadata(self) -> HostHandshake | None:
        """The stack's handshake, with what its worker side has to report since the KV caches were
        registered (vLLM asks once, after registering them, before serving)."""
        inner = self.stack.get_handshake_metadata()
        report = self.stack.build_connector_worker_meta()
        return None if inner is None and report is None else HostHandshake(inner, report)

    def get_mem_pool_context(self) -> AbstractContextManager[object] | None:
        return self.stack.get_mem_pool_context()

    # ---- both sides --------------------------------------------------------------------

    def get_kv_connector_stats(self) -> KVConnectorStats | None:
        stats: object = self.stack.get_kv_connector_stats()
        if stats is None:
            return None
        data = stats_data(stats)
        self._totals = merge_counts(self._totals, data)
        return CapkvStats(data)

    def stats_since_start(self) -> dict[str, Any]:
        """Every counter this side has seen since it was built: its own stack's, and on the
        scheduler side the workers' reports too (what vLLM's stat loggers get, summed)."""
        return dict(self._totals)

    def shutdown(self) -> None:
        self.stack.shutdown()

    # ---- vLLM-only calls: to vLLM's own connectors in the stack --------------------------

    def bind_kv_cache_manager(self, kv_cache_manager: Any) -> None:
        super().bind_kv_cache_manager(kv_cache_manager)
        for child in self._vllm_children:
            child.bind_kv_cache_manager(kv_cache_manager)

    def on_new_request(self, request: Request) -> None:
        for child in self._vllm_children:
            child.on_new_request(request)

    def has_pending_block_frees(self) -> bool:
        return any(child.has_pending_block_frees() for child in self._vllm_children)

    def has_pending_push_work(self) -> bool:
        return any(child.has_pending_push_work() for child in self._vllm_children)

    def reset_cache(self) -> bool | None:
        """Forwarded to vLLM's connectors; ``False`` when one could not reset (capkv's stores keep theirs)."""
        answers = [child.reset_cache() for child in self._vllm_children]
        return False if False in answers else None

    def finish_forward(self) -> None:
        for child in self._vllm_children:
            child.finish_forward()

    def reset_capture_state(self) -> None:
        for child in self._vllm_children:
            child.reset_capture_state()

    # ---- helpers -----------------------------------------------------------------------

    def _inner(self, metadata: object, method: str) -> object:
        if not isinstance(metadata, HostMetadata):
            raise MetadataError(
                f"{self.HOST}.{method}: expected the host's metadata (HostMetadata), got {metadata!r}",
                connector=self.HOST, method=method, value=metadata,
            )
        return metadata.inner


class CapkvHMAConnector(CapkvConnector, SupportsHMA):
    """A capkv stack inside vLLM with its hybrid allocator on: every child must be HMA-capable."""

    HOST: ClassVar[str] = HMA_HOST

    def request_finished_all_groups(
        self, request: Request, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, KVTransferParams | None]:
        """Every group's blocks to the stack."""
        self._loading.forget(request.request_id)
        groups: BlockIds = tuple(list(ids) for ids in block_ids)
        return finish_request(self.stack, request, groups)


publish(__name__, "capkv.vllm")
