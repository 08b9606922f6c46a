"""The CPU fast path: whole-block row copies, batched over blocks, straight to and from host rows.

A gather is one ``torch.index_select`` per run of a layer, written straight
into the host rows (no temporary); a scatter is one indexed write per layer
(all its runs as one evenly spaced slab), read straight from them. Both run on
torch's intra-op threads over 16-byte words, close to a plain copy of the same
bytes (``capkv bench transfer`` measures it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from capkv.transfer._handle import FINISHED, CopyHandle
from capkv.transfer._layout import GroupRuns

if TYPE_CHECKING:
    import torch
else:  # torch loads with the first tensor operation, not with this module
    from capkv._torch import torch

__all__ = ["CpuCopies"]


class CpuCopies:
    """Synchronous copies between a group's planes and host rows on the CPU."""

    __slots__ = ()

    def gather(self, runs: GroupRuns, word: int, ids: torch.Tensor, rows: torch.Tensor) -> CopyHandle:
        """``rows[j, p] = plane_p[ids[j]]`` for every block ``j`` and run ``p``."""
        for index, plane in enumerate(runs.planes(word)):
            torch.index_select(plane, 0, ids, out=rows[:, index])
        return FINISHED

    def scatter(self, runs: GroupRuns, word: int, ids: torch.Tensor, rows: torch.Tensor) -> CopyHandle:
        """``plane_p[ids[j]] = rows[j, p]``; ``ids`` has no duplicates."""
        for first, slab in runs.slabs(word):
            slab[:, ids] = rows[:, first : first + slab.shape[0]].transpose(0, 1)
        return FINISHED
