from typing import Any

from vllm.config.kv_transfer import KVTransferConfig

class VllmConfig:
    # Only what capkv reads; the other sub-configs are opaque here.
    model_config: Any
    cache_config: Any
    parallel_config: Any
    scheduler_config: Any
    kv_transfer_config: KVTransferConfig | None
    def __init__(self, *, kv_transfer_config: KVTransferConfig | None = None, **kwargs: Any) -> None: ...
