"""Pack files: many stored blocks in one file, written once, never changed, read by offset.

A file per block costs a create, a rename and (for durability) an fsync each —
far slower than the bytes themselves — so a writer packs every block it has
queued into one file: it fills a uniquely named temporary file in the store's
directory, fsyncs it once and renames it to its final name (atomic on POSIX and
Windows). A crash leaves either no pack or a complete
one, plus at worst a stray temporary file that readers never open. The directory
is not fsynced: after a power loss a pack may be missing (a miss, for a cache),
never half there. Packs are
immutable, so a reader that opened one keeps reading the same bytes even if
another process evicts (unlinks) it meanwhile: there are no torn reads.

Every record is self-checking — magic, version, the block's key, a fingerprint
of the memory layout that produced the bytes, the payload length and the
payload's checksum (:mod:`capkv.connectors._integrity`: XXH3-128 bound to the
key and fingerprint) — so a truncated, corrupted, moved or stale record is
rejected, never loaded. Records of older format versions are not listed: a
miss, never misread. Reading
decides by what happened: a missing pack is a miss; a bad header or CRC is
damage; any other ``OSError`` (out of file descriptors, an I/O error, no
permission) is this read's failure only, and says nothing about the file.
"""

from __future__ import annotations

import ctypes
import enum
import os
import struct
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from capkv.connectors._integrity import CHECKSUM_SIZE, block_identity, checksum
from capkv.connectors._keys import DIGEST_SIZE, BlockKey

__all__ = [
    "HEADER_SIZE",
    "PACK_SUFFIX",
    "TEMP_SUFFIX",
    "PackRecord",
    "ReadResult",
    "RecordHeader",
    "block_checksums",
    "payload_checksum",
    "read_record",
    "read_records",
    "scan_pack",
    "sweep_temporary_files",
    "tensor_memory",
    "write_pack",
]

_MAGIC = b"CAPKVBLK"
_VERSION = 4
"""4: XXH3-128 checksums bound to the key (3 had a 64-bit position-weighted sum)."""
_HEADER = struct.Struct(f"<8sII{DIGEST_SIZE}s32sQ{CHECKSUM_SIZE}s")
_READ_LIMIT = 1 << 30
"""At most this many bytes per read call (Linux moves at most 2 GiB - 4 KiB per call anyway)."""
HEADER_SIZE = _HEADER.size
TEMP_SUFFIX = ".tmp"
PACK_SUFFIX = ".kvpack"


def tensor_memory(rows: torch.Tensor) -> memoryview:
    """The bytes of a contiguous CPU ``uint8`` tensor, without copying (keep the tensor alive)."""
    buffer = (ctypes.c_char * rows.numel()).from_address(rows.data_ptr())
    return memoryview(buffer).cast("B")


def block_checksums(rows: torch.Tensor, keys: Sequence[BlockKey], fingerprint: bytes) -> list[bytes]:
    """The checksum of each row of a contiguous CPU ``uint8`` tensor (one block per row, ``keys[i]``'s
    bytes under the layout ``fingerprint``)."""
    memory = tensor_memory(rows)
    width = rows.shape[1] if rows.dim() == 2 else 0
    return [
        checksum(memory[index * width : (index + 1) * width], block_identity(key, fingerprint))
        for index, key in enumerate(keys)
    ]


def payload_checksum(payload: memoryview | bytes, key: BlockKey, fingerprint: bytes) -> bytes:
    """The checksum of one record's payload."""
    return checksum(payload, block_identity(key, fingerprint))


@dataclass(frozen=True)
class PackRecord:
    """One block to write: its key, the layout fingerprint its bytes were gathered under, the bytes
    and their :func:`payload_checksum`."""

    key: BlockKey
    fingerprint: bytes
    payload: memoryview
    checksum: bytes


@dataclass(frozen=True)
class RecordHeader:
    """Where a record's payload sits in its pack, and what it claims to be."""

    key: BlockKey
    fingerprint: bytes
    offset: int
    """Of the header; the payload follows it."""
    length: int
    crc: bytes
    """The payload's checksum (:func:`payload_checksum`)."""


def write_pack(root: Path, records: Sequence[PackRecord]) -> tuple[str, list[RecordHeader]]:
    """Write ``records`` as one new pack in ``root``, atomically; the pack's file name and its records."""
    name = f"{uuid.uuid4().hex}{PACK_SUFFIX}"
    headers: list[RecordHeader] = []
    offset = 0
    temporary = root / f".{name}.{os.getpid()}{TEMP_SUFFIX}"
    try:
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileNotFoundError:  # the directory was removed: a store outlives that
        root.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        try:
            parts: list[bytes | memoryview] = []
            for record in records:
                payload = record.payload
                crc = record.checksum
                parts.append(_HEADER.pack(
                    _MAGIC, _VERSION, record.key.group, record.key.digest, record.fingerprint, len(payload), crc
                ))
                parts.append(payload)
                headers.append(RecordHeader(record.key, record.fingerprint, offset, len(payload), crc))
                offset += HEADER_SIZE + len(payload)
            _write_all(descriptor, parts)
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
        os.replace(temporary, root / name)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return name, headers


def _write_all(descriptor: int, parts: list[bytes | memoryview]) -> None:
    """``writev`` in batches the OS accepts, resuming after short writes."""
    limit = getattr(os, "IOV_MAX", 1024) if hasattr(os, "writev") else 1
    views = [memoryview(part) for part in parts]
    index = 0
    while index < len(views):
        batch = views[index : index + limit]
        written = os.writev(descriptor, batch) if hasattr(os, "writev") else os.write(descriptor, batch[0])
        while batch and written >= len(batch[0]):
            written -= len(batch[0])
            batch.pop(0)
            index += 1
        if batch and written:
            views[index] = batch[0][written:]


def scan_pack(path: Path) -> Iterator[RecordHeader]:
    """The records of a pack, from their headers (payloads are skipped, not checked); stops at the
    first header that is not one (a damaged tail)."""
    with open(path, "rb") as file:
        size = os.fstat(file.fileno()).st_size
        offset = 0
        while offset + HEADER_SIZE <= size:
            header = file.read(HEADER_SIZE)
            if len(header) != HEADER_SIZE:
                return
            magic, version, group, digest, fingerprint, length, crc = _HEADER.unpack(header)
            if magic != _MAGIC or version != _VERSION or offset + HEADER_SIZE + length > size:
                return
            yield RecordHeader(BlockKey(group, digest), fingerprint, offset, length, crc)
            offset += HEADER_SIZE + length
            file.seek(offset)


class ReadResult(enum.Enum):
    """What reading one record found."""

    OK = "ok"
    ABSENT = "absent"
    """The pack is gone (evicted, say): a miss."""
    DAMAGED = "damaged"
    """The record is not what its pack's index said, or fails its CRC: nobody can use the pack."""
    FAILED = "failed"
    """The read itself failed (``EMFILE``, ``EIO``, ``EACCES`` ...): nothing is known of the file."""


def read_record(descriptor: int, record: RecordHeader, into: torch.Tensor) -> ReadResult:
    """Read ``record`` from an open pack into ``into`` (a ``uint8`` tensor of its length), checking everything."""
    return read_records(descriptor, [record], into.view(1, -1))[0]


def read_records(descriptor: int, records: Sequence[RecordHeader], rows: torch.Tensor) -> list[ReadResult]:
    """Read records that lie back to back in an open pack into ``rows`` (one contiguous ``uint8`` row
    each), in as few system calls as the OS allows, checking each. Only the end of the file makes a
    read short: a record cut off by it is damaged; one the OS merely returned in parts is not."""
    if any(record.length != rows.shape[1] for record in records):
        return [ReadResult.DAMAGED if r.length != rows.shape[1] else ReadResult.FAILED for r in records]
    memory = tensor_memory(rows)
    width = rows.shape[1]
    headers = [bytearray(HEADER_SIZE) for _ in records]
    buffers: list[bytearray | memoryview] = []
    for index, header in enumerate(headers):
        buffers += (header, memory[index * width : (index + 1) * width])
    try:
        got = _read_all(descriptor, buffers, records[0].offset)
    except FileNotFoundError:
        return [ReadResult.ABSENT] * len(records)
    except OSError:
        return [ReadResult.FAILED] * len(records)
    results: list[ReadResult] = []
    for index, (record, header) in enumerate(zip(records, headers, strict=True)):
        got -= HEADER_SIZE + record.length
        if got < 0:
            results.append(ReadResult.DAMAGED)  # the pack ends before its index said
            continue
        magic, version, group, digest, fingerprint, length, stored = _HEADER.unpack(header)
        claimed = (magic, version, BlockKey(group, digest), fingerprint, length, stored)
        expected = (_MAGIC, _VERSION, record.key, record.fingerprint, record.length, record.crc)
        intact = claimed == expected and payload_checksum(
            memory[index * width : (index + 1) * width], record.key, record.fingerprint
        ) == stored
        results.append(ReadResult.OK if intact else ReadResult.DAMAGED)
    return results


def _read_all(descriptor: int, buffers: list[bytearray | memoryview], offset: int) -> int:
    """``preadv`` into ``buffers`` from ``offset``, at most :data:`_READ_LIMIT` bytes a call, resuming
    after short reads, until they are full or the file ends; the bytes read."""
    views = [memoryview(buffer).cast("B") for buffer in buffers]
    total = 0
    index = 0
    while index < len(views):
        batch: list[memoryview] = []
        size = 0
        for view in views[index:]:
            if size + len(view) > _READ_LIMIT and batch:
                break
            batch.append(view[: _READ_LIMIT - size])
            size += len(batch[-1])
        got = os.preadv(descriptor, batch, offset + total)
        if got == 0:
            return total  # the end of the file
        total += got
        while index < len(views) and got >= len(views[index]):
            got -= len(views[index])
            index += 1
        if got:
            views[index] = views[index][got:]
    return total


def sweep_temporary_files(root: Path) -> int:
    """Remove temporary files left by writers that no longer run; how many were removed."""
    removed = 0
    for path in root.glob(f".*{TEMP_SUFFIX}"):
        parts = path.name.rsplit(".", 2)
        pid = int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else None
        if pid is not None and _alive(pid):
            continue
        path.unlink(missing_ok=True)
        removed += 1
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
