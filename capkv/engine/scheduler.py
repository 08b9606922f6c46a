"""capkv 0.1.0's ``capkv.engine.scheduler``, deprecated: kept until capkv 0.3.0.

Its public names are imported from :mod:`capkv.engine` now; its other names are internal. Reading a
name here warns with its new home (the table: :mod:`capkv._deprecations`).
"""

from typing import TYPE_CHECKING

from capkv._lazy import deprecated_module

if TYPE_CHECKING:
    from capkv.engine._scheduler import FinishedRequest as FinishedRequest
    from capkv.engine._scheduler import Scheduler as Scheduler

__all__: list[str] = []

if not TYPE_CHECKING:  # each name read with a DeprecationWarning (or, if gone, an ImportError)
    __getattr__, __dir__ = deprecated_module(__name__)
