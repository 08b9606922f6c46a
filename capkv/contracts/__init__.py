"""The contracts: what connectors are, what engines hand them, and the KV-cache shape."""

from capkv.contracts._base import KVConnectorBase
from capkv.contracts._class_level import class_level
from capkv.contracts._connector import HMAConnector, KVConnector, RequestT, SupportsHMA
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
from capkv.contracts._spec import KVGroupSpec, KVSpec

__all__ = [
    "AttentionMetadata",
    "BlockIds",
    "ComputedTokenRequest",
    "ConnectorMetadata",
    "ForwardContext",
    "HMAConnector",
    "HandshakeMetadata",
    "KVConnector",
    "KVConnectorBase",
    "KVConnectorOutput",
    "KVGroupSpec",
    "KVSpec",
    "KVTransferParams",
    "LoadErrors",
    "Request",
    "RequestT",
    "SchedulerOutput",
    "SupportsHMA",
    "TokenRequest",
    "WorkerMetadata",
    "class_level",
]
