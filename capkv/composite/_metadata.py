"""The metadata a composite ships between its scheduler side and worker side.

Children's metadata travels in child order. The composite adds what only it
knows: how many *extra* asynchronous saves each finished request still owes,
so the worker side can hold back ``finished_sending`` until every saving child
has reported.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from capkv.contracts._engine import WorkerMetadata
from capkv.errors import MetadataError

__all__ = ["MultiConnectorMetadata", "MultiWorkerMetadata"]


@dataclass(frozen=True)
class MultiConnectorMetadata:
    """Scheduler → worker: each child's metadata plus the composite's own bookkeeping."""

    children: tuple[object, ...]
    extra_async_saves: dict[str, int] = field(default_factory=lambda: dict[str, int]())
    """Finished requests saved by several children: reports owed beyond the first."""
    loaders: dict[str, int] = field(default_factory=lambda: dict[str, int]())
    """Loads started this step: request id -> index of the child that loads it."""


@dataclass(frozen=True)
class MultiWorkerMetadata:
    """Worker → scheduler: each child's worker metadata (``None`` where a child had none)."""

    children: tuple[WorkerMetadata | None, ...]

    def aggregate(self, other: Any, /) -> MultiWorkerMetadata:
        """Merge another worker's report, child by child."""
        if not isinstance(other, MultiWorkerMetadata) or len(other.children) != len(self.children):
            raise MetadataError(
                f"MultiWorkerMetadata.aggregate: expected MultiWorkerMetadata with "
                f"{len(self.children)} children, got {other!r}",
                connector="MultiConnector",
                method="aggregate",
                value=other,
            )
        merged: list[WorkerMetadata | None] = []
        for mine, theirs in zip(self.children, other.children, strict=True):
            if mine is None:
                merged.append(theirs)
            elif theirs is None:
                merged.append(mine)
            else:
                merged.append(mine.aggregate(theirs))
        return MultiWorkerMetadata(tuple(merged))
