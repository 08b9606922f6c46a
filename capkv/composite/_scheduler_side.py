"""The scheduler side of a stack: hits, allocations, metadata, outputs, finishes.

The per-request members (``get_num_new_matched_tokens``, ``update_state_after_alloc``,
finishes) and the per-step ones (``build_connector_meta``, ``update_connector_output``)
are hot paths: they allocate nothing in the common case beyond what they return.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any, cast

from capkv.composite._agreement import agreed_finished_count, agreed_layout, piecewise_needed
from capkv.composite._fanout import ATTACHED, HELD, TOLD, Failures, bad_answer, failure
from capkv.composite._finish import FinishResult, FinishRoutine
from capkv.composite._metadata import NOT_BUILT, Book, MultiConnectorMetadata, MultiWorkerMetadata
from capkv.composite._state import UNSET, StackState
from capkv.contracts._engine import BlockIds, HandshakeMetadata, KVConnectorOutput, Request, SchedulerOutput
from capkv.errors import SubConnectorError

__all__ = ["SchedulerSide"]


_new = object.__new__
_set = object.__setattr__
_NO_HIT: tuple[int | None, bool] = (0, False)
_ASK_AGAIN: tuple[int | None, bool] = (None, False)
_HIT = "(tokens, load_async) with tokens a non-negative int, or None to be asked again"


class SchedulerSide(FinishRoutine, StackState):
    """The members an engine's scheduler calls."""

    __slots__ = ()

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int, /
    ) -> tuple[int | None, bool]:
        """Ask every child; the first with a hit loads. Any ``None`` means "ask again"."""
        if self._load_choice:
            self._load_choice.pop(request.request_id, None)
        chosen: tuple[int | None, bool] = _NO_HIT
        failures: Failures | None = None
        for child in self._children:
            answer: Any = UNSET
            try:
                answer = child.get_num_new_matched_tokens(request, num_computed_tokens)
                tokens, load_async = answer
            except Exception as exc:
                failures = self._failed_answer(failures, child, exc, answer, "get_num_new_matched_tokens", _HIT)
                continue
            if type(tokens) is int:
                if tokens > 0:
                    if chosen is _NO_HIT:
                        self._load_choice[request.request_id] = (self._position(child), bool(load_async))
                        chosen = (tokens, bool(load_async))
                    continue
                if tokens == 0:
                    continue
            elif tokens is None:
                if failures is None:
                    self._load_choice.pop(request.request_id, None)
                    return _ASK_AGAIN
                continue
            bad = bad_answer(self._names[self._position(child)], "get_num_new_matched_tokens", answer, _HIT)
            failures = self._failed_child(failures, child, bad)
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
            for child in self._children:
                try:
                    child.update_state_after_alloc(request, blocks, 0)
                except Exception as exc:
                    failures = self._failed_child(failures, child, exc)
        else:
            loader, load_async = choice
            for index, child in enumerate(self._children):
                try:
                    child.update_state_after_alloc(request, blocks, num_external_tokens if index == loader else 0)
                except Exception as exc:
                    failures = [(index, exc)] if failures is None else [*failures, (index, exc)]
                    if index == loader and not (isinstance(exc, SubConnectorError) and exc.partial):
                        choice = None  # the loader failed (a nested stack says if its loader started)
            if choice is not None and load_async:
                self._loads[request.request_id] = loader
        if failures:
            started = 0 if choice is None else max(num_external_tokens, 0)
            raise failure(
                type(self).__name__, self._names, "update_state_after_alloc", failures,
                f"{TOLD}; .partial is the number of external tokens whose load started ({started}): "
                "an asynchronous load is reported in finished_recving when it ends",
                partial=started,
            )

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
                # a nested stack that failed in part still built its other children's metadata
                append(exc.partial if isinstance(exc, SubConnectorError) and exc.partial is not None else NOT_BUILT)
        books = self._unsent
        if self._savers or self._loads:
            savers: dict[str, int] = {}
            for request_id, mask in self._savers:  # finished requests, in order, since the last book
                savers[request_id] = savers.get(request_id, 0) | mask
            self._serial += 1
            books = (*books, Book(self._origin, self._serial, savers, self._loads))
            self._savers = []
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
            for child in self._children:
                try:
                    child.update_connector_output(connector_output)
                except Exception as exc:
                    failures = self._failed_child(failures, child, exc)
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

