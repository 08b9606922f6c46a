"""Pack files: many stored blocks in one file, written once, never changed, read by offset.

A file per block costs a create, a rename and (for durability) an fsync each —
far slower than the bytes themselves — so a writer packs every block it has
queued into one file: it fills a uniquely named temporary file in the store's
directory, fsyncs it once, renames it to its final name (atomic on POSIX and
Windows) and fsyncs the directory. A crash leaves either no pack or a complete
one, plus at worst a stray temporary file that readers never open. Packs are
immutable, so a reader that opened one keeps reading the same bytes even if
another process evicts (unlinks) it meanwhile: there are no torn reads.

Every record is self-checking — magic, version, the block's key, a fingerprint
of the memory layout that produced the bytes, the payload length and a CRC-32 —
so a truncated, corrupted or stale record is rejected, never loaded. Reading
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
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from capkv.connectors._keys import DIGEST_SIZE, BlockKey

__all__ = [
    "HEADER_SIZE",
    "PACK_SUFFIX",
    "TEMP_SUFFIX",
    "PackRecord",
    "ReadResult",
    "RecordHeader",
    "read_record",
    "scan_pack",
    "sweep_temporary_files",
    "tensor_memory",
    "write_pack",
]

_MAGIC = b"CAPKVBLK"
_VERSION = 2
_HEADER = struct.Struct(f"<8sII{DIGEST_SIZE}s32sQI")
HEADER_SIZE = _HEADER.size
TEMP_SUFFIX = ".tmp"
PACK_SUFFIX = ".kvpack"


def tensor_memory(rows: torch.Tensor) -> memoryview:
    """The bytes of a contiguous CPU ``uint8`` tensor, without copying (keep the tensor alive)."""
    buffer = (ctypes.c_char * rows.numel()).from_address(rows.data_ptr())
    return memoryview(buffer).cast("B")


@dataclass(frozen=True)
class PackRecord:
    """One block to write: its key, the layout fingerprint its bytes were gathered under, the bytes."""

    key: BlockKey
    fingerprint: bytes
    payload: memoryview


@dataclass(frozen=True)
class RecordHeader:
    """Where a record's payload sits in its pack, and what it claims to be."""

    key: BlockKey
    fingerprint: bytes
    offset: int
    """Of the header; the payload follows it."""
    length: int
    crc: int


def write_pack(root: Path, records: Sequence[PackRecord]) -> tuple[str, list[RecordHeader]]:
    """Write ``records`` as one new pack in ``root``, atomically; the pack's file name and its records."""
    name = f"{uuid.uuid4().hex}{PACK_SUFFIX}"
    headers: list[RecordHeader] = []
    offset = 0
    temporary = root / f".{name}.{os.getpid()}{TEMP_SUFFIX}"
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        try:
            parts: list[bytes | memoryview] = []
            for record in records:
                payload = record.payload
                crc = zlib.crc32(payload)
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
    _fsync_directory(root)
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


def read_record(descriptor: int, record: RecordHeader, into: memoryview) -> ReadResult:
    """Read ``record`` from an open pack into ``into`` (exactly its length), checking everything."""
    if record.length != len(into):
        return ReadResult.DAMAGED
    header = bytearray(HEADER_SIZE)
    try:
        got = os.preadv(descriptor, [header, into], record.offset)
    except FileNotFoundError:
        return ReadResult.ABSENT
    except OSError:
        return ReadResult.FAILED
    if got != HEADER_SIZE + record.length:
        return ReadResult.DAMAGED
    magic, version, group, digest, fingerprint, length, crc = _HEADER.unpack(header)
    claimed = (magic, version, BlockKey(group, digest), fingerprint, length, crc)
    expected = (_MAGIC, _VERSION, record.key, record.fingerprint, record.length, record.crc)
    if claimed != expected or zlib.crc32(into) != crc:
        return ReadResult.DAMAGED
    return ReadResult.OK


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


def _fsync_directory(root: Path) -> None:
    if os.name != "posix":
        return
    descriptor = os.open(root, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
