"""vLLM's own connectors as capkv children: :func:`wrap`.

A vLLM connector fails capkv's contract on six members; the wrapper translates each, and is HMA-capable
exactly when vLLM's rule says so, statically too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Final, Generic, cast, overload

import torch
from typing_extensions import Self, TypeVar
from vllm.config import VllmConfig
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, SupportsHMA
from vllm.distributed.kv_transfer.kv_connector.v1.multi_connector import MultiConnector as VllmMultiConnector
from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.core.kv_cache_utils import KVCacheBlock
from vllm.v1.outputs import KVConnectorOutput as VllmKVConnectorOutput

from capkv._homes import publish
from capkv.adapters.vllm._carry import (
    VLLM_NULL_BLOCK_ID,
    PPHandshakes,
    VllmBlockIds,
    attribute_load_errors,
    pass_output,
)
from capkv.adapters.vllm._hma_rule import check_vllm_connector, is_hma_vllm_connector
from capkv.adapters.vllm._receives import FailedReceives
from capkv.adapters.vllm._translate import to_vllm_output
from capkv.composite._native import NativeCalls
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
from capkv.errors import ConfigError

__all__ = [
    "ChildMetadata",
    "HMAVllmChild",
    "VllmChild",
    "wrap",
]

_V = TypeVar("_V", bound=KVConnectorBase_V1 | SupportsHMA, covariant=True)
_HV = TypeVar("_HV", bound=SupportsHMA, covariant=True)
_H = TypeVar("_H", bound=SupportsHMA)
_C = TypeVar("_C", bound=KVConnectorBase_V1)

_LAYOUT: Final = "get_required_kvcache_layout"
_DIRECT: Final = (
    "get_num_new_matched_tokens", "request_finished", "take_events", "get_finished_count",
    "register_kv_caches", "start_load_kv", "wait_for_layer_load", "save_kv_layer", "wait_for_save",
    "build_connector_worker_meta", "clear_connector_metadata", "get_handshake_metadata",
    "get_mem_pool_context", "get_kv_connector_stats", "shutdown",
)
"""Members vLLM's connectors take exactly as capkv's contract calls them."""
_PIECEWISE: Final = "requires_piecewise_for_cudagraph"


@dataclass(frozen=True, slots=True)
class ChildMetadata:
    """Scheduler → worker for one wrapped child: its own metadata, plus the block tables of the loads
    planned this step (where a failed block id belongs)."""

    inner: object
    loads: Mapping[str, BlockIds]


class VllmChild(Generic[_V]):
    """A vLLM connector as a capkv :class:`~capkv.KVConnector` (not HMA-capable)."""

    __capkv_wrapper__: Final = True
    """capkv names a wrapper by what it wraps (diagnostics, ``capkv check``, the mypy plugin)."""

    def __new__(
        cls, connector: object, /, *, vllm_config: VllmConfig | None = None, null_block_id: int = VLLM_NULL_BLOCK_ID
    ) -> Self:
        """Check the connector here, with errors that name it — also in dev mode, where
        beartype would otherwise refuse it first, by the type variable's bound, in ``__init__``."""
        check_vllm_connector(cls.__name__, connector, hma=issubclass(cls, HMAVllmChild))
        return super().__new__(cls)

    def __init__(  # pyright: ignore[reportInconsistentConstructor]  # __new__ takes anything, to refuse it by name
        self, connector: _V, /, *, vllm_config: VllmConfig | None = None, null_block_id: int = VLLM_NULL_BLOCK_ID
    ) -> None:
        self._inner: KVConnectorBase_V1 = cast("KVConnectorBase_V1", connector)
        self._cls: type[Any] = type(self._inner)
        """Answers vLLM's class-level calls: the connector's class, or the class it was configured as
        (a class may hand back another object from its constructor, as vLLM's tests' mocks do)."""
        self._name = type(connector).__name__
        self._vllm_config = vllm_config
        self._null_block_id = null_block_id
        self._planned_loads: dict[str, BlockIds] = {}
        self._group_of: dict[int, int] = {}
        self._receives = FailedReceives(null_block_id)
        # Hot calls, bound once; ``Any``: capkv's request protocol stands for vLLM's Request here.
        calls: Any = connector
        self._allocated: Callable[[Any, KVCacheBlocks, int], None] = calls.update_state_after_alloc
        self._output: Callable[[VllmKVConnectorOutput], None] = calls.update_connector_output
        self._results: Callable[[set[str]], Any] = calls.get_transfer_results
        self._output_is_base = (
            getattr(self._output, "__func__", None) is KVConnectorBase_V1.update_connector_output
        )
        """vLLM's base ``update_connector_output`` does nothing: a stack need not call it (nor translate for it)."""
        # vLLM's base get_transfer_results only repackages get_finished: ask get_finished then.
        own = getattr(type(self._inner), "get_transfer_results", None)
        self._uses_get_finished = own is KVConnectorBase_V1.get_transfer_results
        # Members whose vLLM call is capkv's call are the connector's own bound methods on the
        # instance (shadowing this class's forwarding ones): no extra call frame per call.
        direct = _DIRECT + (("get_finished",) if self._uses_get_finished else ())
        vars(self).update({name: getattr(calls, name) for name in direct})

    @property
    def native_calls(self) -> NativeCalls:
        """The connector's own members, for a stack whose arguments carry vLLM's objects (the host's do):
        it unwraps them once per call instead of once per child (see :mod:`capkv.composite._native`)."""
        output = None if self._output_is_base else self._output
        return NativeCalls(self._allocated, output, blocks="kv_cache_blocks", pass_output=pass_output)

    @property
    def wrapped(self) -> _V:
        """The vLLM connector."""
        return cast("_V", self._inner)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._inner!r})"

    # ---- scheduler side ----------------------------------------------------------

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int, /) -> tuple[int | None, bool]:
        return self._inner.get_num_new_matched_tokens(cast("Any", request), num_computed_tokens)

    def update_state_after_alloc(self, request: Request, blocks: BlockIds, num_external_tokens: int, /) -> None:
        """vLLM's ``KVCacheBlocks``: the engine's own when the host carried them, else built from the ids."""
        vllm_blocks = blocks.kv_cache_blocks if type(blocks) is VllmBlockIds else self._blocks(blocks)
        self._allocated(request, vllm_blocks, num_external_tokens)
        if num_external_tokens > 0:
            self._planned_loads[request.request_id] = blocks

    def _blocks(self, blocks: BlockIds) -> KVCacheBlocks:
        null = self._null_block_id
        return KVCacheBlocks(tuple([KVCacheBlock(i, is_null=i == null) for i in group] for group in blocks))

    def build_connector_meta(self, scheduler_output: SchedulerOutput, /) -> object:
        meta = self._inner.build_connector_meta(scheduler_output)
        if not self._planned_loads:
            return meta
        loads, self._planned_loads = self._planned_loads, {}
        return ChildMetadata(meta, loads)

    def update_connector_output(self, connector_output: KVConnectorOutput, /) -> None:
        """vLLM's ``KVConnectorOutput``: the engine's own (with this child's worker metadata) when carried."""
        if self._output_is_base:  # vLLM's no-op: nothing to translate for
            return
        carried: VllmKVConnectorOutput | None = getattr(connector_output, "vllm_output", None)
        if carried is None:
            self._output(to_vllm_output(connector_output))
            return
        worker_meta: Any = connector_output.worker_meta
        saved = carried.kv_connector_worker_meta
        if saved is worker_meta:
            self._output(carried)
            return
        carried.kv_connector_worker_meta = worker_meta
        try:
            self._output(carried)
        finally:
            carried.kv_connector_worker_meta = saved

    def request_finished(self, request: Request, block_ids: list[int], /) -> tuple[bool, KVTransferParams | None]:
        return self._inner.request_finished(cast("Any", request), block_ids)

    def take_events(self) -> Iterable[object]:
        return self._inner.take_events()

    def get_required_kvcache_layout(self) -> str | None:
        """vLLM's class-level call, with the connector's own ``VllmConfig``."""
        layout: str | None = self._cls.get_required_kvcache_layout(self._config(_LAYOUT))
        return layout

    def get_finished_count(self) -> int | None:
        return self._inner.get_finished_count()

    def requires_piecewise_for_cudagraph(self) -> bool:
        """vLLM's class-level call, with the connector's own ``kv_connector_extra_config``."""
        transfer = self._config(_PIECEWISE).kv_transfer_config
        extra = dict(transfer.kv_connector_extra_config) if transfer is not None else {}
        piecewise: bool = self._cls.requires_piecewise_for_cudagraph(extra)
        return piecewise

    def set_xfer_handshake_metadata(self, metadata: Mapping[int, HandshakeMetadata], /) -> None:
        """vLLM's pipeline-aware call when the host carried vLLM's ``(pp_rank, tp_rank)`` keys."""
        if isinstance(metadata, PPHandshakes):
            self._inner.set_xfer_handshake_metadata_pp_aware(cast("Any", dict(metadata.by_pp_rank)))
        else:
            self._inner.set_xfer_handshake_metadata(dict(metadata))

    def _config(self, method: str) -> VllmConfig:
        config = self._vllm_config
        if config is None:
            # vLLM's KVConnectorBase_V1.__init__ keeps the config it was built with.
            found: object = getattr(self._inner, "_vllm_config", None)
            if isinstance(found, VllmConfig):
                config = found
        if config is None:
            raise ConfigError(
                f"{self._name}.{method} is answered by vLLM's class with a VllmConfig, and none is known: "
                "pass vllm_config= to capkv.vllm.wrap",
                connector=self._name,
                method=method,
            )
        return config

    # ---- worker side ---------------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor], /) -> None:
        self._inner.register_kv_caches(kv_caches)

    def bind_connector_metadata(self, connector_metadata: ConnectorMetadata, /) -> None:
        self._inner.bind_connector_metadata(self._unwrap(connector_metadata))

    def handle_preemptions(self, connector_metadata: ConnectorMetadata, /) -> None:
        self._inner.handle_preemptions(self._unwrap(connector_metadata))

    def _unwrap(self, metadata: object) -> Any:
        if not isinstance(metadata, ChildMetadata):
            return metadata
        group_of = self._group_of  # a block belongs to one group at a time: the latest planned load says which
        null = self._null_block_id
        self._receives.planned(metadata.loads)
        for block_ids in metadata.loads.values():
            for group, ids in enumerate(block_ids):
                for block_id in ids:
                    if block_id != null:
                        group_of[block_id] = group
        return metadata.inner

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        self._inner.start_load_kv(forward_context, **kwargs)

    def wait_for_layer_load(self, layer_name: str, /) -> None:
        self._inner.wait_for_layer_load(layer_name)

    def save_kv_layer(
        self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: AttentionMetadata, **kwargs: Any
    ) -> None:
        self._inner.save_kv_layer(layer_name, kv_layer, attn_metadata, **kwargs)

    def wait_for_save(self) -> None:
        self._inner.wait_for_save()

    def get_finished(self, finished_req_ids: set[str], /) -> tuple[set[str] | None, set[str] | None]:
        """From vLLM's ``get_transfer_results`` (what vLLM's worker calls). A failed receive is a finished
        receive there too; its failure is kept for the host, in vLLM's words (:meth:`take_failed_receives`),
        or, outside a host, becomes load errors (:mod:`._receives`)."""
        if self._uses_get_finished:
            return self._inner.get_finished(finished_req_ids)
        results = self._results(finished_req_ids)
        self._receives.reported(results.failed_recving, (*(results.finished_recving or ()), *finished_req_ids))
        return results.finished_sending or None, results.finished_recving or None

    def take_failed_receives(self) -> set[str]:
        """The receives the connector reported failed since the last call (vLLM's ``failed_recving``)."""
        return self._receives.take()

    def get_block_ids_with_load_errors(self) -> LoadErrors:
        """vLLM's flat set, per group, from the block tables of the planned loads."""
        failed = self._receives.errors()
        flat = self._inner.get_block_ids_with_load_errors()
        if not flat:
            return failed
        errors = attribute_load_errors(flat, self._group_of.get, owner=self._name, method="get_block_ids_with_load_errors")
        for group, ids in failed.items():
            errors.setdefault(group, set()).update(ids)
        return errors

    def build_connector_worker_meta(self) -> WorkerMetadata | None:
        return self._inner.build_connector_worker_meta()

    def clear_connector_metadata(self) -> None:
        self._inner.clear_connector_metadata()

    def get_handshake_metadata(self) -> object:
        return self._inner.get_handshake_metadata()

    def get_mem_pool_context(self) -> AbstractContextManager[object] | None:
        return self._inner.get_mem_pool_context()

    def get_kv_connector_stats(self) -> object:
        return self._inner.get_kv_connector_stats()

    def shutdown(self) -> None:
        self._inner.shutdown()


class HMAVllmChild(VllmChild[_HV]):
    """A vLLM ``SupportsHMA`` connector as a capkv :class:`~capkv.HMAConnector`."""

    def __init__(  # pyright: ignore[reportInconsistentConstructor]  # as in VllmChild
        self, connector: _HV, /, *, vllm_config: VllmConfig | None = None, null_block_id: int = VLLM_NULL_BLOCK_ID
    ) -> None:
        super().__init__(connector, vllm_config=vllm_config, null_block_id=null_block_id)
        calls: Any = connector
        vars(self)["request_finished_all_groups"] = calls.request_finished_all_groups  # direct, as in VllmChild

    def request_finished_all_groups(
        self, request: Request, block_ids: BlockIds, /
    ) -> tuple[bool, KVTransferParams | None]:
        return cast("SupportsHMA", self._inner).request_finished_all_groups(cast("Any", request), block_ids)


@overload
def wrap(  # type: ignore[overload-overlap]  # vLLM's composite proves nothing: its children decide
    connector: VllmMultiConnector, /, *, vllm_config: VllmConfig | None = None, null_block_id: int = ...
) -> VllmChild[VllmMultiConnector]: ...
@overload
def wrap(
    connector: _H, /, *, vllm_config: VllmConfig | None = None, null_block_id: int = ...
) -> HMAVllmChild[_H]: ...
@overload
def wrap(
    connector: _C, /, *, vllm_config: VllmConfig | None = None, null_block_id: int = ...
) -> VllmChild[_C]: ...
def wrap(
    connector: object,
    /,
    *,
    vllm_config: VllmConfig | None = None,
    null_block_id: int = VLLM_NULL_BLOCK_ID,
) -> VllmChild[Any]:
    """``connector`` as a capkv child: :class:`HMAVllmChild` when its class derives from vLLM's
    ``SupportsHMA`` (vLLM's MultiConnector: when every sub-connector's does), else :class:`VllmChild`.

    ``vllm_config`` answers the class-level calls (layout, piecewise CUDA graphs); by default the
    config the connector was built with. ``null_block_id`` is the engine's null block (vLLM's is 0).
    """
    if is_hma_vllm_connector(connector):
        return HMAVllmChild[Any](connector, vllm_config=vllm_config, null_block_id=null_block_id)
    return VllmChild[Any](connector, vllm_config=vllm_config, null_block_id=null_block_id)


publish(__name__, "capkv.vllm")
