"""How each member of the connector contract reaches a stack's children.

The behaviour behind :class:`~capkv.MultiConnector`, whose own module holds only its typed construction.
"""

from __future__ import annotations

from capkv.composite._scheduler_side import SchedulerSide
from capkv.composite._worker_side import WorkerSide

__all__ = ["StackRuntime"]


class StackRuntime(SchedulerSide, WorkerSide):
    """The run-time behaviour of a stack: load from the first child with a hit, save to all."""

    __slots__ = ()

    hma_by_children = True  # built as its HMA variant exactly when every child is HMA-capable
