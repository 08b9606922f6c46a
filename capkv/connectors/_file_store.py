"""``FileStoreConnector``: the same prefix keys as the host pool, one file per block on disk.

Blocks live in one directory, one self-checking file each (see
:mod:`capkv.connectors._block_file`), written atomically by a background
thread, so the store survives a process restart and a crash never leaves a
block that would be read back half-written. The directory *is* the index: a
block is loadable when its file is there at its full size, whoever wrote it.
A block this connector planned to save is held from then on, so no other
request saves it again while its file is being written, until the worker
reports the write landed or failed (a failed one may be saved again). A
file that fails its checks at load time is reported as a load error and never
copied into the engine; a damaged one is also removed (a file of another KV
layout is left for its owner: give each layout its own namespace). The store has no capacity bound.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import ClassVar

import torch

from capkv.config._options import ConnectorOptions, Option
from capkv.connectors._base import PrefixStoreConnector, require_store_spec
from capkv.connectors._block_file import (
    HEADER_SIZE,
    ReadResult,
    block_path,
    read_block_file,
    sweep_temporary_files,
    tensor_memory,
    write_block_file,
)
from capkv.connectors._keys import BlockKey
from capkv.connectors._metadata import BlockMove
from capkv.connectors._worker import Landing, StoreWorker
from capkv.contracts._arguments import argument_error, require_callable, require_instance, require_str
from capkv.contracts._engine import BlockIds, ComputedTokenRequest, KVTransferParams
from capkv.contracts._spec import KVSpec
from capkv.errors import ConfigError
from capkv.transfer._copier import BlockCopier
from capkv.transfer._handle import FINISHED, CopyHandle
from capkv.transfer._layout import spec_block_nbytes

__all__ = ["BlockWriter", "FileIndex", "FileStoreConnector", "FileStoreWorker"]

BlockWriter = Callable[[Path, BlockKey, bytes, memoryview], None]
"""Writes one block file: ``(root, key, fingerprint, payload)``, as :func:`write_block_file`."""


class FileIndex:
    """The scheduler side's view of the directory: a block is there when its file is, at full size.

    Blocks whose write was planned here and has not been reported over are
    *pending*: held (not planned again), not loadable.
    """

    def __init__(self, root: Path, spec: KVSpec, *, owner: str) -> None:
        self._root = root
        self._sizes = tuple(HEADER_SIZE + spec_block_nbytes(spec, g, owner=owner) for g in range(spec.num_groups))
        self._pending: set[BlockKey] = set()

    def loadable(self, key: BlockKey, /) -> bool:
        try:
            return block_path(self._root, key).stat().st_size == self._sizes[key.group]
        except OSError:
            return False

    def holds(self, key: BlockKey, /) -> bool:
        return key in self._pending or self.loadable(key)

    def touch(self, key: BlockKey, /) -> None:
        return None

    def pin(self, key: BlockKey, /) -> int | None:
        return 0 if self.loadable(key) else None

    def unpin(self, key: BlockKey, /) -> None:
        return None

    def reserve(self, key: BlockKey, /) -> int | None:
        self._pending.add(key)
        return 0

    def commit(self, key: BlockKey, /) -> None:
        self._pending.discard(key)

    def release(self, key: BlockKey, /) -> None:
        self._pending.discard(key)


class FileStoreWorker(StoreWorker):
    """Reads block files into host rows and scatters them; gathers and hands rows to a writer thread."""

    def __init__(self, spec: KVSpec, root: Path, *, owner: str, write_block: BlockWriter = write_block_file) -> None:
        super().__init__(spec, owner=owner)
        self._root = root
        self._write_block = write_block
        self._fingerprints: tuple[bytes, ...] = ()
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="capkv-file-store")
        self.write_failures: list[Exception] = []
        """Writes that raised (the block is then not stored, and reported failed), oldest first."""
        self._raised = 0

    def _attached(self, copier: BlockCopier) -> None:
        self._fingerprints = tuple(
            hashlib.blake2b(
                repr((str(self._spec.dtype), group.signature)).encode(), digest_size=32
            ).digest()
            for group in copier.layout.groups
        )

    def _load(self, copier: BlockCopier, move: BlockMove) -> tuple[CopyHandle, set[int]]:
        rows = copier.host_rows(len(move.block_ids), copier.block_nbytes(move.group))
        fingerprint = self._fingerprints[move.group]
        good: list[int] = []
        failed: set[int] = set()
        for index, key in enumerate(move.keys):
            found = read_block_file(self._root, key, fingerprint, tensor_memory(rows[index]))
            if found is ReadResult.OK:
                good.append(index)
                continue
            failed.add(move.block_ids[index])
            if found is ReadResult.DAMAGED:
                block_path(self._root, key).unlink(missing_ok=True)  # so it is not offered again
        if not good:
            return FINISHED, failed
        if failed:
            rows = rows[good]
        return copier.scatter(move.group, [move.block_ids[i] for i in good], rows), failed

    def _save(self, copier: BlockCopier, move: BlockMove) -> tuple[CopyHandle, Landing]:
        rows = copier.host_rows(len(move.block_ids), copier.block_nbytes(move.group))
        handle = copier.gather(move.group, move.block_ids, rows)
        written: Future[tuple[BlockKey, ...]] = self._writer.submit(self._write, handle, rows, move)
        return handle, written

    def _write(self, handle: CopyHandle, rows: torch.Tensor, move: BlockMove) -> tuple[BlockKey, ...]:
        """Write each block of ``move`` (on the writer thread); the keys that could not be written."""
        try:
            handle.wait()
        except Exception as error:
            self.write_failures.append(error)
            return move.keys
        fingerprint = self._fingerprints[move.group]
        failed: list[BlockKey] = []
        for index, key in enumerate(move.keys):
            try:
                self._write_block(self._root, key, fingerprint, tensor_memory(rows[index]))
            except Exception as error:  # a disk error: this block is not stored, the others may be
                self.write_failures.append(error)
                failed.append(key)
        return tuple(failed)

    def flush(self) -> None:
        """Wait until every started write is over; re-raise the first that failed since the last flush.

        Failed blocks may be saved again later, so an old failure is raised once, not forever.
        """
        self._settle(wait=True)
        failures = self.write_failures[self._raised :]
        self._raised = len(self.write_failures)
        if failures:
            raise failures[0]

    def shutdown(self) -> None:
        super().shutdown()
        try:
            self.flush()
        finally:
            self._writer.shutdown(wait=True)


class FileStoreConnector(PrefixStoreConnector):
    """On-disk prefix cache for every KV-cache group (HMA-capable), in directory ``root``.

    ``spec`` describes the engine's KV cache; ``namespace`` separates models
    that share layer names and shapes (use one per model when several share a
    directory). Temporary files left by crashed writers are removed on start.
    ``write_block`` writes one block file on the writer thread; replace it to
    hold, fail or observe this connector's writes (tests), and no other's.
    """

    extra_config_options: ClassVar[ConnectorOptions] = ConnectorOptions(
        takes_spec=True,
        root=Option(str, required=True, help="the store's directory"),
        namespace=Option(str, help="separates models that share layer names and shapes"),
    )
    """What a configuration may set (``capkv check`` and the builder refuse anything else)."""

    def __init__(
        self,
        spec: KVSpec,
        *,
        root: str | os.PathLike[str],
        namespace: str = "",
        write_block: BlockWriter = write_block_file,
    ) -> None:
        name = type(self).__name__
        require_store_spec(spec, name)
        require_instance(root, (str, os.PathLike), name, "root", "a directory path (str or os.PathLike)",
                         connector=name, method="__init__")
        if not os.fspath(root):
            raise argument_error(name, "root", root, "a non-empty directory path", connector=name, method="__init__")
        require_str(namespace, name, "namespace", connector=name, method="__init__")
        require_callable(write_block, name, "write_block", connector=name)
        self.root: Path = Path(root)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(
                f"{name}: cannot use {str(self.root)!r} as the store directory ({exc})",
                connector=name, method="__init__", value=str(self.root),
            ) from exc
        sweep_temporary_files(self.root)
        self._files = FileStoreWorker(spec, self.root, owner=name, write_block=write_block)
        super().__init__(spec, FileIndex(self.root, spec, owner=name), self._files, namespace=namespace)

    def request_finished_all_groups(
        self, request: ComputedTokenRequest, block_ids: BlockIds, /
    ) -> tuple[bool, KVTransferParams | None]:
        """Save the request's computed full blocks of every group; hold them until they are gathered."""
        return self._finish(request, block_ids, "request_finished_all_groups")

    def flush(self) -> None:
        """Wait until every started save is on disk; re-raise the first write that failed since the last flush."""
        self._files.flush()
