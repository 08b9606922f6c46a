"""The generic composite: ``MultiConnector``'s machinery, and what a stack reports about its children.

``MultiConnector`` is public from :mod:`capkv`; this front adds :class:`Drop` and :data:`NOT_BUILT`. Open
``_multi.py`` first (the mechanisms: docs/internals.md, "The composite").
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
