"""What crosses the line between vLLM and a hosted capkv stack, translated both ways.

vLLM ships objects of its own classes between the scheduler and the workers
(metadata, worker metadata, statistics) and reads some of them by type; capkv's
are plain objects. Each capkv object travels inside a thin vLLM-typed envelope
and is unwrapped on the other side. Load errors travel per KV-cache group in the
workers' report (:class:`HostWorkerMetadata`), with which loads landed or failed;
vLLM's own channels for them are :mod:`capkv.adapters.vllm._loads`'s business.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, cast

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorHandshakeMetadata,
    KVConnectorMetadata,
    KVConnectorWorkerMetadata,
)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats
from vllm.v1.outputs import KVConnectorOutput as VllmKVConnectorOutput

from capkv.adapters.vllm._carry import VllmOutputCarrier
from capkv.adapters.vllm._loads import LoadPlanner, PlannedLoad
from capkv.contracts._engine import KVConnectorOutput, WorkerMetadata
from capkv.errors import MetadataError

__all__ = [
    "SITS_OUT",
    "CapkvStats",
    "HostHandshake",
    "HostMetadata",
    "HostWorkerMetadata",
    "merge_counts",
    "stats_data",
    "to_capkv_output",
]


class SitsOut(Enum):
    """The stack's metadata for a step could not be built: the stack sits the step out."""

    SITS_OUT = "SITS_OUT"


SITS_OUT = SitsOut.SITS_OUT


@dataclass(frozen=True)
class HostMetadata(KVConnectorMetadata):
    """Scheduler → worker: the hosted stack's metadata for one step, and the loads planned in it."""

    inner: object
    loads: tuple[PlannedLoad, ...] = ()


@dataclass(frozen=True)
class HostWorkerMetadata(KVConnectorWorkerMetadata):
    """Worker → scheduler: the hosted stack's worker metadata, and how the step's loads ended
    (vLLM merges the workers' with :meth:`aggregate`)."""

    inner: WorkerMetadata | None
    errors: Mapping[int, frozenset[int]] = field(default_factory=lambda: dict[int, frozenset[int]]())
    """Load errors per group, attributed to loads in flight."""
    landed: frozenset[str] = frozenset()
    """Loads that ended with every block loaded."""
    failed: frozenset[str] = frozenset()
    """Loads that ended with a failed block."""

    def aggregate(self, other: KVConnectorWorkerMetadata) -> HostWorkerMetadata:
        """Another worker's report of the same step: a load failed if it failed on any worker."""
        if not isinstance(other, HostWorkerMetadata):
            raise MetadataError(
                f"HostWorkerMetadata.aggregate: expected another HostWorkerMetadata, got {other!r}",
                connector="CapkvConnector", method="aggregate", value=other,
            )
        mine, theirs = self.inner, other.inner
        inner = theirs if mine is None else mine if theirs is None else mine.aggregate(theirs)
        errors = dict(self.errors)
        for group, ids in other.errors.items():
            errors[group] = errors.get(group, frozenset()) | ids
        failed = self.failed | other.failed
        return HostWorkerMetadata(inner, errors, (self.landed | other.landed) - failed, failed)


@dataclass(frozen=True)
class HostHandshake(KVConnectorHandshakeMetadata):
    """Worker → scheduler once, after the KV caches are registered and before any request.

    Carries the stack's own handshake metadata, and the worker metadata the stack
    had to report since registration — e.g. a store's memory layout, without which
    a scheduler side that never sees a tensor cannot offer the blocks its worker can
    load. vLLM collects it from every worker before serving (its handshake).
    """

    inner: object
    worker_meta: WorkerMetadata | None


@dataclass
class CapkvStats(KVConnectorStats):
    """The hosted stack's counters: numbers add up, nested mappings (per child) merge key by key."""

    data: dict[str, Any] = field(default_factory=lambda: dict[str, Any]())

    def reset(self) -> None:
        self.data = {}

    def aggregate(self, other: KVConnectorStats) -> CapkvStats:
        return CapkvStats(merge_counts(self.data, other.data))

    def reduce(self) -> dict[str, int | float]:
        """Every numeric counter, its path joined with dots (e.g. ``#2.loaded_blocks``)."""
        return dict(_flatten(self.data, ""))

    def is_empty(self) -> bool:
        return not self.data


def stats_data(stats: object) -> dict[str, Any]:
    """A stack's statistics as vLLM's ``KVConnectorStats.data``: string keys, a composite's children as ``#1``, ``#2``."""
    if not isinstance(stats, Mapping):
        return {"stack": stats}
    data: dict[str, Any] = {}
    for key, value in cast("Mapping[object, Any]", stats).items():
        name = f"#{key + 1}" if isinstance(key, int) and not isinstance(key, bool) else str(key)
        data[name] = stats_data(cast("Mapping[object, Any]", value)) if isinstance(value, Mapping) else value
    return data


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
        path = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, Mapping):
            yield from _flatten(cast("Mapping[str, Any]", value), path)
        elif _is_number(value):
            yield path, cast("int | float", value)


def to_capkv_output(output: VllmKVConnectorOutput, planner: LoadPlanner, *, owner: str) -> KVConnectorOutput:
    """vLLM's step report as the hosted stack reads it: frozen sets, its own worker metadata, errors per
    group (from the workers' report: lossless with any group count), vLLM's original carried along."""
    method = "update_connector_output"
    meta = output.kv_connector_worker_meta
    if meta is not None and not isinstance(meta, HostWorkerMetadata):
        raise MetadataError(
            f"{owner}.{method}: expected HostWorkerMetadata from the workers, got {meta!r}",
            connector=owner, method=method, value=meta,
        )
    if meta is None:
        recving = planner.reported(output.finished_recving or (), (), ())
        return VllmOutputCarrier(
            finished_sending=frozenset(output.finished_sending or ()), finished_recving=recving, vllm_output=output,
        )
    recving = planner.reported(output.finished_recving or (), meta.landed, meta.failed)
    return VllmOutputCarrier(
        finished_sending=frozenset(output.finished_sending or ()),
        finished_recving=recving,
        worker_meta=meta.inner,
        invalid_block_ids={group: frozenset(ids) for group, ids in meta.errors.items()},
        vllm_output=output,
    )
