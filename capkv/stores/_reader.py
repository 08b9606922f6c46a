"""Loads off the engine's step: a slow backend's reads run on the store's reader thread.

Loaded in the step, a slow backend's read would stall every request of the batch (docs/internals.md, "Loads
off the engine's step").
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

from capkv.stores._backend import Backend
from capkv.stores._loading import Chunk, LoadOutcome, load_chunks
from capkv.stores._staging import DEFAULT_CHUNK_BYTES, StagingRing

if TYPE_CHECKING:  # torch loads with the KV cache, not with the store classes
    import capkv.transfer._copier

__all__ = ["BackgroundLoads", "FinishedLoad", "READER_CHUNK_BYTES"]

READER_CHUNK_BYTES = 4 * DEFAULT_CHUNK_BYTES
"""Bytes per chunk of a background load: off the step, the backend's round trips (one read call per
chunk: a disk seek, a network round trip) cost more than checking bytes that left the CPU's cache."""


@dataclass(frozen=True)
class FinishedLoad:
    """One step's background loads, over: the requests they were for (each now received) and what happened."""

    step: int
    requests: frozenset[str]
    outcome: LoadOutcome


@dataclass(frozen=True)
class _Started:
    step: int
    requests: frozenset[str]
    future: Future[LoadOutcome] | None
    """``None``: nothing to read (every block of these requests was already unavailable)."""


class BackgroundLoads:
    """The reader thread of one store's worker side, and the loads it runs or has run."""

    def __init__(self, backend: Backend, *, owner: str) -> None:
        self._backend = backend
        self._owner = owner
        self._pool: ThreadPoolExecutor | None = None
        self._ring: StagingRing | None = None
        self._started: list[_Started] = []

    def start(
        self, step: int, requests: frozenset[str], chunks: Sequence[Chunk], copier: capkv.transfer._copier.BlockCopier
    ) -> None:
        """Read, check and scatter ``chunks`` (step ``step``'s loads of ``requests``) on the reader thread."""
        future: Future[LoadOutcome] | None = None
        if chunks:
            ring = self.ring(copier)
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix=f"capkv-{self._owner}-reader")
            future = self._pool.submit(self._load, list(chunks), copier, ring)
        self._started.append(_Started(step, requests, future))

    def ring(self, copier: capkv.transfer._copier.BlockCopier) -> StagingRing:
        """The reader's own staging rows (made with the KV cache's copier: pinned on CUDA), in
        :data:`READER_CHUNK_BYTES` chunks; plan the loads' chunks with it."""
        ring = self._ring
        if ring is None:
            ring = self._ring = StagingRing(
                lambda nbytes: copier.host_rows(1, nbytes)[0], chunk_nbytes=READER_CHUNK_BYTES
            )
        return ring

    def _load(
        self, chunks: list[Chunk], copier: capkv.transfer._copier.BlockCopier, ring: StagingRing
    ) -> LoadOutcome:
        import torch  # noqa: PLC0415 (loaded with the KV cache, before any load)

        try:
            with torch.inference_mode():  # thread-local: an engine's KV cache made in it (vLLM's) is written in it
                outcome = load_chunks(chunks, self._backend, copier, ring, owner=self._owner)
            for handle in outcome.handles:
                handle.wait()  # received means in the KV cache: the engine reads it next step
        except Exception as error:  # noqa: BLE001 (a fault here fails the whole load, reported like a read's)
            error.__traceback__ = None
            return failed_outcome(chunks, error)
        return outcome

    def take_finished(self) -> list[FinishedLoad]:
        """The loads that are over since the last call, oldest first (later ones stay, even when done,
        behind one still running: outcomes are handed back in the order the loads started)."""
        finished: list[FinishedLoad] = []
        while self._started:
            first = self._started[0]
            if first.future is not None and not first.future.done():
                break
            self._started.pop(0)
            outcome = LoadOutcome() if first.future is None else first.future.result()
            finished.append(FinishedLoad(first.step, first.requests, outcome))
        return finished

    def pending_since(self) -> int | None:
        """The first step whose loads have not been handed back, or ``None``."""
        return self._started[0].step if self._started else None

    def wait(self) -> None:
        """Until every started load is over (their outcomes stay, for :meth:`take_finished`)."""
        for started in self._started:
            if started.future is not None:
                started.future.exception()

    def drop_rows(self) -> None:
        """Free the staging rows (the KV cache, and the device they were made for, go away); after :meth:`wait`."""
        if self._ring is not None:
            self._ring.clear()
            self._ring = None

    def close(self) -> None:
        """Wait for the started loads, stop the reader thread, free the rows."""
        self.wait()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        self.drop_rows()


def failed_outcome(chunks: Sequence[Chunk], error: Exception) -> LoadOutcome:
    """Every block of ``chunks`` failed, because of ``error`` (which says nothing about the stored values)."""
    outcome = LoadOutcome()
    for chunk in chunks:
        outcome.errors.setdefault(chunk.group, set()).update(chunk.block_ids)
        outcome.failed_requests.update(chunk.requests)
    outcome.read_failure = error
    return outcome
