"""Block copy ops: paged per-layer KV tensors <-> host rows, for every KV-cache group.

:class:`BlockCopier` gathers and scatters any set of one group's blocks; each
copy returns a :class:`CopyHandle` (finished at once on CPU, an event on CUDA).
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
