"""Block copy ops: paged per-layer KV tensors <-> host rows, for every KV-cache group.

Connectors copy through :class:`BlockCopier` whatever the layout or device; open ``_copier.py`` first (the
mechanics: docs/internals.md, "Copy ops").
"""

from typing import TYPE_CHECKING

from capkv._lazy import attach

if TYPE_CHECKING:
    from capkv.transfer._copier import BlockCopier
    from capkv.transfer._handle import CopyHandle
    from capkv.transfer._layout import spec_block_nbytes

__all__ = ["BlockCopier", "CopyHandle", "spec_block_nbytes"]

if not TYPE_CHECKING:  # checkers read the imports above (see capkv._lazy)
    __getattr__, __dir__ = attach(
        __name__,
        {
            "capkv.transfer._copier": ["BlockCopier"],
            "capkv.transfer._handle": ["CopyHandle"],
            "capkv.transfer._layout": ["spec_block_nbytes"],
        },
    )

del TYPE_CHECKING, attach  # dir(), vars(): the front's names only
