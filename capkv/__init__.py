"""capkv: typed, composable, checked KV-cache connectors.

The contract (:class:`KVConnector`), the stack (:class:`MultiConnector`, its capabilities inferred from its
children) and the rules that refuse what a stack cannot serve. Open ``contracts/_connector.py`` first.
"""

from typing import TYPE_CHECKING

from capkv._lazy import attach, before_loading
from capkv._version import __version__

if TYPE_CHECKING:
    from capkv.capabilities._hma import NonHMAChild, StackNode, non_hma_children, supports_hma
    from capkv.capabilities._serving import KVCacheConfigLike, check_stack, finish_request, require_hma
    from capkv.composite._metadata import MultiConnectorMetadata, MultiWorkerMetadata
    from capkv.composite._multi import HMAMultiConnector, MultiConnector
    from capkv.contracts._access import KVCacheAccess
    from capkv.contracts._base import KVConnectorBase
    from capkv.contracts._class_level import class_level
    from capkv.contracts._connector import HMAConnector, KVConnector, SupportsHMA
    from capkv.contracts._engine import (
        AttentionMetadata,
        BlockIds,
        ComputedTokenRequest,
        ConnectorMetadata,
        ForwardContext,
        HandshakeMetadata,
        KVConnectorOutput,
        KVTransferParams,
        LoadErrors,
        Request,
        SchedulerOutput,
        TokenRequest,
        WorkerMetadata,
    )
    from capkv.contracts._key_inputs import KeyedRequest, KeyInputs, MultimodalItem
    from capkv.contracts._spec import KVGroupSpec, KVShard, KVSpec
    from capkv.errors import (
        ArgumentError,
        CapabilityError,
        CapkvError,
        ConfigError,
        ConflictError,
        ContractError,
        FinishError,
        MetadataError,
        SubConnectorError,
    )

__all__ = [
    "ArgumentError",
    "AttentionMetadata",
    "BlockIds",
    "CapabilityError",
    "CapkvError",
    "ComputedTokenRequest",
    "ConfigError",
    "ConflictError",
    "ConnectorMetadata",
    "ContractError",
    "FinishError",
    "ForwardContext",
    "HMAConnector",
    "HMAMultiConnector",
    "HandshakeMetadata",
    "KVCacheConfigLike",
    "KVConnector",
    "KVCacheAccess",
    "KVConnectorBase",
    "KVConnectorOutput",
    "KVGroupSpec",
    "KVShard",
    "KVSpec",
    "KVTransferParams",
    "KeyInputs",
    "KeyedRequest",
    "LoadErrors",
    "MetadataError",
    "MultiConnector",
    "MultiConnectorMetadata",
    "MultiWorkerMetadata",
    "MultimodalItem",
    "NonHMAChild",
    "Request",
    "SchedulerOutput",
    "StackNode",
    "SubConnectorError",
    "SupportsHMA",
    "TokenRequest",
    "WorkerMetadata",
    "check_stack",
    "class_level",
    "finish_request",
    "non_hma_children",
    "require_hma",
    "supports_hma",
]



def _types_checked_in_dev_mode() -> None:
    """In dev mode, capkv goes under beartype before a front loads its first implementation module."""
    from capkv.devmode._mode import check_capkv_types

    check_capkv_types()


before_loading(_types_checked_in_dev_mode)

if not TYPE_CHECKING:  # checkers read the imports above; a __getattr__ they saw would hide typos from them
    __getattr__, __dir__ = attach(
        __name__,
        {
            "capkv.capabilities._hma": ["NonHMAChild", "StackNode", "non_hma_children", "supports_hma"],
            "capkv.capabilities._serving": ["KVCacheConfigLike", "check_stack", "finish_request", "require_hma"],
            "capkv.composite._metadata": ["MultiConnectorMetadata", "MultiWorkerMetadata"],
            "capkv.composite._multi": ["HMAMultiConnector", "MultiConnector"],
            "capkv.contracts._access": ["KVCacheAccess"],
            "capkv.contracts._base": ["KVConnectorBase"],
            "capkv.contracts._class_level": ["class_level"],
            "capkv.contracts._connector": ["HMAConnector", "KVConnector", "SupportsHMA"],
            "capkv.contracts._engine": [
                "AttentionMetadata",
                "BlockIds",
                "ComputedTokenRequest",
                "ConnectorMetadata",
                "ForwardContext",
                "HandshakeMetadata",
                "KVConnectorOutput",
                "KVTransferParams",
                "LoadErrors",
                "Request",
                "SchedulerOutput",
                "TokenRequest",
                "WorkerMetadata",
            ],
            "capkv.contracts._key_inputs": ["KeyInputs", "KeyedRequest", "MultimodalItem"],
            "capkv.contracts._spec": ["KVGroupSpec", "KVShard", "KVSpec"],
            "capkv.errors": [
                "ArgumentError",
                "CapabilityError",
                "CapkvError",
                "ConfigError",
                "ConflictError",
                "ContractError",
                "FinishError",
                "MetadataError",
                "SubConnectorError",
            ],
        },
        submodules=[
            "cli", "composite", "config", "connectors", "devmode", "engine", "errors", "mypy", "stores", "testing",
            "transfer",
        ],
    )

del TYPE_CHECKING, attach, before_loading, _types_checked_in_dev_mode  # dir(), vars(): the front's names only
