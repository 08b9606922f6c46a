"""Conformance to the contract is structural, and the composite satisfies it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import torch
from typing_extensions import assert_type

from capkv import (
    BlockIds,
    HMAConnector,
    KVConnector,
    KVConnectorBase,
    KVConnectorOutput,
    KVTransferParams,
    LoadErrors,
    MultiConnector,
    Request,
    SupportsHMA,
    TokenRequest,
    WorkerMetadata,
    check_stack,
    finish_request,
    supports_hma,
)
from tests.typing_cases._connectors import Disk, Offload, PrefixStore


@dataclass
class Req:
    request_id: str


@dataclass
class TokReq:
    request_id: str
    all_token_ids: list[int]


class Standalone:
    """Inherits nothing, names its parameters freely: still a KVConnector."""

    def get_num_new_matched_tokens(self, req: Request, computed: int) -> tuple[int | None, bool]: return 0, False
    def update_state_after_alloc(self, req: Request, blocks: BlockIds, external: int) -> None: ...
    def build_connector_meta(self, out: Any) -> object: return None
    def update_connector_output(self, output: KVConnectorOutput) -> None: ...
    def request_finished(self, req: Request, ids: list[int]) -> tuple[bool, KVTransferParams | None]: return False, None
    def take_events(self) -> Iterable[object]: return ()
    def get_required_kvcache_layout(self) -> str | None: return None
    def get_finished_count(self) -> int | None: return None
    def requires_piecewise_for_cudagraph(self) -> bool: return False
    def set_xfer_handshake_metadata(self, metadata: Mapping[int, Any]) -> None: ...
    def register_kv_caches(self, caches: dict[str, torch.Tensor]) -> None: ...
    def bind_connector_metadata(self, md: Any) -> None: ...
    def handle_preemptions(self, md: Any) -> None: ...
    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None: ...
    def wait_for_layer_load(self, layer: str) -> None: ...
    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any) -> None: ...
    def wait_for_save(self) -> None: ...
    def get_finished(self, ids: set[str]) -> tuple[set[str] | None, set[str] | None]: return None, None
    def get_block_ids_with_load_errors(self) -> LoadErrors: return {}
    def build_connector_worker_meta(self) -> WorkerMetadata | None: return None
    def clear_connector_metadata(self) -> None: ...
    def get_handshake_metadata(self) -> object: return None
    def get_mem_pool_context(self) -> AbstractContextManager[object] | None: return None
    def get_kv_connector_stats(self) -> object: return None
    def shutdown(self) -> None: ...


class SchedulerOnly:
    """Has the scheduler side only: not a KVConnector."""

    def get_num_new_matched_tokens(self, req: Request, computed: int) -> tuple[int | None, bool]: return 0, False
    def update_state_after_alloc(self, req: Request, blocks: BlockIds, external: int) -> None: ...
    def build_connector_meta(self, out: Any) -> object: return None
    def request_finished(self, req: Request, ids: list[int]) -> tuple[bool, KVTransferParams | None]: return False, None


class Incomplete(KVConnectorBase[Request]):
    """Forgets most required members."""

    def wait_for_save(self) -> None: ...


def needs_connector(connector: KVConnector) -> None: ...
def needs_request_connector(connector: KVConnector[Request]) -> None: ...
def needs_hma(connector: SupportsHMA) -> None: ...


needs_connector(Standalone())
needs_connector(Offload())
needs_connector(SchedulerOnly())  # expect-error
needs_hma(Standalone())  # expect-error
Incomplete()  # expect-error
needs_connector(MultiConnector(Standalone(), Offload()))

# Generic in the request type: a connector that reads tokens cannot take a bare Request.
needs_connector(PrefixStore())
needs_request_connector(Offload())
needs_request_connector(PrefixStore())  # expect-error

# The composite satisfies the whole contract (every member forwarded) ...
as_connector: KVConnector[Request] = MultiConnector(Offload(), Disk())
as_hma: HMAConnector[Request] = MultiConnector(Offload(), PrefixStore())
# ... and accepts the most general request, so it serves connectors of narrower ones.
as_token_connector: KVConnector[TokenRequest] = MultiConnector(PrefixStore())

# finish_request: typed by the connector's request type and the grouped block ids.
assert_type(finish_request(Offload(), Req("r"), ([1, 2], [0, 3])), tuple[bool, dict[str, Any] | None])
finish_request(MultiConnector(Offload(), Disk()), Req("r"), ([1],))
finish_request(PrefixStore(), TokReq("r", [1, 2]), ([1],))
finish_request(PrefixStore(), Req("r"), ([1],))  # expect-error
finish_request(Offload(), Req("r"), [1, 2])  # expect-error
finish_request(Offload(), "r", ([1],))  # expect-error

assert_type(supports_hma(Offload), bool)
check_stack(MultiConnector(Offload(), Disk()), 2)
check_stack(Offload(), "two")  # expect-error


class RenamedKwargsParam(Standalone):
    """With ``**kwargs`` beside it, a parameter must keep vLLM's name (a keyword could collide)."""

    def start_load_kv(self, ctx: Any, **kwargs: Any) -> None: ...  # type: ignore[override]


needs_connector(RenamedKwargsParam())  # expect-error
