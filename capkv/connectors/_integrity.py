"""The one integrity check of every stored block: XXH3-128 of its bytes, bound to what the block claims to be.

Storage damages bytes in patterns no position-weighted sum can promise to see
(two flipped top bits cancel in a sum mod 2**64); a CRC-32 misses one random
corruption in 4 billion. XXH3-128 (the ``xxhash`` library) lets any change —
flipped bits, a torn or shifted sector, words moved or zeroed — through with
probability about 2**-128, and runs faster than a plain ``memcpy`` of the same
bytes, in C, releasing the GIL (``benchmarks/integrity.py`` measures both).
Not a defence against an adversary who can write the store: nothing short of
a keyed MAC is.

The checksum is *bound* to the record's identity (its key, the layout
fingerprint, whatever the caller names): the identity's own 64-bit hash seeds
the payload's hash, so a payload that arrives intact with its checksum but
under another key's header — records spliced, moved or swapped — fails too.

Used by every store whose bytes leave the process (files, Redis). The host
pool does not checksum: its blocks never leave this process's memory, where
ECC (not a checksum) is the defence, and a check would add a pass over every
block to the fastest tier's saves and loads.
"""

from __future__ import annotations

import xxhash

from capkv.connectors._keys import BlockKey

__all__ = ["CHECKSUM_SIZE", "block_identity", "checksum"]

CHECKSUM_SIZE = 16
"""Bytes of a :func:`checksum`."""


def checksum(payload: memoryview | bytes | bytearray, identity: bytes = b"") -> bytes:
    """The :data:`CHECKSUM_SIZE`-byte integrity check of ``payload`` as the record ``identity`` names.

    ``identity`` is any byte string that says what the payload is (see :func:`block_identity`);
    the same payload under another identity has another checksum.
    """
    seed = xxhash.xxh3_64_intdigest(identity) if identity else 0
    return xxhash.xxh3_128_digest(payload, seed)


def block_identity(key: BlockKey, fingerprint: bytes) -> bytes:
    """The identity a stored block is checked under: its key's group and digest and the layout fingerprint."""
    return key.group.to_bytes(4, "little") + key.digest + fingerprint
