"""``FileStoreConnector``: the store's values in pack files in a directory, shared by processes.

One pack file per write (one fsync, one atomic rename), so the cost per block is its bytes, not a file; the
directory is the index every engine process shares.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import ClassVar

from capkv._homes import publish
from capkv.config._options import ConnectorOptions, Option
from capkv.connectors._block_file import (
    PackRecord,
    RecordHeader,
    read_values,
    sweep_temporary_files,
    write_pack,
)
from capkv.connectors._pack_catalog import PackCatalog
from capkv.contracts._arguments import argument_error, require_callable, require_instance, require_int, require_str
from capkv.contracts._spec import KVSpec
from capkv.errors import ConfigError
from capkv.stores._backend import StoreKey
from capkv.stores._base import require_store_spec
from capkv.stores._connector import StoreConnector
from capkv.stores._value import HEADER_SIZE, unpack_header

__all__ = ["DEFAULT_CAPACITY_BYTES", "FileBackend", "FileStoreConnector", "PackWriter"]

DEFAULT_CAPACITY_BYTES = 16 << 30
"""16 GiB."""

PackWriter = Callable[[Path, Sequence[PackRecord]], tuple[str, list[RecordHeader]]]
"""Writes one pack: ``(root, records) -> (file name, records written)``, as :func:`write_pack`."""

_RUN_RECORDS = 256
"""At most this many records per read call (under ``IOV_MAX``)."""

_RUN_BYTES = 256 << 10
"""A run stops growing at this many bytes (one record at least): what one read leaves in a core's cache
for the caller to check before the next read evicts it (measured: XXH3 over a 256 KiB read just made runs
at 3x its speed over one made 4 MiB earlier)."""

_log = logging.getLogger("capkv.stores")


class FileBackend:
    """A store directory's pack files as a backend: batched reads straight into buffers, pins, one
    pack per put.

    The writer puts every value sealed since its last put into one pack file
    (:mod:`capkv.connectors._block_file`). Reads go straight to the record's offset, values that lie back to
    back in one pack in one system call, into the store's buffers. The directory is the index
    (:mod:`capkv.connectors._pack_catalog`), shared by every engine process that uses it, and bounded by
    ``capacity_bytes`` over all of them (least recently used packs go first, never one any process has
    leased).

    A pack that is gone is a miss; any other read error (out of file descriptors, an I/O error, no permission)
    is this step's miss and keeps the file. A value the store's checks find damaged (any byte of it) is
    deleted: a tombstone for its record (the pack's other records stay), which every process's next lookup
    sees. A write that fails is reported once — raised by ``flush``/``close`` and counted in
    ``failed_save_blocks``.
    """

    slow: bool = True
    """Reads go to a disk: the store loads in the background (``load_async``); set ``False`` on an
    instance to load in the engine's step (a RAM disk, say)."""

    def __init__(self, catalog: PackCatalog, *, owner: str, write: PackWriter = write_pack) -> None:
        self.catalog: PackCatalog = catalog
        self._root = catalog.root
        self._directory = os.fspath(catalog.root)
        self._owner = owner
        self._write = write
        self._pinned: dict[StoreKey, list[str]] = {}
        self._offered: list[str] = []
        """Packs the last ``contains`` found, leased until the next."""
        self.eviction_failures: int = 0
        """Evictions that raised (the pack stays; the next put tries again)."""

    def _find(self, key: StoreKey) -> tuple[str, RecordHeader] | None:
        found = self.catalog.find(key.block, key.layout)
        if found is None or HEADER_SIZE + found[1].length != key.nbytes:
            return None
        return found

    def contains(self, keys: Sequence[StoreKey], /) -> list[bool]:
        """Per key, whether a whole value is stored. What it finds stays leased — no process evicts it —
        until the next ``contains``: the scheduler asks, then pins what it plans to load, then asks again,
        so a block it was offered cannot vanish before its load is pinned. It first reads what other
        processes changed (the journal: one ``fstat`` when nothing did), so a record another process
        found damaged and tombstoned is a miss here from then on, not a load that fails again."""
        self.catalog.catch_up()
        offered, self._offered = self._offered, []
        answers: list[bool] = []
        for key in keys:
            name = self._pin(key)
            if name is not None:
                self._offered.append(name)
            answers.append(name is not None)
        for name in offered:
            self.catalog.unpin(name)
        return answers

    def _pin(self, key: StoreKey) -> str | None:
        """Lease a pack that holds ``key``'s whole value; its name, or ``None`` when none is left."""
        return None if self._find(key) is None else self.catalog.pin_place(key.block, key.layout)

    def get(self, keys: Sequence[StoreKey], /) -> list[bytes | None]:
        buffers = [bytearray(key.nbytes) for key in keys]
        counts = self.get_into(keys, [memoryview(buffer) for buffer in buffers])
        return [None if count is None else bytes(buffer[:count]) for buffer, count in zip(buffers, counts, strict=True)]

    def get_into(self, keys: Sequence[StoreKey], buffers: Sequence[memoryview], /) -> list[int | None]:
        return self._get(keys, buffers, None)

    def get_into_parts(
        self, keys: Sequence[StoreKey], parts: Sequence[Sequence[memoryview]], /,
        *, landed: Callable[[int, int], None] | None = None,
    ) -> list[int | None]:
        """Each value read with one ``preadv`` into its parts (runs of records saved together: one call),
        ``landed`` told of each run's values before the next run is read."""
        return self._get(keys, parts, landed)

    def _get(
        self, keys: Sequence[StoreKey], buffers: Sequence[memoryview | Sequence[memoryview]],
        landed: Callable[[int, int], None] | None,
    ) -> list[int | None]:
        counts: list[int | None] = [None] * len(keys)
        opened: dict[str, int] = {}
        indices = list(range(len(keys)))
        try:
            while indices:  # a pack gone under us (unpinned: evicted): its values may be stored elsewhere too
                indices = self._read_keys(keys, indices, buffers, counts, opened, landed)
        finally:
            for descriptor in opened.values():
                os.close(descriptor)  # an evicted pack holds no disk past this read
        return counts

    def _read_keys(
        self, keys: Sequence[StoreKey], indices: list[int], buffers: Sequence[memoryview | Sequence[memoryview]],
        counts: list[int | None], opened: dict[str, int], landed: Callable[[int, int], None] | None,
    ) -> list[int]:
        """Read ``keys[i]`` into ``buffers[i]`` for each ``i`` in ``indices``; the indices whose pack was gone."""
        gone: list[int] = []
        places = self.catalog.find_all([(keys[index].block, keys[index].layout) for index in indices])
        # Records that lie back to back in one pack (saved together) are read in one call.
        run: list[tuple[int, str, RecordHeader]] = []
        last_index, last_name, next_offset, run_bytes = -2, "", -1, 0
        for index, found in zip(indices, places, strict=True):
            if found is None:
                continue
            name, record = found
            if HEADER_SIZE + record.length != keys[index].nbytes:
                continue  # a value of another length: not this layout's whole value, a miss
            if run and (
                len(run) == _RUN_RECORDS or run_bytes >= _RUN_BYTES
                or index != last_index + 1 or name != last_name or record.offset != next_offset
            ):
                gone += self._read_run(run, buffers, counts, opened, landed)
                run, run_bytes = [], 0
            run.append((index, name, record))
            run_bytes += HEADER_SIZE + record.length
            last_index, last_name, next_offset = index, name, record.offset + HEADER_SIZE + record.length
        if run:
            gone += self._read_run(run, buffers, counts, opened, landed)
        return gone

    def _read_run(
        self, run: list[tuple[int, str, RecordHeader]], buffers: Sequence[memoryview | Sequence[memoryview]],
        counts: list[int | None], opened: dict[str, int], landed: Callable[[int, int], None] | None,
    ) -> list[int]:
        """Read one run; its indices if the pack is gone (forgotten: a miss, unless stored elsewhere too)."""
        name = run[0][1]
        try:
            descriptor = opened.get(name)
            if descriptor is None:
                descriptor = opened[name] = os.open(os.path.join(self._directory, name), os.O_RDONLY)
        except FileNotFoundError:
            self.catalog.forget(name)
            return [index for index, _, _ in run]
        except OSError:  # EMFILE, EACCES, EIO: a miss now, the file stays
            return []
        read = read_values(descriptor, [record for _, _, record in run], [buffers[index] for index, _, _ in run])
        if read is None:
            return []
        for (index, _, _), count in zip(run, read, strict=True):
            counts[index] = count
            if landed is not None:
                landed(index, count)
        self.catalog.used(name)
        return []

    def put(self, items: Sequence[tuple[StoreKey, memoryview]], /) -> list[bool]:
        """One pack for every value; all stored, or (the write raised) none."""
        records: list[PackRecord] = []
        for key, value in items:
            header = unpack_header(value)
            if header is None or header.key != key.block or len(value) != HEADER_SIZE + header.length:
                raise ValueError(f"{self._owner}: a value handed to put is not {key.name}'s sealed value")
            records.append(PackRecord(key.block, key.layout, value[HEADER_SIZE:], header.checksum))
        if not records:
            return []
        name, headers = self._write(self._root, records)
        del records
        self.catalog.add(name, headers)
        try:
            self.catalog.evict(keep=name)
        except Exception as error:  # noqa: BLE001 (the values are stored; eviction is retried after the next put)
            self.eviction_failures += 1
            _log.warning("%s: evicting packs failed: %r", self._owner, error)
        return [True] * len(items)

    def delete(self, keys: Sequence[StoreKey], /) -> None:
        """Tombstone every record of each key (the packs' other records stay)."""
        for key in keys:
            while (found := self.catalog.find(key.block, key.layout, refresh=False)) is not None:
                self.catalog.bury(*found)

    def pin(self, keys: Sequence[StoreKey], /) -> list[bool]:
        """Per key, whether a pack holding it is now leased: kept from every process's eviction (never
        a pack that is already gone)."""
        pinned: list[bool] = []
        for key in keys:
            name = self._pin(key)
            if name is not None:
                self._pinned.setdefault(key, []).append(name)
            pinned.append(name is not None)
        return pinned

    def unpin(self, keys: Sequence[StoreKey], /) -> None:
        for key in keys:
            names = self._pinned.get(key)
            if names:
                self.catalog.unpin(names.pop())
                if not names:
                    del self._pinned[key]

    def close(self) -> None:
        """Drop this process's leases and stop following the directory's journal."""
        self._offered = []
        self.catalog.close()


class FileStoreConnector(StoreConnector):
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
    default_loads_async: ClassVar[bool | None] = FileBackend.slow

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
        self.files: FileBackend = FileBackend(self.catalog, owner=name, write=write)
        """The backend: the directory's packs, read and written."""
        super().__init__(spec, self.files, namespace=namespace, background=True)


publish(__name__)
