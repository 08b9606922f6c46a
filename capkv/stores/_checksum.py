"""The one checksum every stored value carries: computed when it is sealed, checked when it is read.

XXH3-128 bound to the value's key and layout, so damaged bytes and values spliced under another key both fail
(why this one: docs/internals.md, "The checksum").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import xxhash

from capkv.stores._host import dense_rows, rows_memory
from capkv.stores._keys import BlockKey

if TYPE_CHECKING:
    import torch

__all__ = ["CHECKSUM_SIZE", "block_identity", "checksum", "checksum_parts", "payload_checksums"]

CHECKSUM_SIZE = 16
"""Bytes of a checksum in a value header."""


def checksum(payload: memoryview | bytes | bytearray, identity: bytes = b"") -> bytes:
    """The :data:`CHECKSUM_SIZE`-byte checksum of ``payload`` as the value ``identity`` names (the
    same bytes under another identity have another checksum)."""
    seed = xxhash.xxh3_64_intdigest(identity) if identity else 0
    return xxhash.xxh3_128_digest(payload, seed)


def checksum_parts(parts: Sequence[memoryview], identity: bytes = b"") -> bytes:
    """:func:`checksum` of the concatenation of ``parts`` (XXH3 streams: the same digest, no copy)."""
    seed = xxhash.xxh3_64_intdigest(identity) if identity else 0
    state = xxhash.xxh3_128(seed=seed)
    for part in parts:
        state.update(part)
    return state.digest()


def block_identity(block: BlockKey, layout: bytes) -> bytes:
    """What a stored block's checksum is bound to: its group, its digest and its layout fingerprint."""
    return block.group.to_bytes(4, "little") + block.digest + layout


def payload_checksums(payloads: torch.Tensor, identities: Sequence[bytes]) -> list[bytes]:
    """The checksum of each row of a 2-D ``uint8`` CPU tensor (one block's bytes per row, each row
    contiguous, rows anywhere: ``rows[:, HEADER_SIZE:]`` is fine), row ``i`` as ``identities[i]``."""
    count, width = payloads.shape
    if count != len(identities):
        raise ValueError(f"{count} payloads but {len(identities)} identities")
    payloads = dense_rows(payloads)
    memory, stride = rows_memory(payloads)
    return [
        checksum(memory[index * stride : index * stride + width], identity)
        for index, identity in enumerate(identities)
    ]
