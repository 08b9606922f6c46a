"""The scheduler side of a stack: hits, allocations, metadata, outputs, finishes.

Its members are hot paths: they allocate nothing in the common case beyond what they return.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

from capkv.composite._agreement import agreed_finished_count, agreed_layout, piecewise_needed
from capkv.composite._fanout import ATTACHED, HELD, TOLD, Failures, bad_answer, failure
from capkv.composite._finish import FinishResult, FinishRoutine
from capkv.composite._handshakes import Handshakes
from capkv.composite._metadata import NOT_BUILT, Book, MultiConnectorMetadata, MultiWorkerMetadata
from capkv.composite._native import NOT_CARRIED
from capkv.composite._plan import Slice
from capkv.composite._state import UNSET, StackState
from capkv.contracts._engine import BlockIds, HandshakeMetadata, KVConnectorOutput, Request, SchedulerOutput
from capkv.errors import ContractError, SubConnectorError

__all__ = ["SchedulerSide"]


_set = object.__setattr__
_ZERO = 0
_NO_HIT: tuple[int | None, bool] = (0, False)
_ASK_AGAIN: tuple[int | None, bool] = (None, False)
_HIT = "(tokens, load_async) with tokens a non-negative int, or None to be asked again"


def _num_tokens(request: Request) -> int | None:
    """How many tokens the request has, when it says (vLLM's ``num_tokens``, or ``all_token_ids``)."""
    count: object = getattr(request, "num_tokens", None)
    if type(count) is int:
        return count
    tokens: object = getattr(request, "all_token_ids", None)
    return len(cast("Sequence[object]", tokens)) if isinstance(tokens, Sequence) else None


class SchedulerSide(FinishRoutine, StackState):
    """The members an engine's scheduler calls."""

    __slots__ = ()

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int, /
    ) -> tuple[int | None, bool]:
        """Compose the children's hits: each child is asked beyond what the earlier ones load.

        A child that loads slices (:func:`~capkv.contracts._tiers.loads_slices`) is asked at
        ``num_computed_tokens`` plus the tokens the children before it offered, and its hit
        extends the stack's; a child that does not is asked at ``num_computed_tokens``, as vLLM
        asks it, and loads only when no child before it had a hit — and then no later child
        extends its hit. A slice that does not end on a block boundary ends the composition too
        (one that must, because it was asked beyond the local hit, is a ``ContractError``).
        Any ``None`` means "ask again": the round ends and no plan is kept.
        """
        plans = self._plans
        if plans:
            plans.pop(request.request_id, None)
        start = num_computed_tokens
        open_ = True  # later children may still extend the hit
        slices: list[Slice] | None = None
        failures: Failures | None = None
        for ask, slicing, index in self._asked:
            asked = start if slicing and open_ else num_computed_tokens
            try:
                answer: Any = ask(request, asked)
            except Exception as exc:
                failures = [(index, exc)] if failures is None else [*failures, (index, exc)]
                continue
            try:
                tokens, load_async = answer
            except (TypeError, ValueError):
                tokens = load_async = UNSET
            if tokens is _ZERO:  # the common answer, first (an int 0: CPython keeps one; False is not it)
                continue
            if type(tokens) is int and tokens >= 0:
                if not tokens:
                    continue
                if open_ and asked == start:
                    bad = self._bad_slice(index, request, asked, tokens, answer, num_computed_tokens)
                    if bad is not None:
                        failures = [(index, bad)] if failures is None else [*failures, (index, bad)]
                        open_ = False
                        continue
                    item = (index, asked, tokens, bool(load_async))
                    if slices is None:
                        slices = [item]
                    else:
                        slices.append(item)
                    start = asked + tokens
                    if not slicing or not self._aligned(start):
                        open_ = False
                continue
            if tokens is None:
                if failures is None:
                    return _ASK_AGAIN
                continue
            bad = bad_answer(self._names[index], "get_num_new_matched_tokens", answer, _HIT)
            failures = [(index, bad)] if failures is None else [*failures, (index, bad)]
        if failures:
            raise failure(type(self).__name__, self._names, "get_num_new_matched_tokens", failures,
                          "no slice was kept; ask again")
        if slices is None:
            return _NO_HIT
        plans[request.request_id] = (num_computed_tokens, tuple(slices))
        if len(slices) == 1:
            return slices[0][2], slices[0][3]
        return start - num_computed_tokens, any(item[3] for item in slices)

    def _aligned(self, position: int) -> bool:
        alignment = self._alignment
        return alignment is None or position % alignment == 0

    def _bad_slice(
        self, index: int, request: Request, asked: int, tokens: int, answer: object, local: int
    ) -> ContractError | None:
        """capkv's verdict on a hit that cannot be a slice: past the prompt, or (asked beyond the
        local hit) not ending on a block boundary."""
        total = _num_tokens(request)
        if total is not None and asked + tokens > total:
            why = f"ends at token {asked + tokens}, past the request's {total} tokens"
        elif asked > local and not self._aligned(asked + tokens):
            why = (f"ends at token {asked + tokens}, not on a block boundary (every group's blocks: a "
                   f"multiple of {self._alignment}); a slice asked beyond the local hit must")
        else:
            return None
        name = self._names[index]
        return ContractError(
            f"{name}.get_num_new_matched_tokens(request {request.request_id!r}, {asked}) returned {answer!r}: "
            f"the hit {why}",
            connector=name, method="get_num_new_matched_tokens", value=answer,
        )

    def update_state_after_alloc(
        self, request: Request, blocks: BlockIds, num_external_tokens: int, /
    ) -> None:
        """Each child that offered a slice gets its part of the tokens the engine accepted; the others 0.

        The engine may accept fewer tokens than offered: the slices are honoured in token order
        and the first that does not fit is cut short. Then every child that knows of foreign loads
        learns which tokens others loaded, and whether to save them (promotion).
        """
        plan = self._plans.get(request.request_id) if self._plans else None  # kept until the finish
        failures: Failures | None = None
        if plan is None and num_external_tokens > 0:
            raise self._more_than_offered(request, num_external_tokens, 0)
        if plan is None or num_external_tokens <= 0:
            native = self._native
            if native is not None:  # every child takes the engine's own blocks: unwrap them once
                engine_blocks: object = getattr(blocks, native[2], None)
                if engine_blocks is not None:
                    for index, call in native[0]:  # (indexed in advance: a count per call cost more)
                        try:
                            call(request, engine_blocks, 0)
                        except Exception as exc:
                            failures = [(index, exc)] if failures is None else [*failures, (index, exc)]
                    if failures:
                        raise self._alloc_failed(failures, 0)
                    return
            for child in self._children:
                try:
                    child.update_state_after_alloc(request, blocks, 0)
                except Exception as exc:
                    failures = self._failed_child(failures, child, exc)
            if failures:
                raise self._alloc_failed(failures, 0)
            return
        local, slices = plan
        counts = [0] * len(self._children)
        left = num_external_tokens
        for index, _, tokens, _ in slices:
            counts[index] = part = min(tokens, left)
            left -= part
        if left:
            raise self._more_than_offered(request, num_external_tokens, num_external_tokens - left)
        cut: dict[int, int] = {}  # loaders that raised -> tokens whose load started anyway
        index = -1
        for child in self._children:
            index += 1
            try:
                child.update_state_after_alloc(request, blocks, counts[index])
            except Exception as exc:
                failures = [(index, exc)] if failures is None else [*failures, (index, exc)]
                if counts[index]:  # a nested stack says how much of its slice started loading
                    partial = exc.partial if isinstance(exc, SubConnectorError) else None
                    cut[index] = min(partial, counts[index]) if isinstance(partial, int) and partial > 0 else 0
        async_mask = 0
        started = 0  # tokens whose load started: the slices up to the first that failed
        parts: list[tuple[int, int, int]] = []
        for index, first, _, load_async in slices:
            part = counts[index]
            if not part:
                break
            if index in cut:
                part = cut[index]
            if part:
                self._loaded_tokens[index] += part
                parts.append((index, first, part))
                if load_async:
                    async_mask |= 1 << index
            started = first + part - local
            if part < counts[index]:
                break
        if started and not async_mask and failures is None and any(slice_[3] for slice_ in slices):
            # The stack answered load_async and the engine cut the hit to synchronous slices: it
            # still parks the request until a receive, which no child will report; the stack does.
            # (A child that raised here makes this call raise: the engine's host decides instead.)
            async_mask = 1 << len(self._children)
        if started:
            self._load_serial += 1
            self._loads.append((request.request_id, self._load_serial, async_mask))
            self._settling.started(request.request_id, self._load_serial, local, async_mask != 0)
            self._landing.started(request.request_id, self._load_serial, blocks if self._spec else None, parts)
            failures = self._tell_foreign(request, counts, local, local + started, failures)
        if failures:
            raise self._alloc_failed(failures, started)

    def _more_than_offered(self, request: Request, accepted: int, offered: int) -> ContractError:
        """The engine's mistake: no child would load the rest, so its KV would be missing."""
        name = type(self).__name__
        return ContractError(
            f"{name}.update_state_after_alloc: num_external_tokens={accepted} for request "
            f"{request.request_id!r}, but its children offered {offered} (at the last get_num_new_matched_tokens); "
            "an engine may accept fewer external tokens than offered, never more",
            connector=name, method="update_state_after_alloc", value=accepted,
        )

    def _tell_foreign(
        self, request: Request, counts: list[int], local: int, end: int, failures: Failures | None
    ) -> Failures | None:
        """Each child that knows of foreign loads learns what the others loaded of ``[local, end)``:
        the slices of earlier children (not to be saved again), and those of later children (saved
        only when the stack promotes)."""
        promote = self._promote
        first = local  # where this child's slice starts
        for index, tell in enumerate(self._foreign):
            own_end = min(first + counts[index], end)
            if tell is not None:
                try:
                    if first > local:
                        tell(request, local, first, False)
                    if own_end < end:
                        tell(request, own_end, end, promote)
                        if promote:
                            self._promoted_tokens[index] += end - own_end
                except Exception as exc:
                    failures = [(index, exc)] if failures is None else sorted([*failures, (index, exc)],
                                                                             key=lambda item: item[0])
            first = own_end
        return failures

    def _alloc_failed(self, failures: Failures, started: int) -> SubConnectorError:
        return failure(
            type(self).__name__, self._names, "update_state_after_alloc", failures,
            f"{TOLD}; .partial is the number of external tokens whose load started ({started}): "
            "an asynchronous load is reported in finished_recving when it ends",
            partial=started,
        )

    def loaded_elsewhere(self, request: Request, start: int, end: int, save: bool, /) -> None:
        """A stack inside a stack: its children learn it too."""
        for tell in self._foreign:
            if tell is not None:
                tell(request, start, end, save)

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
        if self._savers or self._loads or self._folds:
            savers: dict[str, int] = {}
            for request_id, mask in self._savers:  # finished requests, in order, since the last book
                savers[request_id] = savers.get(request_id, 0) | mask
            self._serial += 1
            books = (*books, Book(self._origin, self._serial, savers, tuple(self._loads), tuple(self._folds)))
            self._savers = []
            self._folds = []
            self._loads = []
        metadata = MultiConnectorMetadata(tuple(metas), books)
        settling = self._settling
        if settling.unbuilt:
            settling.built(not failures)
        else:  # what built() does with no synchronous load to ship
            settling.builds += 1
        if failures:
            self._unsent = books
            raise failure(type(self).__name__, self._names, "build_connector_meta", failures, ATTACHED,
                          partial=metadata)
        if books:
            self._unsent = ()
        return metadata

    def update_connector_output(self, connector_output: KVConnectorOutput, /) -> None:
        """Each child sees the step's output with its own worker metadata.

        As vLLM's composite does, each child gets the engine's object with its own share of
        the worker metadata in place for the call; the engine's metadata is back when the
        call returns (or raises). A child must not keep the object past its call. Children
        that take the engine's own output (:mod:`~capkv.composite._native`) get that one,
        its worker-metadata field set the same way.
        """
        settling = self._settling
        if settling.pending or settling.shipped or self._landing.loads:
            self._landing.settle(settling, connector_output, self._spec)
        elif settling.outputs < settling.builds:  # nothing to settle: output() would only count it
            settling.outputs += 1
        worker_meta = connector_output.worker_meta
        if worker_meta is None:
            per_child: tuple[object, ...] | None = None
        elif type(worker_meta) is MultiWorkerMetadata and len(worker_meta.children) == len(self._children):
            per_child = worker_meta.children
        else:
            per_child = self._expect(worker_meta, MultiWorkerMetadata, "update_connector_output").children
        native = self._native
        if native is not None:  # every child takes the engine's own output: unwrapped once
            if not native[1]:  # every child's member is its engine's no-op
                return
            passed = native[3](native[1], connector_output, per_child)
            if passed is None:  # the common case first: every call returned
                return
            if passed is not NOT_CARRIED:
                raise failure(type(self).__name__, self._names, "update_connector_output", passed, TOLD)
        failures: Failures | None = None
        children = self._children
        if per_child is None:
            for child in children:
                try:
                    child.update_connector_output(connector_output)
                except Exception as exc:
                    failures = self._failed_child(failures, child, exc)
        else:
            try:
                for index, child in enumerate(children):  # (an index costs less than a zip)
                    _set(connector_output, "worker_meta", per_child[index])  # the output is a frozen dataclass
                    try:
                        child.update_connector_output(connector_output)
                    except Exception as exc:
                        failures = self._failed_child(failures, child, exc)
            finally:
                _set(connector_output, "worker_meta", worker_meta)
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
        """Every child learns what its own workers produced (see :meth:`get_handshake_metadata`), by rank;
        a payload the stack did not make per child reaches every child."""
        carried = metadata if isinstance(metadata, Handshakes) else Handshakes(metadata)
        self._tell_each("set_xfer_handshake_metadata", lambda index: (carried.for_child(index),))

