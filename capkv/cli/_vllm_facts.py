"""``capkv check``'s line for what vLLM 0.34 asks a connector class before it allocates the KV cache.

Printed only where the installed vLLM asks (0.34 on), from the configured classes by the same rows of the
capability table the hosts apply.
"""

from __future__ import annotations

import importlib.util

from capkv.capabilities._facts import ACCESS, LOOKAHEAD, NEEDS_INSTANCE
from capkv.config._loader import ConfiguredNode
from capkv.contracts._access import KVCacheAccess

__all__ = ["vllm_fact_line"]


def vllm_fact_line(configured: ConfiguredNode) -> str | None:
    """What vLLM is told of KV-cache access and lookahead block hashes for the stack; ``None`` where the
    installed vLLM (none, or one before 0.34) does not ask."""
    if importlib.util.find_spec("vllm") is None:
        return None
    from capkv.adapters.vllm._stack import configured_fact  # noqa: PLC0415 (vLLM is imported only here)
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1  # noqa: PLC0415

    if not hasattr(KVConnectorBase_V1, ACCESS):
        return None

    access = configured_fact(configured, ACCESS, vllm_config=None)
    lookahead = configured_fact(configured, LOOKAHEAD, vllm_config=None)
    shown = "? (a class answers per instance: told as REGISTERS)" if access is NEEDS_INSTANCE else (
        KVCacheAccess(access if isinstance(access, int) else 0).name or "IN_PROCESS"
    )
    taken = "?" if lookahead is NEEDS_INSTANCE else ("yes" if lookahead is True else "no")
    return f"vLLM 0.34 is told: KV-cache access {shown}; lookahead block hashes {taken}"
