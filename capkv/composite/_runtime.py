"""How each member of the connector contract reaches a stack's children.

:class:`StackRuntime` is the behaviour behind :class:`~capkv.MultiConnector`
(whose own module holds only its typed construction). Every fan-out calls
every child, even when one raises, and then raises one error
(:mod:`capkv.composite._fanout`); completions are tracked by child
(:mod:`capkv.composite._completion`). The per-step and per-request members are
hot paths: they allocate nothing in the common case beyond what they return.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import Any, TypeVar, cast

import torch

from capkv.capabilities._hma import StackNode
from capkv.composite._agreement import agreed_finished_count, agreed_layout, piecewise_needed
from capkv.composite._completion import Drop, DroppedReports, ReceiveTracker, SendTracker
from capkv.composite._fanout import ATTACHED, HELD, TOLD, Failures, bad_answer, failure
from capkv.composite._finish import FinishResult, FinishRoutine, Finisher
from capkv.composite._metadata import (
    NOT_BUILT,
    Book,
    MultiConnectorMetadata,
    MultiWorkerMetadata,
    merge_worker_metas,
)
from capkv.contracts._connector import KVConnector
from capkv.contracts._engine import (
    AttentionMetadata,
    BlockIds,
    ConnectorMetadata,
    ForwardContext,
    HandshakeMetadata,
    KVConnectorOutput,
    LoadErrors,
    Request,
    SchedulerOutput,
    WorkerMetadata,
)
from capkv.errors import ConflictError, MetadataError

__all__ = ["StackRuntime"]

_M = TypeVar("_M", MultiConnectorMetadata, MultiWorkerMetadata)
_new = object.__new__
_set = object.__setattr__
_NO_HIT: tuple[int | None, bool] = (0, False)
_ASK_AGAIN: tuple[int | None, bool] = (None, False)
_HIT = "(tokens, load_async) with tokens a non-negative int, or None to be asked again"
_IDS = "(finished_sending, finished_recving), each a set of request ids or None"


class StackRuntime(FinishRoutine, StackNode):
    """The run-time behaviour of a stack: load from the first child with a hit, save to all."""

    hma_by_children = True  # built as its HMA variant exactly when every child is HMA-capable

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
    _savers: dict[str, int]
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
    _single_finishers: tuple[Finisher, ...]
    _hma_finishers: tuple[Finisher, ...]
    _init_kwargs: dict[str, Any]

    def _setup(self, children: tuple[KVConnector, ...], names: tuple[str, ...], hma: bool,
               init_kwargs: dict[str, Any]) -> None:
        """Fresh state for a stack over ``children`` (scheduler side and worker side)."""
        self._children = self._active = children
        self._names = names
        self._load_choice = {}
        self._savers = {}
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
        self._single_finishers = tuple(c.request_finished for c in children)
        self._hma_finishers = tuple(getattr(c, "request_finished_all_groups") for c in children) if hma else ()
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

    # ---- scheduler side ----------------------------------------------------------

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int, /
    ) -> tuple[int | None, bool]:
        """Ask every child; the first with a hit loads. Any ``None`` means "ask again"."""
        if self._load_choice:
            self._load_choice.pop(request.request_id, None)
        chosen: tuple[int | None, bool] = _NO_HIT
        failures: Failures | None = None
        index = 0
        for child in self._children:
            try:
                answer: Any = child.get_num_new_matched_tokens(request, num_computed_tokens)
            except Exception as exc:
                failures = [(index, exc)] if failures is None else [*failures, (index, exc)]
                index += 1
                continue
            try:
                tokens, load_async = answer
            except (TypeError, ValueError):
                tokens, load_async = -1, False  # not a pair: refused below, with the answer itself
            if tokens is None:
                if failures is None:
                    self._load_choice.pop(request.request_id, None)
                    return _ASK_AGAIN
            elif type(tokens) is not int or tokens < 0:
                bad = bad_answer(self._names[index], "get_num_new_matched_tokens", answer, _HIT)
                failures = [(index, bad)] if failures is None else [*failures, (index, bad)]
            elif tokens and chosen is _NO_HIT:
                self._load_choice[request.request_id] = (index, bool(load_async))
                chosen = (tokens, bool(load_async))
            index += 1
        if failures:
            self._load_choice.pop(request.request_id, None)
            raise failure(type(self).__name__, self._names, "get_num_new_matched_tokens", failures,
                          "no child was chosen to load; ask again")
        return chosen

    def update_state_after_alloc(
        self, request: Request, blocks: BlockIds, num_external_tokens: int, /
    ) -> None:
        """The loading child gets the external token count; the others get the blocks and 0."""
        choice = self._load_choice.get(request.request_id) if self._load_choice else None
        failures: Failures | None = None
        if choice is None or num_external_tokens <= 0:
            index = 0
            for child in self._children:
                try:
                    child.update_state_after_alloc(request, blocks, 0)
                except Exception as exc:
                    failures = [(index, exc)] if failures is None else [*failures, (index, exc)]
                index += 1
        else:
            loader, load_async = choice
            if load_async:
                self._loads[request.request_id] = loader
            for index, child in enumerate(self._children):
                try:
                    child.update_state_after_alloc(request, blocks, num_external_tokens if index == loader else 0)
                except Exception as exc:
                    failures = [(index, exc)] if failures is None else [*failures, (index, exc)]
        if failures:
            raise failure(type(self).__name__, self._names, "update_state_after_alloc", failures, TOLD)

    def build_connector_meta(self, scheduler_output: SchedulerOutput, /) -> MultiConnectorMetadata:
        """Children's metadata in order, plus the stack's own book: who saves, who loads."""
        metas: list[object] = []
        append = metas.append
        failures: Failures | None = None
        for child in self._children:
            try:
                append(child.build_connector_meta(scheduler_output))
            except Exception as exc:
                failures = [(len(metas), exc)] if failures is None else [*failures, (len(metas), exc)]
                append(NOT_BUILT)
        books = self._unsent
        if self._savers or self._loads:
            self._serial += 1
            books = (*books, Book(self._origin, self._serial, self._savers, self._loads))
            self._savers = {}
            self._loads = {}
        metadata = MultiConnectorMetadata(tuple(metas), books)
        if failures:
            self._unsent = books
            raise failure(type(self).__name__, self._names, "build_connector_meta", failures, ATTACHED,
                          partial=metadata)
        if books:
            self._unsent = ()
        return metadata

    def update_connector_output(self, connector_output: KVConnectorOutput, /) -> None:
        """Each child sees the step's output with its own worker metadata.

        With worker metadata, each child gets its own shallow copy of the output
        carrying its share (the engine's object is never mutated, so a child may keep
        what it was given); without, every child gets the engine's object.
        """
        worker_meta = connector_output.worker_meta
        failures: Failures | None = None
        if worker_meta is None:
            index = 0
            for child in self._children:
                try:
                    child.update_connector_output(connector_output)
                except Exception as exc:
                    failures = [(index, exc)] if failures is None else [*failures, (index, exc)]
                index += 1
        else:
            per_child = self._expect(worker_meta, MultiWorkerMetadata, "update_connector_output").children
            fields: dict[str, Any] | None = getattr(connector_output, "__dict__", None)
            kind = type(connector_output)
            for index, (child, meta) in enumerate(zip(self._children, per_child)):
                if fields is not None:  # a copy of the frozen output, at a fraction of replace()'s cost
                    own = _new(kind)
                    own_fields = fields.copy()
                    own_fields["worker_meta"] = meta
                    _set(own, "__dict__", own_fields)
                else:
                    own = replace(connector_output, worker_meta=meta)
                try:
                    child.update_connector_output(own)
                except Exception as exc:
                    failures = [(index, exc)] if failures is None else [*failures, (index, exc)]
        if failures:
            raise failure(type(self).__name__, self._names, "update_connector_output", failures, TOLD)

    def request_finished(self, request: Request, block_ids: list[int], /) -> FinishResult:
        """Single-group finish, aggregated over every child."""
        return self._finish(request, self._single_finishers, block_ids, "request_finished")

    def take_events(self) -> list[object]:
        """Every child's events, in child order (drained eagerly: none are lost)."""
        events: list[object] = self._held_events or []
        self._held_events = None
        failures: Failures | None = None
        for index, child in enumerate(self._children):
            try:
                events.extend(child.take_events())
            except Exception as exc:
                failures = [(index, exc)] if failures is None else [*failures, (index, exc)]
        if failures:
            self._held_events = events
            raise failure(type(self).__name__, self._names, "take_events", failures, HELD)
        return events

    def get_required_kvcache_layout(self) -> str | None:
        """The layout the children need; children asking for different layouts conflict."""
        answers = cast("list[str | None]", self._ask("get_required_kvcache_layout"))
        return agreed_layout(type(self).__name__, list(zip(self._names, answers, strict=True)))

    def get_finished_count(self) -> int | None:
        """The children's finished count; they must all give the same answer."""
        answers = cast("list[int | None]", self._ask("get_finished_count"))
        return agreed_finished_count(type(self).__name__, list(zip(self._names, answers, strict=True)))

    def requires_piecewise_for_cudagraph(self) -> bool:
        """Needed when any child needs it."""
        return piecewise_needed(cast("list[bool]", self._ask("requires_piecewise_for_cudagraph")))

    def set_xfer_handshake_metadata(self, metadata: Mapping[int, HandshakeMetadata], /) -> None:
        """Every child learns the peers' metadata."""
        self._tell("set_xfer_handshake_metadata", metadata)

    # ---- worker side -------------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor], /) -> None:
        self._tell("register_kv_caches", kv_caches)

    def bind_connector_metadata(self, connector_metadata: ConnectorMetadata, /) -> None:
        """Apply the stack's books (each once), then bind each child's share.

        A child whose metadata could not be built (its slot is ``NOT_BUILT``) sits
        the step out: it is not bound, and gets no load or save calls until the
        metadata is cleared.
        """
        metadata = self._expect(connector_metadata, MultiConnectorMetadata, "bind_connector_metadata")
        for book in metadata.books:
            if book.serial > self._applied.get(book.origin, 0):
                self._applied[book.origin] = book.serial
                self._sends.expect(book.savers)
                self._receives.expect(book.loaders)
        failures: Failures | None = None
        active: list[KVConnector] | None = None
        for index, (child, meta) in enumerate(zip(self._children, metadata.children)):
            if meta is NOT_BUILT:
                if active is None:
                    active = list(self._children[:index])
                continue
            if active is not None:
                active.append(child)
            try:
                child.bind_connector_metadata(meta)
            except Exception as exc:
                failures = [(index, exc)] if failures is None else [*failures, (index, exc)]
        self._active = self._children if active is None else tuple(active)
        if failures:
            raise failure(type(self).__name__, self._names, "bind_connector_metadata", failures, TOLD)

    def handle_preemptions(self, connector_metadata: ConnectorMetadata, /) -> None:
        metadata = self._expect(connector_metadata, MultiConnectorMetadata, "handle_preemptions")
        failures: Failures | None = None
        for index, (child, meta) in enumerate(zip(self._children, metadata.children)):
            if meta is NOT_BUILT:
                continue
            try:
                child.handle_preemptions(meta)
            except Exception as exc:
                failures = [(index, exc)] if failures is None else [*failures, (index, exc)]
        if failures:
            raise failure(type(self).__name__, self._names, "handle_preemptions", failures, TOLD)

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        failures: Failures | None = None
        for child in self._active:
            try:
                child.start_load_kv(forward_context, **kwargs)
            except Exception as exc:
                failures = self._failed_child(failures, child, exc)
        if failures:
            raise failure(type(self).__name__, self._names, "start_load_kv", failures, TOLD)

    def wait_for_layer_load(self, layer_name: str, /) -> None:
        failures: Failures | None = None
        for child in self._active:
            try:
                child.wait_for_layer_load(layer_name)
            except Exception as exc:
                failures = self._failed_child(failures, child, exc)
        if failures:
            raise failure(type(self).__name__, self._names, "wait_for_layer_load", failures, TOLD)

    def save_kv_layer(
        self,
        layer_name: str,
        kv_layer: torch.Tensor,
        attn_metadata: AttentionMetadata,
        **kwargs: Any,
    ) -> None:
        failures: Failures | None = None
        for child in self._active:
            try:
                child.save_kv_layer(layer_name, kv_layer, attn_metadata, **kwargs)
            except Exception as exc:
                failures = self._failed_child(failures, child, exc)
        if failures:
            raise failure(type(self).__name__, self._names, "save_kv_layer", failures, TOLD)

    def wait_for_save(self) -> None:
        failures: Failures | None = None
        for child in self._active:
            try:
                child.wait_for_save()
            except Exception as exc:
                failures = self._failed_child(failures, child, exc)
        if failures:
            raise failure(type(self).__name__, self._names, "wait_for_save", failures, TOLD)

    def get_finished(
        self, finished_req_ids: set[str], /
    ) -> tuple[set[str] | None, set[str] | None]:
        """A send is finished once every child that saves it has said so; a receive when its loader does."""
        sending = self._held_sending
        recving = self._held_recving
        if sending is not None or recving is not None:
            self._held_sending = self._held_recving = None
        failures: Failures | None = None
        index = 0
        for child in self._children:
            try:
                answer: Any = child.get_finished(finished_req_ids)
            except Exception as exc:
                failures = [(index, exc)] if failures is None else [*failures, (index, exc)]
                index += 1
                continue
            try:
                child_sending, child_recving = answer
            except (TypeError, ValueError):
                bad = bad_answer(self._names[index], "get_finished", answer, _IDS)
                failures = [(index, bad)] if failures is None else [*failures, (index, bad)]
                index += 1
                continue
            if child_sending:
                if isinstance(child_sending, (set, frozenset)):
                    sends = self._sends
                    for request_id in cast("set[str]", child_sending):
                        verdict = sends.report(index, request_id)
                        if verdict is True:
                            if sending is None:
                                sending = {request_id}
                            else:
                                sending.add(request_id)
                        elif verdict is not False:
                            self._dropped.add(self._names[index], verdict, request_id)
                else:
                    bad = bad_answer(self._names[index], "get_finished", answer, _IDS)
                    failures = [(index, bad)] if failures is None else [*failures, (index, bad)]
            if child_recving:
                if isinstance(child_recving, (set, frozenset)):
                    receives = self._receives
                    for request_id in cast("set[str]", child_recving):
                        dropped: Drop | None = receives.report(index, request_id)
                        if dropped is None:
                            if recving is None:
                                recving = {request_id}
                            else:
                                recving.add(request_id)
                        else:
                            self._dropped.add(self._names[index], dropped, request_id)
                else:
                    bad = bad_answer(self._names[index], "get_finished", answer, _IDS)
                    failures = [(index, bad)] if failures is None else [*failures, (index, bad)]
            index += 1
        if failures:
            self._held_sending, self._held_recving = sending, recving
            raise failure(type(self).__name__, self._names, "get_finished", failures, HELD)
        return sending, recving

    def get_block_ids_with_load_errors(self) -> LoadErrors:
        """The union of the children's failed block ids, group by group."""
        errors: LoadErrors = self._held_errors or {}
        self._held_errors = None
        failures: Failures | None = None
        for index, child in enumerate(self._children):
            try:
                reported = cast(object, child.get_block_ids_with_load_errors())
            except Exception as exc:
                failures = [(index, exc)] if failures is None else [*failures, (index, exc)]
                continue
            if not reported:
                continue
            if not isinstance(reported, Mapping):
                bad = bad_answer(
                    self._names[index], "get_block_ids_with_load_errors", reported,
                    "failed block ids per KV-cache group: {group index: set of block ids}",
                )
                failures = [(index, bad)] if failures is None else [*failures, (index, bad)]
                continue
            for group, block_ids in cast("LoadErrors", reported).items():
                if block_ids:
                    errors.setdefault(group, set()).update(block_ids)
        if failures:
            self._held_errors = errors
            raise failure(type(self).__name__, self._names, "get_block_ids_with_load_errors", failures, HELD)
        return errors

    def build_connector_worker_meta(self) -> MultiWorkerMetadata | None:
        failures: Failures | None = None
        metas: list[WorkerMetadata | None] = []
        for index, child in enumerate(self._children):
            try:
                metas.append(child.build_connector_worker_meta())
            except Exception as exc:
                failures = [(index, exc)] if failures is None else [*failures, (index, exc)]
                metas.append(None)
        built = tuple(metas)
        if self._held_worker_metas is not None:
            built = merge_worker_metas(self._held_worker_metas, built)
            self._held_worker_metas = None
        if failures:
            self._held_worker_metas = built
            raise failure(type(self).__name__, self._names, "build_connector_worker_meta", failures, HELD)
        if all(meta is None for meta in built):
            return None
        return MultiWorkerMetadata(built)

    def clear_connector_metadata(self) -> None:
        self._active = self._children
        self._tell("clear_connector_metadata")

    def get_handshake_metadata(self) -> object:
        """The first child's handshake metadata that is not ``None``."""
        return next((metadata for metadata in self._ask("get_handshake_metadata") if metadata is not None), None)

    def get_mem_pool_context(self) -> AbstractContextManager[object] | None:
        """The KV cache lives in one pool, so at most one child may provide it."""
        answers = self._ask("get_mem_pool_context")
        found = [(i, ctx) for i, ctx in enumerate(answers) if ctx is not None]
        if len(found) > 1:
            names = ", ".join(self._names[i] for i, _ in found)
            raise ConflictError(
                f"{type(self).__name__}.get_mem_pool_context: several sub-connectors provide a "
                f"KV-cache memory pool ({names}); the KV cache can live in only one",
                connector=names,
                method="get_mem_pool_context",
                value=[ctx for _, ctx in found],
            )
        return cast("AbstractContextManager[object]", found[0][1]) if found else None

    def get_kv_connector_stats(self) -> dict[int, object] | None:
        """Each child's statistics, by child index (children without any are left out)."""
        stats: dict[int, object] = {}
        failures: Failures | None = None
        for index, child in enumerate(self._children):
            try:
                found = child.get_kv_connector_stats()
            except Exception as exc:
                failures = [(index, exc)] if failures is None else [*failures, (index, exc)]
                continue
            if found is not None:
                stats[index] = found
        if self._held_stats is not None:
            stats = _merge_stats(self._held_stats, stats)
            self._held_stats = None
        if failures:
            self._held_stats = stats
            raise failure(type(self).__name__, self._names, "get_kv_connector_stats", failures, HELD)
        return stats or None

    def shutdown(self) -> None:
        """Shut down every child, even when one fails; then raise what failed."""
        self._tell("shutdown")

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

    def _failed_child(self, failures: Failures | None, child: KVConnector, exc: Exception) -> Failures:
        index = next(i for i, c in enumerate(self._children) if c is child)
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
            "load_choice": dict(self._load_choice),
            "savers": dict(self._savers),
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
        self._savers = dict(state["savers"])
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


def _merge_stats(held: dict[int, object], new: dict[int, object]) -> dict[int, object]:
    """Stats held from a failed call, then this call's: ``aggregate`` where a child has both."""
    merged = dict(held)
    for index, stats in new.items():
        earlier = merged.get(index)
        aggregate = getattr(earlier, "aggregate", None)
        merged[index] = aggregate(stats) if earlier is not None and callable(aggregate) else stats
    return merged
