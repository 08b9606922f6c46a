from vllm.config.kv_transfer import KVTransferConfig as KVTransferConfig
from vllm.config.vllm import VllmConfig as VllmConfig
