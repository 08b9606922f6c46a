"""Connector classes shared by the typing cases (no cases here)."""

from __future__ import annotations

from typing import Any, Generic

from typing_extensions import TypeVar

from capkv import BlockIds, KVConnectorBase, KVTransferParams, Request, TokenRequest

R = TypeVar("R", bound=Request)


class _Quiet(KVConnectorBase[R], Generic[R]):
    """The seven required members, doing nothing."""

    def get_num_new_matched_tokens(self, request: R, num_computed_tokens: int, /) -> tuple[int | None, bool]:
        return 0, False

    def update_state_after_alloc(self, request: R, blocks: BlockIds, num_external_tokens: int, /) -> None: ...
    def build_connector_meta(self, scheduler_output: Any, /) -> object: return None
    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None: ...
    def wait_for_layer_load(self, layer_name: str, /) -> None: ...
    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any) -> None: ...
    def wait_for_save(self) -> None: ...


class Offload(_Quiet[Request]):
    """HMA-capable."""

    def request_finished_all_groups(self, request: Request, block_ids: BlockIds, /) -> tuple[bool, KVTransferParams | None]:
        return False, None


class Disk(_Quiet[Request]):
    """Single-group only."""


class PrefixStore(_Quiet[TokenRequest]):
    """HMA-capable, and needs the request's tokens."""

    def request_finished_all_groups(self, request: TokenRequest, block_ids: BlockIds, /) -> tuple[bool, KVTransferParams | None]:
        return bool(request.all_token_ids), None
