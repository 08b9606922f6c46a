"""A stack's state and the helpers every member uses: children, names, bookkeeping, copies.

What both sides keep, and one way of calling children and reporting their failures.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable, Set as AbstractSet
from typing import Any, TypeVar

from capkv.capabilities._hma import StackNode
from capkv.composite._completion import DroppedReports, ReceiveTracker, SendTracker
from capkv.composite._fanout import TOLD, Failures, failure
from capkv.composite._finish import Finisher
from capkv.composite._landing import Landing
from capkv.composite._metadata import Book, MultiConnectorMetadata, MultiWorkerMetadata
from capkv.composite._native import IndexedCalls, PassOutput, native_calls
from capkv.composite._plan import Plan
from capkv.composite._settling import LoadSettling
from capkv.contracts._connector import KVConnector
from capkv.contracts._engine import LoadErrors, Request, WorkerMetadata
from capkv.contracts._spec import KVSpec
from capkv.contracts._tiers import KnowsFailedLoads, KnowsForeignLoads, loads_slices
from capkv.errors import MetadataError

__all__ = ["UNSET", "ForeignLoads", "NativeStack", "StackState"]

ForeignLoads = Callable[[Request, int, int, bool], None]
"""A child's ``loaded_elsewhere`` (see :class:`~capkv.contracts._tiers.KnowsForeignLoads`)."""
NativeStack = tuple[tuple[tuple[int, Callable[[Any, Any, int], None]], ...], IndexedCalls, str, PassOutput]
"""Every child's own ``update_state_after_alloc`` (with its index), the ``update_connector_output`` of those whose member does
something (with their indices), the attribute carrying the engine's blocks, and the adapter's function passing
the engine's output: see :mod:`capkv.composite._native`."""

_M = TypeVar("_M", MultiConnectorMetadata, MultiWorkerMetadata)
UNSET: Any = object()
"""What a child's answer unpacks to when it is not a pair (never a value a child returns)."""


class StackState(StackNode):
    """What a stack keeps, and how its members call children and report their failures."""

    __slots__ = (
        "_children",
        "_names",
        "_active",
        "_plans",
        "_slicing",
        "_asked",
        "_native",
        "_foreign",
        "_hear_failures",
        "_loading",
        "_early_reports",
        "_early_failures",
        "_promote",
        "_alignment",
        "_spec",
        "_settling",
        "_load_serial",
        "_loaded_tokens",
        "_landing",
        "_promoted_tokens",
        "_savers",
        "_folds",
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
    _plans: dict[str, Plan]
    _slicing: tuple[bool, ...]
    _asked: tuple[tuple[Callable[[Request, int], Any], bool, int], ...]
    """Each child's ``get_num_new_matched_tokens`` (bound once, as the finishers are), whether it loads slices
    (how it is asked), and its index."""
    _native: NativeStack | None
    """The children's own members and the carriers of the engine's objects, when every child takes them."""
    _foreign: tuple[ForeignLoads | None, ...]
    _hear_failures: tuple[Callable[[AbstractSet[str]], None], ...]
    """The ``loads_failed`` of the children that have one (:class:`~capkv.contracts._tiers.KnowsFailedLoads`)."""
    _loading: set[str]
    """Requests whose loads the step being run started (worker side, from the books bound)."""
    _early_reports: list[tuple[int, object]] | None
    """Load errors children reported before ``wait_for_save`` (to tell the others), for the engine's call."""
    _early_failures: Failures | None
    _promote: bool
    _alignment: int | None
    _spec: KVSpec | None
    """The engine's KV cache, once bound: where a token's block is, and the null block."""
    _settling: LoadSettling
    _load_serial: int
    _loaded_tokens: list[int]
    _landing: Landing
    _promoted_tokens: list[int]
    _savers: list[tuple[str, int]]
    _folds: list[tuple[str, int, int]]
    """Requests finished while the engine waits for their asynchronous load: (request id, that load's
    number, bit mask of the children that accepted a save), for the next book."""
    _loads: list[tuple[str, int, int]]
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
               init_kwargs: dict[str, Any], *, promote: bool = False) -> None:
        """Fresh state for a stack over ``children`` (scheduler side and worker side)."""
        self._children = self._active = children
        self._names = names
        self._plans = {}
        self._slicing = tuple(loads_slices(child) for child in children)
        self._asked = tuple(
            (child.get_num_new_matched_tokens, slicing, index)
            for index, (child, slicing) in enumerate(zip(children, self._slicing, strict=True))
        )
        natives = native_calls(children)
        self._native = None if natives is None else (
            tuple((index, n.update_state_after_alloc) for index, n in enumerate(natives)),
            tuple((index, n.update_connector_output) for index, n in enumerate(natives)
                  if n.update_connector_output is not None),
            natives[0].blocks, natives[0].pass_output,
        )
        self._foreign = tuple(
            child.loaded_elsewhere if isinstance(child, KnowsForeignLoads) else None for child in children
        )
        self._hear_failures = tuple(child.loads_failed for child in children if isinstance(child, KnowsFailedLoads))
        self._loading = set()
        self._early_reports = None
        self._early_failures = None
        self._promote = promote
        self._alignment = None
        self._spec = None
        self._settling = LoadSettling()
        self._load_serial = 0
        self._loaded_tokens = [0] * len(children)
        self._landing = Landing(len(children))
        self._promoted_tokens = [0] * len(children)
        self._savers = []
        self._folds = []
        self._loads = []
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

    @property
    def promote(self) -> bool:
        """Whether blocks a later child loaded are saved by the earlier children too (warming the fast tiers)."""
        return self._promote

    @property
    def loaded_tokens(self) -> tuple[int, ...]:
        """Per child, in stack order: tokens the engine accepted from its slices of composed hits."""
        return tuple(self._loaded_tokens)

    @property
    def landed_tokens(self) -> tuple[int, ...]:
        """Per child, in stack order: of :attr:`loaded_tokens`, those the engine kept. A load's failed
        block (the engine's ``invalid_block_ids``) takes its own and every later token of the load, in
        whichever child's slice; needs a bound ``KVSpec`` (without one, every accepted token counts)."""
        return tuple(self._landing.landed)

    @property
    def promoted_tokens(self) -> tuple[int, ...]:
        """Per child, in stack order: tokens loaded from later children that it was asked to save (promotion)."""
        return tuple(self._promoted_tokens)

    def loads_slices(self) -> bool:
        """A stack loads a slice beyond the engine's local hit when every child does: it asks its
        children beyond the start it is given, and a child that cannot would be asked beyond its own
        idea of the local hit."""
        return all(self._slicing)

    def bind_kv_spec(self, spec: KVSpec, /) -> None:
        """The engine's KV cache (:func:`capkv.check_stack` calls this): a slice of a composed hit that
        another child continues must end on a boundary of every group's blocks."""
        sizes = [group.block_size for group in spec.groups if group.block_size]
        self._alignment = math.lcm(*sizes) if sizes else None
        self._spec = spec
        for child in self._children:
            nested: object = getattr(child, "bind_kv_spec", None)
            if isinstance(child, StackNode) and callable(nested):
                nested(spec)

    def loads_landed(self, request_id: str, /) -> None:
        """The engine computed on ``request_id``'s KV (it finished normally): every load the request had
        landed, also one whose step the engine has not reported yet (vLLM finishes a request before it
        hands over that step's report). Its children then get its blocks at finish, none masked."""
        self._settling.landed(request_id)
        for child in self._children:
            nested: object = getattr(child, "loads_landed", None)
            if isinstance(child, StackNode) and callable(nested):
                nested(request_id)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(map(repr, self._children))})"

    # ---- helpers -------------------------------------------------------------------

    def _ask(self, method: str) -> list[object]:
        """Every child's answer to a no-argument query (side-effect free: a child's error propagates)."""
        return [getattr(child, method)() for child in self._children]

    def _tell(self, method: str, *args: object) -> None:
        """Call ``method`` on every child; one error after calling all."""
        self._tell_each(method, lambda _: args)

    def _tell_each(self, method: str, arguments: Callable[[int], tuple[object, ...]]) -> None:
        """Call ``method`` on every child with its own ``arguments(index)``; one error after calling all."""
        failures: Failures | None = None
        for index, child in enumerate(self._children):
            try:
                getattr(child, method)(*arguments(index))
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
            "plans": dict(self._plans),
            "alignment": self._alignment,
            "spec": self._spec,
            "settling": self._settling.state(),
            "load_serial": self._load_serial,
            "loaded_tokens": list(self._loaded_tokens),
            "landing": self._landing.state(),
            "promoted_tokens": list(self._promoted_tokens),
            "savers": list(self._savers),
            "folds": list(self._folds),
            "loads": list(self._loads),
            "unsent": self._unsent,
            "origin": self._origin,
            "serial": self._serial,
            "applied": dict(self._applied),
            "sends": self._sends.state(),
            "receives": self._receives.state(),
            "held": (self._held_sending, self._held_recving, self._held_errors, self._held_events,
                     self._held_worker_metas, self._held_stats),
            "early": (set(self._loading), self._early_reports, self._early_failures),
        }
        own = getattr(self, "__dict__", None)
        if own:
            state["__dict__"] = dict(own)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._plans = dict(state["plans"])
        self._alignment = state["alignment"]
        self._spec = state.get("spec")
        self._settling = LoadSettling()
        if "settling" in state:
            self._settling.restore(state["settling"])
        self._load_serial = state["load_serial"]
        self._loaded_tokens = list(state["loaded_tokens"])
        self._landing = Landing(len(self._loaded_tokens))
        self._landing.landed = list(self._loaded_tokens)  # a state from before landed tokens were counted
        if "landing" in state:
            self._landing.restore(state["landing"])
        self._promoted_tokens = list(state["promoted_tokens"])
        self._savers = list(state["savers"])
        self._folds = list(state.get("folds", ()))
        self._loads = list(state["loads"])
        self._unsent = state["unsent"]
        self._origin = state["origin"]
        self._serial = state["serial"]
        self._applied = dict(state["applied"])
        self._sends.restore(state["sends"])
        self._receives.restore(state["receives"])
        (self._held_sending, self._held_recving, self._held_errors, self._held_events,
         self._held_worker_metas, self._held_stats) = state["held"]
        self._loading, self._early_reports, self._early_failures = state["early"]
        for name, value in state.get("__dict__", {}).items():
            setattr(self, name, value)


