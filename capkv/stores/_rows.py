"""Host rows a store reuses: the buffers its loads read into and its saves gather into.

A fresh buffer per move costs more than its copy on a busy step — page faults
on CPU, a pinned allocation on CUDA — so a store takes rows from here and gives
them back once nothing reads them any more (a save once it landed, a load once
its scatter completed). A buffer is handed out whole or as its first rows, one
user at a time; at most ``limit_bytes`` of idle buffers are kept.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    import torch

    import capkv.transfer._copier

__all__ = ["DEFAULT_KEPT_BYTES", "RowCache"]

DEFAULT_KEPT_BYTES = 256 << 20
"""Idle buffers kept for reuse, at most."""


class RowCache:
    """Idle host-row buffers, by row width."""

    def __init__(self, limit_bytes: int = DEFAULT_KEPT_BYTES) -> None:
        self._limit = limit_bytes
        self._idle = cast("dict[int, list[torch.Tensor]]", {})
        self._idle_bytes = 0
        self._lock = threading.Lock()

    def take(self, copier: capkv.transfer._copier.BlockCopier, count: int, width: int) -> torch.Tensor:
        """A buffer of at least ``count`` rows of ``width`` bytes (only the first ``count`` are to be used)."""
        with self._lock:
            idle = self._idle.get(width, [])
            fitting = [index for index, buffer in enumerate(idle) if buffer.shape[0] >= count]
            if fitting:
                buffer = idle.pop(min(fitting, key=lambda index: idle[index].shape[0]))
                self._idle_bytes -= buffer.numel()
                return buffer
        return copier.host_rows(count, width)

    def give(self, buffer: torch.Tensor) -> None:
        """``buffer`` (as :meth:`take` returned it) is no longer read or written."""
        with self._lock:
            if self._idle_bytes + buffer.numel() > self._limit:
                return
            self._idle.setdefault(buffer.shape[1], []).append(buffer)
            self._idle_bytes += buffer.numel()

    def clear(self) -> None:
        with self._lock:
            self._idle.clear()
            self._idle_bytes = 0
