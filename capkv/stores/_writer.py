"""The store's writer: seals started saves into values and puts them into the backend, in order.

One implementation for every backend, bounded, never raising into the engine's step (docs/internals.md, "The
writer").
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, InvalidStateError
from typing import TYPE_CHECKING, cast

from capkv.errors import ContractError
from capkv.stores._backend import StoreKey
from capkv.stores._causes import backend_fault
from capkv.stores._keys import BlockKey
from capkv.stores._value import seal_values

if TYPE_CHECKING:  # torch loads with the KV cache, not with the store classes
    import torch

    import capkv.transfer._handle

__all__ = ["DEFAULT_BATCH_BYTES", "DEFAULT_PENDING_BYTES", "SaveJob", "Writer"]

DEFAULT_BATCH_BYTES = 256 << 20
"""At most this many bytes per ``put`` (more sealed saves go in the next one)."""

DEFAULT_PENDING_BYTES = 1 << 30
"""At most this many bytes of saves in flight in the background (more are dropped, counted)."""

_KEPT_FAILURES = 64
"""Errors kept for ``flush`` to raise; beyond that only counted."""

Put = Callable[[Sequence[tuple[StoreKey, memoryview]]], Sequence[bool]]
Delete = Callable[[Sequence[StoreKey]], None]


class SaveJob:
    """One started save: its keys, the rows its blocks are gathered into (payload after the header
    space), the copy's handle, and its landing — the block keys not stored, once it is over.

    ``checksums``: the payloads' checksums when they were computed as the rows were gathered (else
    the writer computes them); ``release``: called once the backend is done with the rows (its
    ``put`` returned or raised), so they can be reused."""

    __slots__ = ("checksums", "copied", "keys", "landing", "release", "rows", "values")

    def __init__(
        self, keys: Sequence[StoreKey], rows: torch.Tensor, copied: capkv.transfer._handle.CopyHandle,
        *, checksums: Sequence[bytes] | None = None, release: Callable[[], None] | None = None,
    ) -> None:
        self.keys = tuple(keys)
        self.rows = cast("torch.Tensor | None", rows)
        self.copied = copied
        self.checksums = checksums
        self.release = release
        self.values: list[memoryview] = []
        self.landing: Future[tuple[BlockKey, ...]] = Future()

    @property
    def nbytes(self) -> int:
        return sum(key.nbytes for key in self.keys)

    def land(self, failed: Sequence[StoreKey], *, put: bool = False) -> None:
        """The save is over; ``failed`` were not stored. Drops the rows (no buffer outlives its write);
        after a ``put`` (``put=True``: nothing reads them any more) they are released for reuse."""
        self.rows = None
        self.values = []
        release, self.release = self.release, None
        if put and release is not None:
            release()
        try:
            self.landing.set_result(tuple(key.block for key in failed))
        except InvalidStateError:  # landed already (failed by ``close`` while a stuck thread held it)
            pass


class _Delete:
    __slots__ = ("keys",)

    def __init__(self, keys: Sequence[StoreKey]) -> None:
        self.keys = tuple(keys)


_Item = SaveJob | _Delete
_NOTHING = object()


class Writer:
    """Seals and puts saves into a backend, in the background or inline, surviving any failure."""

    def __init__(
        self, put: Put, delete: Delete, *, owner: str, background: bool, batch_bytes: int = DEFAULT_BATCH_BYTES,
        max_pending_bytes: int = DEFAULT_PENDING_BYTES,
    ) -> None:
        self._put = put
        self._max_pending_bytes = max_pending_bytes
        self._pending_bytes = 0
        """Bytes of the submitted saves not landed yet."""
        self._delete = delete
        self._owner = owner
        self._background = background
        self._batch_bytes = batch_bytes
        self._failures: list[BaseException] = []
        self._dropped = 0
        self._lock = threading.Lock()
        self._open: set[SaveJob] = set()
        """Submitted saves not landed yet (``close`` fails them if a stage is stuck)."""
        self._pending = 0
        self._idle = threading.Condition(self._lock)
        self._sealing: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._putting: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._threads: tuple[threading.Thread, ...] = ()
        self._closed = False

    # ---- submitting --------------------------------------------------------------------------

    @property
    def background(self) -> bool:
        """Whether saves are sealed and put on the writer's threads (else in the caller)."""
        return self._background

    def has_room(self, nbytes: int) -> bool:
        """Whether a save of ``nbytes`` may start now: always inline (it is over before the step goes on),
        in the background while the saves in flight stay under ``max_pending_bytes`` (one always may)."""
        if not self._background:
            return True
        with self._lock:
            return not self._pending_bytes or self._pending_bytes + nbytes <= self._max_pending_bytes

    def submit(self, job: SaveJob) -> None:
        """Seal and put ``job`` (its landing tells how it went)."""
        if not self._enter(job):
            job.land(job.keys)
            return
        if self._background:
            self._sealing.put(job)
        elif self._seal(job):
            self._put_batch([job])

    def delete(self, keys: Sequence[StoreKey]) -> None:
        """Delete ``keys`` after every save submitted before."""
        if not keys:
            return
        item = _Delete(keys)
        if not self._enter(item):
            return
        if self._background:
            self._sealing.put(item)
        else:
            self._run_delete(item)

    def _enter(self, item: _Item) -> bool:
        with self._lock:
            if self._closed:
                return False
            self._pending += 1
            if isinstance(item, SaveJob):
                self._open.add(item)
                self._pending_bytes += item.nbytes
            if self._background and not self._threads:
                self._threads = (
                    threading.Thread(target=self._seal_loop, name=f"capkv-{self._owner}-seal", daemon=True),
                    threading.Thread(target=self._put_loop, name=f"capkv-{self._owner}-put", daemon=True),
                )
                for thread in self._threads:
                    thread.start()
        return True

    def _done(self, items: Sequence[_Item]) -> None:
        with self._lock:
            for item in items:
                if isinstance(item, SaveJob):
                    self._open.discard(item)
                    self._pending_bytes -= item.nbytes
            self._pending -= len(items)
            if not self._pending:
                self._idle.notify_all()

    # ---- stages --------------------------------------------------------------------------------

    def _seal(self, job: SaveJob) -> bool:
        """Wait for the job's copy and write its headers; on any failure the job lands failed."""
        try:
            job.copied.wait()
            rows = job.rows
            if rows is None:
                raise RuntimeError(f"{self._owner}: a save was sealed twice")
            job.values = seal_values(rows, job.keys, job.checksums)
        except BaseException as error:  # noqa: BLE001 (a batch never kills the writer)
            self._keep(error)
            job.land(job.keys)
            self._done([job])
            return False
        return True

    def _put_batch(self, jobs: list[SaveJob]) -> None:
        """One ``put`` of every value of ``jobs``; each job lands with the keys not stored."""
        try:
            items = [(key, value) for job in jobs for key, value in zip(job.keys, job.values, strict=True)]
            answers = list(self._put(items))
            if len(answers) != len(items):
                raise ContractError(
                    f"{self._owner}: the backend's put answered {len(answers)} results for {len(items)} values",
                    connector=self._owner, method="put", value=len(answers),
                )
        except BaseException as error:  # noqa: BLE001
            self._keep(error if isinstance(error, ContractError) else backend_fault(error, "put"))
            for job in jobs:
                job.land(job.keys, put=True)
        else:
            results = iter(answers)
            for job in jobs:
                job.land([key for key in job.keys if next(results) is not True], put=True)
        finally:
            self._done(jobs)

    def _run_delete(self, item: _Delete) -> None:
        try:
            self._delete(item.keys)
        except BaseException as error:  # noqa: BLE001
            self._keep(backend_fault(error, "delete"))
        finally:
            self._done([item])

    def _seal_loop(self) -> None:
        while True:
            item = self._sealing.get()
            if item is None:
                self._putting.put(None)
                return
            if isinstance(item, _Delete) or self._seal(item):
                self._putting.put(item)

    def _put_loop(self) -> None:
        """Every sealed save queued since the last put (up to ``batch_bytes``) in one put; deletes in order."""
        item = self._putting.get()
        while item is not None:
            if isinstance(item, _Delete):
                self._run_delete(item)
                item = self._putting.get()
                continue
            batch, size = [item], item.nbytes
            following: _Item | None | object = _NOTHING
            while size < self._batch_bytes:
                try:
                    following = self._putting.get_nowait()
                except queue.Empty:
                    following = _NOTHING
                    break
                if not isinstance(following, SaveJob):
                    break  # a delete or the end: after this batch
                batch.append(following)
                size += following.nbytes
                following = _NOTHING
            self._put_batch(batch)
            item = self._putting.get() if following is _NOTHING else cast("_Item | None", following)

    # ---- failures ------------------------------------------------------------------------------

    def _keep(self, error: BaseException) -> None:
        """Keep ``error`` for :meth:`flush` — without its traceback, whose frames hold the buffers."""
        error.__traceback__ = None
        error.__context__ = None
        error.__cause__ = None
        with self._lock:
            if len(self._failures) < _KEPT_FAILURES:
                self._failures.append(error)
            else:
                self._dropped += 1

    def take_failures(self) -> tuple[list[BaseException], int]:
        """The errors kept since the last call, and how many more were not kept."""
        with self._lock:
            failures, dropped = self._failures, self._dropped
            self._failures, self._dropped = [], 0
        return failures, dropped

    # ---- draining ------------------------------------------------------------------------------

    def wait(self, timeout_s: float | None = None) -> bool:
        """Wait until everything submitted is over; whether it is (``False`` only after ``timeout_s``)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._lock:
            while self._pending:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._idle.wait(left)
        return True

    def close(self, timeout_s: float = 60.0) -> None:
        """Finish what was submitted (for at most ``timeout_s``), stop the threads, fail what never landed."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            threads, self._threads = self._threads, ()
        deadline = time.monotonic() + timeout_s
        self.wait(timeout_s)
        if threads:
            self._sealing.put(None)
            for thread in threads:
                thread.join(max(0.0, deadline - time.monotonic()))
        with self._lock:
            stuck = list(self._open)
            self._open.clear()
        for job in stuck:  # a stage never came back (a hung disk): these saves did not land
            job.land(job.keys)
        if stuck:
            self._keep(TimeoutError(f"{self._owner}: {len(stuck)} saves still running after {timeout_s:g} s at close"))
