"""One stored block per file, written so that a reader never sees half of one.

A writer fills a uniquely named temporary file in the same directory, flushes
and fsyncs it, then renames it over the final name (``os.replace`` is atomic
on POSIX and Windows) and fsyncs the directory. A crash at any point leaves
either no file or a complete one under the final name, plus at worst a stray
temporary file that readers never open.

The header makes every file self-checking — magic, version, the block's key,
a fingerprint of the KV layout that produced the bytes, the payload length and
a CRC-32 of the payload — so a truncated, corrupted, foreign or stale file is
rejected (a miss), never loaded. Damaged files can be removed; a foreign one
(another layout's, sharing the directory) is left for its owner.
"""

from __future__ import annotations

import ctypes
import enum
import os
import struct
import uuid
import zlib
from pathlib import Path

import torch

from capkv.connectors._keys import DIGEST_SIZE, BlockKey

__all__ = [
    "HEADER_SIZE",
    "TEMP_SUFFIX",
    "ReadResult",
    "block_path",
    "read_block_file",
    "sweep_temporary_files",
    "tensor_memory",
    "write_block_file",
]

_MAGIC = b"CAPKVBLK"
_VERSION = 1
_HEADER = struct.Struct(f"<8sII{DIGEST_SIZE}s32sQI")
HEADER_SIZE = _HEADER.size
TEMP_SUFFIX = ".tmp"
_SUFFIX = ".kvblock"


def block_path(root: Path, key: BlockKey) -> Path:
    return root / f"{key.name}{_SUFFIX}"


def tensor_memory(rows: torch.Tensor) -> memoryview:
    """The bytes of a contiguous CPU ``uint8`` tensor, without copying (keep the tensor alive)."""
    buffer = (ctypes.c_char * rows.numel()).from_address(rows.data_ptr())
    return memoryview(buffer).cast("B")


def write_block_file(root: Path, key: BlockKey, fingerprint: bytes, payload: memoryview) -> None:
    """Store ``payload`` as ``key``'s block, atomically."""
    header = _HEADER.pack(_MAGIC, _VERSION, key.group, key.digest, fingerprint, len(payload), zlib.crc32(payload))
    final = block_path(root, key)
    temporary = root / f".{final.name}.{os.getpid()}.{uuid.uuid4().hex}{TEMP_SUFFIX}"
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        with os.fdopen(descriptor, "wb") as file:
            file.write(header)
            file.write(payload)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, final)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    _fsync_directory(root)


class ReadResult(enum.Enum):
    """What reading a block file found."""

    OK = "ok"
    ABSENT = "absent"
    FOREIGN = "foreign"
    """A valid file for another KV layout or format version: someone else's, left alone."""
    DAMAGED = "damaged"
    """Truncated, padded, corrupted, or not a block file at all: nobody can use it."""


def read_block_file(root: Path, key: BlockKey, fingerprint: bytes, into: memoryview) -> ReadResult:
    """Read ``key``'s block into ``into`` (exactly its length); anything but ``OK`` is a miss."""
    try:
        with open(block_path(root, key), "rb") as file:
            header = file.read(HEADER_SIZE)
            if len(header) != HEADER_SIZE:
                return ReadResult.DAMAGED
            magic, version, group, digest, stored_fingerprint, length, crc = _HEADER.unpack(header)
            if magic != _MAGIC or (group, digest) != (key.group, key.digest):
                return ReadResult.DAMAGED
            if version != _VERSION or stored_fingerprint != fingerprint or length != len(into):
                return ReadResult.FOREIGN
            if file.readinto(into) != length or file.read(1):
                return ReadResult.DAMAGED
    except FileNotFoundError:
        return ReadResult.ABSENT
    except OSError:
        return ReadResult.DAMAGED
    return ReadResult.OK if zlib.crc32(into) == int(crc) else ReadResult.DAMAGED


def sweep_temporary_files(root: Path) -> int:
    """Remove temporary files left by writers that no longer run; how many were removed."""
    removed = 0
    for path in root.glob(f".*{TEMP_SUFFIX}"):
        parts = path.name.rsplit(".", 3)
        pid = int(parts[1]) if len(parts) == 4 and parts[1].isdigit() else None
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
