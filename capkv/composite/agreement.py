"""capkv 0.1.0's ``capkv.composite.agreement``, deprecated: kept until capkv 0.3.0.

Its names are internal to capkv now. Reading a name here warns with its new home (the table:
:mod:`capkv._deprecations`).
"""

from typing import TYPE_CHECKING

from capkv._lazy import deprecated_module

if TYPE_CHECKING:
    from typing_extensions import deprecated

    from capkv._deprecations import signature_of
    from capkv.composite import _agreement

    @deprecated("capkv.composite.agreement.agreed_finished_count is deprecated (capkv 0.2.0, removed in 0.3.0): it is internal, with no public replacement")
    @signature_of(_agreement.agreed_finished_count)
    def agreed_finished_count() -> None: ...

    @deprecated("capkv.composite.agreement.agreed_layout is deprecated (capkv 0.2.0, removed in 0.3.0): it is internal, with no public replacement")
    @signature_of(_agreement.agreed_layout)
    def agreed_layout() -> None: ...

    @deprecated("capkv.composite.agreement.child_label is deprecated (capkv 0.2.0, removed in 0.3.0): it is internal, with no public replacement")
    @signature_of(_agreement.child_label)
    def child_label() -> None: ...

    @deprecated("capkv.composite.agreement.combine is deprecated (capkv 0.2.0, removed in 0.3.0): it is internal, with no public replacement")
    @signature_of(_agreement.combine)
    def combine() -> None: ...

    @deprecated("capkv.composite.agreement.piecewise_needed is deprecated (capkv 0.2.0, removed in 0.3.0): it is internal, with no public replacement")
    @signature_of(_agreement.piecewise_needed)
    def piecewise_needed() -> None: ...

__all__: list[str] = []

if not TYPE_CHECKING:  # each name read with a DeprecationWarning (or, if gone, an ImportError)
    __getattr__, __dir__ = deprecated_module(__name__)
