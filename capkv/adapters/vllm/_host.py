"""vLLM hosts a capkv stack: ``CapkvConnector`` and ``CapkvHMAConnector``.

vLLM builds its connector as ``cls(vllm_config, role, kv_cache_config)``, once
per role. The host reads the stack from ``kv_connector_extra_config["stack"]``
(the shape ``capkv check`` reads), refuses what it cannot serve *before building
anything*, builds the stack for its role over the engine's :class:`~capkv.KVSpec`,
checks it, and puts it under dev-mode contracts (:func:`capkv.devmode.instrument`:
the very same object in production). It asks the built children nothing vLLM
would not ask them: vLLM's own calls (the finished count, the handshake) reach
them when vLLM makes them.

Every member vLLM calls is translated: ``KVCacheBlocks`` → one list of block ids
per group (vLLM's blocks carried along for wrapped vLLM children); vLLM's
``KVConnectorOutput`` → capkv's; load failures → vLLM's channel for the group
count (:mod:`._loads`); metadata, worker metadata, handshakes and statistics in
vLLM's types; the class-level members vLLM calls with arguments answer from the
configured classes; vLLM's members capkv's contract has no counterpart for go to
vLLM's connectors in the stack (:mod:`._vllm_calls`). Finishing goes through
:func:`capkv.finish_request`, never truncating to group 0. During serving a
child's exception ends the requests it concerns, never the engine (:mod:`._contain`).

vLLM decides its hybrid allocator from the host *class* (``issubclass`` of its
``SupportsHMA``), so there are two: ``CapkvHMAConnector`` is one and takes only
an HMA-capable stack (a :class:`~capkv.CapabilityError` naming each non-HMA
child, at construction — never an ``assert``); ``CapkvConnector`` is not, so
vLLM turns HMA off (one group) and any stack serves.
"""

from __future__ import annotations

import functools
from collections.abc import Generator, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from typing import Any, ClassVar, cast

import torch
from vllm.config import VllmConfig
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorHandshakeMetadata,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorTransferResults,
    SupportsHMA,
)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorPromMetrics, KVConnectorStats
from vllm.distributed.kv_transfer.kv_connector.v1.multi_connector import MultiKVConnectorStats
from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.kv_cache_interface import KVCacheConfig
from vllm.v1.outputs import KVConnectorOutput
from vllm.v1.request import Request

from capkv._homes import publish
from capkv.adapters.vllm._carry import PPHandshakes, block_ids_from_vllm
from capkv.adapters.vllm._child import vllm_connectors
from capkv.adapters.vllm._contain import Contained
from capkv.adapters.vllm._loads import LoadPlanner, LoadTracker, Settled
from capkv.adapters.vllm._request import read_vllm_requests
from capkv.adapters.vllm._spec import engine_shard, engine_spec, registered_caches
from capkv.adapters.vllm._stack import Engine, build_hosted, child_vllm_config, configured_fact, load_hosted
from capkv.adapters.vllm._stats import MARK, HostPromMetrics, host_stats, merge_counts, rebuild_stats
from capkv.adapters.vllm._translate import (
    SITS_OUT,
    HostHandshake,
    HostMetadata,
    HostWorkerMetadata,
    host_worker_meta,
    to_capkv_output,
)
from capkv.adapters.vllm._vllm_calls import VllmOnlyMembers, leaves, wrapped_vllm
from capkv.capabilities._facts import LAYOUT, NEEDS_INSTANCE, PIECEWISE
from capkv.capabilities._hma import StackNode
from capkv.capabilities._serving import finish_request, require_hma
from capkv.config._build import closed_on_error
from capkv.config._hosts import HMA_HOST, PLAIN_HOST, require_host_capability, stack_config
from capkv.config._loader import ConfiguredConnector, ConfiguredNode, ConfiguredStack
from capkv.contracts._connector import KVConnector
from capkv.contracts._engine import AttentionMetadata, BlockIds, ForwardContext, KVTransferParams, WorkerMetadata
from capkv.contracts._engine import KVConnectorOutput as CapkvKVConnectorOutput
from capkv.contracts._spec import KVSpec
from capkv.devmode._instrument import instrument
from capkv.errors import ConflictError, FinishError, MetadataError, SubConnectorError

__all__ = ["CapkvConnector", "CapkvHMAConnector"]


class CapkvConnector(VllmOnlyMembers):
    """A capkv stack inside vLLM, without HMA: vLLM turns its hybrid allocator off, so any stack serves."""

    HOST: ClassVar[str] = PLAIN_HOST
    """The host class's name in diagnostics and configurations."""
    INHERIT_ROLE: ClassVar[bool] = True
    """A vLLM child without a ``kv_role`` takes the host's."""

    stack: KVConnector
    """The hosted stack, built for this role (instrumented in dev mode)."""
    spec: KVSpec | None
    """The engine's KV cache as the stack sees it (``None``: vLLM's placeholder config without a group)."""

    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        host = self.HOST
        transfer = vllm_config.kv_transfer_config
        configured = self._configured(None if transfer is None else transfer.kv_connector_extra_config)
        self._check_configured(configured)  # from the classes, before anything is built
        read_vllm_requests()  # stores key blocks by a request's salt, adapter, images and embeddings too
        groups = len(kv_cache_config.kv_cache_groups)
        shard = engine_shard(vllm_config.parallel_config, role, owner=host)
        self.spec = engine_spec(kv_cache_config, owner=host, shard=shard) if groups else None
        built = self._build(configured, Engine(vllm_config, role, kv_cache_config, self.spec, self.INHERIT_ROLE))
        with closed_on_error([built]):  # a stack refused here leaves no writer thread behind
            self._check_built(built)  # the built children have the last word
            require_hma(built, max(groups, 1))
            if configured is not None:
                told = configured_fact(configured, LAYOUT, vllm_config=vllm_config)
                needed = cast("KVConnector", built).get_required_kvcache_layout()
                if needed is not None and needed != told:
                    raise ConflictError(
                        f"{host}: the stack needs the {needed!r} KV-cache layout, but its classes told vLLM "
                        f"{'nothing' if told in (None, NEEDS_INSTANCE) else repr(told)} when vLLM chose its "
                        "layout; declare the layout class-level (@capkv.class_level) in the child that needs it",
                        connector=host, method="get_required_kvcache_layout", value=needed,
                    )
        self._bind_stack(built)

    # ---- the hosted stack ---------------------------------------------------------------

    @classmethod
    def _configured(cls, extra: Mapping[str, Any] | None) -> ConfiguredNode | None:
        """The hosted stack's classes, from the host's ``kv_connector_extra_config``."""
        return load_hosted(stack_config(extra, host=cls.HOST))

    def _check_configured(self, configured: ConfiguredNode | None) -> None:
        require_host_capability(self.HOST, configured)

    def _check_built(self, built: object) -> None:
        require_host_capability(self.HOST, built)

    def _build(self, configured: ConfiguredNode | None, engine: Engine) -> object:
        if configured is None:
            raise MetadataError(f"{self.HOST}: no stack is configured", connector=self.HOST, method="__init__")
        return build_hosted(configured, engine)

    def _bind_stack(self, built: object) -> None:
        """Serve ``built`` from now on (what vLLM's calls go to)."""
        host = self.HOST
        spec: KVSpec | None = getattr(self, "spec", None)
        stack = cast("KVConnector", built)
        self._built = built
        self.stack = stack if spec is None else instrument(stack, spec)
        self._composite = isinstance(built, StackNode)
        self._vllm_children = vllm_connectors(built)
        """vLLM's connectors in the stack: the calls capkv's contract has no member for go to them."""
        all_leaves = list(leaves(built))
        self._only_vllm = bool(all_leaves) and all(wrapped_vllm(leaf) is not None for leaf in all_leaves)
        tops = cast("StackNode", built).children if self._composite else (built,)
        self._stat_keys = [(_stats_key(child), wrapped_vllm(child) is not None) for child in tops]
        self._planner = LoadPlanner(spec)
        self._tracker = LoadTracker(spec, owner=host)
        self._layer_names = () if spec is None else tuple(n for g in spec.groups for n in g.layer_names)
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
        configured = cls._configured(None if transfer is None else transfer.kv_connector_extra_config)
        if configured is None:
            return None
        answer = configured_fact(configured, LAYOUT, vllm_config=vllm_config)
        return None if answer is NEEDS_INSTANCE else cast("str | None", answer)

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: dict[str, Any]) -> bool:
        """Whether any child needs piecewise CUDA graphs; yes when a class cannot say (always safe)."""
        configured = cls._configured(extra_config)
        if configured is None:
            return False
        answer = configured_fact(configured, PIECEWISE, vllm_config=None)
        return True if answer is NEEDS_INSTANCE else bool(answer)

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> KVConnectorStats | None:
        """vLLM's per-child statistics, rebuilt from what crossed a process boundary."""
        return rebuild_stats(data)

    @classmethod
    def build_prom_metrics(
        cls,
        vllm_config: VllmConfig,
        metric_types: dict[type[Any], type[Any]],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> KVConnectorPromMetrics | None:
        """vLLM children's Prometheus metrics (one per class, as vLLM builds them) and capkv's counters."""
        transfer = vllm_config.kv_transfer_config
        configured = cls._configured(None if transfer is None else transfer.kv_connector_extra_config)
        children: dict[str, KVConnectorPromMetrics] = {}
        for leaf in _configured_leaves(configured):
            if leaf.cls.__name__ in children or not issubclass(leaf.cls, KVConnectorBase_V1):
                continue
            built = leaf.cls.build_prom_metrics(
                child_vllm_config(vllm_config, leaf, inherit_role=cls.INHERIT_ROLE),
                metric_types, labelnames, per_engine_labelvalues,
            )
            if built is not None:
                children[leaf.cls.__name__] = cast("KVConnectorPromMetrics", built)
        return HostPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues, children)

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
        if isinstance(stats, MultiKVConnectorStats):
            self._totals = merge_counts(self._totals, _counters(stats))
        output = to_capkv_output(connector_output, self._planner, composite=self._composite, owner=self.HOST)
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
        """The workers' handshakes by tensor-parallel rank (the first pipeline stage's)."""
        self.set_xfer_handshake_metadata_pp_aware({(0, rank): meta for rank, meta in metadata.items()})

    def set_xfer_handshake_metadata_pp_aware(self, metadata: dict[tuple[int, int], Any]) -> None:
        """Every child learns the workers' handshakes, vLLM's children with vLLM's
        ``(pp_rank, tp_rank)`` keys (as vLLM does, also when there are none); what the stack's
        worker side reported since the KV caches were registered goes to the stack as a step's
        worker metadata, before any request is scheduled."""
        inner: dict[tuple[int, int], Any] = {}
        reports: list[WorkerMetadata] = []
        for rank, shake in metadata.items():
            if isinstance(shake, HostHandshake) and not self._only_vllm:  # ours (a nested host's passes on)
                if shake.inner is not None:
                    inner[rank] = shake.inner
                if shake.worker_meta is not None:
                    reports.append(shake.worker_meta)
            else:
                inner[rank] = shake
        self.stack.set_xfer_handshake_metadata(PPHandshakes.of(inner))
        if reports:
            merged = functools.reduce(lambda a, b: a.aggregate(b), reports)
            self.stack.update_connector_output(CapkvKVConnectorOutput(worker_meta=merged))

    def get_finished_count(self) -> int | None:
        return self.stack.get_finished_count()

    # ---- worker side ------------------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        spec = self.spec
        self.stack.register_kv_caches(kv_caches if spec is None else registered_caches(spec, kv_caches, owner=self.HOST))

    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        KVConnectorBase_V1.bind_connector_metadata(self, connector_metadata)
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
        KVConnectorBase_V1.clear_connector_metadata(self)
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
            return None if meta is None else host_worker_meta(meta, self._composite)
        errors = {group: frozenset(ids) for group, ids in settled.errors.items()}
        return host_worker_meta(meta, self._composite, errors=errors, landed=settled.landed, failed=settled.failed)

    def get_handshake_metadata(self) -> KVConnectorHandshakeMetadata | None:
        """The stack's handshake metadata (a vLLM child's as vLLM's composite gives it: the first there
        is), with what capkv's children have to report once the KV caches are registered (a store's
        memory layout, without which a scheduler side that never sees a tensor cannot offer blocks)."""
        inner = cast("KVConnectorHandshakeMetadata | None", self.stack.get_handshake_metadata())
        if self._only_vllm:
            return inner
        try:
            with _vllm_children_quiet(self._built):  # vLLM's children are not asked for worker metadata here
                report = self.stack.build_connector_worker_meta()
        except Exception as exc:
            self._contained("build_connector_worker_meta", exc, "the registration report is lost")
            report = None
        return inner if report is None else HostHandshake(inner, report)

    def get_mem_pool_context(self) -> AbstractContextManager[object] | None:
        try:
            return self.stack.get_mem_pool_context()
        except ConflictError as exc:
            raise ConflictError(
                f"{self.HOST}.get_mem_pool_context: Multiple connectors provide a KV cache memory pool "
                f"({exc.connector}); the KV cache is allocated once, in one pool: configure a custom pool "
                "on at most one child",
                connector=exc.connector, method="get_mem_pool_context", value=exc.value,
            ) from exc

    # ---- both sides --------------------------------------------------------------------

    def get_kv_connector_stats(self) -> KVConnectorStats | None:
        """The children's statistics in vLLM's composite shape (see :mod:`._stats`)."""
        try:
            stats: object = self.stack.get_kv_connector_stats()
        except Exception as exc:
            self._contained("get_kv_connector_stats", exc, "the failing children's statistics come later")
            stats = None
        result = host_stats(self._stat_keys, stats, self._own_counts(), composite=self._composite)
        if result is not None:
            self._totals = merge_counts(self._totals, _counters(result))
        return result

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
        """Every counter this side has seen since it was built, by child class as vLLM keys them (the
        host's own under ``"capkv"``): its own stack's, and on the scheduler side the workers' too."""
        return dict(self._totals)

    def shutdown(self) -> None:
        self.stack.shutdown()

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


def _counters(stats: MultiKVConnectorStats) -> dict[str, Any]:
    """The statistics as plain mappings, without capkv's marks (what ``stats_since_start`` sums)."""
    return cast("dict[str, Any]", _unmarked(stats.to_dict()))


def _unmarked(value: object) -> object:
    if isinstance(value, Mapping):
        items = cast("Mapping[str, object]", value).items()
        return {key: _unmarked(inner) for key, inner in items if key != MARK}
    return value


def _stats_key(child: object) -> str:
    """A child's key in vLLM's per-connector statistics: its class name (a wrapped vLLM connector's
    configured class)."""
    if wrapped_vllm(child) is not None:
        return cast("type[Any]", getattr(child, "_cls")).__name__
    return type(getattr(child, "__wrapped__", child)).__name__


def _configured_leaves(node: ConfiguredNode | None) -> Iterator[ConfiguredConnector]:
    if isinstance(node, ConfiguredStack):
        for entry in node.entries:
            yield from _configured_leaves(entry)
    elif node is not None:
        yield node


@contextmanager
def _vllm_children_quiet(stack: object) -> Generator[None]:
    """Wrapped vLLM children report no worker metadata while the host collects capkv's children's."""
    quiet: list[object] = [leaf for leaf in leaves(stack) if wrapped_vllm(leaf) is not None]
    saved = [vars(leaf).get("build_connector_worker_meta") for leaf in quiet]
    for leaf in quiet:
        vars(leaf)["build_connector_worker_meta"] = _nothing
    try:
        yield
    finally:
        for leaf, method in zip(quiet, saved):
            if method is None:
                vars(leaf).pop("build_connector_worker_meta", None)
            else:
                vars(leaf)["build_connector_worker_meta"] = method


def _nothing() -> None:
    return None


publish(__name__, "capkv.vllm")
