"""vLLM's members that capkv's contract has no counterpart for, forwarded as vLLM's MultiConnector does.

capkv's stores neither hold vLLM's block pool nor push KV to peers, so these concern vLLM's own connectors in
the stack.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, cast

from vllm.distributed.kv_events import KVConnectorKVEvents
from vllm.distributed.kv_transfer.kv_connector.v1.base import CopyBlocksOp, KVConnectorBase_V1
from vllm.v1.metrics.cache_hit_source import CacheHitSource
from vllm.v1.request import Request

from capkv.capabilities._hma import StackNode
from capkv.capabilities._table import DELIVERY, DIVERGENT_HITS, fold
from capkv.composite._plan import Plan
from capkv.contracts._connector import KVConnector

if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = ["VllmOnlyMembers", "load_plans", "serving_leaves", "vllm_connectors"]

_log = logging.getLogger("capkv.vllm")


def serving_leaves(stack: object, request_id: str, tokens: int) -> list[tuple[object, int]]:
    """The leaves of ``stack`` loading ``request_id``, each with its share of ``tokens`` external tokens
    (``[]``: no load is planned for it). A leaf stands for itself.

    A composite keeps each request's plan (its children's slices, in token order) from the hit until the
    request finishes: ``tokens`` is split over the slices in that order, as the allocation splits it, and a
    nested composite splits its share over its own slices.
    """
    node: object = _bare(stack)
    if not isinstance(node, StackNode):
        return [(node, tokens)]
    plans = load_plans(node)
    plan = None if plans is None else plans.get(request_id)
    if plan is None:
        return []
    shares: list[tuple[object, int]] = []
    left = tokens
    children = node.children
    for index, _, offered, _ in plan[1]:
        part = min(offered, left)
        shares += serving_leaves(children[index], request_id, part)
        left -= part
    return shares


def load_plans(stack: object) -> dict[str, Plan] | None:
    """A composite's plans by request id, kept from the hit until the request finishes (the dict itself:
    writes reach the composite); ``None`` for a stack that keeps none."""
    plans: object = getattr(_bare(stack), "_plans", None)
    return cast("dict[str, Plan]", plans) if isinstance(plans, dict) else None


def vllm_connectors(node: object) -> list[KVConnectorBase_V1]:
    """The vLLM connectors wrapped anywhere in a capkv stack, in stack order.

    A host forwards to them the vLLM calls capkv's contract has no member for
    (``bind_kv_cache_manager``, ``on_new_request``, ``reset_cache``, ...): the
    wrapper passes the contract's members, these go to the connectors themselves.
    """
    if isinstance(node, StackNode):
        return [found for child in node.children for found in vllm_connectors(child)]
    if getattr(node.__class__, "__capkv_wrapper__", False) is True:
        wrapped: object = getattr(node, "wrapped")
        return [wrapped] if isinstance(wrapped, KVConnectorBase_V1) else vllm_connectors(wrapped)
    return []


def wrapped_vllm(leaf: object) -> KVConnectorBase_V1 | None:
    """The vLLM connector a capkv wrapper wraps (``None`` for capkv's own connectors)."""
    leaf = _bare(leaf)
    if getattr(type(leaf), "__capkv_wrapper__", False) is not True:
        return None
    inner: object = getattr(leaf, "wrapped")
    return inner if isinstance(inner, KVConnectorBase_V1) else None


def _bare(node: object) -> object:
    """``node`` itself, out of dev mode's instrumentation (``capkv.devmode.instrument``)."""
    return getattr(node, "__wrapped__", node)


class VllmOnlyMembers(KVConnectorBase_V1):
    """The members a host forwards to vLLM's connectors in its stack."""

    stack: KVConnector
    _vllm_children: list[KVConnectorBase_V1]
    _only_vllm: bool
    """Every leaf of the stack is one of vLLM's connectors."""

    @property
    def supports_divergent_local_hybrid_hits(self) -> bool:
        children = self._vllm_children
        return self._only_vllm and bool(children) and fold(DIVERGENT_HITS, (c.supports_divergent_local_hybrid_hits for c in children))

    @property
    def requires_kv_delivery(self) -> bool:
        return fold(DELIVERY, (c.requires_kv_delivery for c in self._vllm_children))

    def bind_kv_cache_manager(self, kv_cache_manager: Any) -> None:
        self._kv_cache_manager = kv_cache_manager
        for child in self._vllm_children:
            child.bind_kv_cache_manager(kv_cache_manager)

    def bind_gpu_block_pool(self, gpu_block_pool: Any) -> None:
        for child in self._vllm_children:
            child.bind_gpu_block_pool(gpu_block_pool)

    def on_new_request(self, request: Request) -> None:
        for child in self._vllm_children:
            child.on_new_request(request)

    def has_pending_block_frees(self) -> bool:
        return any(child.has_pending_block_frees() for child in self._vllm_children)

    def has_pending_push_work(self) -> bool:
        return any(child.has_pending_push_work() for child in self._vllm_children)

    def register_finished_partial_tail(
        self, request: Request, block_ids: tuple[list[int], ...], partial_tail_offloads: list[tuple[int, int, int]]
    ) -> bool:
        """Every vLLM child is told (none is skipped); the blocks stay while any of them took the sources."""
        accepted = [
            child.register_finished_partial_tail(request, block_ids, partial_tail_offloads)
            for child in self._vllm_children
        ]
        return any(accepted)

    def reset_cache(self) -> bool:
        """Every tier of the stack drops what it holds; ``True`` only when every one did. vLLM's
        connectors answer by vLLM's rule (anything but ``False``: vLLM's composite counts their ``None``
        as done); capkv's must answer ``True`` (a store starts a new generation of keys, so nothing from
        before the reset is served after it); one without ``reset_cache`` keeps what it holds: ``False``."""
        answers: list[bool] = []
        for leaf in leaves(self.stack):
            child = wrapped_vllm(leaf)
            reset: Any = child.reset_cache if child is not None else getattr(leaf, "reset_cache", None)
            try:
                answer: object = reset() if callable(reset) else False
            except Exception as exc:  # noqa: BLE001 (a tier that could not reset answers no)
                _log.error("%s.reset_cache: %s raised; answering False", type(self).__name__, leaf, exc_info=exc)
                answer = False
            answers.append(answer is not False if child is not None else answer is True)
        return all(answers)

    def finish_forward(self) -> None:
        for child in self._vllm_children:
            child.finish_forward()

    def reset_capture_state(self) -> None:
        for child in self._vllm_children:
            child.reset_capture_state()

    def set_host_xfer_buffer_ops(self, copy_operation: CopyBlocksOp) -> None:
        for child in self._vllm_children:
            child.set_host_xfer_buffer_ops(copy_operation)

    def get_kv_connector_kv_cache_events(self) -> KVConnectorKVEvents | None:
        """The worker-side KV events of every vLLM child, merged into the first one's container."""
        merged: KVConnectorKVEvents | None = None
        for child in self._vllm_children:
            events = child.get_kv_connector_kv_cache_events()
            if events is not None:
                merged = events if merged is None else merged.merge(events)
        return merged

    def get_loaded_kv_cache_group_ids(self, request: Request) -> tuple[int, ...]:
        """The groups every child loading ``request`` restores (a vLLM child's answer; capkv's stores:
        every prefix-cacheable group). With several loaders, the groups all of them restore: vLLM skips
        zeroing only those."""
        leaves = serving_leaves(self.stack, request.request_id, 0)
        if not leaves:
            return super().get_loaded_kv_cache_group_ids(request)
        common: tuple[int, ...] | None = None
        for leaf, _ in leaves:
            child = wrapped_vllm(leaf)
            groups = (
                child.get_loaded_kv_cache_group_ids(request) if child is not None
                else super().get_loaded_kv_cache_group_ids(request)
            )
            common = tuple(groups) if common is None else tuple(g for g in common if g in groups)
        return () if common is None else common

    def get_external_cache_hit_sources(self, request: Request, num_external_tokens: int) -> dict[CacheHitSource, int]:
        """The tiers the hit came from: each loading child's answer for its share of the tokens (a
        vLLM child's own; capkv's stores: unspecified), summed."""
        shares = serving_leaves(self.stack, request.request_id, num_external_tokens)
        if not shares:
            return super().get_external_cache_hit_sources(request, num_external_tokens)
        answers: list[dict[CacheHitSource, int]] = []
        for leaf, share in shares:
            if not share:
                continue
            child = wrapped_vllm(leaf)
            answers.append(
                child.get_external_cache_hit_sources(request, share) if child is not None
                else super().get_external_cache_hit_sources(request, share)
            )
        if not answers:
            return super().get_external_cache_hit_sources(request, num_external_tokens)
        if len(answers) == 1:
            return answers[0]
        total: dict[CacheHitSource, int] = {}
        for answer in answers:
            for source, count in answer.items():
                total[source] = total.get(source, 0) + count
        return total


def leaves(node: object) -> Iterable[object]:
    """Every leaf of a stack, in order (out of dev mode's instrumentation; a stand-in for no child, none)."""
    node = _bare(node)
    if isinstance(node, StackNode):
        for child in node.children:
            yield from leaves(child)
    elif getattr(type(node), "capkv_no_leaves", False) is not True:
        yield node
