"""capkv 0.1.0's ``capkv.composite.completion``, deprecated: kept until capkv 0.3.0.

``ReceiveFromLoader``, ``SendCountdown`` are gone (an ``ImportError`` says why).
"""

from typing import TYPE_CHECKING

from capkv._lazy import deprecated_module

__all__: list[str] = []

if not TYPE_CHECKING:  # each name read with a DeprecationWarning (or, if gone, an ImportError)
    __getattr__, __dir__ = deprecated_module(__name__)
