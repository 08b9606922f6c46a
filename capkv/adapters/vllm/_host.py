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

from capkv.adapters.vllm._carry import block_ids_from_vllm
from capkv.adapters.vllm._child import vllm_connectors
from capkv.adapters.vllm._contain import Contained
from capkv.adapters.vllm._loads import LoadPlanner, LoadTracker, Settled
from capkv.adapters.vllm._spec import engine_spec, registered_caches
from capkv.adapters.vllm._stack import Engine, build_hosted, configured_fact, load_hosted
from capkv.adapters.vllm._translate import (
    SITS_OUT,
    CapkvStats,
    HostHandshake,
    HostMetadata,
    HostWorkerMetadata,
    merge_counts,
    stats_data,
    to_capkv_output,
)
from capkv.capabilities._facts import LAYOUT, NEEDS_INSTANCE, PIECEWISE
from capkv.capabilities._serving import finish_request, require_hma
from capkv.config._hosts import HMA_HOST, PLAIN_HOST, require_host_capability, stack_config
from capkv.contracts._connector import KVConnector
from capkv.contracts._engine import AttentionMetadata, BlockIds, ForwardContext, KVTransferParams, WorkerMetadata
from capkv.contracts._engine import KVConnectorOutput as CapkvKVConnectorOutput
from capkv.contracts._spec import KVSpec
from capkv.devmode._instrument import instrument
from capkv.errors import ConflictError, FinishError, MetadataError, SubConnectorError

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
        require_host_capability(host, built)  # the built children have the last word
        require_hma(built, self.spec)
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
        self._planner = LoadPlanner(self.spec)
        self._tracker = LoadTracker(self.spec, owner=host)
        self._layer_names = tuple(name for group in self.spec.groups for name in group.layer_names)
        self._contained = Contained(host)
        self._sits_out = False
        """The stack's metadata for this step could not be built or bound: it sits the step out."""
        self._settled: Settled | None = None
        self._flat: set[int] = set()
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
        """The stack's hit; asynchronous to vLLM with several groups (see :mod:`._loads`). A request
        whose load failed is recomputed, never offered a load again; a failed lookup is a miss."""
        planner = self._planner
        if planner.refuses(request.request_id):
            return 0, False
        try:
            tokens, load_async = self.stack.get_num_new_matched_tokens(request, num_computed_tokens)
        except Exception as exc:
            self._contained("get_num_new_matched_tokens", exc, "taken as a miss: the request computes its prompt")
            return 0, False
        return planner.answer(request.request_id, num_computed_tokens, tokens, load_async)

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int) -> None:
        block_ids = block_ids_from_vllm(blocks)  # carries vLLM's blocks (hashes) to wrapped vLLM children
        failed = False
        try:
            self.stack.update_state_after_alloc(request, block_ids, num_external_tokens)
        except Exception as exc:
            started: object = exc.partial if isinstance(exc, SubConnectorError) else 0
            failed = num_external_tokens > 0 and started != num_external_tokens
            self._contained(
                "update_state_after_alloc", exc,
                "its load is reported failed" if failed else "no load was concerned",
            )
        self._planner.allocated(request.request_id, tuple(block_ids), num_external_tokens, failed=failed)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        try:
            inner: object = self.stack.build_connector_meta(scheduler_output)
        except Exception as exc:
            partial = exc.partial if isinstance(exc, SubConnectorError) else None
            self._contained(
                "build_connector_meta", exc,
                "every load planned in this step is reported failed"
                + ("" if partial is not None else "; the stack sits the step out"),
            )
            return HostMetadata(SITS_OUT if partial is None else partial, self._planner.take(fail_all=True))
        return HostMetadata(inner, self._planner.take())

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        stats = connector_output.kv_connector_stats
        if isinstance(stats, CapkvStats):
            self._totals = merge_counts(self._totals, stats.data)
        output = to_capkv_output(connector_output, self._planner, owner=self.HOST)
        try:
            self.stack.update_connector_output(output)
        except Exception as exc:
            self._contained("update_connector_output", exc, "the step's report is lost to the failing children")

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        """One group (vLLM's hybrid allocator off): the stack gets it as the only group."""
        return self._finish(request, (list(block_ids),))

    def _finish(self, request: Request, block_ids: BlockIds) -> tuple[bool, KVTransferParams | None]:
        groups = self._planner.finishing(request.request_id, block_ids)
        try:
            return finish_request(self.stack, request, groups)
        except FinishError as exc:
            self._contained("request_finished", exc, f"the blocks are {'kept' if exc.delay_free else 'freed'} "
                            "as the children that accepted a save need")
            return exc.delay_free, exc.kv_transfer_params
        except Exception as exc:
            self._contained("request_finished", exc, "no child holds the blocks: they are freed")
            return False, None

    def take_events(self) -> Iterable[Any]:
        try:
            return list(self.stack.take_events())
        except Exception as exc:
            self._contained("take_events", exc, "the events are held for the next call")
            return []

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
        metadata = self._host_metadata(connector_metadata, "bind_connector_metadata")
        tracker = self._tracker
        tracker.bind(metadata.loads)
        self._sits_out = metadata.inner is SITS_OUT
        if self._sits_out:
            tracker.fail_step()
            return
        try:
            self.stack.bind_connector_metadata(metadata.inner)
        except Exception as exc:
            self._contained("bind_connector_metadata", exc, "every load of this step is reported failed")
            tracker.fail_step()

    def clear_connector_metadata(self) -> None:
        super().clear_connector_metadata()
        if self._sits_out:
            return
        try:
            self.stack.clear_connector_metadata()
        except Exception as exc:
            self._contained("clear_connector_metadata", exc, "ignored")

    def handle_preemptions(self, kv_connector_metadata: KVConnectorMetadata) -> None:
        metadata = self._host_metadata(kv_connector_metadata, "handle_preemptions")
        if metadata.inner is SITS_OUT:
            return
        try:
            self.stack.handle_preemptions(metadata.inner)
        except Exception as exc:
            self._contained("handle_preemptions", exc, "ignored")

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        """The step's loads. Those the host made asynchronous are reported finished in this very step,
        so they are waited for here, layer by layer, as a forward pass would (vLLM runs none for them)."""
        if self._sits_out:
            return
        try:
            self.stack.start_load_kv(forward_context, **kwargs)
            if self._tracker.host_async_in_step:
                for layer_name in self._layer_names:
                    self.stack.wait_for_layer_load(layer_name)
        except Exception as exc:
            self._contained("start_load_kv", exc, "every load of this step is reported failed")
            self._tracker.fail_step()

    def wait_for_layer_load(self, layer_name: str) -> None:
        if self._sits_out:
            return
        try:
            self.stack.wait_for_layer_load(layer_name)
        except Exception as exc:
            self._contained("wait_for_layer_load", exc, "every load of this step is reported failed")
            self._tracker.fail_step()

    def save_kv_layer(
        self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: AttentionMetadata, **kwargs: Any
    ) -> None:
        if self._sits_out:
            return
        try:
            self.stack.save_kv_layer(layer_name, kv_layer, attn_metadata, **kwargs)
        except Exception as exc:
            self._contained("save_kv_layer", exc, "the failing children do not save this layer")

    def wait_for_save(self) -> None:
        if self._sits_out:
            return
        try:
            self.stack.wait_for_save()
        except Exception as exc:
            self._contained("wait_for_save", exc, "the failing children's saves of this step are lost")

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        results = self.get_transfer_results(finished_req_ids)
        return results.finished_sending or None, results.finished_recving or None

    def get_transfer_results(self, finished_req_ids: set[str]) -> KVConnectorTransferResults:
        """The stack's finished sets, the loads the host made asynchronous, and failed receives
        (several groups; with one, failed blocks go in :meth:`get_block_ids_with_load_errors`)."""
        sending: set[str] | None = None
        recving: set[str] | None = None
        try:
            sending, recving = self.stack.get_finished(finished_req_ids)
        except Exception as exc:
            self._contained("get_finished", exc, "the other children's reports come with the next call")
        settled = self._settle(recving)
        return KVConnectorTransferResults(
            finished_sending=set(sending or ()),
            finished_recving=settled.finished_recving,
            failed_recving=settled.failed_recving,
        )

    def _settle(self, recving: set[str] | None) -> Settled:
        tracker = self._tracker
        try:
            errors = self.stack.get_block_ids_with_load_errors()
        except Exception as exc:
            self._contained("get_block_ids_with_load_errors", exc, "every load of this step is reported failed")
            errors = {}
            tracker.fail_step()
        settled = tracker.settle(recving, errors)
        self._settled = settled
        self._flat |= settled.flat_errors
        return settled

    def get_block_ids_with_load_errors(self) -> set[int]:
        """With one KV-cache group, the failed blocks of this step's loads (vLLM's flat set)."""
        if self._settled is None:  # not asked after get_transfer_results: settle now
            self._settle(None)
        flat, self._flat = self._flat, set()
        return flat

    def build_connector_worker_meta(self) -> HostWorkerMetadata | None:
        try:
            meta = self.stack.build_connector_worker_meta()
        except Exception as exc:
            self._contained("build_connector_worker_meta", exc, "this step's worker report is lost")
            meta = None
        settled, self._settled = self._settled, None
        if settled is None or not (settled.errors or settled.landed or settled.failed):
            return None if meta is None else HostWorkerMetadata(meta)
        errors = {group: frozenset(ids) for group, ids in settled.errors.items()}
        return HostWorkerMetadata(meta, errors, settled.landed, settled.failed)

    def get_handshake_metadata(self) -> HostHandshake | None:
        """The stack's handshake, with what its worker side has to report since the KV caches were
        registered (vLLM asks once, after registering them, before serving)."""
        inner = self.stack.get_handshake_metadata()
        try:
            report = self.stack.build_connector_worker_meta()
        except Exception as exc:
            self._contained("build_connector_worker_meta", exc, "the registration report is lost")
            report = None
        return None if inner is None and report is None else HostHandshake(inner, report)

    def get_mem_pool_context(self) -> AbstractContextManager[object] | None:
        return self.stack.get_mem_pool_context()

    # ---- both sides --------------------------------------------------------------------

    def get_kv_connector_stats(self) -> KVConnectorStats | None:
        stats: object = self.stack.get_kv_connector_stats()
        own = self._own_counts()
        if stats is None and not own:
            return None
        data = stats_data(stats) if stats is not None else {}
        if own:
            data["host"] = own
        self._totals = merge_counts(self._totals, data)
        return CapkvStats(data)

    def _own_counts(self) -> dict[str, int]:
        """The host's own counters since the last report: contained failures, dropped late load errors."""
        counts: dict[str, int] = {}
        contained = self._contained.take()
        if contained:
            counts["contained_errors"] = contained
        if self._tracker.dropped:
            counts["dropped_load_errors"] = self._tracker.dropped
            self._tracker.dropped = 0
        return counts

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

    def _host_metadata(self, metadata: object, method: str) -> HostMetadata:
        if not isinstance(metadata, HostMetadata):
            raise MetadataError(
                f"{self.HOST}.{method}: expected the host's metadata (HostMetadata), got {metadata!r}",
                connector=self.HOST, method=method, value=metadata,
            )
        return metadata


class CapkvHMAConnector(CapkvConnector, SupportsHMA):
    """A capkv stack inside vLLM with its hybrid allocator on: every child must be HMA-capable."""

    HOST: ClassVar[str] = HMA_HOST

    def request_finished_all_groups(
        self, request: Request, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, KVTransferParams | None]:
        """Every group's blocks to the stack."""
        return self._finish(request, tuple(list(ids) for ids in block_ids))
