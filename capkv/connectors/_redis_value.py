"""One stored block as one self-checking Redis value: a fixed header, then the block's bytes.

A value can be damaged (a bug, a hand edit, a partial restore), cut short, or
written by an engine with another KV layout under the same key (a namespace
shared by mistake). None of these may ever reach an engine's KV cache, so the
header repeats the key and carries a fingerprint of the KV layout and the
payload's checksum (:mod:`capkv.connectors._integrity`, bound to key and
layout); :func:`check_value` accepts a value only when all of them match.
Values of another format version (version 1 had a CRC-32 and a 64-byte header)
are someone else's: a miss, left alone, never misread.

The header is 128 bytes (the rest reserved, zero), so the payload starts on a
cache line wherever the value is laid out; a save builds header and payload in
one host row and hands Redis that row without copying it.
"""

from __future__ import annotations

import enum
import struct

from capkv.connectors._integrity import CHECKSUM_SIZE, block_identity, checksum
from capkv.connectors._keys import DIGEST_SIZE, BlockKey

__all__ = ["FINGERPRINT_SIZE", "HEADER_SIZE", "ValueCheck", "check_value", "pack_header"]

FINGERPRINT_SIZE = 16
"""Bytes of the KV-layout fingerprint in each header."""

_MAGIC = b"CAPKVRB\x00"
_VERSION = 2
_PREFIX = struct.Struct("<8sH")
"""Magic and version: the part every format version shares."""
_RESERVED = 128 - _PREFIX.size - struct.calcsize(f"<HI{DIGEST_SIZE}s{FINGERPRINT_SIZE}sQ{CHECKSUM_SIZE}s")
_HEADER = struct.Struct(f"<8sHHI{DIGEST_SIZE}s{FINGERPRINT_SIZE}sQ{CHECKSUM_SIZE}s{_RESERVED}s")
HEADER_SIZE = _HEADER.size
"""Bytes before the payload (128)."""


class ValueCheck(enum.Enum):
    """What a value read back under a key turned out to be."""

    OK = "ok"
    ABSENT = "absent"
    FOREIGN = "foreign"
    """Well formed, for another KV layout or format version: someone else's, left alone."""
    DAMAGED = "damaged"
    """Truncated, padded, corrupted, or not a capkv block: nobody can use it."""


def pack_header(key: BlockKey, fingerprint: bytes, payload: memoryview | bytes) -> bytes:
    """The header of ``key``'s value holding ``payload``."""
    return _HEADER.pack(
        _MAGIC, _VERSION, 0, key.group, key.digest, fingerprint, len(payload),
        checksum(payload, block_identity(key, fingerprint)), bytes(_RESERVED),
    )


def check_value(value: bytes | None, key: BlockKey, fingerprint: bytes, payload_nbytes: int) -> ValueCheck:
    """Whether ``value`` is ``key``'s block for the layout ``fingerprint``, ``payload_nbytes`` long, intact."""
    if value is None:
        return ValueCheck.ABSENT
    if len(value) < _PREFIX.size:
        return ValueCheck.DAMAGED
    magic, version = _PREFIX.unpack_from(value)
    if magic != _MAGIC:
        return ValueCheck.DAMAGED
    if version != _VERSION:
        return ValueCheck.FOREIGN  # another capkv's format: not ours to judge
    if len(value) < HEADER_SIZE:
        return ValueCheck.DAMAGED
    _, _, flags, group, digest, stored_fingerprint, length, stored, reserved = _HEADER.unpack_from(value)
    if (group, digest) != (key.group, key.digest) or flags or reserved != bytes(_RESERVED):
        return ValueCheck.DAMAGED
    if stored_fingerprint != fingerprint or length != payload_nbytes:
        return ValueCheck.FOREIGN
    if len(value) != HEADER_SIZE + length:
        return ValueCheck.DAMAGED
    if checksum(memoryview(value)[HEADER_SIZE:], block_identity(key, fingerprint)) != stored:
        return ValueCheck.DAMAGED
    return ValueCheck.OK
