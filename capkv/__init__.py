"""capkv: typed, composable, checked KV-cache connectors.

Describe connectors with :class:`KVConnector` (and capabilities such as
:class:`SupportsHMA`), stack them with :class:`MultiConnector` — whose
capabilities are inferred from its children, statically and at run time — and
let :func:`check_stack` and :func:`finish_request` refuse what a stack cannot serve.
In dev mode (``CAPKV_DEV=1`` or ``python -X dev``), :func:`instrument` checks
every transfer call against the engine's :class:`KVSpec`.
"""

# First: in dev mode this puts the rest of capkv under beartype as it is imported.
from capkv import devmode

from capkv.capabilities import (
    KVCacheConfigLike,
    NonHMAChild,
    StackNode,
    check_stack,
    finish_request,
    non_hma_children,
    require_hma,
    supports_hma,
)
from capkv.composite import HMAMultiConnector, MultiConnector, MultiConnectorMetadata, MultiWorkerMetadata
from capkv.contracts import (
    BlockIds,
    ComputedTokenRequest,
    HMAConnector,
    KVConnector,
    KVConnectorBase,
    KVConnectorOutput,
    KVGroupSpec,
    KVSpec,
    KVTransferParams,
    LoadErrors,
    Request,
    SupportsHMA,
    TokenRequest,
    WorkerMetadata,
    class_level,
)
from capkv.devmode import instrument
from capkv.errors import (
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
    "BlockIds",
    "CapabilityError",
    "CapkvError",
    "ComputedTokenRequest",
    "ConfigError",
    "ConflictError",
    "ContractError",
    "FinishError",
    "HMAConnector",
    "HMAMultiConnector",
    "KVCacheConfigLike",
    "KVConnector",
    "KVConnectorBase",
    "KVConnectorOutput",
    "KVGroupSpec",
    "KVSpec",
    "KVTransferParams",
    "LoadErrors",
    "MetadataError",
    "MultiConnector",
    "MultiConnectorMetadata",
    "MultiWorkerMetadata",
    "NonHMAChild",
    "Request",
    "StackNode",
    "SubConnectorError",
    "SupportsHMA",
    "TokenRequest",
    "WorkerMetadata",
    "check_stack",
    "class_level",
    "devmode",
    "finish_request",
    "instrument",
    "non_hma_children",
    "require_hma",
    "supports_hma",
]

__version__ = "0.1.0"
