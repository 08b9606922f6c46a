from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1 as KVConnectorBase_V1,
    KVConnectorRole as KVConnectorRole,
    SupportsHMA as SupportsHMA,
    supports_hma as supports_hma,
)
