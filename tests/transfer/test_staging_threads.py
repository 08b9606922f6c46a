"""The CUDA copier shares no scratch across threads: a load on the reader thread and a save on the step's
thread, interleaved at their worst, each move their own bytes (issue 35, defect 4).

No GPU here: CUDA's streams and events are stubbed on CPU (work runs at once, in the calling thread),
which keeps what matters — the order in which two threads touch device memory — and makes the
interleaving deterministic: one thread is held between two copies until the other has done all of its.
Where a GPU is present, ``test_concurrent_loads_and_saves_on_a_device`` runs the same on a real one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch

import capkv.transfer._cuda as cuda_path
from capkv.transfer import BlockCopier
from capkv.transfer._cuda import CudaCopies
from tests.paged import Group, empty_caches, make_spec, randomize

SPEC = make_spec([Group(16)], num_blocks=16)
WAIT_S = 10.0


class _Stream(torch.cuda.Stream):
    """A stream whose work has run by the time it is queued (a CPU build's ``torch.cuda.Stream`` is a
    stand-in class: this makes one without a device)."""

    def __new__(cls, *args: object, **kwargs: object) -> _Stream:
        return object.__new__(cls)

    def __init__(self, *args: object, **kwargs: object) -> None: ...
    def wait_stream(self, stream: object) -> None: ...
    def wait_event(self, event: object) -> None: ...


class _Event(torch.cuda.Event):
    """An event that has happened."""

    def __new__(cls, *args: object, **kwargs: object) -> _Event:
        return object.__new__(cls)

    def __init__(self, *args: object, **kwargs: object) -> None: ...
    def record(self, stream: object = None) -> None: ...
    def query(self) -> bool:
        return True
    def synchronize(self) -> None: ...


class _Cuda:
    """``torch.cuda`` on a CPU: a stream runs its work at once, in the thread that queues it."""

    Event = _Event

    @staticmethod
    def Stream(device: object = None) -> _Stream:  # noqa: N802 (torch's name)
        return _Stream()

    @staticmethod
    def current_stream(device: object = None) -> _Stream:
        return _Stream()

    @staticmethod
    @contextmanager
    def stream(stream: object) -> Iterator[None]:
        yield


class _Torch:
    """The CUDA path's ``torch``, with :class:`_Cuda` for ``torch.cuda``."""

    cuda = _Cuda

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)


@pytest.fixture
def copiers(monkeypatch: pytest.MonkeyPatch) -> tuple[BlockCopier, BlockCopier]:
    """A copier over a CPU KV cache that takes the CUDA path (side streams, staging) with stubbed streams,
    and one over the same cache that reads it the plain CPU way."""
    monkeypatch.setattr(cuda_path, "torch", _Torch())
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self: self)
    caches = empty_caches(SPEC)
    randomize(caches, seed=35)
    stubbed = BlockCopier(SPEC, caches)
    stubbed._copies = CudaCopies(torch.device("cpu"))
    return stubbed, BlockCopier(SPEC, caches)


def _blocks(reference: BlockCopier, ids: list[int]) -> torch.Tensor:
    """The bytes of blocks ``ids``, as rows."""
    rows = reference.host_rows(len(ids), reference.block_nbytes(0))
    reference.gather(0, ids, rows)
    return rows


def _hold_at_copy(monkeypatch: pytest.MonkeyPatch, other: Callable[[], None], *, after: bool) -> None:
    """The calling thread's first host<->device copy is held (just before it, or just ``after``) until
    ``other()`` ran whole, in another thread."""
    original = cuda_path.copy_rows
    holder = threading.current_thread()
    held = [False]

    def run_other() -> None:
        runner = threading.Thread(target=other)
        runner.start()
        runner.join(WAIT_S)
        assert not runner.is_alive(), "the other copy never finished"

    def copy_rows(dst: torch.Tensor, src: torch.Tensor) -> None:
        hold = threading.current_thread() is holder and not held[0]
        held[0] = held[0] or hold
        if hold and not after:
            run_other()
        original(dst, src)
        if hold and after:
            run_other()

    monkeypatch.setattr(cuda_path, "copy_rows", copy_rows)


@pytest.mark.parametrize("held", ["save", "load"])
def test_a_load_and_a_save_on_two_threads_each_move_their_own_bytes(
    held: str, copiers: tuple[BlockCopier, BlockCopier], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``held="save"``: the save is held between gathering into staging and copying staging out, while the
    load runs whole; ``"load"``: the load is held between copying its rows into staging and scattering
    staging into its blocks, while the save runs whole."""
    copier, reference = copiers
    saved_ids, loaded_ids = [1, 2, 3], [7, 8, 9]
    expected = _blocks(reference, saved_ids)
    incoming = torch.randint(0, 256, expected.shape, dtype=torch.uint8)
    rows = copier.host_rows(len(saved_ids), copier.block_nbytes(0))

    def save() -> None:
        copier.gather(0, saved_ids, rows).wait()

    def load() -> None:
        copier.scatter(0, loaded_ids, incoming).wait()

    first, other = (save, load) if held == "save" else (load, save)
    _hold_at_copy(monkeypatch, other, after=held == "load")
    first()
    assert torch.equal(rows, expected), "the save took the load's bytes for its own blocks"
    assert torch.equal(_blocks(reference, loaded_ids), incoming), "the load wrote the save's bytes into its blocks"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (the CPU tests above stub it)")
def test_concurrent_loads_and_saves_on_a_device() -> None:
    caches = empty_caches(SPEC, device="cuda")
    randomize(caches, seed=36)
    copier = BlockCopier(SPEC, caches)
    host = {name: tensor.cpu() for name, tensor in caches.items()}
    reference = BlockCopier(SPEC, host)
    saved_ids, loaded_ids = [1, 2, 3, 4], [9, 10, 11, 12]
    expected = reference.host_rows(len(saved_ids), reference.block_nbytes(0))
    reference.gather(0, saved_ids, expected)
    incoming = copier.host_rows(len(loaded_ids), copier.block_nbytes(0))
    incoming.copy_(torch.randint(0, 256, incoming.shape, dtype=torch.uint8))
    failures: list[str] = []

    def loads() -> None:
        for _ in range(200):
            copier.scatter(0, loaded_ids, incoming).wait()

    loader = threading.Thread(target=loads)
    loader.start()
    for _ in range(200):
        rows = copier.host_rows(len(saved_ids), copier.block_nbytes(0))
        copier.gather(0, saved_ids, rows).wait()
        if not torch.equal(rows, expected):
            failures.append("a save took another thread's bytes")
    loader.join(60)
    assert not failures and not loader.is_alive()
    after = copier.host_rows(len(loaded_ids), copier.block_nbytes(0))
    copier.gather(0, loaded_ids, after).wait()
    assert torch.equal(after, incoming)
