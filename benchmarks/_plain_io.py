"""Plain file I/O of the same bytes a store moves, several honest ways, so a benchmark compares with the best.

A store's load lands values in the engine's KV tensors (CPU memory that torch allocated and the engine
touched); its save writes values and fsyncs. A baseline that reads into a fresh ``bytearray`` or writes
in one odd way is not the limit, so each side here has a few strategies — large sequential
``readinto``/``write``, ``preadv``/``pwritev`` one value a call, and one call over many values —
into (from) a CPU tensor allocated and touched beforehand, and the benchmark takes the fastest of them
round by round. Every strategy returns the bytes it moved and really moves them: the smoke test checks
the destination (the file) holds the source's bytes after each.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import xxhash

from capkv.stores._host import row_memory

__all__ = [
    "IOV_MAX", "Strategy", "best_strategy", "paged_reads", "pinned_copies", "read_strategies", "timed_rounds", "write_strategies",
]

IOV_MAX = min(1024, getattr(os, "IOV_MAX", 1024))
_CALL_LIMIT = 1 << 30
"""Bytes per system call at most (Linux moves under 2 GiB a call)."""

Strategy = Callable[[], int]
"""Moves the bytes once; returns how many it moved."""


def _views(memory: memoryview, value_nbytes: int) -> list[memoryview]:
    return [memory[start : start + value_nbytes] for start in range(0, len(memory), value_nbytes)]


def _preadv_all(descriptor: int, views: list[memoryview], per_call: int) -> int:
    """``preadv`` the file from offset 0 into ``views`` in order, ``per_call`` views (and under 1 GiB) a call."""
    offset = 0
    index = 0
    while index < len(views):
        batch: list[memoryview] = []
        size = 0
        while index < len(views) and len(batch) < per_call and size + len(views[index]) <= _CALL_LIMIT:
            batch.append(views[index])
            size += len(views[index])
            index += 1
        got = os.preadv(descriptor, batch, offset)
        if got != size:
            raise OSError(f"short read: {got} of {size} bytes at offset {offset}")
        offset += got
    return offset


def read_strategies(path: Path, destination: torch.Tensor, value_nbytes: int) -> dict[str, Strategy]:
    """Ways to read ``path``'s first ``destination.numel()`` bytes into ``destination`` (a contiguous CPU
    ``uint8`` tensor, touched already): in chunks with ``readinto``, one value per ``preadv``, and
    :data:`IOV_MAX` values per ``preadv``."""
    memory = row_memory(destination)
    views = _views(memory, value_nbytes)

    def readinto(chunk: int) -> Strategy:
        def run() -> int:
            with open(path, "rb", buffering=0) as file:
                got = 0
                while got < len(memory):
                    count = file.readinto(memory[got : got + chunk])
                    if not count:
                        raise OSError(f"{path} ended after {got} of {len(memory)} bytes")
                    got += count
                return got

        return run

    def preadv(per_call: int) -> Strategy:
        def run() -> int:
            descriptor = os.open(path, os.O_RDONLY)
            try:
                return _preadv_all(descriptor, views, per_call)
            finally:
                os.close(descriptor)

        return run

    return {
        "readinto 1 MiB chunks": readinto(1 << 20),
        "readinto 16 MiB chunks": readinto(16 << 20),
        "preadv one value a call": preadv(1),
        f"preadv {IOV_MAX} values a call": preadv(IOV_MAX),
    }


def paged_reads(path: Path, parts: list[list[memoryview]]) -> dict[str, Strategy]:
    """References, not baselines: ``path`` read one value per ``preadv`` straight into the engine's blocks
    (``parts[i]``: value ``i``'s runs in the paged KV cache, as a store's load lands it), without and with
    XXH3-128 over each value as it lands. They split a load's gap to the best plain read into what the
    paged layout costs (scattered runs instead of one contiguous buffer), what integrity costs, and what
    is left: the store's bookkeeping."""
    sizes = [sum(len(part) for part in value) for value in parts]
    offsets = [sum(sizes[:index]) for index in range(len(sizes))]

    def run(hashed: bool) -> Strategy:
        def read() -> int:
            descriptor = os.open(path, os.O_RDONLY)
            try:
                got = 0
                for value, offset in zip(parts, offsets, strict=True):
                    got += os.preadv(descriptor, value, offset)
                    if hashed:
                        state = xxhash.xxh3_128()
                        for part in value:
                            state.update(part)
                        state.digest()
                return got
            finally:
                os.close(descriptor)

        return read

    return {"preadv one value a call into the paged blocks": run(False), "the same + XXH3-128 per value": run(True)}


def pinned_copies(nbytes: int, device: torch.device) -> dict[str, Strategy]:
    """References for a KV cache on a GPU: ``nbytes`` copied from pinned host memory to the device, and back
    (each finished before it returns): what a load and a save must move across the bus at least."""
    host = torch.ones(nbytes, dtype=torch.uint8, pin_memory=True)
    on_device = torch.empty(nbytes, dtype=torch.uint8, device=device)

    def copy(into: torch.Tensor, source: torch.Tensor) -> Strategy:
        def run() -> int:
            into.copy_(source, non_blocking=True)
            torch.cuda.synchronize(device)
            return source.numel()

        return run

    return {"host -> device, pinned": copy(on_device, host), "device -> host, pinned": copy(host, on_device)}


def write_strategies(path: Path, source: torch.Tensor, value_nbytes: int) -> dict[str, Strategy]:
    """Ways to write ``source`` (a contiguous CPU ``uint8`` tensor) to a new file at ``path`` and fsync it:
    sequential ``write`` in chunks, one value per ``pwritev``, :data:`IOV_MAX` values per ``pwritev``.
    Each run writes a new file (the last run's is removed first, as a store writes new packs), fsyncs and
    closes it."""
    memory = row_memory(source)
    views = _views(memory, value_nbytes)

    def write(chunk: int) -> Strategy:
        def run() -> int:
            descriptor = _create(path)
            try:
                done = 0
                while done < len(memory):
                    done += os.write(descriptor, memory[done : done + chunk])
                os.fsync(descriptor)
                return done
            finally:
                os.close(descriptor)

        return run

    def pwritev(per_call: int) -> Strategy:
        def run() -> int:
            descriptor = _create(path)
            try:
                offset = 0
                for start in range(0, len(views), per_call):
                    batch = views[start : start + per_call]
                    size = sum(len(view) for view in batch)
                    written = os.pwritev(descriptor, batch, offset)
                    if written != size:  # a regular file takes it all, short of a full disk
                        raise OSError(f"short write: {written} of {size} bytes")
                    offset += written
                os.fsync(descriptor)
                return offset
            finally:
                os.close(descriptor)

        return run

    return {
        "write 1 MiB chunks": write(1 << 20),
        "write 16 MiB chunks": write(16 << 20),
        "pwritev one value a call": pwritev(1),
        f"pwritev {IOV_MAX} values a call": pwritev(IOV_MAX),
    }


def _create(path: Path) -> int:
    path.unlink(missing_ok=True)
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)


def timed_rounds(
    strategies: dict[str, Strategy], expected: int, *, first: int = 0, before: Callable[[], object] | None = None
) -> tuple[dict[str, float], dict[str, float]]:
    """Each strategy run once, in turn from the ``first``-th (rotate it round by round: whichever runs
    first meets another page cache), ``before`` each (untimed): wall seconds and CPU seconds (the process's)
    per strategy. One that moves other than ``expected`` bytes is refused (a baseline that moves less would
    look fast)."""
    wall: dict[str, float] = {}
    cpu: dict[str, float] = {}
    names = list(strategies)
    first %= len(names)
    for name in names[first:] + names[:first]:
        strategy = strategies[name]
        if before is not None:
            before()
        started, cpu_started = time.perf_counter(), time.process_time()
        moved = strategy()
        wall[name], cpu[name] = time.perf_counter() - started, time.process_time() - cpu_started
        if moved != expected:
            raise RuntimeError(f"baseline {name!r} moved {moved} bytes, not {expected}")
    return wall, cpu


def best_strategy(rounds: list[dict[str, float]]) -> str:
    """The strategy with the lowest median seconds over ``rounds`` (not the fastest of each round: the least
    of several noisy samples would flatter the baseline against the one sample of the thing measured)."""
    return min(rounds[0], key=lambda name: statistics.median(times[name] for times in rounds))
