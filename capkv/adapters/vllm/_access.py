"""vLLM's ``KVCacheAccess`` where the installed vLLM has it (0.34), else capkv's of the same values.

So a host answers in vLLM's own type, and is one code base for every release.
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
