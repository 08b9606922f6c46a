"""vLLM's own connector names, for capkv's registry (vLLM is imported only to answer).

So a stack may name ``"OffloadingConnector"`` as vLLM's configuration does, as the class vLLM's factory builds for
the entry (NIXL's ``transfer_mode = "push"``: ``NixlPushConnector``); without vLLM the registry's error says how
to install it.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Mapping
from typing import Any, cast

from capkv.errors import ConfigError

__all__ = ["HINT", "resolve_vllm_name"]

HINT = (
    "vLLM does not register it either"
    if importlib.util.find_spec("vllm") is not None
    else "vLLM's connector names resolve when vLLM is installed (capkv[vllm])"
)
"""What the registry adds to an unknown name's error."""


def resolve_vllm_name(name: str, entry: Mapping[str, Any]) -> type[Any] | None:
    """The class vLLM's connector factory builds for ``entry`` named ``name``; ``None`` if vLLM does not
    register the name (or is not installed)."""
    if importlib.util.find_spec("vllm") is None:
        return None
    factory: Any = importlib.import_module("vllm.distributed.kv_transfer.kv_connector.factory").KVConnectorFactory
    try:
        factory.get_connector_class_by_name(name)
    except ValueError:  # vLLM does not register the name
        return None
    transfer: Any = importlib.import_module("vllm.config.kv_transfer").KVTransferConfig
    extra: Any = entry.get("kv_connector_extra_config")
    extra = dict(cast("Mapping[str, Any]", extra)) if isinstance(extra, Mapping) else {}
    try:
        cls: type[Any] = factory.get_connector_class(
            transfer(kv_connector=name, kv_role=entry.get("kv_role") or "kv_both", kv_connector_extra_config=extra)
        )
    except ValueError as exc:  # vLLM refuses the entry's config (NIXL's transfer_mode "sideways")
        raise ConfigError(
            f'"{name}": vLLM refuses its kv_connector_extra_config: {exc}', connector=name, method="resolve", value=extra
        ) from exc
    return cls
