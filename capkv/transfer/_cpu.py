"""The CPU fast path: whole-block row copies, batched over blocks, straight to and from host rows.

A layer's runs form one evenly spaced slab (dense layouts always do), so a
gather is one ``torch.index_select`` per slab, written straight into the host
rows (no temporary), and a scatter one indexed write per slab, read straight
from them. Blocks whose ids follow each other (``7, 8, 9``: what a fresh block
pool hands out) lie next to each other in every slab, so a run of them moves as
one strided copy instead — the element-by-element indexed kernels run at about
two thirds of a plain copy's speed, a strided copy at nearly all of it — when
the run is long enough to pay for its call (:data:`SPAN_BYTES`). Both run on
torch's intra-op threads over 16-byte words (``capkv bench transfer`` measures them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from capkv.transfer._handle import FINISHED, CopyHandle
from capkv.transfer._layout import GroupRuns

if TYPE_CHECKING:
    import torch
else:  # torch loads with the first tensor operation, not with this module
    from capkv._torch import torch

__all__ = ["SPAN_BYTES", "CpuCopies", "spans"]

SPAN_BYTES = 128 << 10
"""A run of consecutive blocks is copied as one strided copy when it moves at least this many bytes
per slab on average; shorter runs go through the indexed kernel, whose one call covers every block."""


def spans(ids: list[int]) -> list[tuple[int, int]]:
    """``[start, stop)`` positions of ``ids`` where the ids ascend by one (``[4, 5, 6, 9]``: two)."""
    found: list[tuple[int, int]] = []
    start = 0
    for position in range(1, len(ids)):
        if ids[position] != ids[position - 1] + 1:
            found.append((start, position))
            start = position
    if ids:
        found.append((start, len(ids)))
    return found


class CpuCopies:
    """Synchronous copies between a group's slabs and host rows on the CPU."""

    __slots__ = ()

    def gather(self, runs: GroupRuns, word: int, ids: torch.Tensor, rows: torch.Tensor) -> CopyHandle:
        """``rows[j, p] = run_p[ids[j]]`` for every block ``j`` and run ``p``."""
        slabs = runs.slabs(word)
        found = _coalesced(ids, slabs, word)
        for first, slab in slabs:
            width = slab.shape[0]
            if found is None:
                torch.index_select(slab, 1, ids, out=rows[:, first : first + width].transpose(0, 1))
                continue
            for start, stop, block in found:
                rows[start:stop, first : first + width].copy_(slab[:, block : block + stop - start].transpose(0, 1))
        return FINISHED

    def scatter(self, runs: GroupRuns, word: int, ids: torch.Tensor, rows: torch.Tensor) -> CopyHandle:
        """``run_p[ids[j]] = rows[j, p]``; ``ids`` has no duplicates."""
        slabs = runs.slabs(word)
        found = _coalesced(ids, slabs, word)
        for first, slab in slabs:
            width = slab.shape[0]
            if found is None:
                slab[:, ids] = rows[:, first : first + width].transpose(0, 1)
                continue
            for start, stop, block in found:
                slab[:, block : block + stop - start].copy_(rows[start:stop, first : first + width].transpose(0, 1))
        return FINISHED


def _coalesced(
    ids: torch.Tensor, slabs: tuple[tuple[int, torch.Tensor], ...], word: int
) -> list[tuple[int, int, int]] | None:
    """``(start, stop, first block id)`` per run of consecutive ids, when the runs are long enough to
    copy one by one (:data:`SPAN_BYTES`); else ``None``: one indexed copy for every block."""
    count = ids.numel()
    per_block = min(slab.shape[0] * slab.shape[2] for _, slab in slabs) * word
    if count * per_block < SPAN_BYTES:
        return None
    listed = cast("list[int]", ids.tolist())  # pyright: ignore[reportUnknownMemberType]
    found = spans(listed)
    if count * per_block < SPAN_BYTES * len(found):
        return None
    return [(start, stop, listed[start]) for start, stop in found]
