"""vLLM hosts a capkv stack: ``CapkvConnector`` and ``CapkvHMAConnector``.

Two classes because vLLM decides its hybrid allocator from the host *class*; each refuses what it cannot serve
before building anything (what it translates: docs/vllm.md and docs/internals.md, "The vLLM adapter").
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable
from typing import Any, ClassVar, cast

from vllm.config import VllmConfig
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata, KVConnectorRole, SupportsHMA
from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.kv_cache_interface import KVCacheConfig
from vllm.v1.outputs import KVConnectorOutput
from vllm.v1.request import Request, RequestStatus

from capkv._homes import publish
from capkv.adapters.vllm._carry import PPHandshakes, block_ids_from_vllm
from capkv.adapters.vllm._contain import Contained
from capkv.adapters.vllm._host_class import ClassLevelMembers
from capkv.adapters.vllm._host_facts import AsyncLoads, check_told
from capkv.adapters.vllm._host_stats import StatsMembers, stat_node
from capkv.adapters.vllm._host_worker import WorkerMembers
from capkv.adapters.vllm._loads import LoadPlanner, LoadTracker
from capkv.adapters.vllm._members import complete
from capkv.adapters.vllm._request import read_vllm_requests
from capkv.adapters.vllm._spec import engine_shard, engine_spec
from capkv.adapters.vllm._stack import Engine, build_hosted, configured_fact
from capkv.adapters.vllm._translate import SITS_OUT, HostHandshake, HostMetadata, to_capkv_output
from capkv.adapters.vllm._visibility import warn_hidden
from capkv.adapters.vllm._vllm_calls import leaves, vllm_connectors, wrapped_vllm
from capkv.capabilities._facts import LAYOUT, NEEDS_INSTANCE
from capkv.capabilities._hma import StackNode
from capkv.capabilities._serving import finish_request, require_hma
from capkv.config._build import closed_on_error
from capkv.config._hosts import HMA_HOST, require_host_capability
from capkv.config._loader import ConfiguredNode
from capkv.contracts._connector import KVConnector
from capkv.contracts._engine import BlockIds, KVTransferParams, WorkerMetadata
from capkv.contracts._engine import KVConnectorOutput as CapkvKVConnectorOutput
from capkv.contracts._spec import KVSpec
from capkv.devmode._instrument import instrument
from capkv.errors import ConflictError, FinishError, MetadataError, SubConnectorError

__all__ = ["CapkvConnector", "CapkvHMAConnector"]

_log = logging.getLogger("capkv.vllm")
_NORMAL_FINISH = frozenset(
    getattr(RequestStatus, name)
    for name in ("FINISHED_STOPPED", "FINISHED_LENGTH_CAPPED", "FINISHED_REPETITION")
    if hasattr(RequestStatus, name)
)
"""vLLM's finishes of a request the model computed tokens for (on every block it loaded)."""


class CapkvConnector(AsyncLoads, ClassLevelMembers, WorkerMembers, StatsMembers):
    """A capkv stack inside vLLM, without HMA: vLLM turns its hybrid allocator off, so any stack serves."""

    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        host = self.HOST
        transfer = vllm_config.kv_transfer_config
        configured = self._configured(None if transfer is None else transfer.kv_connector_extra_config)
        self._check_configured(configured)  # from the classes, before anything is built
        read_vllm_requests()  # stores key blocks by a request's salt, adapter, images and embeddings too
        groups = len(kv_cache_config.kv_cache_groups)
        shard = engine_shard(vllm_config.parallel_config, role, owner=host)
        self.spec: KVSpec | None = engine_spec(kv_cache_config, owner=host, shard=shard) if groups else None
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
                check_told(host, type(self), transfer, built)
        self._bind_stack(built)

    # ---- the hosted stack ---------------------------------------------------------------

    def _check_configured(self, configured: ConfiguredNode | None) -> None:
        require_host_capability(self.HOST, configured)
        warn_hidden(self.HOST, configured, top_level_visible=False)

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
        self.stack: KVConnector = stack if spec is None else instrument(stack, spec)
        served: object = getattr(self.stack, "__wrapped__", self.stack)  # dev mode serves a rebuilt composite
        bind: object = getattr(served, "bind_kv_spec", None)
        if spec is not None and isinstance(served, StackNode) and callable(bind):
            bind(spec)  # where a token's block is: a load the engine has not confirmed masks only its own blocks
        self._composite = isinstance(built, StackNode)
        self._vllm_children = vllm_connectors(built)
        """vLLM's connectors in the stack: the calls capkv's contract has no member for go to them."""
        all_leaves = list(leaves(built))
        self._only_vllm = bool(all_leaves) and all(wrapped_vllm(leaf) is not None for leaf in all_leaves)
        self._receivers = [leaf for leaf in all_leaves if callable(getattr(leaf, "take_failed_receives", None))]
        for child in self._receivers:  # the host takes their failed receives from now on (vLLM's words)
            cast("Any", child).take_failed_receives()
        tops = cast("StackNode", built).children if self._composite else (built,)
        self._stat_keys = [stat_node(child) for child in tops]
        self._planner = LoadPlanner(spec)
        self._tracker = LoadTracker(spec, owner=host)
        self._layer_names = () if spec is None else tuple(n for g in spec.groups for n in g.layer_names)
        self._contained = Contained(host)
        self._sits_out = False
        self._settled = None
        self._flat = set()
        self._totals = {}
        self._registered = None
        self._released = []

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
        self._count_reported(connector_output.kv_connector_stats)
        output = to_capkv_output(connector_output, self._planner, composite=self._composite, owner=self.HOST)
        try:
            self.stack.update_connector_output(output)
        except Exception as exc:
            self._contained("update_connector_output", exc, "the step's report is lost to the failing children")

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        """One group (vLLM's hybrid allocator off): the stack gets it as the only group."""
        return self._finish(request, (list(block_ids),))

    def _finish(self, request: Request, block_ids: BlockIds) -> tuple[bool, KVTransferParams | None]:
        """The stack's finish. A request that finished normally computed on its KV, so its loads landed,
        also a synchronous one in the step vLLM has not reported to the connector yet (vLLM finishes a
        request, e.g. a one-token prefill, before it hands over that step's report): every child gets
        its blocks. Any other finish (an abort) masks what a load it had may not have filled; a request vLLM
        ended with an error (a load that failed, maybe another connector's beside this host in vLLM's own
        composite) hands its children the null block throughout: its steps saved what they computed."""
        status = getattr(request, "status", None)
        landed = status in _NORMAL_FINISH
        groups = self._planner.finishing(request.request_id, block_ids, landed=landed)
        if status == RequestStatus.FINISHED_ERROR and self.spec is not None:
            null = self.spec.null_block_id
            groups = tuple([null] * len(ids) for ids in groups)
        if landed and self._composite:
            cast("Any", getattr(self.stack, "__wrapped__", self.stack)).loads_landed(request.request_id)
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
        """Every child learns what its own workers produced, vLLM's children with vLLM's
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

    # ---- both sides --------------------------------------------------------------------

    def shutdown(self) -> None:
        """Shut the stack down. What it raises (failures its stores kept: background saves that failed)
        is logged on ``capkv.vllm``, never raised: vLLM forgets its worker connector only when
        ``shutdown`` returns, and a connector it kept would be the next in-process engine's."""
        try:
            self.stack.shutdown()
        except Exception:  # noqa: BLE001 (reported above; the engine is going away)
            _log.exception("%s.shutdown: the stack raised while shutting down (logged, not raised into vLLM)", type(self).__name__)

class CapkvHMAConnector(CapkvConnector, SupportsHMA):
    """A capkv stack inside vLLM with its hybrid allocator on: every child must be HMA-capable."""

    HOST: ClassVar[str] = HMA_HOST

    def request_finished_all_groups(
        self, request: Request, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, KVTransferParams | None]:
        """Every group's blocks to the stack."""
        return self._finish(request, tuple(list(ids) for ids in block_ids))


complete(CapkvConnector)
complete(CapkvHMAConnector)
publish(__name__, "capkv.vllm")
