"""capkv 0.1.0's ``capkv.config.registry``, deprecated: kept until capkv 0.3.0.

Its public names are imported from :mod:`capkv.config` now; its other names are internal. Reading a
name here warns with its new home (the table: :mod:`capkv._deprecations`).
"""

from typing import TYPE_CHECKING

from capkv._lazy import deprecated_module

if TYPE_CHECKING:
    from typing_extensions import deprecated

    from capkv._deprecations import signature_of
    from capkv.config import _registry
    from capkv.config._registry import BUILTIN_CONNECTORS as BUILTIN_CONNECTORS
    from capkv.config._registry import ConnectorRegistry as ConnectorRegistry
    from capkv.config._registry import ENTRY_POINT_GROUP as ENTRY_POINT_GROUP
    from capkv.config._registry import default_registry as default_registry

    @deprecated("capkv.config.registry.register_connector is deprecated (capkv 0.2.0, removed in 0.3.0): use capkv.config.register_connector")
    @signature_of(_registry.register_connector)
    def register_connector() -> None: ...

    @deprecated("capkv.config.registry.resolve_connector is deprecated (capkv 0.2.0, removed in 0.3.0): it is internal, with no public replacement")
    @signature_of(_registry.resolve_connector)
    def resolve_connector() -> None: ...

__all__: list[str] = []

if not TYPE_CHECKING:  # each name read with a DeprecationWarning (or, if gone, an ImportError)
    __getattr__, __dir__ = deprecated_module(__name__)
