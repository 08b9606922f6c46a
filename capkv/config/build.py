"""capkv 0.1.0's ``capkv.config.build``, deprecated: kept until capkv 0.3.0.

Its public names are imported from :mod:`capkv.config` now; its other names are internal. Reading a
name here warns with its new home (the table: :mod:`capkv._deprecations`).
"""

from typing import TYPE_CHECKING

from capkv._lazy import deprecated_module

if TYPE_CHECKING:
    from typing_extensions import deprecated

    from capkv._deprecations import signature_of
    from capkv.config import _build
    from capkv.config._build import ConnectorFactory as ConnectorFactory
    from capkv.config._build import FACTORY_HOOK as FACTORY_HOOK

    @deprecated("capkv.config.build.build_connector is deprecated (capkv 0.2.0, removed in 0.3.0): use capkv.config.build_connector")
    @signature_of(_build.build_connector)
    def build_connector() -> None: ...

    @deprecated("capkv.config.build.build_stack is deprecated (capkv 0.2.0, removed in 0.3.0): use capkv.config.build_stack")
    @signature_of(_build.build_stack)
    def build_stack() -> None: ...

__all__: list[str] = []

if not TYPE_CHECKING:  # each name read with a DeprecationWarning (or, if gone, an ImportError)
    __getattr__, __dir__ = deprecated_module(__name__)
