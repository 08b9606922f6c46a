"""Capability rules: what a connector or a stack can serve, decided once, never by ``assert``."""

from capkv.capabilities.hma import HMA_METHOD, NonHMAChild, StackNode, non_hma_children, supports_hma
from capkv.capabilities.serving import KVCacheConfigLike, check_stack, finish_request, num_kv_cache_groups

__all__ = [
    "HMA_METHOD",
    "KVCacheConfigLike",
    "NonHMAChild",
    "StackNode",
    "check_stack",
    "finish_request",
    "non_hma_children",
    "num_kv_cache_groups",
    "supports_hma",
]
