"""capkv 0.1.0's ``capkv.contracts.class_level``, deprecated: kept until capkv 0.3.0.

Its public names are imported from :mod:`capkv` now. Reading a name here warns with its new home
(the table: :mod:`capkv._deprecations`).
"""

from typing import TYPE_CHECKING

from capkv._lazy import deprecated_module

if TYPE_CHECKING:
    from typing_extensions import deprecated

    from capkv._deprecations import signature_of
    from capkv.contracts import _class_level

    @deprecated("capkv.contracts.class_level.class_level is deprecated (capkv 0.2.0, removed in 0.3.0): use capkv.class_level")
    @signature_of(_class_level.class_level)
    def class_level() -> None: ...

__all__: list[str] = []

if not TYPE_CHECKING:  # each name read with a DeprecationWarning (or, if gone, an ImportError)
    __getattr__, __dir__ = deprecated_module(__name__)
