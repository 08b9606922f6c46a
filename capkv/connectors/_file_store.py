"""``FileStoreConnector``: the same prefix keys as the host pool, in pack files in a directory.

Writes are batched: a background thread writes every save queued since its
last write as one pack file (:mod:`capkv.connectors._block_file`: one file, one
fsync, one atomic rename), so the cost per block is its bytes, not a file.
Reads go straight to the record's offset. The directory is the index
(:mod:`capkv.connectors._pack_catalog`), shared by every engine process that
uses it, and bounded by ``capacity_bytes`` (least recently used packs go first).

Keys include the memory layout: each record carries the fingerprint of the
layout its bytes were gathered under, taken when the save was started (in the
engine step, never later on the writer thread), so blocks of another layout
are not offered, not loaded and do not stop this engine from saving its own.

Reading decides by errno: a pack that is gone is a miss; a record whose header
or CRC is wrong is damage, and is removed (a tombstone; the pack's other
records stay); any other error (out of
file descriptors, an I/O error, no permission) fails this step's load of the
block and keeps the file. A write that fails is reported once — raised by
``flush``/``close`` (all failures since the last, as one exception or an
``ExceptionGroup``) and counted in ``failed_save_blocks`` — and keeps nothing:
no traceback frames, no host buffers.
"""

from __future__ import annotations

import hashlib
import os
import queue
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch

from capkv._homes import publish
from capkv.config._options import ConnectorOptions, Option
from capkv.connectors._base import PrefixStoreConnector, require_store_spec
from capkv.connectors._block_file import (
    HEADER_SIZE,
    PackRecord,
    ReadResult,
    RecordHeader,
    block_checksums,
    read_records,
    sweep_temporary_files,
    tensor_memory,
    write_pack,
)
from capkv.connectors._keys import BlockKey
from capkv.connectors._metadata import BlockMove
from capkv.connectors._pack_catalog import PackCatalog
from capkv.connectors._worker import Landing, StoreWorker
from capkv.contracts._arguments import argument_error, require_callable, require_instance, require_int, require_str
from capkv.contracts._engine import BlockIds, ComputedTokenRequest, KVTransferParams
from capkv.contracts._spec import KVSpec
from capkv.errors import ConfigError
from capkv.transfer._copier import BlockCopier
from capkv.transfer._handle import FINISHED, CopyHandle

__all__ = ["DEFAULT_CAPACITY_BYTES", "FileIndex", "FileStoreConnector", "FileStoreWorker", "PackWriter"]

DEFAULT_CAPACITY_BYTES = 16 << 30
"""16 GiB."""

PackWriter = Callable[[Path, Sequence[PackRecord]], tuple[str, list[RecordHeader]]]
"""Writes one pack: ``(root, records) -> (file name, records written)``, as :func:`write_pack`."""

_BATCH_BYTES = 256 << 20
"""At most this many payload bytes per pack (more queued saves go in the next one)."""

_KEPT_FAILURES = 64
"""Write failures kept for ``flush`` to raise; beyond that only counted."""

_OPEN_PACKS = 32
"""Pack files a reader keeps open."""

_RUN_RECORDS = 256
"""At most this many records per read call (two buffers each, under ``IOV_MAX``)."""


class FileIndex:
    """The scheduler side's view of the directory: a block is there when a pack lists it under this
    engine's layout. Blocks whose write was planned here and not yet reported are *pending*: held (not
    planned again), not loadable. Until the layout is known nothing is loadable."""

    def __init__(self, catalog: PackCatalog) -> None:
        self._catalog = catalog
        self._fingerprints: tuple[bytes, ...] | None = None
        self._pending: set[BlockKey] = set()
        self._pinned: dict[BlockKey, list[str]] = {}

    def set_layout(self, fingerprints: tuple[bytes, ...], /) -> None:
        self._fingerprints = fingerprints

    def _place(self, key: BlockKey) -> str | None:
        fingerprints = self._fingerprints
        if fingerprints is None:
            return None
        found = self._catalog.find(key, fingerprints[key.group])
        return None if found is None else found[0]

    def loadable(self, key: BlockKey, /) -> bool:
        return self._place(key) is not None

    def holds(self, key: BlockKey, /) -> bool:
        return key in self._pending or self.loadable(key)

    def touch(self, key: BlockKey, /) -> None:
        return None

    def pin(self, key: BlockKey, /) -> int | None:
        name = self._place(key)
        if name is None:
            return None
        self._catalog.pin(name)
        self._pinned.setdefault(key, []).append(name)
        return 0

    def unpin(self, key: BlockKey, /) -> None:
        names = self._pinned.get(key)
        if names:
            self._catalog.unpin(names.pop())
            if not names:
                del self._pinned[key]

    def reserve(self, key: BlockKey, /) -> int | None:
        self._pending.add(key)
        return 0

    def commit(self, key: BlockKey, /) -> None:
        self._pending.discard(key)

    def release(self, key: BlockKey, /) -> None:
        self._pending.discard(key)


@dataclass
class _Job:
    """One started save, queued for the writer thread (the layout fingerprint taken at start)."""

    move: BlockMove
    rows: torch.Tensor
    copied: CopyHandle
    fingerprint: bytes
    landed: Future[tuple[BlockKey, ...]]


class FileStoreWorker(StoreWorker):
    """Reads records into host rows and scatters them; gathers rows and queues them for the writer thread."""

    def __init__(self, spec: KVSpec, catalog: PackCatalog, *, owner: str, write: PackWriter = write_pack) -> None:
        super().__init__(spec, owner=owner)
        self._catalog = catalog
        self._root = catalog.root
        self._write = write
        self._fingerprints: tuple[bytes, ...] = ()
        self._queue: queue.Queue[_Job | None] = queue.Queue()
        self._failures: list[BaseException] = []
        self._dropped_failures = 0
        self._failures_lock = threading.Lock()
        self._open: OrderedDict[str, int] = OrderedDict()
        self._thread = threading.Thread(target=self._writer, name="capkv-file-store", daemon=True)
        self._thread.start()
        self._closed = False

    # ---- layout ----------------------------------------------------------------------------

    def _attached(self, copier: BlockCopier) -> None:
        self._fingerprints = tuple(
            hashlib.blake2b(repr((str(self._spec.dtype), group.signature)).encode(), digest_size=32).digest()
            for group in copier.layout.groups
        )
        self.announce_layout(self._fingerprints)

    @property
    def fingerprints(self) -> tuple[bytes, ...]:
        return self._fingerprints

    # ---- loads -------------------------------------------------------------------------------

    def _load(self, copier: BlockCopier, move: BlockMove) -> tuple[CopyHandle, set[int]]:
        rows = copier.host_rows(len(move.block_ids), copier.block_nbytes(move.group))
        fingerprint = self._fingerprints[move.group]
        results = [ReadResult.ABSENT] * len(move.keys)
        # Records that lie back to back in one pack (saved together) are read in one call.
        run: list[tuple[int, str, RecordHeader]] = []
        for index, key in enumerate(move.keys):
            found = self._catalog.find(key, fingerprint, refresh=False) or self._catalog.find(key, fingerprint)
            if found is None:
                continue
            name, record = found
            if run and (len(run) == _RUN_RECORDS or not _continues(run[-1], index, name, record)):
                self._read_run(run, rows, results)
                run = []
            run.append((index, name, record))
        if run:
            self._read_run(run, rows, results)
        good = [i for i, result in enumerate(results) if result is ReadResult.OK]
        failed = {move.block_ids[i] for i, result in enumerate(results) if result is not ReadResult.OK}
        if not good:
            return FINISHED, failed
        if failed:
            rows = rows[good]
        return copier.scatter(move.group, [move.block_ids[i] for i in good], rows), failed

    def _read_run(self, run: list[tuple[int, str, RecordHeader]], rows: torch.Tensor, results: list[ReadResult]) -> None:
        """Read records back to back in one pack into their rows; each one's result into ``results``."""
        name = run[0][1]
        try:
            descriptor = self._descriptor(name)
        except FileNotFoundError:
            self._catalog.forget(name)  # evicted: a miss
            return
        except OSError:  # EMFILE, EACCES, EIO: these loads fail, the file stays
            for index, _, _ in run:
                results[index] = ReadResult.FAILED
            return
        first = run[0][0]  # a run's rows are consecutive too: its records are the move's in order
        read = read_records(descriptor, [record for _, _, record in run], rows[first : first + len(run)])
        for (index, _, record), result in zip(run, read, strict=True):
            results[index] = result
            if result is ReadResult.DAMAGED:
                self._catalog.bury(name, record)
        if ReadResult.OK in read:
            self._catalog.used(name)

    def _descriptor(self, name: str) -> int:
        descriptor = self._open.get(name)
        if descriptor is not None:
            self._open.move_to_end(name)
            return descriptor
        descriptor = os.open(self._root / name, os.O_RDONLY)
        self._open[name] = descriptor
        while len(self._open) > _OPEN_PACKS:
            _, oldest = self._open.popitem(last=False)
            os.close(oldest)
        return descriptor

    def _close(self, name: str) -> None:
        descriptor = self._open.pop(name, None)
        if descriptor is not None:
            os.close(descriptor)

    # ---- saves -------------------------------------------------------------------------------

    def _save(self, copier: BlockCopier, move: BlockMove) -> tuple[CopyHandle, Landing]:
        rows = copier.host_rows(len(move.block_ids), copier.block_nbytes(move.group))
        copied = copier.gather(move.group, move.block_ids, rows)
        landed: Future[tuple[BlockKey, ...]] = Future()
        self._queue.put(_Job(move, rows, copied, self._fingerprints[move.group], landed))
        return copied, landed

    def _writer(self) -> None:
        """The writer thread: every queued save since the last pack goes into the next one."""
        while True:
            batch, stop = self._next_batch()
            try:
                if batch:
                    self._write_batch(batch)
            finally:
                for _ in range(len(batch) + stop):
                    self._queue.task_done()
            del batch  # no host rows outlive their write
            if stop:
                return

    def _next_batch(self) -> tuple[list[_Job], bool]:
        """The queued saves, up to a pack's worth of bytes (waiting for the first), and whether to stop."""
        first = self._queue.get()
        if first is None:
            return [], True
        batch = [first]
        size = first.rows.numel()
        while size < _BATCH_BYTES:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if job is None:
                return batch, True
            batch.append(job)
            size += job.rows.numel()
        return batch, False

    def _write_batch(self, batch: list[_Job]) -> None:
        records: list[PackRecord] = []
        written: list[_Job] = []
        for job in batch:
            try:
                job.copied.wait()
            except Exception as error:  # the gather failed: nothing of this save to write
                self._failed_write(error)
                job.landed.set_result(job.move.keys)
                continue
            written.append(job)
            sums = block_checksums(job.rows)
            records += (
                PackRecord(key, job.fingerprint, tensor_memory(job.rows[index]), sums[index])
                for index, key in enumerate(job.move.keys)
            )
        if not written:
            return
        try:
            name, headers = self._write(self._root, records)
        except Exception as error:  # a disk error: none of these blocks is stored
            self._failed_write(error)
            for job in written:
                job.landed.set_result(job.move.keys)
            return
        finally:
            del records
        self._catalog.add(name, headers)
        for job in written:
            job.landed.set_result(())
        try:
            self._catalog.evict(keep=name)
        except Exception as error:  # never let eviction kill the writer
            self._failed_write(error)

    def _failed_write(self, error: BaseException) -> None:
        """Keep the failure for ``flush`` — without its traceback, whose frames hold the buffers."""
        error.__traceback__ = None
        error.__context__ = None
        error.__cause__ = None
        with self._failures_lock:
            if len(self._failures) < _KEPT_FAILURES:
                self._failures.append(error)
            else:
                self._dropped_failures += 1

    # ---- draining ------------------------------------------------------------------------------

    def flush(self) -> None:
        """Wait until every started write is over; raise the failures since the last call, each once."""
        self._queue.join()
        self._settle(wait=True)
        with self._failures_lock:
            failures, dropped = self._failures, self._dropped_failures
            self._failures, self._dropped_failures = [], 0
        if not failures:
            return
        if len(failures) == 1 and not dropped:
            raise failures[0]
        group = ExceptionGroup(
            f"{self._owner}: {len(failures) + dropped} background writes failed"
            + (f" ({dropped} more not kept)" if dropped else ""),
            [e if isinstance(e, Exception) else RuntimeError(repr(e)) for e in failures],
        )
        raise group

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            super().shutdown()
            self.flush()
        finally:
            self._queue.put(None)
            self._thread.join(timeout=60)
            for name in list(self._open):
                self._close(name)


def _continues(last: tuple[int, str, RecordHeader], index: int, name: str, record: RecordHeader) -> bool:
    """Whether ``record`` (the move's ``index``-th block) can join a read run ending with ``last``:
    the next row, the same pack, right after it."""
    last_index, last_name, last_record = last
    return (
        last_index + 1 == index and last_name == name
        and last_record.offset + HEADER_SIZE + last_record.length == record.offset
    )


class FileStoreConnector(PrefixStoreConnector):
    """On-disk prefix cache for every KV-cache group (HMA-capable), in directory ``root``.

    ``spec`` describes the engine's KV cache; ``namespace`` separates models
    that share layer names and shapes (use one per model when several share a
    directory). ``capacity_bytes`` bounds the directory's packs (default
    16 GiB; several processes sharing ``root`` should pass the same). Temporary
    files left by crashed writers are removed on start. ``write`` writes one
    pack on the writer thread; replace it to hold, fail or observe this
    connector's writes (tests), and no other's. A context manager: ``close()``
    waits for every write and raises the failures not raised yet.
    """

    extra_config_options: ClassVar[ConnectorOptions] = ConnectorOptions(
        takes_spec=True,
        root=Option(str, required=True, help="the store's directory"),
        namespace=Option(str, help="separates models that share layer names and shapes"),
        capacity_bytes=Option(int, minimum=1, help="bound on the directory's packs, in bytes (default 16 GiB)"),
    )
    """What a configuration may set (``capkv check`` and the builder refuse anything else)."""

    def __init__(
        self,
        spec: KVSpec,
        *,
        root: str | os.PathLike[str],
        namespace: str = "",
        capacity_bytes: int = DEFAULT_CAPACITY_BYTES,
        write: PackWriter = write_pack,
    ) -> None:
        name = type(self).__name__
        require_store_spec(spec, name)
        require_instance(root, (str, os.PathLike), name, "root", "a directory path (str or os.PathLike)",
                         connector=name, method="__init__")
        if not os.fspath(root):
            raise argument_error(name, "root", root, "a non-empty directory path", connector=name, method="__init__")
        require_str(namespace, name, "namespace", connector=name, method="__init__")
        require_callable(write, name, "write", connector=name)
        capacity_bytes = require_int(capacity_bytes, name, "capacity_bytes", minimum=1, connector=name, method="__init__")
        self.root: Path = Path(root)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(
                f"{name}: cannot use {str(self.root)!r} as the store directory ({exc})",
                connector=name, method="__init__", value=str(self.root),
            ) from exc
        sweep_temporary_files(self.root)
        self.catalog: PackCatalog = PackCatalog(self.root, capacity_bytes)
        """The directory's packs, as this process sees them."""
        self._index = FileIndex(self.catalog)
        self._files = FileStoreWorker(spec, self.catalog, owner=name, write=write)
        super().__init__(spec, self._index, self._files, namespace=namespace)

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor], /) -> None:
        super().register_kv_caches(kv_caches)
        self._index.set_layout(self._files.fingerprints)  # this object is both sides: no need to wait

    def request_finished_all_groups(
        self, request: ComputedTokenRequest, block_ids: BlockIds, /
    ) -> tuple[bool, KVTransferParams | None]:
        """Save the request's computed full blocks not saved yet; hold them until they are gathered."""
        return self._finish(request, block_ids, "request_finished_all_groups")

    def flush(self) -> None:
        """Wait until every started save is on disk; raise the write failures not raised yet, each once."""
        self._files.flush()


publish(__name__)
