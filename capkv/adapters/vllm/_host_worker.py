"""A host's worker side: vLLM's worker calls, translated for the stack, its failures contained.

Sleep mode (vLLM 0.33) included: the KV cache's views are dropped and registered again where children hold
them.
"""

from __future__ import annotations

from collections.abc import Generator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, cast

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorHandshakeMetadata,
    KVConnectorMetadata,
    KVConnectorTransferResults,
)

from capkv.adapters.vllm._host_state import HostState
from capkv.adapters.vllm._loads import Settled
from capkv.adapters.vllm._spec import registered_caches
from capkv.adapters.vllm._translate import SITS_OUT, HostHandshake, HostWorkerMetadata, host_worker_meta
from capkv.adapters.vllm._vllm_calls import leaves, wrapped_vllm
from capkv.composite._handshakes import ChildHandshakes
from capkv.contracts._engine import AttentionMetadata, ForwardContext
from capkv.errors import ConflictError

__all__ = ["WorkerMembers", "holds_kv_views"]


class WorkerMembers(HostState):
    """vLLM's worker-side members."""

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        spec = self.spec
        registered = kv_caches if spec is None else registered_caches(spec, kv_caches, owner=self.HOST)
        self._registered, self._released = registered, []
        self.stack.register_kv_caches(registered)

    def unregister_kv_caches(self) -> None:
        """Before vLLM gives up the KV cache's memory (sleep, or discarding the cache): every vLLM child
        unregisters it; every capkv child holding views of it finishes its copies and drops them."""
        for child in self._vllm_children:
            cast("Any", child).unregister_kv_caches()
        released: list[object] = []
        for leaf in leaves(self._built):
            if not holds_kv_views(leaf):
                continue
            released.append(leaf)
            try:
                cast("Any", leaf).unregister_kv_caches()
            except Exception as exc:
                self._contained("unregister_kv_caches", exc, "its views are taken again on wake")
        self._released = released

    def restore_kv_caches(self) -> None:
        """On wake: every vLLM child restores its registration; the capkv children that dropped their
        views are registered with the same KV cache again."""
        for child in self._vllm_children:
            cast("Any", child).restore_kv_caches()
        released, self._released = self._released, []
        caches = self._registered
        if caches is None:
            return
        for leaf in released:
            try:
                cast("Any", leaf).register_kv_caches(caches)
            except Exception as exc:
                self._contained("restore_kv_caches", exc, "it loads and saves nothing until registered again")

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
        failed_receives: set[str] = set()
        for child in self._receivers:  # vLLM's connectors in the stack: their failed receives, in vLLM's words
            failed_receives |= cast("Any", child).take_failed_receives()
        try:
            errors = self.stack.get_block_ids_with_load_errors()
        except Exception as exc:
            self._contained("get_block_ids_with_load_errors", exc, "every load of this step is reported failed")
            errors = {}
            tracker.fail_step()
        settled = tracker.settle(recving, errors, failed_receives)
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
        """The stack's handshake metadata (a composite's keeps every child's own in its place, so each
        gets its own back), with what capkv's children have to report once the KV caches are registered
        (a store's memory layout, without which a scheduler side that never sees a tensor cannot offer
        blocks). A stack of vLLM's connectors only hands its own on as it is."""
        inner = cast("KVConnectorHandshakeMetadata | None", self.stack.get_handshake_metadata())
        if self._only_vllm:
            return inner
        try:
            with _vllm_children_quiet(self._built):  # vLLM's children are not asked for worker metadata here
                report = self.stack.build_connector_worker_meta()
        except Exception as exc:
            self._contained("build_connector_worker_meta", exc, "the registration report is lost")
            report = None
        if report is None and not isinstance(inner, ChildHandshakes):
            return inner
        return HostHandshake(inner, report)

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


def holds_kv_views(leaf: object) -> bool:
    """Whether a leaf is a capkv child that holds views of the engine's KV cache: it releases them in
    ``unregister_kv_caches`` (vLLM's connectors are told by their own member)."""
    return wrapped_vllm(leaf) is None and callable(getattr(leaf, "unregister_kv_caches", None))


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
