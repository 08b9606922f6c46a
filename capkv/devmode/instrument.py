"""capkv 0.1.0's ``capkv.devmode.instrument``, deprecated: kept until capkv 0.3.0.

Its public names are imported from :mod:`capkv.devmode` now; its other names are internal. Reading a
name here warns with its new home (the table: :mod:`capkv._deprecations`).
"""

from typing import TYPE_CHECKING

from capkv._lazy import deprecated_module

if TYPE_CHECKING:
    from typing_extensions import deprecated

    from capkv._deprecations import signature_of
    from capkv.devmode import _instrument
    from capkv.devmode._instrument import CHECKED_METHODS as CHECKED_METHODS
    from capkv.devmode._instrument import Instrumented as Instrumented

    @deprecated("capkv.devmode.instrument.instrument is deprecated (capkv 0.2.0, removed in 0.3.0): use capkv.devmode.instrument")
    @signature_of(_instrument.instrument)
    def instrument() -> None: ...

__all__: list[str] = []

if not TYPE_CHECKING:  # each name read with a DeprecationWarning (or, if gone, an ImportError)
    __getattr__, __dir__ = deprecated_module(__name__)
