"""capkv 0.1.0's ``capkv.config.loader``, deprecated: kept until capkv 0.3.0.

Its public names are imported from :mod:`capkv.config` now; its other names are internal. Reading a
name here warns with its new home (the table: :mod:`capkv._deprecations`).
"""

from typing import TYPE_CHECKING

from capkv._lazy import deprecated_module

if TYPE_CHECKING:
    from typing_extensions import deprecated

    from capkv._deprecations import signature_of
    from capkv.config import _loader
    from capkv.config._loader import ConfiguredConnector as ConfiguredConnector
    from capkv.config._loader import ConfiguredNode as ConfiguredNode
    from capkv.config._loader import ConfiguredStack as ConfiguredStack

    @deprecated("capkv.config.loader.load_stack is deprecated (capkv 0.2.0, removed in 0.3.0): use capkv.config.load_stack")
    @signature_of(_loader.load_stack)
    def load_stack() -> None: ...

    @deprecated("capkv.config.loader.load_stack_file is deprecated (capkv 0.2.0, removed in 0.3.0): use capkv.config.load_stack_file")
    @signature_of(_loader.load_stack_file)
    def load_stack_file() -> None: ...

    @deprecated("capkv.config.loader.read_config_file is deprecated (capkv 0.2.0, removed in 0.3.0): it is internal, with no public replacement")
    @signature_of(_loader.read_config_file)
    def read_config_file() -> None: ...

__all__: list[str] = []

if not TYPE_CHECKING:  # each name read with a DeprecationWarning (or, if gone, an ImportError)
    __getattr__, __dir__ = deprecated_module(__name__)
