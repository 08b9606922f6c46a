"""The writes of one load into the engine's KV cache, which stop for good once the load is given up.

A load given up past a bound is reported failed and the engine moves on: a write that landed later would
corrupt blocks it recomputes (docs/internals.md, "Loads off the engine's step").
"""

from __future__ import annotations

import threading
from collections.abc import Generator
from contextlib import contextmanager
from types import TracebackType
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    import capkv.transfer._handle

__all__ = ["LoadAbandoned", "WriteGuard"]


class LoadAbandoned(Exception):
    """Raised into a load's own thread when it tries to write into the KV cache after it was given up."""


class WriteGuard:
    """``with guard:`` around each write of one load into the KV cache (a scatter, or a read into the
    blocks themselves); :meth:`abandon` ends them. Copies a write queued (a CUDA scatter) are kept
    with :meth:`keep`, and waited for by :meth:`abandon`."""

    __slots__ = ("_abandoned", "_copies", "_lock", "_reading")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._abandoned = False
        self._reading = False
        self._copies = cast("list[capkv.transfer._handle.CopyHandle]", [])

    @property
    def abandoned(self) -> bool:
        return self._abandoned

    def __enter__(self) -> None:
        self._lock.acquire()
        if self._abandoned:
            self._lock.release()
            raise LoadAbandoned

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self._lock.release()

    @contextmanager
    def reading(self) -> Generator[None]:
        """``with guard.reading():`` around a backend read straight into the KV cache: a write that lasts as
        long as the backend takes (a hung disk: for ever), which :meth:`abandon` does not wait for."""
        with self:
            self._reading = True
            try:
                yield
            finally:
                self._reading = False

    def keep(self, copy: capkv.transfer._handle.CopyHandle) -> None:
        """A copy into the KV cache that a write queued and that may still run (call inside ``with``)."""
        if not copy.done():
            self._copies.append(copy)

    def abandon(self, timeout_s: float) -> bool:
        """Give the load up, once no write is under way (waiting at most ``timeout_s`` for one to end) and
        every copy a write queued has completed; ``False``: a write is still under way (a read into the
        blocks themselves, stuck in the backend), and the load is not given up."""
        if self._reading or not self._lock.acquire(timeout=max(0.0, timeout_s)):
            return False
        try:
            self._abandoned = True
            copies, self._copies = self._copies, cast("list[capkv.transfer._handle.CopyHandle]", [])
        finally:
            self._lock.release()
        for copy in copies:
            copy.wait()
        return True
