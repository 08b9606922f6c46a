"""Which packs came and went in a store directory, told to every process that shares it.

A lookup miss must see the packs other processes wrote a moment ago without listing the directory (thousands
of packs, on the scheduler's path).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

__all__ = ["JOURNAL_PREFIX", "ROTATE_BYTES", "PackJournal"]

JOURNAL_PREFIX = ".journal."
ROTATE_BYTES = 1 << 20
"""A generation past this size is followed by the next (about 20,000 lines)."""


def _generation(name: str) -> int | None:
    suffix = name.removeprefix(JOURNAL_PREFIX)
    return int(suffix) if name.startswith(JOURNAL_PREFIX) and suffix.isdigit() else None


def latest_generation(names: list[str]) -> int:
    """The newest journal generation among directory entry ``names`` (0 when there is none)."""
    return max((g for g in map(_generation, names) if g is not None), default=0)


class PackJournal:
    """One process's end of a store directory's journal: appends changes, reads the others'.

    Every change is also a line appended to a journal in the directory: ``+<pack>`` (written), ``-<pack>``
    (evicted), ``!<pack> <offset>`` (a record found damaged). A reader keeps its place and, per miss, pays one
    ``fstat``, reading only the lines added since (:meth:`read`).

    Appends are single ``O_APPEND`` writes, so writers never interleave inside a line on a local file system.
    The journal rotates through generations ``.journal.<n>``: whoever finds generation ``n`` past
    :data:`ROTATE_BYTES` creates ``n + 1`` and removes ``n - 1``. A writer that finds a newer generation after
    appending appends there too, and a reader finishes a generation only after seeing the next one exists, so
    no line falls between them. A reader that lost its place (its generation removed under it, the directory
    deleted) gets ``None`` and lists the directory once — the only time a reader does.
    """

    def __init__(self, root: Path) -> None:
        self._root = root
        self._lock = threading.Lock()
        self._read_fd: int | None = None
        self._read_generation = 0
        self._offset = 0
        self._partial = b""
        self._write_fd: int | None = None
        self._write_generation = 0

    def _path(self, generation: int) -> Path:
        return self._root / f"{JOURNAL_PREFIX}{generation}"

    # ---- reading ---------------------------------------------------------------------

    def start(self, generation: int) -> None:
        """Read from the current end of ``generation`` on (call before listing the directory: what
        changes while it is listed is read again, harmlessly)."""
        with self._lock:
            self._close_reader()
            try:
                self._read_fd = os.open(self._path(generation), os.O_RDONLY | os.O_CREAT, 0o644)
            except OSError:
                return  # no directory: read() answers None until there is one
            self._read_generation = generation
            self._offset = os.fstat(self._read_fd).st_size
            self._partial = b""

    def read(self) -> list[str] | None:
        """The lines appended since the last call, oldest first; ``None`` when some may be lost (list
        the directory, then :meth:`start` again)."""
        with self._lock:
            descriptor = self._read_fd
            if descriptor is None:
                return None
            try:
                status = os.fstat(descriptor)
                if status.st_nlink == 0:
                    return None  # removed under us: rotated past, or the directory deleted
                lines = self._drain(descriptor, status.st_size)
                while status.st_size >= ROTATE_BYTES and self._path(self._read_generation + 1).exists():
                    lines += self._drain(descriptor, os.fstat(descriptor).st_size)  # what came before the switch
                    following = os.open(self._path(self._read_generation + 1), os.O_RDONLY)
                    self._close_reader()
                    self._read_fd, descriptor = following, following
                    self._read_generation += 1
                    self._offset, self._partial = 0, b""
                    status = os.fstat(descriptor)
                    lines += self._drain(descriptor, status.st_size)
            except OSError:
                return None
            return lines

    def _drain(self, descriptor: int, size: int) -> list[str]:
        if size <= self._offset:
            return []
        data = self._partial + os.pread(descriptor, size - self._offset, self._offset)
        self._offset += len(data) - len(self._partial)
        complete, _, self._partial = data.rpartition(b"\n")
        return complete.decode("ascii", "replace").split("\n") if complete else []

    def _close_reader(self) -> None:
        if self._read_fd is not None:
            os.close(self._read_fd)
            self._read_fd = None

    # ---- writing ---------------------------------------------------------------------

    def append(self, line: str) -> None:
        """Tell every process ``line`` (best effort: a reader that misses it finds out otherwise)."""
        data = f"{line}\n".encode("ascii")
        with self._lock:
            try:
                self._append(data)
            except OSError:
                self._close_writer()

    def _append(self, data: bytes) -> None:
        if self._write_fd is None or os.fstat(self._write_fd).st_nlink == 0:
            self._close_writer()
            names = os.listdir(self._root)  # rare: the first write, or after the journal moved on
            self._write_generation = latest_generation(names)
            self._write_fd = os.open(self._path(self._write_generation), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(self._write_fd, data)
        if os.fstat(self._write_fd).st_size >= ROTATE_BYTES:
            try:
                os.close(os.open(self._path(self._write_generation + 1), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
                self._path(self._write_generation - 1).unlink(missing_ok=True)
            except FileExistsError:
                pass  # another process rotated first
        while self._path(self._write_generation + 1).exists():  # readers may have moved on: follow them
            following = os.open(self._path(self._write_generation + 1), os.O_WRONLY | os.O_APPEND)
            self._close_writer()
            self._write_fd = following
            self._write_generation += 1
            os.write(following, data)

    def _close_writer(self) -> None:
        if self._write_fd is not None:
            os.close(self._write_fd)
            self._write_fd = None

    def close(self) -> None:
        with self._lock:
            self._close_reader()
            self._close_writer()
