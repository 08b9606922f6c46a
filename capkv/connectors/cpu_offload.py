"""capkv 0.1.0's ``capkv.connectors.cpu_offload``, deprecated: kept until capkv 0.3.0.

Its public names are imported from :mod:`capkv.connectors` now; its other names are internal.
``HostPoolWorker`` is gone (an ``ImportError`` says why). Reading a name here warns with its new
home (the table: :mod:`capkv._deprecations`).
"""

from typing import TYPE_CHECKING

from capkv._lazy import deprecated_module

if TYPE_CHECKING:
    from capkv.connectors._cpu_offload import CPUOffloadConnector as CPUOffloadConnector
    from capkv.connectors._cpu_offload import HostPoolConnector as HostPoolConnector

__all__: list[str] = []

if not TYPE_CHECKING:  # each name read with a DeprecationWarning (or, if gone, an ImportError)
    __getattr__, __dir__ = deprecated_module(__name__)
