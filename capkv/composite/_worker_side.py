"""The worker side of a stack: binding metadata, loads and saves, completions, reports.

What other children handed over when one raised is held and returned by the next call, never lost.
"""

from __future__ import annotations

from collections.abc import Mapping, Set as AbstractSet
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, cast

from capkv.composite._completion import ENDS_IN_RECEIVE, ENDS_IN_SEND, Drop
from capkv.composite._handshakes import ChildHandshakes
from capkv.composite._fanout import HELD, TOLD, Failures, bad_answer, failure
from capkv.composite._metadata import NOT_BUILT, MultiConnectorMetadata, MultiWorkerMetadata, merge_worker_metas
from capkv.composite._state import StackState
from capkv.contracts._connector import KVConnector
from capkv.contracts._engine import AttentionMetadata, ConnectorMetadata, ForwardContext, LoadErrors, WorkerMetadata
from capkv.errors import ConflictError

if TYPE_CHECKING:  # torch loads only where KV is moved, not with the composite
    import torch

__all__ = ["WorkerSide"]


_IDS = "(finished_sending, finished_recving), each a set of request ids or None"


class WorkerSide(StackState):
    """The members an engine's workers call."""

    __slots__ = ()

    @property
    def _folded_saves_bit(self) -> int:
        """The bit a receive waits on for the saves folded into it: past the children's bits and the stack's own."""
        return 2 << len(self._children)

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
                self._receives.expect(book.loads)
                self._loading.update(request_id for request_id, _, _ in book.loads)
                itself = len(self._children)  # the bit of a receive the stack owes itself (a cut hit)
                for request_id, number, mask in book.folds:
                    self._sends.fold(request_id, mask)
                    self._receives.fold(request_id, number, self._folded_saves_bit)
                for request_id, _, mask in book.loads:
                    if mask >> itself & 1:
                        self._receives.report(itself, request_id)
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
        """Every child's saves; first, when this step's loads failed anywhere, the children that save
        learn which requests loaded this step (they save nothing of them until recomputed)."""
        if self._loading and self._hear_failures:
            self._tell_failed_loads()
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
                        if isinstance(verdict, Drop):
                            self._dropped.add(self._names[index], verdict, request_id)
                            continue
                        if verdict & ENDS_IN_SEND:
                            if sending is None:
                                sending = {request_id}
                            else:
                                sending.add(request_id)
                        if verdict & ENDS_IN_RECEIVE:  # the receive it waited for, if still to come, may complete now
                            self._receives.sent(request_id, self._folded_saves_bit)
                else:
                    bad = bad_answer(self._names[index], "get_finished", answer, _IDS)
                    failures = [(index, bad)] if failures is None else [*failures, (index, bad)]
            if child_recving:
                if isinstance(child_recving, (set, frozenset)):
                    receives = self._receives
                    for request_id in cast("set[str]", child_recving):
                        received = receives.report(index, request_id)
                        if received is not True and received is not False:
                            self._dropped.add(self._names[index], received, request_id)
                else:
                    bad = bad_answer(self._names[index], "get_finished", answer, _IDS)
                    failures = [(index, bad)] if failures is None else [*failures, (index, bad)]
            index += 1
        if failures:  # completed loads stay in the tracker, for the next call
            self._held_sending, self._held_recving = sending, recving
            raise failure(type(self).__name__, self._names, "get_finished", failures, HELD)
        completed = self._receives.take()  # one per request per call: a second load of it waits for the next
        if completed:
            recving = completed if recving is None else recving | completed
        return sending, recving

    def _tell_failed_loads(self) -> None:
        """Ask the children for this step's load errors now (kept for the engine's call); if any reported
        one, tell the children that save which requests loaded this step: none of them saves their blocks
        this step (a block computed on a failed load, or loaded as garbage, must not be stored anywhere)."""
        reports = self._early_reports if self._early_reports is not None else []
        failures = self._early_failures
        failed = False
        for index, child in enumerate(self._children):
            try:
                reported = cast(object, child.get_block_ids_with_load_errors())
            except Exception as exc:  # raised again by the engine's call, as every child's error is
                failures = [(index, exc)] if failures is None else [*failures, (index, exc)]
                failed = True
                continue
            if reported:
                reports.append((index, reported))
                failed = True
        self._early_reports, self._early_failures = reports, failures
        if failed:
            loading = frozenset(self._loading)
            for tell in self._hear_failures:
                tell(loading)

    def loads_failed(self, request_ids: AbstractSet[str], /) -> None:
        """A stack inside a stack: its children learn it too."""
        for tell in self._hear_failures:
            tell(request_ids)

    def get_block_ids_with_load_errors(self) -> LoadErrors:
        """The union of the children's failed block ids, group by group."""
        errors: LoadErrors = self._held_errors or {}
        self._held_errors = None
        failures: Failures | None = self._early_failures
        answers = self._early_reports  # what children reported before wait_for_save, if asked then
        self._early_reports = self._early_failures = None
        for index, child in enumerate(self._children):
            try:
                reported = cast(object, child.get_block_ids_with_load_errors())
            except Exception as exc:
                failures = [(index, exc)] if failures is None else [*failures, (index, exc)]
                continue
            if reported:
                answers = [(index, reported)] if answers is None else [*answers, (index, reported)]
        for index, reported in answers or ():
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
            failures.sort(key=lambda item: item[0])
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
        self._loading.clear()
        self._tell("clear_connector_metadata")

    def get_handshake_metadata(self) -> object:
        """Every child's handshake metadata, each in its place (:class:`ChildHandshakes`), so that
        :meth:`set_xfer_handshake_metadata` hands each child its own; ``None`` when no child has any."""
        answers = self._ask("get_handshake_metadata")
        return None if all(answer is None for answer in answers) else ChildHandshakes(tuple(answers))

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

def _merge_stats(held: dict[int, object], new: dict[int, object]) -> dict[int, object]:
    """Stats held from a failed call, then this call's: ``aggregate`` where a child has both."""
    merged = dict(held)
    for index, stats in new.items():
        earlier = merged.get(index)
        aggregate = getattr(earlier, "aggregate", None)
        merged[index] = aggregate(stats) if earlier is not None and callable(aggregate) else stats
    return merged
