"""The contracts: what connectors are, what engines hand them, and the KV-cache shape."""

from capkv.contracts.base import KVConnectorBase
from capkv.contracts.class_level import class_level
from capkv.contracts.connector import HMAConnector, KVConnector, RequestT, SupportsHMA
from capkv.contracts.engine import (
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
from capkv.contracts.spec import KVGroupSpec, KVSpec

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
