"""Host rows a store reuses: a load's ring waits for the copy that last read a slot; saves' rows come back bounded."""

from __future__ import annotations

from collections.abc import Callable

import torch

from capkv.stores._staging import RowCache, StagingRing


class _Copy:
    """A copy handle that finishes when the test says so, and counts the waits on it."""

    def __init__(self) -> None:
        self.finished = False
        self.waits = 0

    def done(self) -> bool:
        return self.finished

    def wait(self) -> None:
        self.waits += 1
        self.finished = True

    def stream_wait(self) -> None:
        self.wait()


def _allocator(log: list[int]) -> Callable[[int], torch.Tensor]:
    def allocate(nbytes: int) -> torch.Tensor:
        log.append(nbytes)
        return torch.empty(nbytes, dtype=torch.uint8)

    return allocate


def test_the_ring_reuses_its_slots_and_waits_for_the_copy_that_read_one() -> None:
    allocated: list[int] = []
    ring = StagingRing(_allocator(allocated), slots=2, chunk_nbytes=1024)
    assert ring.rows_per_chunk(100) == 10 and ring.rows_per_chunk(4096) == 1
    first, _ = ring.take(10, 100)
    copy = _Copy()
    ring.hold(copy)
    second, _ = ring.take(10, 100)
    assert copy.waits == 0  # the other slot: nothing to wait for
    again, memory = ring.take(4, 100)
    assert copy.waits == 1  # the first slot, once its copy is over
    assert again.data_ptr() == first.data_ptr() != second.data_ptr() and len(memory) == 1024
    assert allocated == [1024, 1024]
    big, memory = ring.take(1, 4096)  # one value larger than a chunk: the slot grows, once
    assert big.shape == (1, 4096) and len(memory) == 4096 and allocated == [1024, 1024, 4096]
    ring.clear()


def test_the_row_cache_hands_back_returned_buffers_of_a_fitting_size_only() -> None:
    allocated: list[int] = []
    cache = RowCache(_allocator(allocated), idle_nbytes=8 << 20)
    rows, buffer = cache.rows(10, 1000)
    assert rows.shape == (10, 1000) and allocated == [16384]  # sized up to a power of two below 1 MiB
    _, other = cache.rows(10, 1000)  # the first is still out: a new one
    assert allocated == [16384, 16384] and other.data_ptr() != buffer.data_ptr()
    cache.give(buffer)
    reused, same = cache.rows(12, 1000)
    assert same.data_ptr() == buffer.data_ptr() and reused.data_ptr() == buffer.data_ptr() and len(allocated) == 2
    cache.give(same)
    cache.rows(1, 100)  # far smaller: a buffer more than twice its size is not handed out
    assert allocated[-1] == 128
    cache.rows(3, 1 << 20)
    assert allocated[-1] == 3 << 20  # whole MiBs above 1 MiB


def test_the_row_cache_keeps_at_most_its_bound_of_idle_bytes() -> None:
    cache = RowCache(_allocator([]), idle_nbytes=3 << 20)
    buffers = [cache.rows(1, 1 << 20)[1] for _ in range(5)]
    for buffer in buffers:
        cache.give(buffer)
    assert sum(b.numel() for b in cache._free) == 3 << 20  # the oldest were freed
    assert [b.data_ptr() for b in cache._free] == [b.data_ptr() for b in buffers[2:]]
