"""capkv 0.1.0's ``capkv.capabilities.serving``, deprecated: kept until capkv 0.3.0.

Its public names are imported from :mod:`capkv` now; its other names are internal. Reading a name
here warns with its new home (the table: :mod:`capkv._deprecations`).
"""

from typing import TYPE_CHECKING

from capkv._lazy import deprecated_module

if TYPE_CHECKING:
    from typing_extensions import deprecated

    from capkv._deprecations import signature_of
    from capkv.capabilities import _serving
    from capkv.capabilities._serving import KVCacheConfigLike as KVCacheConfigLike

    @deprecated("capkv.capabilities.serving.check_stack is deprecated (capkv 0.2.0, removed in 0.3.0): use capkv.check_stack")
    @signature_of(_serving.check_stack)
    def check_stack() -> None: ...

    @deprecated("capkv.capabilities.serving.finish_request is deprecated (capkv 0.2.0, removed in 0.3.0): use capkv.finish_request")
    @signature_of(_serving.finish_request)
    def finish_request() -> None: ...

    @deprecated("capkv.capabilities.serving.num_kv_cache_groups is deprecated (capkv 0.2.0, removed in 0.3.0): it is internal, with no public replacement")
    @signature_of(_serving.num_kv_cache_groups)
    def num_kv_cache_groups() -> None: ...

    @deprecated("capkv.capabilities.serving.require_hma is deprecated (capkv 0.2.0, removed in 0.3.0): use capkv.require_hma")
    @signature_of(_serving.require_hma)
    def require_hma() -> None: ...

__all__: list[str] = []

if not TYPE_CHECKING:  # each name read with a DeprecationWarning (or, if gone, an ImportError)
    __getattr__, __dir__ = deprecated_module(__name__)
