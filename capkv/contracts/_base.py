"""An optional base class with the contract's optional members filled in.

A connector then writes only the members that carry its logic; nothing requires inheriting it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Generic


from capkv._homes import publish
from capkv.contracts._access import KVCacheAccess
from capkv.contracts._class_level import class_level
from capkv.contracts._connector import RequestT
from capkv.contracts._engine import (
    AttentionMetadata,
    BlockIds,
    ConnectorMetadata,
    ForwardContext,
    HandshakeMetadata,
    KVConnectorOutput,
    KVTransferParams,
    LoadErrors,
    SchedulerOutput,
    WorkerMetadata,
)
from capkv.errors import MetadataError

if TYPE_CHECKING:  # torch loads only where KV is moved, not with the contracts
    import torch

__all__ = ["KVConnectorBase"]


class KVConnectorBase(ABC, Generic[RequestT]):
    """Defaults for every optional member of :class:`~capkv.KVConnector`.

    A concrete connector writes only the seven members that carry its logic; the rest default to "nothing to
    do". The three facts (layout, finished count, piecewise CUDA graphs) default at class level, so ``capkv
    check`` knows them without building the connector. Nothing requires inheriting this class: the contract is
    the :class:`~capkv.KVConnector` protocol.
    """

    _connector_metadata: object = None

    # ---- required: scheduler side ---------------------------------------------

    @abstractmethod
    def get_num_new_matched_tokens(
        self, request: RequestT, num_computed_tokens: int, /
    ) -> tuple[int | None, bool]: ...

    @abstractmethod
    def update_state_after_alloc(
        self, request: RequestT, blocks: BlockIds, num_external_tokens: int, /
    ) -> None: ...

    @abstractmethod
    def build_connector_meta(self, scheduler_output: SchedulerOutput, /) -> object: ...

    # ---- required: worker side ------------------------------------------------

    @abstractmethod
    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None: ...

    @abstractmethod
    def wait_for_layer_load(self, layer_name: str, /) -> None: ...

    @abstractmethod
    def save_kv_layer(
        self,
        layer_name: str,
        kv_layer: torch.Tensor,
        attn_metadata: AttentionMetadata,
        **kwargs: Any,
    ) -> None: ...

    @abstractmethod
    def wait_for_save(self) -> None: ...

    # ---- optional: scheduler side ---------------------------------------------

    def update_connector_output(self, connector_output: KVConnectorOutput, /) -> None:
        return None

    def request_finished(
        self, request: RequestT, block_ids: list[int], /
    ) -> tuple[bool, KVTransferParams | None]:
        return False, None

    def take_events(self) -> Iterable[object]:
        return ()

    # The three facts below are class-level (see :func:`~capkv.class_level`): a
    # connector that keeps the defaults answers ``capkv check`` from its class.

    @class_level
    def get_required_kvcache_layout(cls) -> str | None:
        """No particular layout.

        Override with an instance method when the answer depends on the
        connector's configuration; declare it ``@class_level`` when it does
        not, so ``capkv check`` can answer before building the connector.
        """
        return None

    @class_level
    def get_finished_count(cls) -> int | None:
        """The world size (``None``); override as for :meth:`get_required_kvcache_layout`."""
        return None

    @class_level
    def requires_piecewise_for_cudagraph(cls) -> bool:
        """Full CUDA graphs are fine; override as for :meth:`get_required_kvcache_layout`."""
        return False

    @class_level
    def kv_cache_access(cls) -> KVCacheAccess:
        """Copies within the engine's process only; say more (class-level) when the connector
        registers or exports the KV cache: vLLM allocates it by the answer."""
        return KVCacheAccess.IN_PROCESS

    @class_level
    def supports_lookahead_block_hashes(cls) -> bool:
        """No: the connector is not known to take a request's lookahead block hashes (vLLM 0.34 then
        hashes no lookahead tokens); say yes (class-level) when it keys only the blocks it is offered."""
        return False

    @class_level
    def loads_slices(cls) -> bool:
        """Whether the connector loads a slice that starts beyond the engine's local hit: no.

        Say ``True`` (class-level, like the facts above) when ``get_num_new_matched_tokens``
        takes ``num_computed_tokens`` as "every token before this is in the engine's
        blocks by the time the request runs" and the load then writes only blocks from
        there on (and never the null block): a :class:`~capkv.MultiConnector` then asks
        it beyond what earlier children load, so tiers' hits add up.
        """
        return False

    def set_xfer_handshake_metadata(
        self, metadata: Mapping[int, HandshakeMetadata], /
    ) -> None:
        return None

    # ---- optional: worker side ------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor], /) -> None:
        return None

    def bind_connector_metadata(self, connector_metadata: ConnectorMetadata, /) -> None:
        self._connector_metadata = connector_metadata

    def clear_connector_metadata(self) -> None:
        self._connector_metadata = None

    @property
    def connector_metadata(self) -> object:
        """The metadata bound for this step; :class:`~capkv.errors.MetadataError` outside a step."""
        if self._connector_metadata is None:
            raise MetadataError(
                f"{type(self).__name__}: no connector metadata is bound; "
                "it is only available between bind_connector_metadata and clear_connector_metadata",
                connector=type(self).__name__,
                method="connector_metadata",
            )
        return self._connector_metadata

    def handle_preemptions(self, connector_metadata: ConnectorMetadata, /) -> None:
        return None

    def get_finished(
        self, finished_req_ids: set[str], /
    ) -> tuple[set[str] | None, set[str] | None]:
        return None, None

    def get_block_ids_with_load_errors(self) -> LoadErrors:
        return {}

    def build_connector_worker_meta(self) -> WorkerMetadata | None:
        return None

    def get_handshake_metadata(self) -> object:
        return None

    def get_mem_pool_context(self) -> AbstractContextManager[object] | None:
        return None

    def get_kv_connector_stats(self) -> object:
        return None

    def shutdown(self) -> None:
        return None


publish(__name__)
