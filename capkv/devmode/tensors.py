"""capkv 0.1.0's ``capkv.devmode.tensors``, deprecated: kept until capkv 0.3.0.

Its names are internal to capkv now. Reading a name here warns with its new home (the table:
:mod:`capkv._deprecations`).
"""

from typing import TYPE_CHECKING

from capkv._lazy import deprecated_module

if TYPE_CHECKING:
    from typing_extensions import deprecated

    from capkv._deprecations import signature_of
    from capkv.contracts import _kv_tensors

    @deprecated("capkv.devmode.tensors.check_kv_caches is deprecated (capkv 0.2.0, removed in 0.3.0): it is internal, with no public replacement; capkv.devmode.instrument checks a stack's calls, and capkv.devmode's hints (block_ids_hint, ...) are the same checks for your own functions")
    @signature_of(_kv_tensors.check_kv_caches)
    def check_kv_caches() -> None: ...

    @deprecated("capkv.devmode.tensors.check_kv_tensor is deprecated (capkv 0.2.0, removed in 0.3.0): it is internal, with no public replacement; capkv.devmode.instrument checks a stack's calls, and capkv.devmode's hints (block_ids_hint, ...) are the same checks for your own functions")
    @signature_of(_kv_tensors.check_kv_tensor)
    def check_kv_tensor() -> None: ...

__all__: list[str] = []

if not TYPE_CHECKING:  # each name read with a DeprecationWarning (or, if gone, an ImportError)
    __getattr__, __dir__ = deprecated_module(__name__)
