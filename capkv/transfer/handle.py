"""capkv 0.1.0's ``capkv.transfer.handle``, deprecated: kept until capkv 0.3.0.

Its public names are imported from :mod:`capkv.transfer` now; its other names are internal. Reading
a name here warns with its new home (the table: :mod:`capkv._deprecations`).
"""

from typing import TYPE_CHECKING

from capkv._lazy import deprecated_module

if TYPE_CHECKING:
    from typing_extensions import deprecated

    from capkv._deprecations import signature_of
    from capkv.transfer import _handle
    from capkv.transfer._handle import AllCopies as AllCopies
    from capkv.transfer._handle import CopyHandle as CopyHandle
    from capkv.transfer._handle import CudaEventCopy as CudaEventCopy
    from capkv.transfer._handle import FINISHED as FINISHED
    from capkv.transfer._handle import FinishedCopy as FinishedCopy

    @deprecated("capkv.transfer.handle.all_of is deprecated (capkv 0.2.0, removed in 0.3.0): it is internal, with no public replacement")
    @signature_of(_handle.all_of)
    def all_of() -> None: ...

__all__: list[str] = []

if not TYPE_CHECKING:  # each name read with a DeprecationWarning (or, if gone, an ImportError)
    __getattr__, __dir__ = deprecated_module(__name__)
