"""Which blocks a store directory holds, in which pack and where: the file store's index.

The directory is the truth, shared by every engine process (vLLM's scheduler and each worker); a catalog lists
it once, then follows its journal, so a lookup miss never lists it again.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from capkv.connectors._block_file import HEADER_SIZE, PACK_SUFFIX, RecordHeader, scan_pack
from capkv.stores._keys import BlockKey
from capkv.connectors._pack_journal import PackJournal, latest_generation

__all__ = ["DEAD_SUFFIX", "PackCatalog"]

DEAD_SUFFIX = ".dead"

_Where = tuple[BlockKey, bytes]


@dataclass
class _Pack:
    size: int
    records: list[RecordHeader]
    last_used: float
    dead: set[int] = field(default_factory=set[int])
    """Offsets of its records found damaged (each has a tombstone file, removed with the pack)."""


@dataclass
class _Lease:
    descriptor: int
    pins: int


class PackCatalog:
    """A thread-safe view of one store directory's packs, and this process's leases on them.

    It maps ``(key, layout fingerprint)`` to a record; records of another layout are simply other keys: never
    offered, and never a reason not to save this layout's own copy. A record found damaged (bad header or
    checksum) is removed from the store, not its pack, whose other records are good: a tombstone file
    ``<pack>.<offset>.dead`` tells processes that list the directory later, the journal those running now.

    Capacity is bounded in bytes, over every process's packs. Eviction removes whole packs, least recently
    used first (a load marks its pack used, for other processes too, through the file's modification time,
    checked again before a pack goes). A pin is a lease that every process honours and no crash leaves behind:
    a shared ``flock`` on the pack, held by an open descriptor, which the kernel drops when the process dies.
    Eviction takes the exclusive lock without waiting, so it passes over a pinned pack and a pin never takes a
    pack being evicted; a pin checks that the pack it locked is still linked, so it never succeeds on a pack
    that is gone. A reader that opened a pack keeps reading it after an eviction (packs never change in
    place).
    """

    def __init__(self, root: Path, capacity_bytes: int) -> None:
        self.root = root
        self.capacity_bytes = capacity_bytes
        self._lock = threading.Lock()
        self._packs: dict[str, _Pack] = {}
        self._where: dict[_Where, dict[str, RecordHeader]] = {}
        self._leases: dict[str, _Lease] = {}
        self._journal = PackJournal(root)
        self.evictions: int = 0
        """Packs this catalog evicted."""
        self.refresh()

    # ---- lookups ---------------------------------------------------------------------

    def find(self, key: BlockKey, fingerprint: bytes, *, refresh: bool = True) -> tuple[str, RecordHeader] | None:
        """Where ``key`` is stored under ``fingerprint`` (reading the journal once on a miss)."""
        found = self._find(key, fingerprint)
        if found is None and refresh and self.catch_up():
            found = self._find(key, fingerprint)
        return found

    def find_all(self, wheres: list[tuple[BlockKey, bytes]]) -> list[tuple[str, RecordHeader] | None]:
        """:meth:`find` of many ``(key, fingerprint)``: one lock, the journal read at most once."""
        found = self._find_all(wheres)
        if None in found and self.catch_up():
            found = self._find_all(wheres)
        return found

    def _find_all(self, wheres: list[tuple[BlockKey, bytes]]) -> list[tuple[str, RecordHeader] | None]:
        found: list[tuple[str, RecordHeader] | None] = []
        with self._lock:
            lookup = self._where.get
            for where in wheres:
                places = lookup(where)
                found.append(next(iter(places.items())) if places else None)
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

    # ---- following the directory ---------------------------------------------------------

    def catch_up(self) -> bool:
        """Apply what the journal says changed since the last call (or list the directory when the
        journal cannot tell); whether anything did."""
        lines = self._journal.read()
        if lines is None:
            return self.refresh()
        for line in lines:
            name, _, offset = line[1:].partition(" ")
            if not name.endswith(PACK_SUFFIX) or "/" in name:
                continue  # a torn line (a writer died mid-append): a later listing finds the pack
            if line[0] == "+":
                self._scan(name)
            elif line[0] == "-":
                self.forget(name)
            elif line[0] == "!" and offset.isdigit():
                self._forget_record(name, int(offset))
        return bool(lines)

    def refresh(self) -> bool:
        """List the directory: learn its packs and tombstones, forget packs that are gone (at start,
        when the journal lost its place, and when a full store checks its size)."""
        try:
            names = os.listdir(self.root)
        except OSError:
            self._journal.start(0)  # no directory: read() says so until there is one again
            with self._lock:
                gone = list(self._packs)
            for name in gone:
                self.forget(name)
            return bool(gone)
        self._journal.start(latest_generation(names))
        dead: dict[str, set[int]] = {}
        present: set[str] = set()
        for entry in names:
            if entry.endswith(PACK_SUFFIX):
                present.add(entry)
            elif entry.endswith(DEAD_SUFFIX):
                pack, _, offset = entry.removesuffix(DEAD_SUFFIX).rpartition(".")
                if offset.isdigit():
                    dead.setdefault(pack, set()).add(int(offset))
        with self._lock:
            known = set(self._packs)
        for name in known - present:
            self.forget(name)
        for name, offsets in dead.items():
            for dead_offset in offsets:
                self._forget_record(name, dead_offset)
        for name in present - known:
            self._scan(name, dead.get(name, set()))
        return known != present

    def _scan(self, name: str, dead: frozenset[int] | set[int] = frozenset()) -> None:
        """List pack ``name`` from its headers, but for the records at offsets ``dead`` (a pack the
        journal announces has none yet: its tombstones come later, as journal lines too)."""
        with self._lock:
            if name in self._packs:
                return
        try:
            records = list(scan_pack(self.root / name))
            status = os.stat(self.root / name)
        except OSError:  # gone already, or unreadable now: a later listing tries again
            return
        self._add(name, [r for r in records if r.offset not in dead], status.st_size, status.st_mtime)
        with self._lock:
            pack = self._packs.get(name)
            if pack is not None:
                pack.dead |= dead

    # ---- changes -----------------------------------------------------------------------

    def add(self, name: str, records: list[RecordHeader]) -> None:
        """A pack this process just wrote: listed here, and announced to the others."""
        self._add(name, records, sum(r.length for r in records) + len(records) * HEADER_SIZE, time.time())
        self._journal.append(f"+{name}")

    def _add(self, name: str, records: list[RecordHeader], size: int, last_used: float) -> None:
        with self._lock:
            if name in self._packs:
                return
            self._packs[name] = _Pack(size, records, last_used)
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
        self._journal.append(f"!{name} {record.offset}")

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
            pack.dead.add(offset)

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

    # ---- leases ----------------------------------------------------------------------------

    def pin(self, name: str) -> bool:
        """Keep pack ``name`` from every process's eviction until :meth:`unpin`; ``False`` when it is
        gone (then forgotten), being evicted this moment, or cannot be opened now (``EMFILE`` ...)."""
        gone = False
        with self._lock:
            lease = self._leases.get(name)
            if lease is not None:
                lease.pins += 1
                return True
            try:
                descriptor = os.open(self.root / name, os.O_RDONLY)
            except FileNotFoundError:
                descriptor, gone = None, True
            except OSError:
                descriptor = None  # no descriptor to spare: not now, and the pack stays listed
            if descriptor is not None:
                try:
                    fcntl.flock(descriptor, fcntl.LOCK_SH | fcntl.LOCK_NB)
                    gone = os.fstat(descriptor).st_nlink == 0  # evicted between our open and our lock
                    held = not gone
                except OSError:  # being evicted this moment
                    held, gone = False, True
                if held:
                    self._leases[name] = _Lease(descriptor, 1)
                    return True
                os.close(descriptor)
        if gone:
            self.forget(name)
        return False

    def pin_place(self, key: BlockKey, fingerprint: bytes) -> str | None:
        """Pin a pack that holds ``key`` under ``fingerprint``; its name, or ``None`` when none is left."""
        if self.find(key, fingerprint) is None:  # reads the journal on a miss
            return None
        with self._lock:
            names = list(self._where.get((key, fingerprint), ()))
        for name in names:
            if self.pin(name):
                return name
        return None

    def unpin(self, name: str) -> None:
        with self._lock:
            lease = self._leases.get(name)
            if lease is None:
                return
            lease.pins -= 1
            if lease.pins <= 0:
                del self._leases[name]
                os.close(lease.descriptor)  # drops the lock

    def pinned(self, name: str) -> bool:
        """Whether this process holds a lease on pack ``name``."""
        with self._lock:
            return name in self._leases

    # ---- eviction --------------------------------------------------------------------------

    def evict(self, *, keep: str | None = None) -> int:
        """Remove least recently used packs until the directory fits its capacity (never ``keep``,
        nor a pack any process has pinned); how many were removed."""
        self.catch_up()
        removed = 0
        passed: set[str] = set()
        while True:
            with self._lock:
                total = sum(pack.size for pack in self._packs.values())
                if total <= self.capacity_bytes:
                    return removed
                candidates = [(p.last_used, n) for n, p in self._packs.items() if n != keep and n not in passed]
            if not candidates:
                return removed
            last_used, victim = min(candidates)
            passed.add(victim)
            outcome = self._remove(victim, last_used)
            if outcome == "removed":
                removed += 1
                self.evictions += 1
            elif outcome == "used":
                passed.discard(victim)  # used elsewhere since: its place in the order moved

    def _remove(self, name: str, last_used: float) -> str:
        """Evict one pack unless it is pinned or was used since ``last_used``: removed, pinned, used or gone."""
        path = self.root / name
        try:
            descriptor = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            self.forget(name)  # another process evicted it first
            return "gone"
        except OSError:
            return "pinned"  # cannot look now: leave it
        try:
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return "pinned"
            status = os.fstat(descriptor)
            if status.st_nlink == 0:
                self.forget(name)
                return "gone"
            if status.st_mtime > last_used + 1e-3:
                with self._lock:
                    pack = self._packs.get(name)
                    if pack is not None:
                        pack.last_used = status.st_mtime
                return "used"
            try:
                path.unlink()
            except FileNotFoundError:
                pass
            except OSError:
                return "pinned"
        finally:
            os.close(descriptor)
        with self._lock:
            pack = self._packs.get(name)
            dead: set[int] = set() if pack is None else set(pack.dead)
        for offset in dead:
            (self.root / f"{name}.{offset}{DEAD_SUFFIX}").unlink(missing_ok=True)
        self.forget(name)
        self._journal.append(f"-{name}")
        return "removed"

    def close(self) -> None:
        """Drop every lease this process holds and stop following the journal."""
        with self._lock:
            leases, self._leases = list(self._leases.values()), {}
        for lease in leases:
            os.close(lease.descriptor)
        self._journal.close()
