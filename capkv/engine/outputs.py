"""capkv 0.1.0's ``capkv.engine.outputs``, deprecated: kept until capkv 0.3.0.

Its public names are imported from :mod:`capkv.engine`, :mod:`capkv.testing` now; its other names
are internal. Reading a name here warns with its new home (the table: :mod:`capkv._deprecations`).
"""

from typing import TYPE_CHECKING

from capkv._lazy import deprecated_module

if TYPE_CHECKING:
    from capkv.engine._outputs import ForwardContext as ForwardContext
    from capkv.engine._outputs import LoadCheck as LoadCheck
    from capkv.engine._outputs import Mismatch as Mismatch
    from capkv.engine._outputs import ModelRunnerOutput as ModelRunnerOutput
    from capkv.engine._outputs import ScheduledRequest as ScheduledRequest
    from capkv.engine._outputs import SchedulerOutput as SchedulerOutput

__all__: list[str] = []

if not TYPE_CHECKING:  # each name read with a DeprecationWarning (or, if gone, an ImportError)
    __getattr__, __dir__ = deprecated_module(__name__)
