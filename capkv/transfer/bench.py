"""capkv 0.1.0's ``capkv.transfer.bench``, deprecated: kept until capkv 0.3.0.

Its names are internal to capkv now. Reading a name here warns with its new home (the table:
:mod:`capkv._deprecations`).
"""

from typing import TYPE_CHECKING

from capkv._lazy import deprecated_module

if TYPE_CHECKING:
    from typing_extensions import deprecated

    from capkv._deprecations import signature_of
    from capkv.transfer import _bench
    from capkv.transfer._bench import Timing as Timing
    from capkv.transfer._bench import TransferFigures as TransferFigures

    @deprecated("capkv.transfer.bench.measure_transfer is deprecated (capkv 0.2.0, removed in 0.3.0): it is internal, with no public replacement")
    @signature_of(_bench.measure_transfer)
    def measure_transfer() -> None: ...

__all__: list[str] = []

if not TYPE_CHECKING:  # each name read with a DeprecationWarning (or, if gone, an ImportError)
    __getattr__, __dir__ = deprecated_module(__name__)
