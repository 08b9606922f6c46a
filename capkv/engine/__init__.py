"""A small, faithful reference engine for exercising connectors.

It has what a connector meets in vLLM — a paged KV cache with several groups
(full attention and sliding window), a block pool with a null block and a prefix
cache, a scheduler and a worker calling the connector contract in vLLM's order —
and one thing vLLM cannot offer: the "model" computes KV as a pure function of
(layer, position, token prefix), so every block a connector loads is checked
bit-exact against recomputation. Read :mod:`capkv.engine.scheduler` and
:mod:`capkv.engine.worker` to see when each connector method is called.
"""

from capkv.engine.block_pool import BlockPool
from capkv.engine.block_tables import BlockTables, LocalHit
from capkv.engine.compute import KVFunction
from capkv.engine.engine import Engine
from capkv.engine.kv_cache import PagedKVCache, Slots
from capkv.engine.model import FULL, KV_LAYOUT, NULL_BLOCK_ID, SLIDING, GroupLayout, ModelShape
from capkv.engine.outputs import (
    ForwardContext,
    LoadCheck,
    Mismatch,
    ModelRunnerOutput,
    ScheduledRequest,
    SchedulerOutput,
)
from capkv.engine.request import Request, RequestStatus
from capkv.engine.scheduler import FinishedRequest, Scheduler
from capkv.engine.stats import EngineStats, GroupStats
from capkv.engine.verify import VerificationError, Verifier
from capkv.engine.worker import LayerAttentionMetadata, Worker
from capkv.engine.workload import Workload

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
