"""What a host holds: the state its members share, declared once for each of them (:mod:`._host`).

The host's members live by side in several modules; all read the state bound here with the stack.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from capkv.adapters.vllm._stack import load_hosted
from capkv.adapters.vllm._translate import HostMetadata
from capkv.adapters.vllm._vllm_calls import VllmOnlyMembers
from capkv.config._hosts import PLAIN_HOST, stack_config
from capkv.contracts._connector import KVConnector
from capkv.contracts._spec import KVSpec
from capkv.errors import MetadataError

import torch

from capkv.adapters.vllm._contain import Contained
from capkv.adapters.vllm._stats import StatNode
from capkv.adapters.vllm._loads import LoadPlanner, LoadTracker, Settled
from capkv.config._loader import ConfiguredNode  # at run time: dev mode's beartype resolves the hints

__all__ = ["HostState"]


class HostState(VllmOnlyMembers):
    """The host's shared state (bound with the stack) and the helpers every side uses."""

    HOST: ClassVar[str] = PLAIN_HOST
    """The host class's name in diagnostics and configurations."""
    INHERIT_ROLE: ClassVar[bool] = True
    """A vLLM child without a ``kv_role`` takes the host's."""

    stack: KVConnector
    """The hosted stack, built for this role (instrumented in dev mode)."""
    spec: KVSpec | None
    """The engine's KV cache as the stack sees it (``None``: vLLM's placeholder config without a group)."""

    _built: object
    """The stack as built (not instrumented)."""
    _composite: bool
    _stat_keys: list[StatNode]
    """Each top-level child's key in vLLM's per-connector statistics, and whether it is one of vLLM's."""
    _receivers: list[object]
    """The wrapped vLLM connectors anywhere in the stack (``VllmChild``): their failed receives pass through."""
    _planner: LoadPlanner
    _tracker: LoadTracker
    _layer_names: tuple[str, ...]
    _contained: Contained
    _sits_out: bool
    """The stack's metadata for this step could not be built or bound: it sits the step out."""
    _settled: Settled | None
    _flat: set[int]
    _totals: dict[str, Any]
    _registered: dict[str, torch.Tensor] | None
    """The KV cache as the stack was given it (what capkv children that dropped their views get again)."""
    _released: list[object]
    """capkv children that dropped their views of the KV cache (``unregister_kv_caches``) until it is restored."""

    @classmethod
    def _configured(cls, extra: Mapping[str, Any] | None) -> ConfiguredNode | None:
        """The hosted stack's classes, from the host's ``kv_connector_extra_config``."""
        return load_hosted(stack_config(extra, host=cls.HOST))

    def _host_metadata(self, metadata: object, method: str) -> HostMetadata:
        if not isinstance(metadata, HostMetadata):
            raise MetadataError(
                f"{self.HOST}.{method}: expected the host's metadata (HostMetadata), got {metadata!r}",
                connector=self.HOST, method=method, value=metadata,
            )
        return metadata
