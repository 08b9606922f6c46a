"""capkv 0.1.0's ``capkv.contracts.engine``, deprecated: kept until capkv 0.3.0.

Its public names are imported from :mod:`capkv` now. Reading a name here warns with its new home
(the table: :mod:`capkv._deprecations`).
"""

from typing import TYPE_CHECKING

from capkv._lazy import deprecated_module

if TYPE_CHECKING:
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

__all__: list[str] = []

if not TYPE_CHECKING:  # each name read with a DeprecationWarning (or, if gone, an ImportError)
    __getattr__, __dir__ = deprecated_module(__name__)
