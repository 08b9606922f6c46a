from vllm.distributed.kv_events import KVConnectorKVEvents
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorWorkerMetadata
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats

class KVConnectorOutput:
    finished_sending: set[str] | None
    finished_recving: set[str] | None
    kv_connector_stats: KVConnectorStats | None
    kv_cache_events: KVConnectorKVEvents | None
    kv_connector_worker_meta: KVConnectorWorkerMetadata | None
    invalid_block_ids: set[int]
    failed_recving: set[str]
    expected_finished_count: int
    def __init__(
        self,
        finished_sending: set[str] | None = None,
        finished_recving: set[str] | None = None,
        kv_connector_stats: KVConnectorStats | None = None,
        kv_cache_events: KVConnectorKVEvents | None = None,
        kv_connector_worker_meta: KVConnectorWorkerMetadata | None = None,
        invalid_block_ids: set[int] = ...,
        failed_recving: set[str] = ...,
        expected_finished_count: int = 0,
    ) -> None: ...
    def is_empty(self) -> bool: ...
