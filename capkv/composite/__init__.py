"""The composite's public details; ``capkv.MultiConnector`` itself is public from :mod:`capkv`.

What a caller of a stack may handle: :class:`Drop`, why a child's completion
report was dropped, and :class:`DroppedReports`, the counts a stack keeps in
``stack.dropped_reports``.
"""

from typing import TYPE_CHECKING

from capkv._lazy import attach

if TYPE_CHECKING:
    from capkv.composite._completion import Drop, DroppedReports

__all__ = ["Drop", "DroppedReports"]

if not TYPE_CHECKING:  # checkers read the imports above (see capkv._lazy)
    __getattr__, __dir__ = attach(__name__, {"capkv.composite._completion": ["Drop", "DroppedReports"]})
