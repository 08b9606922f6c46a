import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata as KVConnectorMetadata
from vllm.forward_context import ForwardContext
from vllm.v1.attention.backend import AttentionMetadata
from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.request import Request
from dataclasses import dataclass
from typing import Any

from vllm.config import VllmConfig
from vllm.config.kv_transfer import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorWorkerMetadata,
    SupportsHMA,
)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorPromMetrics, KVConnectorStats
from vllm.v1.kv_cache_interface import KVCacheConfig
from vllm.v1.request import Request

class MultiKVConnectorMetadata(KVConnectorMetadata):
    metadata: tuple[KVConnectorMetadata, ...]
    extra_async_saves: dict[str, int] | None
    def __init__(
        self, metadata: tuple[KVConnectorMetadata, ...], extra_async_saves: dict[str, int] | None = None
    ) -> None: ...

@dataclass
class MultiKVConnectorWorkerMetadata(KVConnectorWorkerMetadata):
    metadata: tuple[KVConnectorWorkerMetadata | None, ...]
    def aggregate(self, other: KVConnectorWorkerMetadata) -> KVConnectorWorkerMetadata: ...

@dataclass
class MultiKVConnectorStats(KVConnectorStats):
    def to_dict(self) -> dict[str, Any]: ...
    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats: ...
    def reset(self) -> None: ...
    def reduce(self) -> dict[str, Any]: ...  # per connector, as vLLM declares it
    def is_empty(self) -> bool: ...
    def __getitem__(self, connector_id: str) -> KVConnectorStats: ...
    def __setitem__(self, connector_id: str, stats: KVConnectorStats) -> None: ...

class MultiKVConnectorPromMetrics(KVConnectorPromMetrics):
    def __init__(
        self,
        vllm_config: VllmConfig,
        metric_types: dict[type[Any], type[Any]],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
        prom_metrics: dict[str, KVConnectorPromMetrics],
    ) -> None: ...
    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None: ...

class MultiConnector(KVConnectorBase_V1, SupportsHMA):
    """vLLM's composite. It derives from SupportsHMA whatever its children are: vLLM decides
    its real capability from the configured children (``all_children_support_hma``)."""
    @classmethod
    def all_children_support_hma(cls, kv_transfer_config: KVTransferConfig) -> bool: ...
    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig) -> None: ...
    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None: ...
    def wait_for_layer_load(self, layer_name: str) -> None: ...
    def save_kv_layer(
        self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: AttentionMetadata, **kwargs: Any
    ) -> None: ...
    def wait_for_save(self) -> None: ...
    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int | None, bool]: ...
    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int) -> None: ...
    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata: ...
    @property
    def sub_connectors(self) -> list[KVConnectorBase_V1]: ...
    def request_finished(self, request: Request, blocks: list[int]) -> tuple[bool, dict[str, Any] | None]: ...
    def request_finished_all_groups(
        self, request: Request, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]: ...
