"""A connector that fails on purpose, in a real engine: failed loads (sync or async) and raising members.

``Faulty(claim=True, ...)`` claims every prompt's block-aligned prefix, like
:mod:`tests.vllm.liar`, but never loads it: the load always fails, reported
as load errors for every block of it (``fail_load``) or by raising in the
members named in ``raise_in``. With ``load_async`` its loads are asynchronous:
each is reported finished by the worker step after the one that bound it.
``claim=False`` offers nothing, so only the raising members matter.
"""

from __future__ import annotations

from typing import Any

from capkv import BlockIds, ComputedTokenRequest, KVConnectorBase, KVTransferParams, LoadErrors

BLOCK = 32
"""The engine's block size in these tests (every group)."""
NULL = 0


class Faulty(KVConnectorBase[ComputedTokenRequest]):
    def __init__(
        self, *, claim: bool = False, load_async: bool = False, fail_load: bool = False, raise_in: tuple[str, ...] = (),
        min_local: int = 0,
    ) -> None:
        self.claim = claim
        self.min_local = min_local
        """Claim only beyond a local prefix hit of at least this many tokens."""
        self.load_async = load_async
        self.fail_load = fail_load
        self.raise_in = frozenset(raise_in)
        self._planned: dict[str, BlockIds] = {}
        self._bound: dict[str, BlockIds] = {}
        self._running: dict[str, BlockIds] = {}
        self._finished: set[str] = set()
        self._errors: LoadErrors = {}

    def _maybe_raise(self, method: str) -> None:
        if method in self.raise_in:
            raise RuntimeError(f"Faulty: {method} fails on purpose")

    # ---- scheduler side ------------------------------------------------------------

    def get_num_new_matched_tokens(self, request: ComputedTokenRequest, num_computed_tokens: int, /) -> tuple[int | None, bool]:
        self._maybe_raise("get_num_new_matched_tokens")
        if not self.claim or num_computed_tokens < self.min_local:
            return 0, False
        claimed = (len(request.all_token_ids) - 1) // BLOCK * BLOCK
        tokens = max(claimed - num_computed_tokens, 0)
        return tokens, self.load_async and tokens > 0

    def update_state_after_alloc(self, request: ComputedTokenRequest, blocks: BlockIds, num_external_tokens: int, /) -> None:
        self._maybe_raise("update_state_after_alloc")
        if num_external_tokens > 0:
            self._planned[request.request_id] = tuple(list(ids) for ids in blocks)

    def build_connector_meta(self, scheduler_output: Any, /) -> object:
        self._maybe_raise("build_connector_meta")
        planned, self._planned = self._planned, {}
        return planned

    def update_connector_output(self, connector_output: Any, /) -> None:
        self._maybe_raise("update_connector_output")

    def request_finished_all_groups(self, request: ComputedTokenRequest, block_ids: BlockIds, /) -> tuple[bool, KVTransferParams | None]:
        self._maybe_raise("request_finished_all_groups")
        return False, None

    def take_events(self) -> list[object]:
        self._maybe_raise("take_events")
        return []

    # ---- worker side -----------------------------------------------------------------

    def bind_connector_metadata(self, connector_metadata: object, /) -> None:
        self._maybe_raise("bind_connector_metadata")
        assert isinstance(connector_metadata, dict)
        self._bound = dict(connector_metadata)

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        self._maybe_raise("start_load_kv")
        for request_id, blocks in self._bound.items():
            if self.fail_load:
                for group, ids in enumerate(blocks):
                    self._errors.setdefault(group, set()).update(i for i in ids if i != NULL)
            if self.load_async:
                self._running[request_id] = blocks
        self._bound = {}

    def wait_for_layer_load(self, layer_name: str, /) -> None:
        self._maybe_raise("wait_for_layer_load")

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any) -> None:
        self._maybe_raise("save_kv_layer")

    def wait_for_save(self) -> None:
        self._maybe_raise("wait_for_save")

    def get_finished(self, finished_req_ids: set[str], /) -> tuple[set[str] | None, set[str] | None]:
        self._maybe_raise("get_finished")
        done, self._finished = self._finished, set(self._running)  # reported one step after they started
        self._running = {}
        return None, done or None

    def get_block_ids_with_load_errors(self) -> LoadErrors:
        self._maybe_raise("get_block_ids_with_load_errors")
        errors, self._errors = self._errors, {}
        return errors

    def build_connector_worker_meta(self) -> None:
        self._maybe_raise("build_connector_worker_meta")
        return None
