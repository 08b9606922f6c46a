"""One stored block as one self-checking value: a 64-byte header, then the block's bytes.

Every backend stores the same values, so what a backend does to them — cut
them short, damage them, return another key's value, hold a value written by an
engine with another memory layout under a colliding name — is caught here, once:
the header repeats the key (group and digest), the layout fingerprint (which
includes the worker's shard) and the payload length, and carries the payload's
checksum (:mod:`capkv.stores._checksum`). A value is loaded only when all of
them match.

Header (little-endian): magic ``CKVB`` (4 bytes), format version (2), flags (2,
zero), group (4), payload length (4), digest (16), layout (16), checksum (16).
64 bytes, so the payload starts on a cache line wherever a value is laid out;
a save builds header and payload in one host row and hands the backend that row
without copying it.
"""

from __future__ import annotations

import ctypes
import enum
import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING

from capkv.stores._backend import StoreKey
from capkv.stores._checksum import CHECKSUM_SIZE, block_identity, payload_checksums
from capkv.stores._keys import DIGEST_SIZE, BlockKey

if TYPE_CHECKING:
    import torch

__all__ = [
    "HEADER_SIZE",
    "LAYOUT_SIZE",
    "ValueCheck",
    "ValueHeader",
    "check_value",
    "check_values",
    "pack_header",
    "row_memory",
    "seal_values",
    "unpack_header",
]

LAYOUT_SIZE = 16
"""Bytes of the layout fingerprint in a key and a header."""

_MAGIC = b"CKVB"
_VERSION = 2
"""2: XXH3-128 bound to key and layout (1 had a position-weighted sum); values of version 1 are misses."""
_HEADER = struct.Struct(f"<4sHHII{DIGEST_SIZE}s{LAYOUT_SIZE}s{CHECKSUM_SIZE}s")
HEADER_SIZE = _HEADER.size
"""Bytes before the payload (64)."""


class ValueCheck(enum.Enum):
    """What a value read back under a key turned out to be."""

    OK = "ok"
    ABSENT = "absent"
    FOREIGN = "foreign"
    """Well formed, of another memory layout or format version: someone else's, left alone."""
    DAMAGED = "damaged"
    """Truncated, padded, corrupted, another key's, or not a capkv value: nobody can use it."""


class ValueHeader:
    """A parsed header: what a value claims to be."""

    __slots__ = ("checksum", "key", "layout", "length")

    def __init__(self, key: BlockKey, layout: bytes, length: int, checksum: bytes) -> None:
        self.key = key
        self.layout = layout
        self.length = length
        self.checksum = checksum


def pack_header(key: BlockKey, layout: bytes, length: int, checksum: bytes) -> bytes:
    """The header of ``key``'s value: ``length`` payload bytes with ``checksum``, gathered under ``layout``."""
    return _HEADER.pack(_MAGIC, _VERSION, 0, key.group, length, key.digest, layout, checksum)


def unpack_header(header: bytes | bytearray | memoryview) -> ValueHeader | None:
    """What the first :data:`HEADER_SIZE` bytes claim, or ``None`` when they are not a capkv value header
    of this format version (``FOREIGN`` values of another version read as ``None`` too)."""
    if len(header) < HEADER_SIZE:
        return None
    magic, version, flags, group, length, digest, layout, checksum = _HEADER.unpack_from(header)
    if magic != _MAGIC or version != _VERSION or flags:
        return None
    return ValueHeader(BlockKey(group, digest), layout, length, checksum)


def row_memory(rows: torch.Tensor) -> memoryview:
    """The bytes of a contiguous CPU ``uint8`` tensor (or one row), without copying (keep the tensor alive)."""
    buffer = (ctypes.c_char * rows.numel()).from_address(rows.data_ptr())
    return memoryview(buffer).cast("B")


def seal_values(rows: torch.Tensor, keys: Sequence[StoreKey]) -> list[memoryview]:
    """Write each row's header in front of its payload (``rows[i, HEADER_SIZE:]``, gathered already);
    the values, one memoryview per row, in order."""
    payload = rows.shape[1] - HEADER_SIZE
    sums = payload_checksums(rows[:, HEADER_SIZE:], [block_identity(key.block, key.layout) for key in keys])
    values: list[memoryview] = []
    for index, (key, checksum) in enumerate(zip(keys, sums, strict=True)):
        row = row_memory(rows[index])
        row[:HEADER_SIZE] = pack_header(key.block, key.layout, payload, checksum)
        values.append(row)
    return values


def check_values(rows: torch.Tensor, keys: Sequence[StoreKey], lengths: Sequence[int | None]) -> list[ValueCheck]:
    """Whether each row holds ``keys[i]``'s value, whole and intact; ``lengths[i]`` is how many bytes
    the backend put in the row (``None``: absent). Checksums of the rows that may pass are computed in one batch."""
    results: list[ValueCheck] = []
    candidates: list[int] = []
    claimed: list[bytes] = []
    for index, (key, length) in enumerate(zip(keys, lengths, strict=True)):
        if length is None:
            results.append(ValueCheck.ABSENT)
            continue
        header = unpack_header(row_memory(rows[index, :HEADER_SIZE])) if length >= HEADER_SIZE else None
        if header is None:
            results.append(_unknown(rows, index, length))
        elif header.key != key.block:
            results.append(ValueCheck.DAMAGED)  # another key's value: never this one's
        elif header.layout != key.layout:
            results.append(ValueCheck.FOREIGN)
        elif length != key.nbytes or header.length != key.nbytes - HEADER_SIZE:
            results.append(ValueCheck.DAMAGED)
        else:
            results.append(ValueCheck.OK)
            candidates.append(index)
            claimed.append(header.checksum)
    if candidates:
        payloads = rows[:, HEADER_SIZE:]
        if len(candidates) != len(keys):
            payloads = payloads[candidates]
        identities = [block_identity(keys[index].block, keys[index].layout) for index in candidates]
        for index, stored, actual in zip(candidates, claimed, payload_checksums(payloads, identities), strict=True):
            if stored != actual:
                results[index] = ValueCheck.DAMAGED
    return results


def check_value(value: bytes | bytearray | memoryview | None, key: StoreKey) -> ValueCheck:
    """Whether ``value`` (as a backend returned it) is ``key``'s value, whole and intact."""
    import torch  # noqa: PLC0415

    rows = torch.zeros((1, key.nbytes), dtype=torch.uint8)
    if value is not None:
        data = memoryview(value).cast("B")
        count = min(len(data), key.nbytes)
        row_memory(rows[0])[:count] = data[:count]
    return check_values(rows, [key], [None if value is None else len(memoryview(value).cast("B"))])[0]


def _unknown(rows: torch.Tensor, index: int, length: int) -> ValueCheck:
    """A row whose header does not parse: a value of another format version (well formed) is someone else's."""
    if length >= 8 and bytes(row_memory(rows[index, :4])) == _MAGIC:
        version = int.from_bytes(bytes(row_memory(rows[index, 4:6])), "little")
        if version != _VERSION:
            return ValueCheck.FOREIGN
    return ValueCheck.DAMAGED
