"""A small, faithful reference engine for exercising connectors.

It has what a connector meets in vLLM — a paged KV cache with several groups
(full attention and sliding window), a block pool with a null block and a prefix
cache, a scheduler and a worker calling the connector contract in vLLM's order —
and one thing vLLM cannot offer: the "model" computes KV as a pure function of
(layer, position, token prefix), so every block a connector loads is checked
bit-exact against recomputation. Read :mod:`capkv.engine._scheduler` and
:mod:`capkv.engine._worker` to see when each connector method is called.
"""

from capkv.engine._block_pool import BlockPool
from capkv.engine._block_tables import BlockTables, LocalHit
from capkv.engine._compute import KVFunction
from capkv.engine._engine import Engine
from capkv.engine._kv_cache import PagedKVCache, Slots
from capkv.engine._model import FULL, KV_LAYOUT, NULL_BLOCK_ID, SLIDING, GroupLayout, ModelShape
from capkv.engine._outputs import (
    ForwardContext,
    LoadCheck,
    Mismatch,
    ModelRunnerOutput,
    ScheduledRequest,
    SchedulerOutput,
)
from capkv.engine._request import Request, RequestStatus
from capkv.engine._scheduler import FinishedRequest, Scheduler
from capkv.engine._stats import EngineStats, GroupStats
from capkv.engine._verify import VerificationError, Verifier
from capkv.engine._worker import LayerAttentionMetadata, Worker
from capkv.engine._workload import Workload

__all__ = [
    "FULL",
    "KV_LAYOUT",
    "NULL_BLOCK_ID",
    "SLIDING",
    "BlockPool",
    "BlockTables",
    "Engine",
    "EngineStats",
    "FinishedRequest",
    "ForwardContext",
    "GroupLayout",
    "GroupStats",
    "KVFunction",
    "LayerAttentionMetadata",
    "LoadCheck",
    "LocalHit",
    "Mismatch",
    "ModelRunnerOutput",
    "ModelShape",
    "PagedKVCache",
    "Request",
    "RequestStatus",
    "ScheduledRequest",
    "Scheduler",
    "SchedulerOutput",
    "Slots",
    "VerificationError",
    "Verifier",
    "Worker",
    "Workload",
]
