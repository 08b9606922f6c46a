"""Which blocks a store directory holds, in which pack and where: the file store's index.

The directory is the truth, shared by every engine process that uses it: a
catalog lists its packs (rescanning only when the directory changed, and only
the packs it has not read yet) and maps ``(key, layout fingerprint)`` to a
record. Records of another layout are simply other keys: never offered, and
never a reason not to save this layout's own copy.

A record found damaged (bad header or CRC) is removed from the store, not its
pack, whose other records are good: a tombstone file ``<pack>.<offset>.dead``
tells every process to skip it, and goes with its pack.

Capacity is bounded in bytes. Eviction removes whole packs, least recently used
first (a load marks its pack used, also for other processes, through the file's
modification time), never one a planned load has pinned. Another process may
evict a pack first: an unlink that finds nothing is fine, and a reader that
already opened the pack keeps reading it (packs are never changed in place).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from capkv.connectors._block_file import HEADER_SIZE, PACK_SUFFIX, RecordHeader, scan_pack

DEAD_SUFFIX = ".dead"
from capkv.stores._keys import BlockKey

__all__ = ["DEAD_SUFFIX", "PackCatalog"]

_Where = tuple[BlockKey, bytes]


@dataclass
class _Pack:
    size: int
    records: list[RecordHeader]
    last_used: float
    pins: int = 0


class PackCatalog:
    """A thread-safe view of one store directory's packs."""

    def __init__(self, root: Path, capacity_bytes: int) -> None:
        self.root = root
        self.capacity_bytes = capacity_bytes
        self._lock = threading.Lock()
        self._packs: dict[str, _Pack] = {}
        self._where: dict[_Where, dict[str, RecordHeader]] = {}
        self._seen_mtime: int | None = None
        self.evictions: int = 0
        """Packs this catalog evicted."""

    # ---- lookups ---------------------------------------------------------------------

    def find(self, key: BlockKey, fingerprint: bytes, *, refresh: bool = True) -> tuple[str, RecordHeader] | None:
        """Where ``key`` is stored under ``fingerprint`` (rescanning the directory once on a miss if it changed)."""
        found = self._find(key, fingerprint)
        if found is None and refresh and self.refresh():
            found = self._find(key, fingerprint)
        return found

    def _find(self, key: BlockKey, fingerprint: bytes) -> tuple[str, RecordHeader] | None:
        with self._lock:
            places = self._where.get((key, fingerprint))
            if not places:
                return None
            name, record = next(iter(places.items()))
            return name, record

    @property
    def total_bytes(self) -> int:
        with self._lock:
            return sum(pack.size for pack in self._packs.values())

    def __len__(self) -> int:
        """Records listed (a block stored twice counts twice)."""
        with self._lock:
            return sum(len(pack.records) for pack in self._packs.values())

    # ---- changes -----------------------------------------------------------------------

    def refresh(self) -> bool:
        """Rescan the directory if it changed since the last scan; whether it did."""
        try:
            mtime = os.stat(self.root).st_mtime_ns
        except OSError:
            return False
        if mtime == self._seen_mtime:
            return False
        self._seen_mtime = mtime
        entries: list[tuple[str, os.stat_result]] = []
        dead: dict[str, set[int]] = {}
        try:
            for entry in os.scandir(self.root):
                if entry.name.endswith(PACK_SUFFIX):
                    entries.append((entry.name, entry.stat()))
                elif entry.name.endswith(DEAD_SUFFIX):
                    pack, _, offset = entry.name.removesuffix(DEAD_SUFFIX).rpartition(".")
                    if offset.isdigit():
                        dead.setdefault(pack, set()).add(int(offset))
        except OSError:
            self._seen_mtime = None
            return False
        present = {name for name, _ in entries}
        with self._lock:
            known = set(self._packs)
        for name in known - present:
            self.forget(name)
        for name, offsets in dead.items():
            if name in known:
                for dead_offset in offsets:
                    self._forget_record(name, dead_offset)
        for name, stat in entries:
            if name in known:
                continue
            try:
                records = [r for r in scan_pack(self.root / name) if r.offset not in dead.get(name, ())]
            except OSError:  # gone already, or unreadable now: the next scan tries again
                self._seen_mtime = None
                continue
            self.add(name, records, size=stat.st_size, last_used=stat.st_mtime)
        return True

    def add(self, name: str, records: list[RecordHeader], *, size: int | None = None, last_used: float | None = None) -> None:
        """A pack (this process's, just written; or found by a scan)."""
        total = size if size is not None else sum(r.length for r in records) + len(records) * HEADER_SIZE
        with self._lock:
            if name in self._packs:
                return
            self._packs[name] = _Pack(total, records, time.time() if last_used is None else last_used)
            for record in records:
                self._where.setdefault((record.key, record.fingerprint), {})[name] = record

    def forget(self, name: str) -> None:
        """Drop a pack from the view (gone from the directory, or damaged and removed)."""
        with self._lock:
            pack = self._packs.pop(name, None)
            if pack is None:
                return
            for record in pack.records:
                where = (record.key, record.fingerprint)
                places = self._where.get(where)
                if places is not None:
                    places.pop(name, None)
                    if not places:
                        del self._where[where]

    def bury(self, name: str, record: RecordHeader) -> None:
        """``record`` of pack ``name`` is damaged: skip it here and, by its tombstone, everywhere."""
        self._forget_record(name, record.offset)
        try:
            (self.root / f"{name}.{record.offset}{DEAD_SUFFIX}").touch()
        except OSError:
            pass  # the other processes find out by reading it, as this one did

    def _forget_record(self, name: str, offset: int) -> None:
        with self._lock:
            pack = self._packs.get(name)
            if pack is None:
                return
            kept: list[RecordHeader] = []
            for record in pack.records:
                if record.offset != offset:
                    kept.append(record)
                    continue
                places = self._where.get((record.key, record.fingerprint))
                if places is not None:
                    places.pop(name, None)
                    if not places:
                        del self._where[(record.key, record.fingerprint)]
            pack.records = kept

    def used(self, name: str) -> None:
        """A load read this pack: most recently used, here and (by its mtime) for other processes."""
        now = time.time()
        with self._lock:
            pack = self._packs.get(name)
            if pack is None or now - pack.last_used < 1.0:
                return
            pack.last_used = now
        try:
            os.utime(self.root / name)
        except OSError:
            pass

    def pin(self, name: str) -> None:
        with self._lock:
            pack = self._packs.get(name)
            if pack is not None:
                pack.pins += 1

    def unpin(self, name: str) -> None:
        with self._lock:
            pack = self._packs.get(name)
            if pack is not None and pack.pins > 0:
                pack.pins -= 1

    def evict(self, *, keep: str | None = None) -> int:
        """Remove least recently used packs until the store fits its capacity (never ``keep`` nor a
        pinned one); how many were removed."""
        self.refresh()
        removed = 0
        while True:
            with self._lock:
                total = sum(pack.size for pack in self._packs.values())
                if total <= self.capacity_bytes:
                    return removed
                candidates = [(p.last_used, n) for n, p in self._packs.items() if n != keep and not p.pins]
            if not candidates:
                return removed
            _, victim = min(candidates)
            try:
                (self.root / victim).unlink()
            except FileNotFoundError:
                pass  # another process evicted it first
            except OSError:
                return removed  # cannot remove now: try again after the next write
            for tombstone in self.root.glob(f"{victim}.*{DEAD_SUFFIX}"):
                tombstone.unlink(missing_ok=True)
            self.forget(victim)
            removed += 1
            self.evictions += 1

