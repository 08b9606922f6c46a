"""capkv 0.1.0's ``capkv.capabilities.facts``, deprecated: kept until capkv 0.3.0.

Its names are internal to capkv now. Reading a name here warns with its new home (the table:
:mod:`capkv._deprecations`).
"""

from typing import TYPE_CHECKING

from capkv._lazy import deprecated_module

if TYPE_CHECKING:
    from typing_extensions import deprecated

    from capkv._deprecations import signature_of
    from capkv.capabilities import _facts
    from capkv.capabilities._facts import FINISHED_COUNT as FINISHED_COUNT
    from capkv.capabilities._facts import LAYOUT as LAYOUT
    from capkv.capabilities._facts import NEEDS_INSTANCE as NEEDS_INSTANCE
    from capkv.capabilities._facts import NeedsInstance as NeedsInstance
    from capkv.capabilities._facts import PIECEWISE as PIECEWISE
    from capkv.capabilities._facts import STATIC_FACTS as STATIC_FACTS
    from capkv.capabilities._facts import StaticFact as StaticFact

    @deprecated("capkv.capabilities.facts.class_fact is deprecated (capkv 0.2.0, removed in 0.3.0): it is internal, with no public replacement")
    @signature_of(_facts.class_fact)
    def class_fact() -> None: ...

__all__: list[str] = []

if not TYPE_CHECKING:  # each name read with a DeprecationWarning (or, if gone, an ImportError)
    __getattr__, __dir__ = deprecated_module(__name__)
