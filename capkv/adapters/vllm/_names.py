"""vLLM's own connector names, for capkv's registry (vLLM is imported only to answer).

So a stack may name ``"OffloadingConnector"`` as vLLM's configuration does; without vLLM the registry's error
says how to install it.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

__all__ = ["HINT", "resolve_vllm_name"]

HINT = (
    "vLLM does not register it either"
    if importlib.util.find_spec("vllm") is not None
    else "vLLM's connector names resolve when vLLM is installed (capkv[vllm])"
)
"""What the registry adds to an unknown name's error."""


def resolve_vllm_name(name: str) -> type[Any] | None:
    """The class vLLM's connector factory registers as ``name``; ``None`` if none (or no vLLM)."""
    if importlib.util.find_spec("vllm") is None:
        return None
    factory: Any = importlib.import_module("vllm.distributed.kv_transfer.kv_connector.factory").KVConnectorFactory
    try:
        cls: type[Any] = factory.get_connector_class_by_name(name)
    except ValueError:  # vLLM does not register the name
        return None
    return cls
