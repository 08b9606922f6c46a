"""The worker side's loads: synchronous ones in the step, asynchronous ones on the reader thread.

Each asynchronous load is reported once, by its own number: two loads of one request id are two reports
(docs/internals.md, "The worker side").
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING

from capkv.composite._completion import ReportQueue
from capkv.contracts._engine import LoadErrors
from capkv.stores._backend import Backend, StoreKey
from capkv.stores._causes import LoadFailureLog, backend_fault
from capkv.stores._keys import BlockKey
from capkv.stores._loading import LoadOutcome, load_chunks, plan_chunks
from capkv.stores._metadata import StoreMetadata
from capkv.stores._reader import BackgroundLoads
from capkv.stores._staging import StagingRing

if TYPE_CHECKING:  # torch loads with the KV cache, not with the store classes
    import capkv.transfer._copier

__all__ = ["WorkerLoads"]

Copier = Callable[[str], "capkv.transfer._copier.BlockCopier"]
"""The registered KV cache's copier (``method`` names the caller in the error raised before registration)."""


class WorkerLoads:
    """Every load of one store's worker side, and what they did until it is reported."""

    def __init__(
        self, backend: Backend, *, owner: str, copier: Copier, store_key: Callable[[BlockKey], StoreKey],
        counts: Counter[str],
    ) -> None:
        self._backend = backend
        self._owner = owner
        self._copier = copier
        self._store_key = store_key
        self._counts = counts
        self.reader = BackgroundLoads(backend, owner=owner)
        """The loads of requests the scheduler side answered ``load_async`` for (``StoreMetadata.receiving``)."""
        self._ring: StagingRing | None = None
        """The host rows synchronous loads go through (made on the first load, reused)."""
        self._receiving_for: StoreMetadata | None = None
        """The bound metadata whose asynchronous loads were started (binding and ``start_load_kv`` both start
        them: once per metadata, whatever its step number says)."""
        self.failed_now: set[str] = set()
        """Requests whose load failed in the step being run: they save nothing this step."""
        self.ran_through = 0
        """The last step whose synchronous loads ran (stream-ordered: the engine reads them after)."""
        self._reports = ReportQueue()
        self._received: set[int] = set()
        """Asynchronous loads (by number) reported received since the last :meth:`take_received`."""
        self._errors: LoadErrors = {}
        self._failures: list[BaseException] = []
        self._failure_log = LoadFailureLog(owner)
        self._lost: set[BlockKey] = set()
        self.damaged_values = 0
        """Values that failed their checks at load time (deleted from the backend)."""

    def staging_ring(self, copier: capkv.transfer._copier.BlockCopier) -> StagingRing:
        """The host rows synchronous loads go through, made with the KV cache's copier (pinned on CUDA)."""
        ring = self._ring
        if ring is None:
            ring = self._ring = StagingRing(lambda nbytes: copier.host_rows(1, nbytes)[0])
        return ring

    def receive(self, metadata: StoreMetadata, sizes: Sequence[int], method: str) -> None:
        """Start the step's asynchronous loads (``metadata.receiving``) on the reader thread, once per
        metadata: as soon as it is bound, so they overlap the step's forward pass (vLLM calls
        ``start_load_kv`` after the forward when a step has no synchronous load). Safe before the
        forward: the engine computes none of these requests until they are received."""
        if metadata is self._receiving_for or not metadata.receiving:
            return
        self._receiving_for = metadata
        receiving = frozenset(metadata.receiving)
        later = [move for move in metadata.loads if move.request_id in receiving]
        copier = self._copier(method)
        numbers = metadata.receiving_loads or (0,) * len(metadata.receiving)
        chunks = plan_chunks(later, self._store_key, sizes, self.reader.ring(copier))
        self.reader.start(metadata.step, tuple(zip(metadata.receiving, numbers, strict=True)), chunks, copier)

    def load(self, metadata: StoreMetadata, sizes: Sequence[int]) -> None:
        """Run the step's synchronous loads, chunk by chunk, and order the engine's stream after them;
        the asynchronous ones (``metadata.receiving``) are started by :meth:`receive`, here at the latest."""
        for group, block_id in metadata.unavailable:
            self._errors.setdefault(group, set()).add(block_id)
        self.failed_now = set()
        receiving = frozenset(metadata.receiving)
        now = [move for move in metadata.loads if move.request_id not in receiving]
        if now:
            copier = self._copier("start_load_kv")
            ring = self.staging_ring(copier)
            outcome = load_chunks(
                plan_chunks(now, self._store_key, sizes, ring), self._backend, copier, ring, owner=self._owner
            )
            self._count(outcome)
            self.failed_now = outcome.failed_requests
            for handle in outcome.handles:
                handle.stream_wait()
        self.receive(metadata, sizes, "start_load_kv")
        self.ran_through = metadata.step

    def loads_failed(self, request_ids: Collection[str]) -> None:
        """Loads of these requests failed this step elsewhere in a stack: they save nothing this step."""
        self.failed_now.update(request_ids)

    def received(self) -> set[str] | None:
        """Requests whose asynchronous load is over (``get_finished``'s receiving set), one load per request
        per call; every failed block of those loads is a load error from now on, so the engine hears of
        both in the same step."""
        self.collect()
        now, numbers = self._reports.take()
        self._received.update(numbers)
        return now

    def collect(self) -> None:
        """Take in the asynchronous loads that are over: their outcomes now, their reports when asked."""
        for finished in self.reader.take_finished():
            self._count(finished.outcome)
            for request_id, number in finished.loads:
                self._reports.add(request_id, number)

    def _count(self, outcome: LoadOutcome) -> None:
        """Take in what a load did: its load errors, failures, lost and damaged values, counts."""
        for group, failed in outcome.errors.items():
            self._errors.setdefault(group, set()).update(failed)
        self._failure_log.failed(outcome.errors, outcome.why)
        if outcome.read_failure is not None:
            self._failures.append(outcome.read_failure)
        self.damaged_values += len(outcome.damaged)
        self._lost.update(key.block for key in outcome.lost)
        self._counts["loaded_blocks"] += outcome.loaded
        self._counts["loaded_bytes"] += outcome.loaded_bytes
        self._counts["failed_blocks"] += sum(len(failed) for failed in outcome.errors.values())
        if outcome.damaged:
            try:
                self._backend.delete(outcome.damaged)
            except Exception as error:  # noqa: BLE001 (it is found damaged again next time)
                self._failures.append(backend_fault(error, "delete"))

    # ---- what the reports say ------------------------------------------------------------

    def loaded_through(self) -> int:
        """The last step every load of which is over (pins outlive the loads reading them)."""
        pending = self.reader.pending_since()
        return self.ran_through if pending is None else pending - 1

    def take_lost(self) -> frozenset[BlockKey]:
        lost, self._lost = frozenset(self._lost), set()
        return lost

    def take_received(self) -> frozenset[int]:
        received, self._received = frozenset(self._received), set()
        return received

    def has_news(self) -> bool:
        return bool(self._lost or self._received)

    def take_errors(self) -> LoadErrors:
        errors, self._errors = self._errors, {}
        return errors

    def take_failures(self) -> list[BaseException]:
        failures, self._failures = self._failures, []
        return failures

    def keep_failure(self, error: BaseException) -> None:
        self._failures.append(error)

    # ---- draining --------------------------------------------------------------------------

    def release(self) -> None:
        """Wait for every load (they scatter into the cache being released), then drop the rows."""
        self.reader.wait()
        self.reader.drop_rows()
        self.clear_rows()

    def clear_rows(self) -> None:
        if self._ring is not None:
            self._ring.clear()
            self._ring = None
