"""A hosted stack's statistics in vLLM's own types, so vLLM's stat loggers and Prometheus see every child.

The same shape vLLM's composite reports, rebuilt across processes as vLLM rebuilds its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple, cast

from vllm.config import VllmConfig
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorPromMetrics, KVConnectorStats
from vllm.distributed.kv_transfer.kv_connector.v1.multi_connector import MultiKVConnectorStats

__all__ = [
    "HOST_KEY",
    "MARK",
    "CapkvStats",
    "HostStats",
    "HostPromMetrics",
    "StatNode",
    "host_stats",
    "merge_counts",
    "rebuild_stats",
    "stats_data",
]

HOST_KEY: Final = "capkv"
"""The key of the host's own counters in its statistics."""
MARK: Final = "__capkv__"
"""Marks what capkv's statistics become across processes: ``"counters"`` or ``"host"``."""
_COUNTER: Final = "vllm:capkv_connector_events_total"


@dataclass
class CapkvStats(KVConnectorStats):
    """A capkv connector's counters: numbers add up, nested mappings (a nested stack's children) merge."""

    data: dict[str, Any] = field(default_factory=lambda: dict[str, Any]())

    def to_dict(self) -> dict[str, Any]:
        return {**self.data, MARK: "counters"}

    def reset(self) -> None:
        self.data = {}

    def aggregate(self, other: KVConnectorStats) -> CapkvStats:
        return CapkvStats(merge_counts(self.data, other.data))

    def reduce(self) -> dict[str, int | float]:
        """Every numeric counter, its path joined with dots (e.g. ``#2.loaded_blocks`` in a nested stack)."""
        return dict(_flatten(self.data, ""))

    def is_empty(self) -> bool:
        return not self.data


@dataclass
class HostStats(MultiKVConnectorStats):
    """A host's statistics: vLLM's composite's shape, marked so a nesting host rebuilds them."""

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), MARK: "host"}


def stats_data(stats: object) -> dict[str, Any]:
    """capkv statistics as vLLM's ``KVConnectorStats.data``: string keys, a composite's children as ``#1``, ``#2``."""
    if not isinstance(stats, Mapping):
        return {"stats": stats}
    data: dict[str, Any] = {}
    for key, value in cast("Mapping[object, Any]", stats).items():
        name = f"#{key + 1}" if isinstance(key, int) and not isinstance(key, bool) else str(key)
        data[name] = stats_data(cast("Mapping[object, Any]", value)) if isinstance(value, Mapping) else value
    return data


class StatNode(NamedTuple):
    """A child of a hosted stack as its statistics are keyed: its key (class name), whether it is one of
    vLLM's connectors, and a nested composite's children."""

    key: str
    vllm: bool
    children: tuple[StatNode, ...] = ()


def host_stats(
    children: Sequence[StatNode], stats: object, own: Mapping[str, int], *, composite: bool
) -> MultiKVConnectorStats | None:
    """The stack's statistics as vLLM's composite reports its children's.

    ``children``: per child of the hosted stack, its :class:`StatNode`; ``stats``: the
    stack's ``get_kv_connector_stats()`` (by child index for a composite, the leaf's own
    for a one-connector stack). A vLLM connector inside a nested capkv composite reports
    at the top, under its class, as it would in vLLM's composite (its statistics object is
    what vLLM's loggers reduce); the nested composite keeps its capkv children's counters.
    """
    per_child: Iterable[tuple[int, object]]
    if not composite:
        per_child = () if stats is None else ((0, stats),)
    else:
        per_child = cast("Mapping[int, object]", stats or {}).items()
    lifted: list[tuple[str, KVConnectorStats]] = []
    result: MultiKVConnectorStats | None = None  # a HostStats once anything is added
    for index, value in per_child:
        if value is None or not 0 <= index < len(children):
            continue
        node = children[index]
        if node.vllm and isinstance(value, KVConnectorStats):
            child: KVConnectorStats = value
        else:
            rest = _lifted(node.children, value, lifted)
            if node.children and rest == {}:  # a nested composite whose statistics were all vLLM connectors'
                continue
            child = CapkvStats(stats_data(rest))
        result = _add(result, node.key, child)
    for key, found in lifted:
        result = _add(result, key, found)
    if own:
        result = _add(result, HOST_KEY, CapkvStats(dict(own)))
    return result


def _lifted(nested: tuple[StatNode, ...], stats: object, lifted: list[tuple[str, KVConnectorStats]]) -> object:
    """A nested composite's statistics without its vLLM connectors' (each appended to ``lifted``)."""
    if not nested or not isinstance(stats, Mapping):
        return stats
    kept: dict[object, object] = {}
    for index, value in cast("Mapping[object, object]", stats).items():
        node = nested[index] if isinstance(index, int) and 0 <= index < len(nested) else None
        if node is not None and node.vllm and isinstance(value, KVConnectorStats):
            lifted.append((node.key, value))
            continue
        kept[index] = value if node is None else _lifted(node.children, value, lifted)
    return kept


def _add(into: MultiKVConnectorStats | None, key: str, stats: KVConnectorStats) -> MultiKVConnectorStats:
    """vLLM's rule: children of one class are aggregated under its name."""
    if into is None:
        into = HostStats()
    held = into.data.get(key)
    into.data[key] = stats if held is None else held.aggregate(stats)
    return into


def rebuild_stats(data: Mapping[str, Any] | None) -> MultiKVConnectorStats:
    """``build_kv_connector_stats`` of a host: vLLM's statistics shipped as dicts, rebuilt per child."""
    rebuilt: dict[str, KVConnectorStats] = {}
    for key, value in (data or {}).items():
        if key == MARK:
            continue
        if isinstance(value, KVConnectorStats):
            rebuilt[key] = value
            continue
        found = _rebuild_one(key, cast("dict[str, Any]", value))
        if found is not None:
            rebuilt[key] = found
    return MultiKVConnectorStats(data=rebuilt)


def _rebuild_one(key: str, value: dict[str, Any]) -> KVConnectorStats | None:
    mark = value.get(MARK)
    if mark == "counters" or key == HOST_KEY:
        return CapkvStats({k: v for k, v in value.items() if k != MARK})
    if mark == "host":
        return HostStats(data=rebuild_stats(value).data)
    try:
        cls: Any = KVConnectorFactory.get_connector_class_by_name(key)
    except ValueError as refused:
        if _capkv_connector(key):
            return CapkvStats(value)
        raise refused from None
    built: KVConnectorStats | None = cls.build_kv_connector_stats(data=value)
    return built


def _capkv_connector(name: str) -> bool:
    from capkv.config._registry import default_registry
    from capkv.errors import ConfigError

    try:
        default_registry.resolve(name)
    except ConfigError:
        return False
    return True


class HostPromMetrics(KVConnectorPromMetrics):
    """vLLM children's Prometheus metrics by class name, and a counter for every capkv counter."""

    def __init__(
        self,
        vllm_config: VllmConfig,
        metric_types: dict[type[Any], type[Any]],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
        children: Mapping[str, KVConnectorPromMetrics],
    ) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self.children = dict(children)
        self._counter: Any = _process_counter(self._counter_cls, [*labelnames, "connector", "counter"])
        self._bound: dict[tuple[int, str, str], Any] = {}

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        for key, data in transfer_stats_data.items():
            if key == MARK:
                continue
            child = self.children.get(key)
            if child is not None:
                child.observe(data, engine_idx)
            elif isinstance(data, Mapping):
                self._count(key, cast("Mapping[str, Any]", data), engine_idx)

    def _count(self, connector: str, data: Mapping[str, Any], engine_idx: int) -> None:
        for counter, value in _flatten(data, ""):
            if value <= 0:
                continue
            bound = self._bound.get((engine_idx, connector, counter))
            if bound is None:
                labels = [*self.per_engine_labelvalues.get(engine_idx, []), connector, counter]
                bound = self._bound[(engine_idx, connector, counter)] = self._counter.labels(*labels)
            bound.inc(value)


_COUNTERS: dict[tuple[object, tuple[str, ...]], Any] = {}
"""capkv's counter per metric class and labels: registered once per process, whatever the nesting of hosts."""


def _process_counter(counter_cls: Any, labelnames: list[str]) -> Any:
    """The process's capkv counter. Prometheus takes a metric name once per registry: a host nested in
    a drop-in (or another host) shares the outer one's; one that vLLM unregistered meanwhile (its stat
    logger drops every ``vllm:`` metric when a new one starts) is registered again."""
    key = (counter_cls, tuple(labelnames))
    try:
        counter: Any = counter_cls(
            name=_COUNTER,
            documentation="capkv connectors' counters (blocks and bytes loaded and saved, failures, hits)",
            labelnames=labelnames,
        )
    except ValueError:  # prometheus_client: "Duplicated timeseries in CollectorRegistry"
        held = _COUNTERS.get(key)
        if held is None:
            raise
        return held
    _COUNTERS[key] = counter
    return counter


def merge_counts(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """``old`` and ``new`` merged: numbers summed, mappings merged recursively, anything else replaced."""
    merged = dict(old)
    for key, new_value in new.items():
        mine: object = merged.get(key)
        theirs: object = new_value
        if _is_number(mine) and _is_number(theirs):
            merged[key] = cast("float", mine) + cast("float", theirs)
        elif isinstance(mine, Mapping) and isinstance(theirs, Mapping):
            merged[key] = merge_counts(cast("Mapping[str, Any]", mine), cast("Mapping[str, Any]", theirs))
        else:
            merged[key] = theirs
    return merged


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _flatten(data: Mapping[str, Any], prefix: str) -> Iterable[tuple[str, int | float]]:
    for key, value in data.items():
        if key == MARK:
            continue
        path = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, Mapping):
            yield from _flatten(cast("Mapping[str, Any]", value), path)
        elif _is_number(value):
            yield path, cast("int | float", value)
