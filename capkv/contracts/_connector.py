"""The connector contract: what an engine may call on a KV-cache connector.

Named and ordered like vLLM's v1 connector API, so engine authors feel at home; conformance is structural.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from typing_extensions import TypeVar

from capkv._homes import publish
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

if TYPE_CHECKING:  # torch loads only where KV is moved, not with the contracts
    import torch

__all__ = ["KV_CONNECTOR_MEMBERS", "HMAConnector", "KVConnector", "RequestT", "SupportsHMA", "missing_members"]

RequestT = TypeVar("RequestT", bound=Request, contravariant=True, default=Any)
"""The request type a connector accepts; ``Any`` when unspecified."""


@runtime_checkable
class KVConnector(Protocol[RequestT]):
    """A KV-cache connector: scheduler-side and worker-side members, in vLLM's order.

    Parameters are positional-only, so an implementation may name them as it likes — except in the two methods
    that also take ``**kwargs`` (``start_load_kv``, ``save_kv_layer``): there a renamed parameter could
    collide with a keyword, so checkers rightly insist on vLLM's names. Any class with these members *is* a
    ``KVConnector``: inheriting :class:`~capkv.KVConnectorBase` is optional.

    The contract is generic in the request type a connector accepts (``KVConnector[R]``); a bare
    ``KVConnector`` accepts connectors written for any request type.
    """

    # ---- scheduler side -------------------------------------------------------

    def get_num_new_matched_tokens(
        self, request: RequestT, num_computed_tokens: int, /
    ) -> tuple[int | None, bool]:
        """Tokens loadable beyond the local prefix hit (``None``: ask again next step), and whether the load is async."""
        ...

    def update_state_after_alloc(
        self, request: RequestT, blocks: BlockIds, num_external_tokens: int, /
    ) -> None:
        """The engine allocated ``blocks`` (one list per group) for ``request``."""
        ...

    def build_connector_meta(self, scheduler_output: SchedulerOutput, /) -> object:
        """Build this step's metadata for the worker side."""
        ...

    def update_connector_output(self, connector_output: KVConnectorOutput, /) -> None:
        """Take the workers' report for the step."""
        ...

    def request_finished(
        self, request: RequestT, block_ids: list[int], /
    ) -> tuple[bool, KVTransferParams | None]:
        """Single-group finish: ``(delay_free, kv_transfer_params)``."""
        ...

    def take_events(self) -> Iterable[object]:
        """KV-cache events since the last call."""
        ...

    def get_required_kvcache_layout(self) -> str | None:
        """The KV-cache layout this connector needs (e.g. ``"HND"``), or ``None``.

        Declare it a classmethod (``@class_level`` in a :class:`~capkv.KVConnectorBase`
        subclass) when the answer does not depend on the instance, so ``capkv check``
        can answer before building; likewise the next two members.
        """
        ...

    def get_finished_count(self) -> int | None:
        """How many completion reports finish one transfer (``None``: the world size); may be class-level."""
        ...

    def requires_piecewise_for_cudagraph(self) -> bool:
        """Whether layer-wise hooks forbid full CUDA-graph capture; may be class-level."""
        ...

    def set_xfer_handshake_metadata(
        self, metadata: Mapping[int, HandshakeMetadata], /
    ) -> None:
        """The peers' handshake metadata, by rank."""
        ...

    # ---- worker side ----------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor], /) -> None:
        """The engine's paged KV tensors, by layer name."""
        ...

    def bind_connector_metadata(self, connector_metadata: ConnectorMetadata, /) -> None:
        """This step's metadata from the scheduler side."""
        ...

    def handle_preemptions(self, connector_metadata: ConnectorMetadata, /) -> None:
        """Requests were preempted; finish or cancel their transfers before blocks are reused."""
        ...

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        """Start loading KV for this step's requests."""
        ...

    def wait_for_layer_load(self, layer_name: str, /) -> None:
        """Block until ``layer_name`` has been loaded."""
        ...

    def save_kv_layer(
        self,
        layer_name: str,
        kv_layer: torch.Tensor,
        attn_metadata: AttentionMetadata,
        **kwargs: Any,
    ) -> None:
        """Start saving ``layer_name``'s KV for this step."""
        ...

    def wait_for_save(self) -> None:
        """Block until this step's saves no longer need the paged buffers."""
        ...

    def get_finished(
        self, finished_req_ids: set[str], /
    ) -> tuple[set[str] | None, set[str] | None]:
        """Requests whose async ``(sending, receiving)`` transfers have completed."""
        ...

    def get_block_ids_with_load_errors(self) -> LoadErrors:
        """Block ids that failed to load, per KV-cache group."""
        ...

    def build_connector_worker_meta(self) -> WorkerMetadata | None:
        """This step's metadata for the scheduler side."""
        ...

    def clear_connector_metadata(self) -> None:
        """Forget the metadata bound for this step."""
        ...

    def get_handshake_metadata(self) -> object:
        """Handshake data for peers, or ``None``."""
        ...

    def get_mem_pool_context(self) -> AbstractContextManager[object] | None:
        """A context in which the engine allocates its KV cache, or ``None``."""
        ...

    def get_kv_connector_stats(self) -> object:
        """Transfer statistics since the last call, or ``None``."""
        ...

    def shutdown(self) -> None:
        """Complete or cancel outstanding transfers and release resources."""
        ...


KV_CONNECTOR_MEMBERS: tuple[str, ...] = tuple(
    name for name, value in vars(KVConnector).items() if callable(value) and not name.startswith("_")
)
"""Every member of the :class:`KVConnector` contract, in declaration order."""


def missing_members(obj: object) -> list[str]:
    """The contract's members that ``obj`` (an instance or a class) lacks: empty for a connector.

    A structural answer with the member names, which ``isinstance(obj, KVConnector)``
    cannot give, so every refusal can say what is missing.
    """
    return [name for name in KV_CONNECTOR_MEMBERS if not callable(getattr(obj, name, None))]


@runtime_checkable
class SupportsHMA(Protocol[RequestT]):
    """The connector handles several KV-cache groups (vLLM's hybrid memory allocator)."""

    def request_finished_all_groups(
        self, request: RequestT, block_ids: BlockIds, /
    ) -> tuple[bool, KVTransferParams | None]:
        """Finish with every group's blocks: ``(delay_free, kv_transfer_params)``."""
        ...


@runtime_checkable
class HMAConnector(KVConnector[RequestT], SupportsHMA[RequestT], Protocol[RequestT]):
    """A connector that is HMA-capable: the bound of an HMA stack's children."""


publish(__name__)
