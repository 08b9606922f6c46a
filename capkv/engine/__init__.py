"""A small, faithful reference engine for exercising connectors.

It has what a connector meets in vLLM — a paged KV cache with several groups
(full attention and sliding window), a block pool with a null block and a prefix
cache, a scheduler and a worker calling the connector contract in vLLM's order —
and one thing vLLM cannot offer: the "model" computes KV as a pure function of
(layer, position, token prefix), so every block a connector loads is checked
bit-exact against recomputation (:class:`VerificationError` otherwise).

Users build a :class:`ModelShape` (its groups are :data:`FULL` or :data:`SLIDING`
:class:`GroupLayout`), a :class:`Workload`, and run an :class:`Engine` over a
connector; :class:`EngineStats` says what was loaded and saved. The engine's own
requests and scheduler objects stay internal: connectors see them through the
contracts' types (``capkv.Request``, ``capkv.SchedulerOutput``, ...).
"""

from typing import TYPE_CHECKING

from capkv._lazy import attach

if TYPE_CHECKING:
    from capkv.engine._engine import Engine
    from capkv.engine._model import FULL, SLIDING, GroupLayout, ModelShape
    from capkv.engine._outputs import Mismatch
    from capkv.engine._scheduler import FinishedRequest
    from capkv.engine._stats import EngineStats, GroupStats
    from capkv.engine._verify import VerificationError
    from capkv.engine._workload import Workload

__all__ = [
    "FULL",
    "SLIDING",
    "Engine",
    "EngineStats",
    "FinishedRequest",
    "GroupLayout",
    "GroupStats",
    "Mismatch",
    "ModelShape",
    "VerificationError",
    "Workload",
]

if not TYPE_CHECKING:  # checkers read the imports above (see capkv._lazy)
    __getattr__, __dir__ = attach(
        __name__,
        {
            "capkv.engine._engine": ["Engine"],
            "capkv.engine._model": ["FULL", "SLIDING", "GroupLayout", "ModelShape"],
            "capkv.engine._outputs": ["Mismatch"],
            "capkv.engine._scheduler": ["FinishedRequest"],
            "capkv.engine._stats": ["EngineStats", "GroupStats"],
            "capkv.engine._verify": ["VerificationError"],
            "capkv.engine._workload": ["Workload"],
        },
    )

del TYPE_CHECKING, attach  # dir(), vars(): the front's names only
