"""What crosses the line between vLLM and a hosted capkv stack, translated both ways.

vLLM ships objects of its own classes between the scheduler and the workers
(metadata, worker metadata, statistics) and reads some of them by type; capkv's
are plain objects. Each capkv object travels inside a thin vLLM-typed envelope
and is unwrapped on the other side. Load errors go the other way: capkv reports
them per KV-cache group, vLLM wants one flat set of block ids — lossless,
because a block id belongs to one group at a time — and gives the scheduler side
that flat set back, which :class:`LoadingBlocks` attributes to groups from the
block tables of the requests that were loading. Nothing is guessed: an id no
loading request holds is a :class:`~capkv.ContractError`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorHandshakeMetadata,
    KVConnectorMetadata,
    KVConnectorWorkerMetadata,
)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats
from vllm.v1.outputs import KVConnectorOutput as VllmKVConnectorOutput

from capkv.adapters.vllm._carry import attribute_load_errors
from capkv.contracts._engine import BlockIds, KVConnectorOutput, LoadErrors, WorkerMetadata
from capkv.errors import MetadataError

__all__ = [
    "CapkvStats",
    "HostHandshake",
    "HostMetadata",
    "HostWorkerMetadata",
    "LoadingBlocks",
    "flat_load_errors",
    "merge_counts",
    "stats_data",
    "to_capkv_output",
]


@dataclass(frozen=True)
class HostMetadata(KVConnectorMetadata):
    """Scheduler → worker: the hosted stack's metadata for one step."""

    inner: object


@dataclass(frozen=True)
class HostWorkerMetadata(KVConnectorWorkerMetadata):
    """Worker → scheduler: the hosted stack's worker metadata; vLLM merges workers' with :meth:`aggregate`."""

    inner: WorkerMetadata

    def aggregate(self, other: KVConnectorWorkerMetadata) -> HostWorkerMetadata:
        if not isinstance(other, HostWorkerMetadata):
            raise MetadataError(
                f"HostWorkerMetadata.aggregate: expected another HostWorkerMetadata, got {other!r}",
                connector="CapkvConnector", method="aggregate", value=other,
            )
        return HostWorkerMetadata(self.inner.aggregate(other.inner))


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


def flat_load_errors(errors: LoadErrors) -> set[int]:
    """capkv's per-group load errors as vLLM's flat set (a block id belongs to one group at a time)."""
    flat: set[int] = set()
    for block_ids in errors.values():
        flat |= block_ids
    return flat


class LoadingBlocks:
    """The blocks of requests with a load planned, by group: where a flat load-error id belongs."""

    __slots__ = ("_owner", "_by_request", "_group_of")

    def __init__(self, owner: str) -> None:
        self._owner = owner
        self._by_request: dict[str, BlockIds] = {}
        self._group_of: dict[int, tuple[int, str]] = {}

    def record(self, request_id: str, block_ids: BlockIds, null_block_id: int) -> None:
        """``request_id`` loads into ``block_ids``; the latest allocation of a block wins."""
        self.forget(request_id)
        self._by_request[request_id] = block_ids
        for group, ids in enumerate(block_ids):
            for block_id in ids:
                if block_id != null_block_id:
                    self._group_of[block_id] = (group, request_id)

    def forget(self, request_id: str) -> None:
        """``request_id`` finished: its blocks may go to any group now."""
        for ids in self._by_request.pop(request_id, ()):
            for block_id in ids:
                if self._group_of.get(block_id, (0, ""))[1] == request_id:
                    del self._group_of[block_id]

    def attribute(self, flat: Iterable[int], *, method: str) -> dict[int, frozenset[int]]:
        """vLLM's flat load-error set, per group."""
        errors = attribute_load_errors(flat, self._group, owner=self._owner, method=method)
        return {group: frozenset(ids) for group, ids in errors.items()}

    def _group(self, block_id: int) -> int | None:
        found = self._group_of.get(block_id)
        return None if found is None else found[0]


def to_capkv_output(output: VllmKVConnectorOutput, loading: LoadingBlocks, *, owner: str) -> KVConnectorOutput:
    """vLLM's step report as the hosted stack reads it: frozen sets, its own worker metadata, errors per group."""
    method = "update_connector_output"
    meta = output.kv_connector_worker_meta
    if meta is not None and not isinstance(meta, HostWorkerMetadata):
        raise MetadataError(
            f"{owner}.{method}: expected HostWorkerMetadata from the workers, got {meta!r}",
            connector=owner, method=method, value=meta,
        )
    return KVConnectorOutput(
        finished_sending=frozenset(output.finished_sending or ()),
        finished_recving=frozenset(output.finished_recving or ()),
        worker_meta=None if meta is None else meta.inner,
        invalid_block_ids=loading.attribute(output.invalid_block_ids or (), method=method),
    )
