"""capkv 0.1.0's ``capkv.transfer.cuda``, deprecated: kept until capkv 0.3.0.

Its names are internal to capkv now. Reading a name here warns with its new home (the table:
:mod:`capkv._deprecations`).
"""

from typing import TYPE_CHECKING

from capkv._lazy import deprecated_module

if TYPE_CHECKING:
    from typing_extensions import deprecated

    from capkv._deprecations import signature_of
    from capkv.transfer import _cuda
    from capkv.transfer._cuda import CudaCopies as CudaCopies
    from capkv.transfer._cuda import DEFAULT_STAGING_BYTES as DEFAULT_STAGING_BYTES

    @deprecated("capkv.transfer.cuda.chunk_spans is deprecated (capkv 0.2.0, removed in 0.3.0): it is internal, with no public replacement")
    @signature_of(_cuda.chunk_spans)
    def chunk_spans() -> None: ...

__all__: list[str] = []

if not TYPE_CHECKING:  # each name read with a DeprecationWarning (or, if gone, an ImportError)
    __getattr__, __dir__ = deprecated_module(__name__)
