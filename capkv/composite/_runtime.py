"""How each member of the connector contract reaches a stack's children.

:class:`StackRuntime` is the behaviour behind :class:`~capkv.MultiConnector`
(whose own module holds only its typed construction): the scheduler-side and
worker-side members over the shared state. Every fan-out calls every child,
even when one raises, and then raises one error (:mod:`capkv.composite._fanout`).
"""

from __future__ import annotations

from capkv.composite._scheduler_side import SchedulerSide
from capkv.composite._worker_side import WorkerSide

__all__ = ["StackRuntime"]


class StackRuntime(SchedulerSide, WorkerSide):
    """The run-time behaviour of a stack: load from the first child with a hit, save to all."""

    __slots__ = ()

    hma_by_children = True  # built as its HMA variant exactly when every child is HMA-capable
