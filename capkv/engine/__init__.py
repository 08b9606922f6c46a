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

    # Deprecated (capkv._deprecations): names that left this front; each read warns with its new home.
    from capkv.engine._block_pool import BlockPool as BlockPool
    from capkv.engine._block_tables import BlockTables as BlockTables
    from capkv.engine._block_tables import LocalHit as LocalHit
    from capkv.engine._compute import KVFunction as KVFunction
    from capkv.engine._kv_cache import PagedKVCache as PagedKVCache
    from capkv.engine._kv_cache import Slots as Slots
    from capkv.engine._model import KV_LAYOUT as KV_LAYOUT
    from capkv.engine._model import NULL_BLOCK_ID as NULL_BLOCK_ID
    from capkv.engine._outputs import ForwardContext as ForwardContext
    from capkv.engine._outputs import LoadCheck as LoadCheck
    from capkv.engine._outputs import ModelRunnerOutput as ModelRunnerOutput
    from capkv.engine._outputs import ScheduledRequest as ScheduledRequest
    from capkv.engine._outputs import SchedulerOutput as SchedulerOutput
    from capkv.engine._request import Request as Request
    from capkv.engine._request import RequestStatus as RequestStatus
    from capkv.engine._scheduler import Scheduler as Scheduler
    from capkv.engine._verify import Verifier as Verifier
    from capkv.engine._worker import LayerAttentionMetadata as LayerAttentionMetadata
    from capkv.engine._worker import Worker as Worker

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
