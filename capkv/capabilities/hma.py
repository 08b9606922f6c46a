"""capkv 0.1.0's ``capkv.capabilities.hma``, deprecated: kept until capkv 0.3.0.

Its public names are imported from :mod:`capkv` now; its other names are internal. Reading a name
here warns with its new home (the table: :mod:`capkv._deprecations`).
"""

from typing import TYPE_CHECKING

from capkv._lazy import deprecated_module

if TYPE_CHECKING:
    from typing_extensions import deprecated

    from capkv._deprecations import signature_of
    from capkv.capabilities import _hma
    from capkv.capabilities._hma import HMA_METHOD as HMA_METHOD
    from capkv.capabilities._hma import HMA_RULE as HMA_RULE
    from capkv.capabilities._hma import NonHMAChild as NonHMAChild
    from capkv.capabilities._hma import StackNode as StackNode

    @deprecated("capkv.capabilities.hma.explain_not_hma is deprecated (capkv 0.2.0, removed in 0.3.0): it is internal, with no public replacement")
    @signature_of(_hma.explain_not_hma)
    def explain_not_hma() -> None: ...

    @deprecated("capkv.capabilities.hma.non_hma_children is deprecated (capkv 0.2.0, removed in 0.3.0): use capkv.non_hma_children")
    @signature_of(_hma.non_hma_children)
    def non_hma_children() -> None: ...

    @deprecated("capkv.capabilities.hma.supports_hma is deprecated (capkv 0.2.0, removed in 0.3.0): use capkv.supports_hma")
    @signature_of(_hma.supports_hma)
    def supports_hma() -> None: ...

__all__: list[str] = []

if not TYPE_CHECKING:  # each name read with a DeprecationWarning (or, if gone, an ImportError)
    __getattr__, __dir__ = deprecated_module(__name__)
