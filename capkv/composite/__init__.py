"""The generic composite: what a stack reports about its children's completion reports.

``MultiConnector`` and its metadata are public from :mod:`capkv`; this front adds
what only a stack's observer needs: why a child's report was dropped
(:class:`Drop`, counted in ``stack.dropped_reports``) and the marker of metadata
a side has not built (:data:`NOT_BUILT`). The ``capkv.composite`` logger is the
one dropped reports are logged on.
"""

from typing import TYPE_CHECKING

from capkv._lazy import attach

if TYPE_CHECKING:
    from capkv.composite._completion import Drop, DroppedReports
    from capkv.composite._metadata import NOT_BUILT

__all__ = ["NOT_BUILT", "Drop", "DroppedReports"]

if not TYPE_CHECKING:  # checkers read the imports above (see capkv._lazy)
    __getattr__, __dir__ = attach(
        __name__,
        {"capkv.composite._completion": ["Drop", "DroppedReports"], "capkv.composite._metadata": ["NOT_BUILT"]},
    )

del TYPE_CHECKING, attach  # dir(), vars(): the front's names only
