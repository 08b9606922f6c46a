"""The contracts: what connectors are, what engines hand them, and the KV-cache shape.

Implementation only: every name here lives in a private module and is public
from :mod:`capkv` (``capkv.KVConnector``, ``capkv.KVSpec``, ...).

The names capkv 0.1.0 exported here still import, each with a ``DeprecationWarning``
naming its new home, until capkv 0.3.0 (:mod:`capkv._deprecations`).
"""

from typing import TYPE_CHECKING

from capkv._lazy import attach

if TYPE_CHECKING:
    # Deprecated (capkv._deprecations): names that left this front; each read warns with its new home.
    from typing_extensions import deprecated

    from capkv._deprecations import signature_of
    from capkv.contracts import _class_level
    from capkv.contracts._base import KVConnectorBase as KVConnectorBase
    from capkv.contracts._connector import HMAConnector as HMAConnector
    from capkv.contracts._connector import KVConnector as KVConnector
    from capkv.contracts._connector import RequestT as RequestT
    from capkv.contracts._connector import SupportsHMA as SupportsHMA
    from capkv.contracts._engine import AttentionMetadata as AttentionMetadata
    from capkv.contracts._engine import BlockIds as BlockIds
    from capkv.contracts._engine import ComputedTokenRequest as ComputedTokenRequest
    from capkv.contracts._engine import ConnectorMetadata as ConnectorMetadata
    from capkv.contracts._engine import ForwardContext as ForwardContext
    from capkv.contracts._engine import HandshakeMetadata as HandshakeMetadata
    from capkv.contracts._engine import KVConnectorOutput as KVConnectorOutput
    from capkv.contracts._engine import KVTransferParams as KVTransferParams
    from capkv.contracts._engine import LoadErrors as LoadErrors
    from capkv.contracts._engine import Request as Request
    from capkv.contracts._engine import SchedulerOutput as SchedulerOutput
    from capkv.contracts._engine import TokenRequest as TokenRequest
    from capkv.contracts._engine import WorkerMetadata as WorkerMetadata
    from capkv.contracts._spec import KVGroupSpec as KVGroupSpec
    from capkv.contracts._spec import KVSpec as KVSpec

    @deprecated("capkv.contracts.class_level is deprecated (capkv 0.2.0, removed in 0.3.0): use capkv.class_level")
    @signature_of(_class_level.class_level)
    def class_level() -> None: ...

__all__: list[str] = []

if not TYPE_CHECKING:  # checkers read the imports above (see capkv._lazy)
    __getattr__, __dir__ = attach(__name__, {})

del TYPE_CHECKING, attach  # dir(), vars(): the front's names only
