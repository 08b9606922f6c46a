"""The CUDA path: copies on a side stream, staged through bounded device memory.

An event marks completion, so the host never blocks on a save and loads are ordered by a stream wait, not a
host sync.
"""

from __future__ import annotations

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


class CudaCopies:
    """Asynchronous copies between device planes and host rows."""

    __slots__ = ("_device", "_stage", "_staging_nbytes", "_stream")

    def __init__(self, device: torch.device, staging_nbytes: int = DEFAULT_STAGING_BYTES) -> None:
        self._device = device
        self._stream = torch.cuda.Stream(device=device)  # type: ignore[no-untyped-call]
        self._staging_nbytes = staging_nbytes
        self._stage: torch.Tensor | None = None

    def _staging(self, rows: torch.Tensor) -> torch.Tensor:
        """A dense device buffer shaped like ``rows``; call under the side stream."""
        nbytes = rows.numel() * rows.element_size()
        if self._stage is None or self._stage.numel() < nbytes:
            self._stage = torch.empty(nbytes, dtype=torch.uint8, device=self._device)
        return self._stage[:nbytes].view(rows.dtype).view(rows.shape)

    def _spans(self, rows: torch.Tensor) -> list[tuple[int, int]]:
        block_nbytes = rows[0].numel() * rows.element_size() if rows.shape[0] else 0
        return chunk_spans(rows.shape[0], block_nbytes, self._staging_nbytes)

    def gather(self, runs: GroupRuns, word: int, ids: torch.Tensor, rows: torch.Tensor) -> CopyHandle:
        planes = runs.planes(word)
        producer = torch.cuda.current_stream(self._device)
        ids_host = ids.pin_memory()
        with torch.cuda.stream(self._stream):
            self._stream.wait_stream(producer)
            ids_dev = ids_host.to(self._device, non_blocking=True)
            for start, stop in self._spans(rows):
                stage = self._staging(rows[start:stop])
                for index, plane in enumerate(planes):
                    torch.index_select(plane, 0, ids_dev[start:stop], out=stage[:, index])
                copy_rows(rows[start:stop], stage)
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            event.record(self._stream)
        return CudaEventCopy(event, self._device, (ids_host, ids_dev, rows))

    def scatter(self, runs: GroupRuns, word: int, ids: torch.Tensor, rows: torch.Tensor) -> CopyHandle:
        planes = runs.planes(word)
        producer = torch.cuda.current_stream(self._device)
        ids_host = ids.pin_memory()
        with torch.cuda.stream(self._stream):
            # Kernels already queued may still read the destination blocks' old contents.
            self._stream.wait_stream(producer)
            ids_dev = ids_host.to(self._device, non_blocking=True)
            for start, stop in self._spans(rows):
                stage = self._staging(rows[start:stop])
                copy_rows(stage, rows[start:stop])
                for index, plane in enumerate(planes):
                    plane.index_copy_(0, ids_dev[start:stop], stage[:, index])
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            event.record(self._stream)
        return CudaEventCopy(event, self._device, (ids_host, ids_dev, rows))
