"""Host rows a store reuses step after step, so loads and saves neither allocate nor page-fault.

Fresh host memory is expensive (zeroed page by page on first touch, pinned by the driver on CUDA), so a store
takes it once and keeps it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

from capkv.stores._value import row_memory

if TYPE_CHECKING:  # torch loads with the KV cache, not with the store classes
    import torch

    import capkv.transfer._handle

__all__ = ["DEFAULT_CHUNK_BYTES", "DEFAULT_IDLE_BYTES", "RowCache", "StagingRing"]

DEFAULT_CHUNK_BYTES = 4 << 20
"""Bytes per chunk: within a core's share of the CPU's caches (a chunk is checked and scattered while
it is still there), and large enough that its fixed costs — one backend read, one scatter call, about
0.1-0.2 ms — stay a few percent of moving its bytes. Measured on the file-store benchmark's loads
(CPU time per load, medians): 256 KiB 66 ms, 1 MiB 49 ms, 2 MiB 41 ms, 4 MiB 39 ms, 16 MiB 41 ms."""

DEFAULT_IDLE_BYTES = 1 << 30
"""At most this many bytes of returned save rows are kept for reuse (more are freed): as many as a background
writer may hold in flight (``capkv.stores._writer.DEFAULT_PENDING_BYTES``), so a burst of saves that fit in
flight finds its rows again next time. At 256 MiB one 4,096-token request of an 8B-shaped model (512 MiB of
rows) gathered into fresh memory every time: measured, the second of two 128 MiB gathers took 410-420 ms
instead of 40-100 ms (page faults on first touch)."""

_GRAIN = 1 << 20
"""Buffers are sized in steps of this (smaller ones in powers of two), so a buffer serves saves of
nearby sizes."""


class _Slot:
    __slots__ = ("busy", "memory", "rows")

    def __init__(self) -> None:
        self.rows = cast("torch.Tensor | None", None)
        self.memory = memoryview(b"")
        self.busy = cast("capkv.transfer._handle.CopyHandle | None", None)


class StagingRing:
    """``slots`` reusable host buffers of at least ``chunk_nbytes`` each, taken in turn.

    ``allocate(nbytes)`` makes one buffer (a 1-D ``uint8`` CPU tensor); a slot
    grows (once) when a single value does not fit in a chunk.
    """

    __slots__ = ("_allocate", "_next", "_slots", "chunk_nbytes")

    def __init__(
        self, allocate: Callable[[int], torch.Tensor], *, slots: int = 2, chunk_nbytes: int = DEFAULT_CHUNK_BYTES
    ) -> None:
        self._allocate = allocate
        self.chunk_nbytes = chunk_nbytes
        self._slots = [_Slot() for _ in range(max(1, slots))]
        self._next = 0

    def rows_per_chunk(self, row_nbytes: int) -> int:
        """How many rows of ``row_nbytes`` one chunk holds (at least one)."""
        return max(1, self.chunk_nbytes // row_nbytes)

    def take(self, count: int, row_nbytes: int) -> tuple[torch.Tensor, memoryview]:
        """The next slot as ``count`` rows of ``row_nbytes`` (a ``(count, row_nbytes)`` view) and the
        memoryview of its bytes, once the copy that last read it has completed. Mark the copy that
        reads it now with :meth:`hold`."""
        slot = self._slots[self._next]
        self._next = (self._next + 1) % len(self._slots)
        if slot.busy is not None:
            slot.busy.wait()
            slot.busy = None
        nbytes = count * row_nbytes
        rows = slot.rows
        if rows is None or rows.numel() < nbytes:
            rows = slot.rows = self._allocate(max(nbytes, self.chunk_nbytes))
            slot.memory = row_memory(rows)
        return rows[:nbytes].view(count, row_nbytes), slot.memory

    def hold(self, handle: capkv.transfer._handle.CopyHandle) -> None:
        """The slot taken last is read by ``handle``'s copy: the next :meth:`take` of it waits for it."""
        self._slots[self._next - 1].busy = handle

    def clear(self) -> None:
        """Drop the buffers (after waiting for the copies that read them)."""
        for slot in self._slots:
            if slot.busy is not None:
                slot.busy.wait()
            slot.busy, slot.rows, slot.memory = None, None, memoryview(b"")


class RowCache:
    """Host buffers for saves: :meth:`rows` takes one (an idle one that fits, or a new one from
    ``allocate(nbytes)``, a 1-D ``uint8`` CPU tensor); :meth:`give` returns it once nothing reads it
    any more (from any thread). Idle buffers beyond ``idle_nbytes`` are freed, oldest first."""

    __slots__ = ("_allocate", "_free", "_idle", "_lock", "idle_nbytes")

    def __init__(self, allocate: Callable[[int], torch.Tensor], *, idle_nbytes: int = DEFAULT_IDLE_BYTES) -> None:
        self._allocate = allocate
        self.idle_nbytes = idle_nbytes
        self._free = cast("list[torch.Tensor]", [])
        """Idle buffers, oldest first."""
        self._idle = 0
        self._lock = threading.Lock()

    def rows(self, count: int, row_nbytes: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``count`` rows of ``row_nbytes`` (a ``(count, row_nbytes)`` view) and the buffer they are in
        (for :meth:`give`): the smallest idle buffer that holds them and is at most twice their size."""
        nbytes = count * row_nbytes
        size = _sized(nbytes)
        buffer = cast("torch.Tensor | None", None)
        with self._lock:
            fits = [(free.numel(), index) for index, free in enumerate(self._free) if size <= free.numel() <= 2 * size]
            if fits:
                buffer = self._free.pop(min(fits)[1])
                self._idle -= buffer.numel()
        if buffer is None:
            buffer = self._allocate(size)
        return buffer[:nbytes].view(count, row_nbytes), buffer

    def give(self, buffer: torch.Tensor) -> None:
        """``buffer`` (from :meth:`rows`) is free: nothing reads or writes it any more."""
        with self._lock:
            self._free.append(buffer)
            self._idle += buffer.numel()
            while self._idle > self.idle_nbytes:
                self._idle -= self._free.pop(0).numel()

    def clear(self) -> None:
        with self._lock:
            self._free, self._idle = [], 0


def _sized(nbytes: int) -> int:
    """The buffer size that serves ``nbytes``: the next power of two up to :data:`_GRAIN`, then the
    next multiple of it."""
    if nbytes <= _GRAIN:
        return max(64, 1 << (nbytes - 1).bit_length())
    return -(-nbytes // _GRAIN) * _GRAIN
