"""The one checksum every stored value carries: computed when it is sealed, checked when it is read.

Every backend's values go through :func:`payload_checksums` (one block:
:func:`checksum`), so changing the checksum is a change here and nowhere else.
It is 16 bytes wide in the value header (:mod:`capkv.stores._value`).

It is XXH3-128 (the ``xxhash`` library). Storage damages bytes in patterns a
position-weighted sum cannot promise to see (two flipped top bits cancel in a
sum mod 2**64: a fresh engine loaded such a block) and a CRC-32 lets one random
corruption in 4 billion through; XXH3-128 lets any change — flipped bits, a
torn or shifted sector, words moved or zeroed — through with probability about
2**-128, faster than a plain ``memcpy`` of the same bytes, in C, releasing the
GIL (``python -m benchmarks.integrity`` measures it against memcpy and CRC32C).
Not a defence against an adversary who can write the store: nothing short of a
keyed MAC is.

The checksum is *bound* to the value's identity (:func:`block_identity`: its
block key and layout): the identity's own 64-bit hash seeds the payload's hash,
so a payload that arrives intact with its checksum under another key's header —
records spliced, moved or swapped — fails too.

The shared store layer checks every backend's values, the host pool's too:
there the threat is not storage (RAM has ECC) but bookkeeping — a slot handed to
another key, a value overwritten while still indexed — which the key binding
catches, for about half a memcpy's time per block.
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
