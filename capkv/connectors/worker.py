"""capkv 0.1.0's ``capkv.connectors.worker``, deprecated: kept until capkv 0.3.0.

Its names are internal to capkv now. ``Landing``, ``StoredWhenCopied``, ``consecutive_runs`` are
gone (an ``ImportError`` says why). Reading a name here warns with its new home (the table:
:mod:`capkv._deprecations`).
"""

from typing import TYPE_CHECKING

from capkv._lazy import deprecated_module

if TYPE_CHECKING:
    from capkv.stores._worker import StoreWorker as StoreWorker

__all__: list[str] = []

if not TYPE_CHECKING:  # each name read with a DeprecationWarning (or, if gone, an ImportError)
    __getattr__, __dir__ = deprecated_module(__name__)
