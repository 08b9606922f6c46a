"""One stored block as one self-checking value: a 64-byte header, then the block's bytes.

Whatever a backend does to a value is caught here, once (the header: docs/internals.md, "Self-checking
values").
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING

from capkv.stores._backend import StoreKey
from capkv.stores._checksum import CHECKSUM_SIZE, block_identity, checksum, checksum_parts, payload_checksums
from capkv.stores._host import dense_rows, row_memory, rows_memory
from capkv.stores._keys import DIGEST_SIZE, BlockKey

if TYPE_CHECKING:
    import torch

__all__ = [
    "FORMAT_VERSION",
    "HEADER_SIZE",
    "LAYOUT_SIZE",
    "ValueCheck",
    "ValueHeader",
    "check_bytes",
    "check_memory",
    "check_value",
    "check_values",
    "pack_header",
    "why_damaged",
    "row_memory",
    "seal_values",
    "unpack_header",
]

LAYOUT_SIZE = 16
"""Bytes of the layout fingerprint in a key and a header."""

_MAGIC = b"CKVB"
FORMAT_VERSION = 2
"""The value format (in every header, and in every layout fingerprint: so in every key). 2: XXH3-128 bound to key and layout (1 had a position-weighted sum); values of version 1 are misses."""
_HEADER = struct.Struct(f"<4sHHII{DIGEST_SIZE}s{LAYOUT_SIZE}s{CHECKSUM_SIZE}s")
HEADER_SIZE = _HEADER.size
"""Bytes before the payload (64)."""


class ValueCheck(enum.Enum):
    """What a value read back under a key turned out to be."""

    OK = "ok"
    ABSENT = "absent"
    DAMAGED = "damaged"
    """Truncated, padded, corrupted in any byte (header or payload), another key's, or not a capkv value
    of this format: nobody can use it under this key, so it is deleted."""


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
    return _HEADER.pack(_MAGIC, FORMAT_VERSION, 0, key.group, length, key.digest, layout, checksum)


def unpack_header(header: bytes | bytearray | memoryview) -> ValueHeader | None:
    """What the first :data:`HEADER_SIZE` bytes claim, or ``None`` when they are not a capkv value header
    of this format version."""
    if len(header) < HEADER_SIZE:
        return None
    magic, version, flags, group, length, digest, layout, checksum = _HEADER.unpack_from(header)
    if magic != _MAGIC or version != FORMAT_VERSION or flags:
        return None
    return ValueHeader(BlockKey(group, digest), layout, length, checksum)


def seal_values(rows: torch.Tensor, keys: Sequence[StoreKey], checksums: Sequence[bytes] | None = None) -> list[memoryview]:
    """Write each row's header in front of its payload (``rows[i, HEADER_SIZE:]``, gathered already);
    the values, one memoryview per row, in order. ``checksums``: the payloads' checksums, when they
    were computed already (as the rows were gathered); otherwise they are computed here."""
    payload = rows.shape[1] - HEADER_SIZE
    if checksums is None:
        checksums = payload_checksums(rows[:, HEADER_SIZE:], [block_identity(key.block, key.layout) for key in keys])
    memory, stride = rows_memory(rows)  # the values are the rows' memory
    values: list[memoryview] = []
    for index, (key, checksum) in enumerate(zip(keys, checksums, strict=True)):
        start = index * stride
        _HEADER.pack_into(memory, start, _MAGIC, FORMAT_VERSION, 0, key.group, payload, key.digest, key.layout, checksum)
        values.append(memory[start : start + HEADER_SIZE + payload])
    return values


def check_values(rows: torch.Tensor, keys: Sequence[StoreKey], lengths: Sequence[int | None]) -> list[ValueCheck]:
    """Whether each row holds ``keys[i]``'s value, whole and intact; ``lengths[i]`` is how many bytes
    the backend put in the row (``None``: absent)."""
    rows = dense_rows(rows)
    memory, stride = rows_memory(rows)
    return check_memory(memory, stride, keys, lengths)


def check_memory(
    memory: memoryview, stride: int, keys: Sequence[StoreKey], lengths: Sequence[int | None]
) -> list[ValueCheck]:
    """:func:`check_values` of rows laid out ``stride`` bytes apart in ``memory`` (row ``i`` at ``i * stride``).

    One pass per value, right after its read while its bytes are still in the
    CPU's cache: the header is parsed in place and the checksum runs over the
    payload where it lies (no copies, no per-row tensors)."""
    return [
        _verdict(key, length, memory, index * stride, memory[index * stride + HEADER_SIZE : index * stride + key.nbytes])
        for index, (key, length) in enumerate(zip(keys, lengths, strict=True))
    ]


def check_bytes(value: memoryview, key: StoreKey) -> ValueCheck:
    """:func:`check_memory` of one value where a backend returned it (``B``-format bytes, header first)."""
    return _verdict(key, len(value), value, 0, value[HEADER_SIZE : key.nbytes])


def check_part(headers: memoryview, index: int, key: StoreKey, length: int | None, payload: Sequence[memoryview]) -> ValueCheck:
    """:func:`check_memory` of value ``index`` read in parts: its header at ``index * HEADER_SIZE`` in
    ``headers``, its payload in ``payload`` (in order: the engine's own blocks, where it was read). Called
    as the value lands, while it is in the CPU's cache; the checksum streams over the parts (the digest of
    the payload in one piece)."""
    return _verdict(key, length, headers, index * HEADER_SIZE, payload)


def _verdict(
    key: StoreKey, length: int | None, header: memoryview, offset: int, payload: memoryview | Sequence[memoryview]
) -> ValueCheck:
    """One value read under ``key`` (``length`` bytes, ``None``: a miss): its header at ``offset`` in
    ``header``, its payload in one piece or in parts."""
    if length is None:
        return ValueCheck.ABSENT
    if length != key.nbytes:  # cut short or padded: whatever its header says
        return ValueCheck.DAMAGED
    magic, version, flags, group, claimed, digest, layout, stored = _HEADER.unpack_from(header, offset)
    block = key.block
    if (
        magic != _MAGIC or version != FORMAT_VERSION or flags or group != block.group or digest != block.digest
        or layout != key.layout or claimed != key.nbytes - HEADER_SIZE
    ):
        return ValueCheck.DAMAGED  # under this key, any mismatch is damage (the module says why)
    identity = block_identity(block, layout)
    actual = checksum(memoryview(payload), identity) if isinstance(payload, memoryview) else checksum_parts(payload, identity)
    return ValueCheck.OK if stored == actual else ValueCheck.DAMAGED


def why_damaged(key: StoreKey, length: int | None, header: bytes | bytearray | memoryview) -> str:
    """In words, why a value read under ``key`` (``length`` bytes, its header first in ``header``) is not
    ``key``'s: the first field that does not match, the checksum last. For a message, after a failed check."""
    if length is None:
        return "absent"
    claims = unpack_header(header) if length >= HEADER_SIZE else None
    if claims is not None and claims.key != key.block:
        return (
            f"another block's value: its header names group {claims.key.group}, digest {claims.key.digest.hex()[:12]}; "
            f"the key is group {key.group}, digest {key.digest.hex()[:12]}"
            + ("" if length == key.nbytes else f" (and it is {length} bytes long, not {key.nbytes})")
        )
    if length != key.nbytes:
        return f"{length} bytes long, not the {key.nbytes} of its value (cut short or padded)"
    if claims is None:
        return "not a capkv value of this format (its header's magic, version or flags)"
    if claims.layout != key.layout:
        return "a value of another layout or shard (its header's layout fingerprint)"
    if claims.length != key.nbytes - HEADER_SIZE:
        return f"its header claims {claims.length} payload bytes, not {key.nbytes - HEADER_SIZE}"
    return "its payload is not the one saved (the checksum does not match)"


def check_value(value: bytes | bytearray | memoryview | None, key: StoreKey) -> ValueCheck:
    """Whether ``value`` (as a backend returned it) is ``key``'s value, whole and intact."""
    import torch  # noqa: PLC0415

    rows = torch.zeros((1, key.nbytes), dtype=torch.uint8)
    if value is not None:
        data = memoryview(value).cast("B")
        count = min(len(data), key.nbytes)
        row_memory(rows[0])[:count] = data[:count]
    return check_values(rows, [key], [None if value is None else len(memoryview(value).cast("B"))])[0]

