"""How a connector reaches the engine's KV cache: :class:`KVCacheAccess`, a class-level fact.

vLLM 0.34 allocates its KV cache by it (memory a NIC registers must come in one piece); the names and
values are vLLM's, so the answer crosses over by value.
"""

from __future__ import annotations

import enum

from capkv._homes import publish

__all__ = ["KVCacheAccess"]


class KVCacheAccess(enum.IntFlag):
    """What a connector needs of the KV cache's allocation (flags; a composite ORs its children's)."""

    IN_PROCESS = 0
    """Copies within the engine's process only (capkv's stores): any allocation serves."""
    REGISTERS = 1
    """Registers the KV cache with an RDMA or UCX engine: one physical allocation per segment."""
    EXPORTS_FD = 2
    """Another process imports it through POSIX file descriptors."""
    EXPORTS_FABRIC = 4
    """Another process on the host imports it through FABRIC handles."""
    LEGACY_IPC = 8
    """Shares it through legacy CUDA IPC (vLLM's extensible KV cache is then not used)."""


publish(__name__)
