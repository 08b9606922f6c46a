"""The CPU fast path: whole-block row copies, batched over blocks, straight to and from host rows.

Slabs are cut into pieces so a gather stays a handful of parallel regions (why: docs/internals.md, "The CPU
path").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from capkv.transfer._handle import FINISHED, CopyHandle
from capkv.transfer._layout import GroupRuns

if TYPE_CHECKING:
    import torch
else:  # torch loads with the first tensor operation, not with this module
    from capkv._torch import torch

__all__ = ["SLICE_WORDS", "CpuCopies", "pieces"]

SLICE_WORDS = 32768
"""ATen's parallel grain (``at::internal::GRAIN_SIZE``): ``index_select`` splits its ids among threads only
when one id's slice has fewer elements than this; a gather keeps every slice below it."""

Piece = tuple[int, int, int, int, "torch.Tensor"]
"""``(first run, runs, first word, last word + 1, view)``: ``view`` is ``slab[runs, :, words]``."""


def pieces(slabs: tuple[tuple[int, torch.Tensor], ...], limit: int) -> tuple[Piece, ...]:
    """Cut each ``(first run, (runs, num_blocks, width))`` slab into views whose per-block slice
    (``runs x words``) has fewer than ``limit`` elements and is dense: runs together only where they
    are adjacent in memory (while they fit), a run's words in near-equal column chunks when one run
    alone does not fit.

    A slice of runs apart (K and V of vLLM's layout) is not dense, and ``index_select`` then copies it
    id by id through a generic copy kernel instead of one ``memcpy`` each: at 16-token blocks that cost
    a tenth of the throughput, more than the few extra calls one piece per run takes."""
    found: list[Piece] = []
    for first, slab in slabs:
        runs, width = slab.shape[0], slab.shape[2]
        adjacent = runs == 1 or (slab.stride(2) == 1 and slab.stride(0) == width)
        together = max(1, (limit - 1) // max(1, width)) if adjacent else 1
        chunks = 1 if together > 1 or width < limit else -(-width // (limit - 1))
        cuts = [width * chunk // chunks for chunk in range(chunks + 1)]
        for run in range(0, runs, together):
            count = min(together, runs - run)
            for start, stop in zip(cuts, cuts[1:]):
                found.append((first + run, count, start, stop, slab[run : run + count, :, start:stop]))
    return tuple(found)


class CpuCopies:
    """Synchronous copies between a group's slabs and host rows on the CPU."""

    __slots__ = ("_pieces",)

    def __init__(self) -> None:
        self._pieces: dict[tuple[int, int, int], tuple[Piece, ...]] = {}

    def gather(self, runs: GroupRuns, word: int, ids: torch.Tensor, rows: torch.Tensor) -> CopyHandle:
        """``rows[j, p] = run_p[ids[j]]`` for every block ``j`` and run ``p``."""
        key = (runs.index, word, SLICE_WORDS)
        found = self._pieces.get(key)
        if found is None:
            found = self._pieces[key] = pieces(runs.slabs(word), SLICE_WORDS)
        for first, count, start, stop, view in found:
            torch.index_select(view, 1, ids, out=rows[:, first : first + count, start:stop].transpose(0, 1))
        return FINISHED

    def scatter(self, runs: GroupRuns, word: int, ids: torch.Tensor, rows: torch.Tensor) -> CopyHandle:
        """``run_p[ids[j]] = rows[j, p]``; ``ids`` has no duplicates.

        An indexed write is one parallel region per slab whatever the slice size, so slabs stay whole.
        """
        for first, slab in runs.slabs(word):
            slab[:, ids] = rows[:, first : first + slab.shape[0]].transpose(0, 1)
        return FINISHED
