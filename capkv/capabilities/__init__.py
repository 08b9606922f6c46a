"""Capability rules: what a connector or a stack can serve, decided once, never by ``assert``.

Implementation only: the rules users call are public from :mod:`capkv`
(``capkv.check_stack``, ``capkv.supports_hma``, ...).

The names capkv 0.1.0 exported here still import, each with a ``DeprecationWarning``
naming its new home, until capkv 0.3.0 (:mod:`capkv._deprecations`).
"""

from typing import TYPE_CHECKING

from capkv._lazy import attach

if TYPE_CHECKING:
    # Deprecated (capkv._deprecations): names that left this front; each read warns with its new home.
    from typing_extensions import deprecated

    from capkv._deprecations import signature_of
    from capkv.capabilities import _facts
    from capkv.capabilities import _hma
    from capkv.capabilities import _serving
    from capkv.capabilities._facts import NEEDS_INSTANCE as NEEDS_INSTANCE
    from capkv.capabilities._facts import STATIC_FACTS as STATIC_FACTS
    from capkv.capabilities._facts import StaticFact as StaticFact
    from capkv.capabilities._hma import HMA_METHOD as HMA_METHOD
    from capkv.capabilities._hma import HMA_RULE as HMA_RULE
    from capkv.capabilities._hma import NonHMAChild as NonHMAChild
    from capkv.capabilities._hma import StackNode as StackNode
    from capkv.capabilities._serving import KVCacheConfigLike as KVCacheConfigLike

    @deprecated("capkv.capabilities.check_stack is deprecated (capkv 0.2.0, removed in 0.3.0): use capkv.check_stack")
    @signature_of(_serving.check_stack)
    def check_stack() -> None: ...

    @deprecated("capkv.capabilities.class_fact is deprecated (capkv 0.2.0, removed in 0.3.0): it is internal, with no public replacement")
    @signature_of(_facts.class_fact)
    def class_fact() -> None: ...

    @deprecated("capkv.capabilities.explain_not_hma is deprecated (capkv 0.2.0, removed in 0.3.0): it is internal, with no public replacement")
    @signature_of(_hma.explain_not_hma)
    def explain_not_hma() -> None: ...

    @deprecated("capkv.capabilities.finish_request is deprecated (capkv 0.2.0, removed in 0.3.0): use capkv.finish_request")
    @signature_of(_serving.finish_request)
    def finish_request() -> None: ...

    @deprecated("capkv.capabilities.non_hma_children is deprecated (capkv 0.2.0, removed in 0.3.0): use capkv.non_hma_children")
    @signature_of(_hma.non_hma_children)
    def non_hma_children() -> None: ...

    @deprecated("capkv.capabilities.num_kv_cache_groups is deprecated (capkv 0.2.0, removed in 0.3.0): it is internal, with no public replacement")
    @signature_of(_serving.num_kv_cache_groups)
    def num_kv_cache_groups() -> None: ...

    @deprecated("capkv.capabilities.require_hma is deprecated (capkv 0.2.0, removed in 0.3.0): use capkv.require_hma")
    @signature_of(_serving.require_hma)
    def require_hma() -> None: ...

    @deprecated("capkv.capabilities.supports_hma is deprecated (capkv 0.2.0, removed in 0.3.0): use capkv.supports_hma")
    @signature_of(_hma.supports_hma)
    def supports_hma() -> None: ...

__all__: list[str] = []

if not TYPE_CHECKING:  # checkers read the imports above (see capkv._lazy)
    __getattr__, __dir__ = attach(__name__, {})

del TYPE_CHECKING, attach  # dir(), vars(): the front's names only
