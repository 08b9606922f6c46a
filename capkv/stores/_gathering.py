"""A save's gather on CPU with its checksums computed while the rows are still in the CPU's cache.

An inline save pays for the checksum in the step anyway; computing it per chunk reads bytes that are still
hot.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

from capkv.stores._backend import StoreKey
from capkv.stores._checksum import block_identity, payload_checksums
from capkv.stores._value import HEADER_SIZE

if TYPE_CHECKING:  # torch loads with the KV cache, not with the store classes
    import torch

    import capkv.transfer._copier
    import capkv.transfer._handle

__all__ = ["gather_checksummed"]


def gather_checksummed(
    copier: capkv.transfer._copier.BlockCopier, group: int, block_ids: Sequence[int], rows: torch.Tensor,
    keys: Sequence[StoreKey], chunk_rows: int,
) -> tuple[capkv.transfer._handle.CopyHandle, list[bytes] | None]:
    """Gather ``block_ids`` into ``rows`` (payload after the header space) ``chunk_rows`` at a time,
    checksumming each chunk as its copy ends; the copy's handle and the checksums (``None`` when a copy
    was still running on return: the writer checksums the rows once it is over)."""
    from capkv.transfer._handle import all_of  # noqa: PLC0415 (with the KV cache)

    checksums: list[bytes] | None = []
    handles = cast("list[capkv.transfer._handle.CopyHandle]", [])
    count = len(block_ids)
    for start in range(0, count, chunk_rows):
        stop = min(count, start + chunk_rows)
        handle = copier.gather(group, block_ids[start:stop], rows[start:stop, HEADER_SIZE:])
        handles.append(handle)
        if checksums is not None and handle.done():
            identities = [block_identity(key.block, key.layout) for key in keys[start:stop]]
            checksums += payload_checksums(rows[start:stop, HEADER_SIZE:], identities)
        else:
            checksums = None
    return all_of(handles), checksums
