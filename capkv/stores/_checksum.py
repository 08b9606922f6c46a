"""The one checksum every stored value carries: computed when it is sealed, checked when it is read.

Every backend's values go through :func:`payload_checksums`, so changing the
checksum (its algorithm, its width) is a change here and nowhere else. It is
16 bytes wide in the value header (:mod:`capkv.stores._value`).

Today's checksum is a position-weighted sum (mod 2**64) of the payload's 8-byte
words taken along two axes, every word with an odd weight: it changes with every
single-bit error, and words moved, swapped, zeroed or cut off pass it only by
coincidence; torch computes it for a whole batch of blocks at memory speed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    import torch

__all__ = ["CHECKSUM_SIZE", "payload_checksums"]

CHECKSUM_SIZE = 16
"""Bytes of a checksum in a value header."""

_CHUNK_WORDS = 64
_MIX = 0x0E3779B97F4A7C15
_weights = cast("dict[int, torch.Tensor]", {})


def payload_checksums(payloads: torch.Tensor) -> list[bytes]:
    """The checksum of each row of a 2-D ``uint8`` CPU tensor (one block's bytes per row, each row contiguous)."""
    import torch  # noqa: PLC0415 (loaded with the first block, not with the store classes)

    count, nbytes = payloads.shape
    if count == 0:
        return []
    words = payloads.view(torch.int64) if nbytes % 8 == 0 and payloads.stride(0) % 8 == 0 else payloads.to(torch.int64)
    width = words.shape[1]
    chunk = _CHUNK_WORDS if width % _CHUNK_WORDS == 0 else 1
    grid = words.view(count, width // chunk, chunk)
    across, down = grid.sum(dim=2), grid.sum(dim=1)
    # Each word's total weight, (2c + 1) + 2 * MIX * (2k + 1), is odd: a flip of any single bit moves the sum.
    mixed = (across * _odd_weights(across.shape[1])).sum(dim=1) + (down * _odd_weights(chunk)).sum(dim=1) * (2 * _MIX)
    values = cast("list[int]", mixed.tolist())  # pyright: ignore[reportUnknownMemberType]
    return [(value & 0xFFFF_FFFF_FFFF_FFFF).to_bytes(CHECKSUM_SIZE, "little") for value in values]


def _odd_weights(count: int) -> torch.Tensor:
    import torch  # noqa: PLC0415

    weights = _weights.get(count)
    if weights is None:
        weights = _weights[count] = torch.arange(count, dtype=torch.int64) * 2 + 1
    return weights
