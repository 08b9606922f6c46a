"""capkv 0.1.0's ``capkv.composite.multi``, deprecated: kept until capkv 0.3.0.

Its public names are imported from :mod:`capkv` now; its other names are internal. Reading a name
here warns with its new home (the table: :mod:`capkv._deprecations`).
"""

from typing import TYPE_CHECKING

from capkv._lazy import deprecated_module

if TYPE_CHECKING:
    from typing_extensions import deprecated

    from capkv._deprecations import signature_of
    from capkv.composite import _building
    from capkv.composite._multi import HMAMultiConnector as HMAMultiConnector
    from capkv.composite._multi import MultiConnector as MultiConnector

    @deprecated("capkv.composite.multi.answers_by_agreement is deprecated (capkv 0.2.0, removed in 0.3.0): it is internal, with no public replacement")
    @signature_of(_building.answers_by_agreement)
    def answers_by_agreement() -> None: ...

    @deprecated("capkv.composite.multi.stack_class is deprecated (capkv 0.2.0, removed in 0.3.0): it is internal, with no public replacement")
    @signature_of(_building.stack_class)
    def stack_class() -> None: ...

__all__: list[str] = []

if not TYPE_CHECKING:  # each name read with a DeprecationWarning (or, if gone, an ImportError)
    __getattr__, __dir__ = deprecated_module(__name__)
