import enum
from typing import Any, Literal

KVRole = Literal["kv_producer", "kv_consumer", "kv_both"]

class KVCacheAccess(enum.IntFlag):  # vLLM 0.34
    IN_PROCESS = 0
    REGISTERS = ...
    EXPORTS_FD = ...
    EXPORTS_FABRIC = ...
    LEGACY_IPC = ...
    def needs_single_chunk(self) -> bool: ...

class KVTransferConfig:
    kv_connector: str | None
    engine_id: str | None
    kv_buffer_device: str
    kv_role: KVRole | None
    kv_port: int
    kv_connector_extra_config: dict[str, Any]
    kv_connector_module_path: str | None
    enable_permute_local_kv: bool
    kv_load_failure_policy: Literal["recompute", "fail"]
    def __init__(
        self,
        kv_connector: str | None = ...,
        engine_id: str | None = ...,
        kv_buffer_device: str = ...,
        kv_role: KVRole | None = ...,
        kv_port: int = ...,
        kv_connector_extra_config: dict[str, Any] = ...,
        kv_connector_module_path: str | None = ...,
        enable_permute_local_kv: bool = ...,
        kv_load_failure_policy: Literal["recompute", "fail"] = ...,
    ) -> None: ...
    @property
    def is_kv_transfer_instance(self) -> bool: ...
    @property
    def is_kv_producer(self) -> bool: ...
    @property
    def is_kv_consumer(self) -> bool: ...
    def get_from_extra_config(self, key: str, default: Any) -> Any: ...
    def has_connector(self, connector_name: str) -> bool: ...
