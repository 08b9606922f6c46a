"""Bit-exact verification: the cached KV against recomputation.

The model's KV is a pure function of (layer, position, prefix), so the engine can check any slot at any time.
"""

from __future__ import annotations

import torch

from capkv._homes import publish
from capkv.engine._compute import KVFunction
from capkv.engine._kv_cache import PagedKVCache
from capkv.engine._model import GroupLayout
from capkv.engine._outputs import Mismatch
from capkv.engine._request import Request
from capkv.errors import CapkvError

__all__ = ["VerificationError", "Verifier"]

_SAME_SIZE_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


class VerificationError(CapkvError):
    """Cached KV differs from recomputation: a connector stored or loaded the wrong bytes."""

    def __init__(self, mismatch: Mismatch) -> None:
        super().__init__(f"KV mismatch: {mismatch.describe()}", method="verify", group=mismatch.group, value=mismatch)
        self.mismatch = mismatch


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.contiguous().view(_SAME_SIZE_INT[tensor.element_size()])


class Verifier:
    """Compares slots of the paged cache with what the model computes for them.

    The engine checks twice per request: right after a connector loaded KV (before any layer uses it), and
    when the request finishes (every block it still holds, in every group and layer). Comparisons are on the
    raw bits, so ``-0.0`` vs ``0.0`` or a NaN is a mismatch too.
    """

    def __init__(self, cache: PagedKVCache, kv_function: KVFunction) -> None:
        self.cache = cache
        self.kv_function = kv_function

    def check_range(
        self,
        request: Request,
        group: GroupLayout,
        layer: str,
        table: list[int],
        start: int,
        stop: int,
        *,
        when: str,
    ) -> list[Mismatch]:
        """One :class:`Mismatch` per block of ``[start, stop)`` whose KV is wrong in ``layer`` (null blocks skipped)."""
        stop = min(stop, len(table) * group.block_size)
        if stop <= start:
            return []
        slots = self.cache.slots(group, table, range(start, stop), skip_null=True)
        if not len(slots):
            return []
        positions = slots.positions
        seeds = self.kv_function.seeds([request.prefix_hash(p) for p in positions])
        expected = self.kv_function.kv(layer, seeds)
        got, expected = _bits(self.cache.read(layer, slots)), _bits(expected)
        if torch.equal(got, expected):
            return []
        bad = (got != expected).flatten(2).any(dim=2).any(dim=0)
        found: dict[int, Mismatch] = {}
        for found_at in torch.nonzero(bad).flatten():
            index = int(found_at)
            block_index = slots.block_indices[index]
            if block_index not in found:
                found[block_index] = Mismatch(
                    request_id=request.request_id,
                    group=group.index,
                    layer=layer,
                    block_id=slots.block_ids[index],
                    block_index=block_index,
                    position=positions[index],
                    when=when,
                )
        return list(found.values())

    def check_request(self, request: Request, tables: tuple[list[int], ...], *, when: str = "at finish") -> Mismatch | None:
        """The first mismatch anywhere in the request's computed KV, group by group, layer by layer."""
        for group, table in zip(self.cache.shape.groups, tables, strict=True):
            for layer in group.layer_names:
                found = self.check_range(request, group, layer, table, 0, request.num_computed_tokens, when=when)
                if found:
                    return found[0]
        return None


publish(__name__)
