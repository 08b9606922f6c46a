"""vLLM's ``KVCacheAccess`` flags where the installed vLLM has them (0.34), else capkv's, of the same values.

A host answers vLLM's ``kv_cache_access`` in vLLM's own type; on a vLLM before 0.34 no
one asks, and capkv's :class:`~capkv.KVCacheAccess` stands in, so the host is one code
base for every release.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

__all__ = ["VllmKVCacheAccess"]

if TYPE_CHECKING:
    from vllm.config.kv_transfer import KVCacheAccess as VllmKVCacheAccess
else:
    try:
        from vllm.config.kv_transfer import KVCacheAccess as VllmKVCacheAccess
    except ImportError:  # vLLM 0.32, 0.33
        from capkv.contracts._access import KVCacheAccess as VllmKVCacheAccess
