"""The metadata a composite ships between its scheduler side and worker side.

Children's metadata in child order, plus numbered books of what only the composite knows, applied once each
(docs/internals.md, "Completions").
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, ClassVar

from capkv._homes import publish
from capkv.contracts._engine import WorkerMetadata
from capkv.errors import MetadataError

__all__ = ["NOT_BUILT", "Book", "MultiConnectorMetadata", "MultiWorkerMetadata", "NotBuilt"]


class NotBuilt(Enum):
    """The slot of a child whose ``build_connector_meta`` raised: it sits the step out."""

    NOT_BUILT = "NOT_BUILT"

    # pickle takes a str (a global's name); typeshed's Enum says tuple only
    def __reduce_ex__(self, protocol: object) -> str:  # type: ignore[override]  # pyright: ignore[reportIncompatibleMethodOverride]
        """Pickled by name, as ``capkv.composite.NOT_BUILT``: the one marker in every process."""
        return self.name


NOT_BUILT = NotBuilt.NOT_BUILT


@dataclass(frozen=True, slots=True)
class Book:
    """The composite's own bookkeeping from one ``build_connector_meta`` call."""

    origin: str
    """The scheduler-side stack that wrote it (serials count per origin)."""
    serial: int
    """Increases with every book an origin writes; a worker side applies each once."""
    savers: dict[str, int]
    """Finished requests -> bit mask of the children that accepted an asynchronous save."""
    loads: tuple[tuple[str, int, int], ...]
    """Loads started, in order: ``(request id, load number, bit mask of the children loading a
    slice of it asynchronously)``; numbers increase with every load the origin starts."""
    folds: tuple[tuple[str, int, int], ...] = ()
    """Requests that finished while the engine waited for an asynchronous load of theirs: ``(request id,
    that load's number, bit mask of the children that accepted an asynchronous save)``. The engine keeps
    their blocks until that load's receive, so the receive waits for those saves, and their sends are
    never reported as sends."""


class MultiConnectorMetadata:
    """Scheduler → worker: each child's metadata plus the composite's own books.

    Read-only by convention (a slotted class rather than a frozen dataclass:
    it is built once per engine step, and that construction is on the hot path).
    """

    __slots__ = ("books", "children")

    children: tuple[object, ...]
    """Each child's metadata, in child order (:data:`NOT_BUILT` where its build raised)."""
    books: tuple[Book, ...]
    """The composite's bookkeeping, oldest first (usually none or one)."""

    def __init__(self, children: tuple[object, ...], books: tuple[Book, ...] = ()) -> None:
        self.children = children
        self.books = books

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, MultiConnectorMetadata):
            return NotImplemented
        return self.children == other.children and self.books == other.books

    __hash__: ClassVar[None]  # type: ignore[assignment]  # compared by value, not hashable

    def __repr__(self) -> str:
        return f"MultiConnectorMetadata(children={self.children!r}, books={self.books!r})"

    def __reduce__(self) -> tuple[object, ...]:
        return (MultiConnectorMetadata, (self.children, self.books))


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
        return MultiWorkerMetadata(merge_worker_metas(self.children, other.children))


def merge_worker_metas(
    mine: tuple[WorkerMetadata | None, ...], theirs: tuple[WorkerMetadata | None, ...]
) -> tuple[WorkerMetadata | None, ...]:
    """Child by child: ``aggregate`` where both have a report, else the one there is."""
    merged: list[WorkerMetadata | None] = []
    for a, b in zip(mine, theirs, strict=True):
        if a is None:
            merged.append(b)
        elif b is None:
            merged.append(a)
        else:
            merged.append(a.aggregate(b))
    return tuple(merged)


publish(__name__)
