"""A deliberately wrong connector: it claims every prompt's block-aligned prefix and loads nothing.

Hosted in vLLM it gives the same compute shape as a correct load, with stale
bytes in the "loaded" blocks — what a comparison against a local prefix hit
must catch.
"""

from __future__ import annotations

from typing import Any

from capkv import BlockIds, ComputedTokenRequest, KVConnectorBase, KVTransferParams

BLOCK = 32


class ClaimsPrefixLoadsNothing(KVConnectorBase[ComputedTokenRequest]):
    def get_num_new_matched_tokens(self, request: ComputedTokenRequest, num_computed_tokens: int, /) -> tuple[int | None, bool]:
        claimed = (len(request.all_token_ids) - 1) // BLOCK * BLOCK
        return max(claimed - num_computed_tokens, 0), False

    def update_state_after_alloc(self, request: ComputedTokenRequest, blocks: BlockIds, num_external_tokens: int, /) -> None:
        return None

    def build_connector_meta(self, scheduler_output: Any, /) -> object:
        return None

    def request_finished_all_groups(self, request: ComputedTokenRequest, block_ids: BlockIds, /) -> tuple[bool, KVTransferParams | None]:
        return False, None

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        return None

    def wait_for_layer_load(self, layer_name: str, /) -> None:
        return None

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any) -> None:
        return None

    def wait_for_save(self) -> None:
        return None
