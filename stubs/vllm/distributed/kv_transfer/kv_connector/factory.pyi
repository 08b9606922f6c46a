from vllm.config import VllmConfig
from vllm.config.kv_transfer import KVCacheAccess, KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.base import KVConnectorBase
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.v1.kv_cache_interface import KVCacheConfig

class KVConnectorFactory:
    @classmethod
    def register_connector(cls, name: str, module_path: str, class_name: str) -> None: ...
    @classmethod
    def create_connector(
        cls, config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig
    ) -> KVConnectorBase: ...
    @classmethod
    def get_connector_class_by_name(cls, connector_name: str) -> type[KVConnectorBase]: ...
    @classmethod
    def get_connector_class(cls, kv_transfer_config: KVTransferConfig) -> type[KVConnectorBase]: ...
    @classmethod
    def supports_hma_config(cls, kv_transfer_config: KVTransferConfig) -> bool: ...
    @classmethod
    def kv_cache_access(cls, kv_transfer_config: KVTransferConfig) -> KVCacheAccess: ...  # vLLM 0.34
