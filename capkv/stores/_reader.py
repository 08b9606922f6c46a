"""Loads off the engine's step: a slow backend's reads run on the store's reader thread.

Loaded in the step, a slow backend's read would stall every request of the batch; here nothing a load meets
can lose it, and no wait is unbounded (docs/internals.md, "Loads off the engine's step").
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from capkv.stores._backend import Backend
from capkv.stores._loading import Chunk, LoadOutcome, load_chunks
from capkv.stores._staging import DEFAULT_CHUNK_BYTES, StagingRing
from capkv.stores._write_guard import WriteGuard

if TYPE_CHECKING:  # torch loads with the KV cache, not with the store classes
    import capkv.transfer._copier

__all__ = ["BackgroundLoads", "FinishedLoad", "READER_CHUNK_BYTES", "failed_outcome"]

READER_CHUNK_BYTES = 4 * DEFAULT_CHUNK_BYTES
"""Bytes per chunk of a background load: off the step, the backend's round trips (one read call per
chunk: a disk seek, a network round trip) cost more than checking bytes that left the CPU's cache."""

ABANDON_GRACE_S = 0.2
"""How long giving loads up waits, in all, for writes into the KV cache already under way."""


@dataclass(frozen=True)
class FinishedLoad:
    """One step's background loads, over: each ``(request id, load number)``, and what happened."""

    step: int
    loads: tuple[tuple[str, int], ...]
    outcome: LoadOutcome


class _Load:
    """One step's background loads, from start to hand-back."""

    __slots__ = ("chunks", "copier", "done", "guard", "loads", "outcome", "ring", "step")

    def __init__(
        self, step: int, loads: tuple[tuple[str, int], ...], chunks: list[Chunk],
        copier: capkv.transfer._copier.BlockCopier, ring: StagingRing,
    ) -> None:
        self.step = step
        self.loads = loads
        self.chunks = chunks
        self.copier = copier
        self.ring = ring
        self.guard = WriteGuard()
        self.done = threading.Event()
        self.outcome: LoadOutcome | None = None

    def end(self, outcome: LoadOutcome) -> None:
        """The load is over (the first outcome given stands: a load given up stays failed)."""
        if self.outcome is None:
            self.outcome = outcome
        self.done.set()


class BackgroundLoads:
    """The reader thread of one store's worker side, and the loads it runs or has run."""

    def __init__(self, backend: Backend, *, owner: str) -> None:
        self._backend = backend
        self._owner = owner
        self._ring: StagingRing | None = None
        self._started: list[_Load] = []
        """Loads not handed back yet, in the order they started."""
        self._queue: queue.SimpleQueue[_Load | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        """Orders ``_Load.end`` between the thread and a caller giving the load up."""

    def start(
        self, step: int, loads: Sequence[tuple[str, int]], chunks: Sequence[Chunk],
        copier: capkv.transfer._copier.BlockCopier,
    ) -> None:
        """Read, check and scatter ``chunks`` (step ``step``'s loads, each ``(request id, number)``) on the
        reader thread."""
        load = _Load(step, tuple(loads), list(chunks), copier, self.ring(copier))
        self._started.append(load)
        if not chunks:  # nothing to read: every block was already unavailable
            load.end(LoadOutcome())
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"capkv-{self._owner}-reader", daemon=True)
            self._thread.start()
        self._queue.put(load)

    def ring(self, copier: capkv.transfer._copier.BlockCopier) -> StagingRing:
        """The reader's own staging rows (made with the KV cache's copier: pinned on CUDA), in
        :data:`READER_CHUNK_BYTES` chunks; plan the loads' chunks with it."""
        ring = self._ring
        if ring is None:
            ring = self._ring = StagingRing(
                lambda nbytes: copier.host_rows(1, nbytes)[0], chunk_nbytes=READER_CHUNK_BYTES
            )
        return ring

    def _run(self) -> None:
        while (load := self._queue.get()) is not None:
            outcome = self._execute(load)
            with self._lock:
                load.end(outcome)

    def _execute(self, load: _Load) -> LoadOutcome:
        """Run ``load``; whatever it raises (a ``BaseException`` too) fails all of its blocks."""
        import torch  # noqa: PLC0415 (loaded with the KV cache, before any load)

        try:
            if load.guard.abandoned:
                return LoadOutcome()  # given up before it began: its failure is already handed back
            with torch.inference_mode():  # thread-local: an engine's KV cache made in it (vLLM's) is written in it
                outcome = load_chunks(
                    load.chunks, self._backend, load.copier, load.ring, owner=self._owner, guard=load.guard
                )
            for handle in outcome.handles:
                handle.wait()  # received means in the KV cache: the engine reads it next step
        except BaseException as error:  # noqa: BLE001 (nothing a load meets may escape: it is this load's failure)
            error.__traceback__ = None
            return failed_outcome(load.chunks, error)
        return outcome

    def take_finished(self) -> list[FinishedLoad]:
        """The loads that are over since the last call, oldest first (later ones stay, even when done,
        behind one still running: outcomes are handed back in the order the loads started)."""
        finished: list[FinishedLoad] = []
        while self._started and self._started[0].done.is_set():
            load = self._started.pop(0)
            finished.append(FinishedLoad(load.step, load.loads, load.outcome or LoadOutcome()))
        return finished

    def pending_since(self) -> int | None:
        """The first step whose loads have not been handed back, or ``None``."""
        return self._started[0].step if self._started else None

    def running(self) -> int:
        """How many started loads are not over."""
        return sum(not load.done.is_set() for load in self._started)

    def wait(self, timeout_s: float | None = None) -> bool:
        """Until every started load is over (their outcomes stay, for :meth:`take_finished`), for at most
        ``timeout_s``; whether they are."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        for load in list(self._started):
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not load.done.wait(left):
                return False
        return True

    def abandon(self, *, force: bool = False) -> int:
        """Give up every started load that is not over: each is handed back with all its blocks failed
        (the caller raises why, once). A load writing into the KV cache right now (a read into the blocks
        themselves, stuck) is given up only when ``force`` (the store is closing: the engine computes on
        nothing any more). How many loads were not given up."""
        deadline = time.monotonic() + ABANDON_GRACE_S
        left = 0
        for load in list(self._started):
            if load.done.is_set():
                continue
            if load.guard.abandon(deadline - time.monotonic()) or force:
                failed = failed_outcome(load.chunks, None)
                with self._lock:
                    load.end(failed)
            else:
                left += 1
        return left

    def drop_rows(self) -> None:
        """Free the staging rows (the KV cache, and the device they were made for, go away); after :meth:`wait`."""
        if self._ring is not None:
            self._ring.clear()
            self._ring = None

    def close(self, timeout_s: float) -> int:
        """Wait for the started loads (at most ``timeout_s``), give up the rest (handed back failed), stop
        the reader thread (left behind if a read is stuck: it is a daemon), free the rows. How many loads
        were given up."""
        abandoned = 0
        if not self.wait(timeout_s):
            abandoned = self.running()
            self.abandon(force=True)
        if self._thread is not None:
            self._queue.put(None)
            if not abandoned:
                self._thread.join(ABANDON_GRACE_S)
            self._thread = None
        if not abandoned:
            self.drop_rows()  # a stuck read may still use them: they go with it
        return abandoned


def failed_outcome(chunks: Sequence[Chunk], error: BaseException | None) -> LoadOutcome:
    """Every block of ``chunks`` failed, because of ``error`` (which says nothing about the stored values;
    ``None``: the load was given up, and its caller says why)."""
    outcome = LoadOutcome()
    for chunk in chunks:
        outcome.errors.setdefault(chunk.group, set()).update(chunk.block_ids)
        outcome.failed_requests.update(chunk.requests)
    outcome.read_failure = error
    return outcome
