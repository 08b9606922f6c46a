"""Completion of a block copy, however the device runs it.

One small interface for a CPU copy (done when the call returns) and a CUDA one (done later), so connectors are
written once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

from capkv._homes import publish

if TYPE_CHECKING:
    import torch
else:  # torch loads with the first tensor operation, not with this module
    from capkv._torch import torch

__all__ = ["FINISHED", "AllCopies", "CopyHandle", "CudaEventCopy", "FinishedCopy", "all_of"]


@runtime_checkable
class CopyHandle(Protocol):
    """A block copy that was started."""

    def done(self) -> bool:
        """Whether the copy has completed (never blocks)."""
        ...

    def wait(self) -> None:
        """Block the calling thread until the copy has completed."""
        ...

    def stream_wait(self) -> None:
        """Order the device's current stream after the copy, without blocking the host."""
        ...


class FinishedCopy:
    """A copy that completed before its call returned (the CPU path)."""

    __slots__ = ()

    def done(self) -> bool:
        return True

    def wait(self) -> None:
        return None

    def stream_wait(self) -> None:
        return None


FINISHED = FinishedCopy()


class CudaEventCopy:
    """A copy queued on a CUDA stream, completed when its event is.

    Holds the tensors the queued work still reads or writes (pinned host
    buffers, index tensors) until the event has completed, so the caching
    allocators cannot hand their memory out from under the copy.
    """

    __slots__ = ("_device", "_event", "_keepalive")

    def __init__(
        self, event: torch.cuda.Event, device: torch.device, keepalive: tuple[torch.Tensor, ...]
    ) -> None:
        self._event = event
        self._device = device
        self._keepalive: tuple[torch.Tensor, ...] | None = keepalive

    def done(self) -> bool:
        if self._keepalive is None:
            return True
        if not self._event.query():  # type: ignore[no-untyped-call]
            return False
        self._keepalive = None
        return True

    def wait(self) -> None:
        self._event.synchronize()
        self._keepalive = None

    def stream_wait(self) -> None:
        torch.cuda.current_stream(self._device).wait_event(self._event)


class AllCopies:
    """Several copies that complete together, as one handle."""

    __slots__ = ("_handles",)

    def __init__(self, handles: tuple[CopyHandle, ...]) -> None:
        self._handles = handles

    def done(self) -> bool:
        return all(handle.done() for handle in self._handles)

    def wait(self) -> None:
        for handle in self._handles:
            handle.wait()

    def stream_wait(self) -> None:
        for handle in self._handles:
            handle.stream_wait()


def all_of(handles: list[CopyHandle]) -> CopyHandle:
    """One handle for ``handles`` (the handle itself when there is one)."""
    if not handles:
        return FINISHED
    if len(handles) == 1:
        return handles[0]
    return AllCopies(tuple(handles))


publish(__name__)
