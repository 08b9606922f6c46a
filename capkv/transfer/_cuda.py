"""The CUDA path: copies on a side stream, staged through bounded device memory.

An event marks completion, so the host never blocks on a save and loads are ordered by a stream wait, not a
host sync. Each thread that copies has its own side stream and staging buffer: no scratch is shared across
threads (docs/internals.md, "The CUDA path").
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from capkv.transfer._handle import CopyHandle, CudaEventCopy
from capkv.transfer._layout import GroupRuns

if TYPE_CHECKING:
    import torch
else:  # torch loads with the first tensor operation, not with this module
    from capkv._torch import torch

__all__ = ["DEFAULT_STAGING_BYTES", "CudaCopies", "chunk_spans"]

DEFAULT_STAGING_BYTES = 64 << 20


def chunk_spans(num_blocks: int, block_nbytes: int, staging_nbytes: int) -> list[tuple[int, int]]:
    """``[start, stop)`` spans of at most ``staging_nbytes`` worth of blocks (at least one block each)."""
    per_chunk = max(1, staging_nbytes // max(1, block_nbytes))
    return [(start, min(num_blocks, start + per_chunk)) for start in range(0, num_blocks, per_chunk)]


def copy_rows(dst: torch.Tensor, src: torch.Tensor) -> None:
    """Non-blocking copy of ``(n, runs, width)`` rows across devices.

    One copy when both sides are dense; otherwise one per row (each row is
    dense), so a strided host view never forces a hidden synchronous detour.
    """
    if dst.is_contiguous() and src.is_contiguous():
        dst.copy_(src, non_blocking=True)
        return
    for row in range(dst.shape[0]):
        dst[row].copy_(src[row], non_blocking=True)


class _Lane:
    """One thread's side stream and staging buffer."""

    __slots__ = ("stage", "stream")

    def __init__(self, stream: torch.cuda.Stream) -> None:
        self.stream = stream
        self.stage: torch.Tensor | None = None


class CudaCopies:
    """Asynchronous copies between device planes and host rows, from any thread (a lane per thread:
    up to ``staging_nbytes`` of device memory each)."""

    __slots__ = ("_device", "_lanes", "_staging_nbytes")

    def __init__(self, device: torch.device, staging_nbytes: int = DEFAULT_STAGING_BYTES) -> None:
        self._device = device
        self._staging_nbytes = staging_nbytes
        self._lanes = threading.local()

    def _lane(self) -> _Lane:
        """The calling thread's lane, made on its first copy."""
        lane: _Lane | None = getattr(self._lanes, "lane", None)
        if lane is None:
            lane = self._lanes.lane = _Lane(torch.cuda.Stream(device=self._device))  # type: ignore[no-untyped-call]
        return lane

    def _staging(self, lane: _Lane, rows: torch.Tensor) -> torch.Tensor:
        """A dense device buffer shaped like ``rows``, the lane's own; call under the lane's stream."""
        nbytes = rows.numel() * rows.element_size()
        if lane.stage is None or lane.stage.numel() < nbytes:
            lane.stage = torch.empty(nbytes, dtype=torch.uint8, device=self._device)
        return lane.stage[:nbytes].view(rows.dtype).view(rows.shape)

    def _spans(self, rows: torch.Tensor) -> list[tuple[int, int]]:
        block_nbytes = rows[0].numel() * rows.element_size() if rows.shape[0] else 0
        return chunk_spans(rows.shape[0], block_nbytes, self._staging_nbytes)

    def gather(self, runs: GroupRuns, word: int, ids: torch.Tensor, rows: torch.Tensor) -> CopyHandle:
        planes = runs.planes(word)
        lane = self._lane()
        producer = torch.cuda.current_stream(self._device)
        ids_host = ids.pin_memory()
        with torch.cuda.stream(lane.stream):
            lane.stream.wait_stream(producer)
            ids_dev = ids_host.to(self._device, non_blocking=True)
            for start, stop in self._spans(rows):
                stage = self._staging(lane, rows[start:stop])
                for index, plane in enumerate(planes):
                    torch.index_select(plane, 0, ids_dev[start:stop], out=stage[:, index])
                copy_rows(rows[start:stop], stage)
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            event.record(lane.stream)
        return CudaEventCopy(event, self._device, (ids_host, ids_dev, rows))

    def scatter(self, runs: GroupRuns, word: int, ids: torch.Tensor, rows: torch.Tensor) -> CopyHandle:
        planes = runs.planes(word)
        lane = self._lane()
        producer = torch.cuda.current_stream(self._device)
        ids_host = ids.pin_memory()
        with torch.cuda.stream(lane.stream):
            # Kernels already queued may still read the destination blocks' old contents.
            lane.stream.wait_stream(producer)
            ids_dev = ids_host.to(self._device, non_blocking=True)
            for start, stop in self._spans(rows):
                stage = self._staging(lane, rows[start:stop])
                copy_rows(stage, rows[start:stop])
                for index, plane in enumerate(planes):
                    plane.index_copy_(0, ids_dev[start:stop], stage[:, index])
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            event.record(lane.stream)
        return CudaEventCopy(event, self._device, (ids_host, ids_dev, rows))
