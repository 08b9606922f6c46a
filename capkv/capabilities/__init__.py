"""Capability rules: what a connector or a stack can serve, decided once, never by ``assert``."""

from capkv.capabilities._facts import NEEDS_INSTANCE, STATIC_FACTS, StaticFact, class_fact
from capkv.capabilities._hma import (
    HMA_METHOD,
    HMA_RULE,
    NonHMAChild,
    StackNode,
    explain_not_hma,
    non_hma_children,
    supports_hma,
)
from capkv.capabilities._serving import (
    KVCacheConfigLike,
    check_stack,
    finish_request,
    num_kv_cache_groups,
    require_hma,
)

__all__ = [
    "HMA_METHOD",
    "HMA_RULE",
    "KVCacheConfigLike",
    "NEEDS_INSTANCE",
    "NonHMAChild",
    "STATIC_FACTS",
    "StackNode",
    "StaticFact",
    "check_stack",
    "class_fact",
    "explain_not_hma",
    "finish_request",
    "non_hma_children",
    "num_kv_cache_groups",
    "require_hma",
    "supports_hma",
]
