"""A stack's state and the helpers every member uses: children, names, bookkeeping, copies.

:class:`StackState` holds what both sides of a stack keep (the scheduler side's
load choices and books, the worker side's trackers and held-over results) and
the shared ways of calling children and reporting their failures; the members
themselves live in :mod:`~capkv.composite._scheduler_side` and
:mod:`~capkv.composite._worker_side`.
"""

from __future__ import annotations

import uuid
from typing import Any, TypeVar

from capkv.capabilities._hma import StackNode
from capkv.composite._completion import DroppedReports, ReceiveTracker, SendTracker
from capkv.composite._fanout import TOLD, Failures, bad_answer, failure
from capkv.composite._finish import Finisher
from capkv.composite._metadata import Book, MultiConnectorMetadata, MultiWorkerMetadata
from capkv.contracts._connector import KVConnector
from capkv.contracts._engine import LoadErrors, WorkerMetadata
from capkv.errors import MetadataError

__all__ = ["UNSET", "StackState"]

_M = TypeVar("_M", MultiConnectorMetadata, MultiWorkerMetadata)
UNSET: Any = object()
"""A child's answer before its call returned (so a failed unpacking is told from the child's own error)."""


class StackState(StackNode):
    """What a stack keeps, and how its members call children and report their failures."""

    __slots__ = (
        "_children",
        "_names",
        "_active",
        "_load_choice",
        "_savers",
        "_loads",
        "_unsent",
        "_origin",
        "_serial",
        "_applied",
        "_sends",
        "_receives",
        "_dropped",
        "_held_sending",
        "_held_recving",
        "_held_errors",
        "_held_events",
        "_held_worker_metas",
        "_held_stats",
        "_single_finishers",
        "_hma_finishers",
        "_init_kwargs",
    )

    _children: tuple[KVConnector, ...]
    _names: tuple[str, ...]
    _active: tuple[KVConnector, ...]
    _load_choice: dict[str, tuple[int, bool]]
    _savers: list[tuple[str, int]]
    _loads: dict[str, int]
    _unsent: tuple[Book, ...]
    _origin: str
    _serial: int
    _applied: dict[str, int]
    _sends: SendTracker
    _receives: ReceiveTracker
    _dropped: DroppedReports
    _held_sending: set[str] | None
    _held_recving: set[str] | None
    _held_errors: LoadErrors | None
    _held_events: list[object] | None
    _held_worker_metas: tuple[WorkerMetadata | None, ...] | None
    _held_stats: dict[int, object] | None
    _single_finishers: tuple[tuple[int, Finisher], ...]
    _hma_finishers: tuple[tuple[int, Finisher], ...]
    _init_kwargs: dict[str, Any]

    def _setup(self, children: tuple[KVConnector, ...], names: tuple[str, ...], hma: bool,
               init_kwargs: dict[str, Any]) -> None:
        """Fresh state for a stack over ``children`` (scheduler side and worker side)."""
        self._children = self._active = children
        self._names = names
        self._load_choice = {}
        self._savers = []
        self._loads = {}
        self._unsent = ()
        self._origin = uuid.uuid4().hex
        self._serial = 0
        self._applied = {}
        self._sends = SendTracker()
        self._receives = ReceiveTracker()
        self._dropped = DroppedReports()
        self._held_sending = self._held_recving = None
        self._held_errors = None
        self._held_events = None
        self._held_worker_metas = None
        self._held_stats = None
        self._single_finishers = tuple((1 << i, c.request_finished) for i, c in enumerate(children))
        self._hma_finishers = (
            tuple((1 << i, getattr(c, "request_finished_all_groups")) for i, c in enumerate(children)) if hma else ()
        )
        self._init_kwargs = init_kwargs

    @property
    def children(self) -> tuple[object, ...]:
        """The sub-connectors, in stack order."""
        return self._children

    @property
    def dropped_reports(self) -> DroppedReports:
        """Completion reports of children that were not passed on, by (child, reason).

        A child repeating a report, reporting a save it did not accept or a load
        it is not doing: each is dropped (never forwarded, which could free
        blocks early or report a request twice), counted here, and the first of
        each kind is logged as a warning on the ``capkv.composite`` logger.
        """
        return self._dropped

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(map(repr, self._children))})"

    # ---- helpers -------------------------------------------------------------------

    def _ask(self, method: str) -> list[object]:
        """Every child's answer to a no-argument query (side-effect free: a child's error propagates)."""
        return [getattr(child, method)() for child in self._children]

    def _tell(self, method: str, *args: object) -> None:
        """Call ``method`` on every child; one error after calling all."""
        failures: Failures | None = None
        for index, child in enumerate(self._children):
            try:
                getattr(child, method)(*args)
            except Exception as exc:
                failures = [(index, exc)] if failures is None else [*failures, (index, exc)]
        if failures:
            raise failure(type(self).__name__, self._names, method, failures, TOLD)

    def _position(self, child: KVConnector) -> int:
        """A child's index in the stack (by identity: a child sits at one place only)."""
        return next(i for i, c in enumerate(self._children) if c is child)

    def _failed_child(self, failures: Failures | None, child: KVConnector, exc: Exception) -> Failures:
        index = self._position(child)
        return [(index, exc)] if failures is None else [*failures, (index, exc)]

    def _failed_answer(self, failures: Failures | None, child: KVConnector, exc: Exception, answer: object,
                       method: str, expected: str) -> Failures:
        """A child's own exception, or — when its call returned (``answer`` set) but the answer was
        not a pair — capkv's verdict on that answer."""
        if answer is not UNSET and isinstance(exc, (TypeError, ValueError)):
            exc = bad_answer(self._names[self._position(child)], method, answer, expected)
        return self._failed_child(failures, child, exc)

    def _expect(self, metadata: object, kind: type[_M], method: str) -> _M:
        """``metadata`` as the composite's own kind, or a :class:`~capkv.MetadataError`."""
        if not isinstance(metadata, kind) or len(metadata.children) != len(self._children):
            raise MetadataError(
                f"{type(self).__name__}.{method}: expected {kind.__name__} with "
                f"{len(self._children)} children, got {metadata!r}",
                connector=type(self).__name__,
                method=method,
                value=metadata,
            )
        return metadata

    # ---- copy and pickle -----------------------------------------------------------

    def __getstate__(self) -> dict[str, object]:
        """The stack's bookkeeping (both sides), and a subclass's own attributes."""
        state: dict[str, object] = {
            "load_choice": dict(self._load_choice),
            "savers": list(self._savers),
            "loads": dict(self._loads),
            "unsent": self._unsent,
            "origin": self._origin,
            "serial": self._serial,
            "applied": dict(self._applied),
            "sends": self._sends.state(),
            "receives": self._receives.state(),
            "held": (self._held_sending, self._held_recving, self._held_errors, self._held_events,
                     self._held_worker_metas, self._held_stats),
        }
        own = getattr(self, "__dict__", None)
        if own:
            state["__dict__"] = dict(own)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._load_choice = dict(state["load_choice"])
        self._savers = list(state["savers"])
        self._loads = dict(state["loads"])
        self._unsent = state["unsent"]
        self._origin = state["origin"]
        self._serial = state["serial"]
        self._applied = dict(state["applied"])
        self._sends.restore(state["sends"])
        self._receives.restore(state["receives"])
        (self._held_sending, self._held_recving, self._held_errors, self._held_events,
         self._held_worker_metas, self._held_stats) = state["held"]
        for name, value in state.get("__dict__", {}).items():
            setattr(self, name, value)


