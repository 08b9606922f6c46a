"""P/D stacks for the conformance tests: NIXL beside a capkv tier, as capkv's drop-in and as vLLM's own composite.

``capkv``: ``capkv.vllm.MultiConnector`` over the children; ``vllm``: vLLM's own
``MultiConnector`` over the same children. A capkv tier is a capkv store hosted by
``CapkvHMAConnector`` or ``CapkvConnector`` (``nested``: the same child in both
composites), or, in capkv's drop-in only, the store named directly among the
drop-in's connectors (``flat``), whose reference is vLLM's composite over the
HMA host (vLLM cannot build a capkv store by itself).
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from tests.vllm.pd_harness import Node, kv_cache_config, node
from tests.vllm.pd_children import FABRIC, NixlLikeWorker

TIERS = ("hma-host", "plain-host", "flat")
ORDERS = ("nixl-first", "tier-first")
_fabrics = itertools.count()


def nixl(role: str, fabric: str) -> dict[str, Any]:
    """NIXL (its engine id is the composite's, as vLLM's composite hands it down)."""
    return {"kv_connector": "NixlLike", "kv_connector_module_path": "tests.vllm.pd_children", "kv_role": role,
            "kv_connector_extra_config": {"fabric": fabric}}


def store(kind: str = "cpu", root: Path | None = None) -> dict[str, Any]:
    if kind == "file":
        return {"kv_connector": "FileStoreConnector", "kv_connector_extra_config": {"root": str(root), "namespace": "pd"}}
    return {"kv_connector": "CPUOffloadConnector", "kv_connector_extra_config": {"capacity_blocks": 64}}


def tier(kind: str, role: str, leaf: dict[str, Any]) -> dict[str, Any]:
    if kind == "flat":  # vLLM checks every entry of a "MultiConnector" as a KVTransferConfig: it needs a role
        return {**leaf, "kv_role": role}
    host = "CapkvHMAConnector" if kind == "hma-host" else "CapkvConnector"
    return {"kv_connector": host, "kv_connector_module_path": "capkv.vllm", "kv_role": role,
            "kv_connector_extra_config": {"stack": leaf}}


def composite(which: str, role: str, engine_id: str, children: list[dict[str, Any]]) -> dict[str, Any]:
    config: dict[str, Any] = {"kv_connector": "MultiConnector", "kv_role": role, "engine_id": engine_id,
                              "kv_connector_extra_config": {"connectors": children}}
    if which == "capkv":
        config["kv_connector_module_path"] = "capkv.vllm"
    return config


class Scene:
    """One P/D node's stack, built for capkv's drop-in or vLLM's composite, on a fabric of its own."""

    def __init__(self, model_dir: Path, which: str, *, role: str, tier_kind: str, order: str, groups: int,
                 policy: str = "fail", leaf: dict[str, Any] | None = None, handshake: str | None = None) -> None:
        self.fabric = f"fabric-{next(_fabrics)}"
        self.engine_id = "P" if role == "kv_producer" else "D"
        kind = tier_kind if which == "capkv" or tier_kind != "flat" else "hma-host"
        children = [nixl(role, self.fabric), tier(kind, role, leaf or store())]
        if order == "tier-first":
            children.reverse()
        self.groups = groups
        self.config = composite(which, role, self.engine_id, children)
        if handshake is None:  # vLLM's composite keeps one handshake for all: each child gets its own by hand
            handshake = "engine" if which == "capkv" else "per-child"
        self.node: Node = node(model_dir, self.config, groups=groups, policy=policy, handshake=handshake)

    def producer(self, engine_id: str = "remote-P") -> NixlLikeWorker:
        """A producer on this scene's fabric holding KV to pull (its own tensors)."""
        worker = NixlLikeWorker(engine_id, self.fabric, kv_cache_config(self.groups), hma_required=self.groups > 1)
        caches = {name: tensor.clone() for name, tensor in self.node.caches.items()}
        worker.register(caches)
        return worker

    def read_by_consumer(self, request_id: str) -> None:
        """A decode node read ``request_id``'s blocks from this (prefill) node."""
        FABRIC[self.fabric][self.engine_id].read.add(request_id)

    def close(self) -> None:
        self.node.shutdown()
        FABRIC.pop(self.fabric, None)


def pull_params(engine_id: str, request_id: str, block_ids: list[list[int]], tokens: int) -> dict[str, Any]:
    """A decode request's ``kv_transfer_params``: pull from ``engine_id`` (as a prefill node's answer reads)."""
    return {"do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": engine_id,
            "remote_request_id": request_id, "remote_block_ids": block_ids, "remote_host": "127.0.0.1",
            "remote_port": 1, "tp_size": 1, "remote_num_tokens": tokens}
