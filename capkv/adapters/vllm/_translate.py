"""What crosses the line between vLLM and a hosted capkv stack, translated both ways.

vLLM reads some of what it ships by type, so each capkv object travels inside a thin vLLM-typed envelope.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast
from dataclasses import dataclass, field
from enum import Enum

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorHandshakeMetadata,
    KVConnectorMetadata,
    KVConnectorWorkerMetadata,
)
from vllm.distributed.kv_transfer.kv_connector.v1.multi_connector import MultiKVConnectorWorkerMetadata
from vllm.v1.outputs import KVConnectorOutput as VllmKVConnectorOutput

from capkv.adapters.vllm._carry import VllmOutputCarrier
from capkv.adapters.vllm._loads import LoadPlanner, PlannedLoad
from capkv.composite._metadata import MultiWorkerMetadata
from capkv.contracts._engine import KVConnectorOutput, WorkerMetadata
from capkv.errors import MetadataError

__all__ = [
    "SITS_OUT",
    "HostHandshake",
    "HostMetadata",
    "HostWorkerMetadata",
    "host_worker_meta",
    "stack_worker_meta",
    "to_capkv_output",
    "to_vllm_output",
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


@dataclass
class HostWorkerMetadata(MultiKVConnectorWorkerMetadata):
    """Worker → scheduler: each child's worker metadata, as vLLM's composite ships its children's
    (``metadata``: one entry per child of the hosted stack, ``None`` where a child had none), and how
    the step's loads ended. vLLM merges the workers' reports with :meth:`aggregate`."""

    metadata: tuple[Any, ...]  # capkv's children's reports are capkv's types
    errors: Mapping[int, frozenset[int]] = field(default_factory=lambda: dict[int, frozenset[int]]())
    """Load errors per group, attributed to loads in flight."""
    landed: Mapping[str, int] = field(default_factory=lambda: dict[str, int]())
    """Loads that ended with every block loaded, each with how many workers' reports say so (a load is
    over once every worker's is: a worker's may end a step after another's)."""
    failed: frozenset[str] = frozenset()
    """Loads that ended with a failed block."""

    def aggregate(self, other: KVConnectorWorkerMetadata) -> HostWorkerMetadata:
        """Another worker's report of the same step: child by child; a load failed if it failed on any worker."""
        if not isinstance(other, MultiKVConnectorWorkerMetadata) or len(other.metadata) != len(self.metadata):
            raise MetadataError(
                f"HostWorkerMetadata.aggregate: expected another HostWorkerMetadata of {len(self.metadata)} "
                f"children, got {other!r}",
                connector="CapkvConnector", method="aggregate", value=other,
            )
        children = tuple(
            theirs if mine is None else mine if theirs is None else mine.aggregate(theirs)
            for mine, theirs in zip(self.metadata, other.metadata)
        )
        if not isinstance(other, HostWorkerMetadata):
            return HostWorkerMetadata(children, self.errors, self.landed, self.failed)
        errors = dict(self.errors)
        for group, ids in other.errors.items():
            errors[group] = errors.get(group, frozenset()) | ids
        failed = self.failed | other.failed
        landed = {
            request_id: self.landed.get(request_id, 0) + other.landed.get(request_id, 0)
            for request_id in (*self.landed, *other.landed) if request_id not in failed
        }
        return HostWorkerMetadata(children, errors, landed, failed)


def host_worker_meta(
    stack_meta: object, composite: bool, *, errors: Mapping[int, frozenset[int]] | None = None,
    landed: frozenset[str] = frozenset(), failed: frozenset[str] = frozenset(),
) -> HostWorkerMetadata:
    """The stack's worker metadata (a composite's per child; a one-connector stack's own) in the envelope."""
    if composite and isinstance(stack_meta, MultiWorkerMetadata):
        children: tuple[Any, ...] = stack_meta.children
    else:
        children = (stack_meta,)
    return HostWorkerMetadata(children, errors or {}, dict.fromkeys(landed, 1), failed)


def stack_worker_meta(meta: MultiKVConnectorWorkerMetadata, composite: bool) -> WorkerMetadata | None:
    """The stack's worker metadata out of the envelope (vLLM's own composite envelope is taken too)."""
    children = cast("tuple[WorkerMetadata | None, ...]", meta.metadata)
    if composite:
        return None if all(child is None for child in children) else MultiWorkerMetadata(children)
    return children[0] if children else None


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


def to_capkv_output(
    output: VllmKVConnectorOutput, planner: LoadPlanner, *, composite: bool, owner: str
) -> KVConnectorOutput:
    """vLLM's step report as the hosted stack reads it: frozen sets, its own worker metadata, errors per
    group (from the workers' report: lossless with any group count), vLLM's original carried along."""
    method = "update_connector_output"
    meta = output.kv_connector_worker_meta
    if meta is not None and not isinstance(meta, MultiKVConnectorWorkerMetadata):
        raise MetadataError(
            f"{owner}.{method}: expected HostWorkerMetadata from the workers, got {meta!r}",
            connector=owner, method=method, value=meta,
        )
    if not isinstance(meta, HostWorkerMetadata):
        recving = planner.reported(output.finished_recving or (), (), ())
        return VllmOutputCarrier(
            finished_sending=frozenset(output.finished_sending or ()),
            finished_recving=recving,
            worker_meta=None if meta is None else stack_worker_meta(meta, composite),
            vllm_output=output,
        )
    recving = planner.reported(output.finished_recving or (), meta.landed, meta.failed)
    return VllmOutputCarrier(
        finished_sending=frozenset(output.finished_sending or ()),
        finished_recving=recving,
        worker_meta=stack_worker_meta(meta, composite),
        invalid_block_ids={group: frozenset(ids) for group, ids in meta.errors.items()},
        vllm_output=output,
    )


def to_vllm_output(output: KVConnectorOutput) -> VllmKVConnectorOutput:
    """capkv's output as vLLM's (load errors flat: a block id belongs to one group at a time)."""
    invalid: set[int] = set()
    for block_ids in output.invalid_block_ids.values():
        invalid |= block_ids
    return VllmKVConnectorOutput(
        finished_sending=set(output.finished_sending) or None,
        finished_recving=set(output.finished_recving) or None,
        kv_connector_worker_meta=cast("Any", output.worker_meta),
        invalid_block_ids=invalid,
    )
