"""Pack files: many stored blocks in one file, written once, never changed, read by offset.

A file per block costs a create, a rename and an fsync each — far more than the bytes — so a writer packs
every block it has queued into one file.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from capkv.stores._keys import BlockKey
from capkv.stores._value import HEADER_SIZE, pack_header, unpack_header

__all__ = [
    "HEADER_SIZE",
    "PACK_SUFFIX",
    "TEMP_SUFFIX",
    "PackRecord",
    "RecordHeader",
    "read_values",
    "scan_pack",
    "sweep_temporary_files",
    "write_pack",
]

TEMP_SUFFIX = ".tmp"
PACK_SUFFIX = ".kvpack"
_READ_LIMIT = 1 << 30
"""At most this many bytes per read call."""
_IOV_MAX = min(1024, getattr(os, "IOV_MAX", 1024))
"""At most this many buffers per read call."""


@dataclass(frozen=True)
class PackRecord:
    """One value to write: its key, the layout fingerprint its bytes were gathered under, the block's
    bytes and their checksum (:mod:`capkv.stores._checksum`)."""

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
    """Of the payload."""
    checksum: bytes
    """The payload's checksum, as the header says."""


def write_pack(root: Path, records: Sequence[PackRecord]) -> tuple[str, list[RecordHeader]]:
    """Write ``records`` as one new pack in ``root``, atomically; the pack's file name and its records.

    The pack fills a uniquely named temporary file in the store's directory, is fsynced once and renamed to
    its final name (atomic on POSIX and Windows). A crash leaves either no pack or a complete one, plus at
    worst a stray temporary file that readers never open (:func:`sweep_temporary_files`). The directory is not
    fsynced: after a power loss a pack may be missing (a miss, for a cache), never half there. Packs are
    immutable, so a reader that opened one keeps reading the same bytes even if another process evicts
    (unlinks) it meanwhile: there are no torn reads.

    Every record is one stored value (:mod:`capkv.stores._value`): its header says the block's key, the memory
    layout (and shard) the bytes were gathered under, the payload length and its checksum, so a truncated,
    corrupted or stale record is found out by the store's checks when it is read, never loaded. The pack adds
    nothing to a value: the records' headers are the pack's index (:func:`scan_pack`).
    """
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
                parts.append(pack_header(record.key, record.fingerprint, len(payload), record.checksum))
                parts.append(payload)
                headers.append(RecordHeader(record.key, record.fingerprint, offset, len(payload), record.checksum))
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
    first header that is not one (a damaged tail, or a pack of another format)."""
    with open(path, "rb") as file:
        size = os.fstat(file.fileno()).st_size
        offset = 0
        while offset + HEADER_SIZE <= size:
            header = unpack_header(file.read(HEADER_SIZE))
            if header is None or offset + HEADER_SIZE + header.length > size:
                return
            yield RecordHeader(header.key, header.layout, offset, header.length, header.checksum)
            offset += HEADER_SIZE + header.length
            file.seek(offset)


def read_values(
    descriptor: int, records: Sequence[RecordHeader], buffers: Sequence[memoryview | Sequence[memoryview]]
) -> list[int] | None:
    """Read records that lie back to back in an open pack, each whole value (header and payload) into
    its buffer — or its buffers, filled in order (a value read in parts: its header into the store's
    rows, its payload straight into the engine's blocks) — in as few system calls as the OS allows; per
    record, how many of its bytes were read (fewer than its value's length only where the pack ends
    before its index said — a read the OS returned in parts is resumed, never short), or ``None`` when
    the pack is gone or unreadable.

    Reading decides by what happened: a missing pack is a miss; any other ``OSError`` (out of file
    descriptors, an I/O error, no permission) is this read's miss only, and says nothing about the file.
    """
    views: list[memoryview] = []
    sizes: list[int] = []
    for record, buffer in zip(records, buffers, strict=True):
        size = HEADER_SIZE + record.length
        if isinstance(buffer, memoryview):
            views.append(memoryview(buffer)[:size])
        else:  # parts: their lengths add up to the value's (the caller sized them from its key)
            views.extend(buffer)
        sizes.append(size)
    wanted = sum(sizes)
    try:
        got = _read_all(descriptor, views, records[0].offset, wanted)
    except OSError:
        return None
    if got == wanted:
        return sizes
    counts: list[int] = []
    for size in sizes:
        counts.append(min(got, size))
        got = max(0, got - size)
    return counts


def _read_all(descriptor: int, buffers: list[memoryview], offset: int, wanted: int) -> int:
    """``preadv`` into ``buffers`` (``wanted`` bytes in all) from ``offset``, at most
    :data:`_READ_LIMIT` bytes a call (Linux moves at most 2 GiB - 4 KiB per call), resuming after
    short reads until they are full or the file ends; the bytes read."""
    if wanted <= _READ_LIMIT and len(buffers) <= _IOV_MAX:
        got = os.preadv(descriptor, buffers, offset)  # the usual case: one call reads it all
        if got == wanted or got == 0:
            return got
        total = got
    else:
        total = 0
    views = [memoryview(buffer).cast("B") for buffer in buffers]
    index = 0
    skip = total
    while index < len(views) and skip >= len(views[index]):
        skip -= len(views[index])
        index += 1
    if skip:
        views[index] = views[index][skip:]
    while index < len(views):
        batch: list[memoryview] = []
        size = 0
        for view in views[index : index + _IOV_MAX]:
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
