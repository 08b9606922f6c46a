"""A host's statistics: the children's in vLLM's composite shape, the host's own counters, and totals.

The host adds what it counts itself (contained failures, late load errors) and keeps every counter since it
was built.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats
from vllm.distributed.kv_transfer.kv_connector.v1.multi_connector import MultiKVConnectorStats

from capkv.adapters.vllm._host_state import HostState
from capkv.adapters.vllm._stats import MARK, StatNode, host_stats, merge_counts
from capkv.adapters.vllm._vllm_calls import wrapped_vllm
from capkv.capabilities._hma import StackNode

__all__ = ["StatsMembers", "stat_node", "stats_key"]


class StatsMembers(HostState):
    """vLLM's statistics members, and the host's running totals."""

    def get_kv_connector_stats(self) -> KVConnectorStats | None:
        """The children's statistics in vLLM's composite shape (see :mod:`._stats`)."""
        try:
            stats: object = self.stack.get_kv_connector_stats()
        except Exception as exc:
            self._contained("get_kv_connector_stats", exc, "the failing children's statistics come later")
            stats = None
        result = host_stats(self._stat_keys, stats, self._own_counts(), composite=self._composite)
        if result is not None:
            self._totals = merge_counts(self._totals, _counters(result))
        return result

    def _count_reported(self, stats: object) -> None:
        """The workers' statistics reached the scheduler side: add them to its totals."""
        if isinstance(stats, MultiKVConnectorStats):
            self._totals = merge_counts(self._totals, _counters(stats))

    def _own_counts(self) -> dict[str, int]:
        """The host's own counters since the last report: contained failures, dropped late load errors."""
        counts: dict[str, int] = {}
        contained = self._contained.take()
        if contained:
            counts["contained_errors"] = contained
        if self._tracker.dropped:
            counts["dropped_load_errors"] = self._tracker.dropped
            self._tracker.dropped = 0
        return counts

    def stats_since_start(self) -> dict[str, Any]:
        """Every counter this side has seen since it was built, by child class as vLLM keys them (the
        host's own under ``"capkv"``): its own stack's, and on the scheduler side the workers' too."""
        return dict(self._totals)


def _counters(stats: MultiKVConnectorStats) -> dict[str, Any]:
    """The statistics as plain mappings, without capkv's marks (what ``stats_since_start`` sums)."""
    return cast("dict[str, Any]", _unmarked(stats.to_dict()))


def _unmarked(value: object) -> object:
    if isinstance(value, Mapping):
        items = cast("Mapping[str, object]", value).items()
        return {key: _unmarked(inner) for key, inner in items if key != MARK}
    return value


def stat_node(child: object) -> StatNode:
    """How ``child``'s statistics are keyed, a nested composite's children included."""
    bare: object = getattr(child, "__wrapped__", child)
    nested = tuple(stat_node(c) for c in bare.children) if isinstance(bare, StackNode) else ()
    return StatNode(stats_key(child), wrapped_vllm(child) is not None, nested)


def stats_key(child: object) -> str:
    """A child's key in vLLM's per-connector statistics: its class name (a wrapped vLLM connector's
    configured class)."""
    if wrapped_vllm(child) is not None:
        return cast("type[Any]", getattr(child, "_cls")).__name__
    return type(getattr(child, "__wrapped__", child)).__name__
