"""capkv 0.1.0's ``capkv.contracts.connector``, deprecated: kept until capkv 0.3.0.

Its public names are imported from :mod:`capkv` now; its other names are internal. Reading a name
here warns with its new home (the table: :mod:`capkv._deprecations`).
"""

from typing import TYPE_CHECKING

from capkv._lazy import deprecated_module

if TYPE_CHECKING:
    from typing_extensions import deprecated

    from capkv._deprecations import signature_of
    from capkv.contracts import _connector
    from capkv.contracts._connector import HMAConnector as HMAConnector
    from capkv.contracts._connector import KVConnector as KVConnector
    from capkv.contracts._connector import KV_CONNECTOR_MEMBERS as KV_CONNECTOR_MEMBERS
    from capkv.contracts._connector import RequestT as RequestT
    from capkv.contracts._connector import SupportsHMA as SupportsHMA

    @deprecated("capkv.contracts.connector.missing_members is deprecated (capkv 0.2.0, removed in 0.3.0): it is internal, with no public replacement")
    @signature_of(_connector.missing_members)
    def missing_members() -> None: ...

__all__: list[str] = []

if not TYPE_CHECKING:  # each name read with a DeprecationWarning (or, if gone, an ImportError)
    __getattr__, __dir__ = deprecated_module(__name__)
