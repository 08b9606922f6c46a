"""A third-party store written from the docs alone (guide § 16): a SQLite ``Backend`` under ``StoreConnector``.

``SQLiteStore`` is correct. Each other store plants one bug in its backend, the way a real one
slips in; the kit (``check_connector``) and ``capkv demo`` must catch every one and name its cause
(tests/testing/test_planted_bugs.py). ``capkv demo --import tests.testing.sqlite_store --stack
"cpu,tests.testing.sqlite_store:WrongRows"`` serves one.
"""

from __future__ import annotations

import sqlite3
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

from capkv import KVSpec
from capkv.config import ConnectorOptions, Option
from capkv.stores import StoreConnector, StoreKey

__all__ = ["PLANTED", "SQLiteBackend", "SQLiteStore"]


class SQLiteBackend:
    """Values as rows of one table, ``(name, value)``; one connection, shared by the store's threads."""

    slow = False

    def __init__(self, path: str) -> None:
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS kv (name TEXT PRIMARY KEY, value BLOB NOT NULL)")

    def contains(self, keys: Sequence[StoreKey], /) -> list[bool]:
        with self._lock:
            sizes = dict(self._db.execute(
                f"SELECT name, length(value) FROM kv WHERE name IN ({_marks(keys)})", [k.name for k in keys]
            ).fetchall())
        return [sizes.get(key.name) == key.nbytes for key in keys]

    def get(self, keys: Sequence[StoreKey], /) -> list[bytes | None]:
        with self._lock:
            values = dict(self._db.execute(
                f"SELECT name, value FROM kv WHERE name IN ({_marks(keys)})", [k.name for k in keys]
            ).fetchall())
        return [values.get(key.name) for key in keys]

    def put(self, items: Sequence[tuple[StoreKey, memoryview]], /) -> list[bool]:
        rows = [(key.name, bytes(value)) for key, value in items]  # the store reuses the memory: copy it
        with self._lock:
            self._db.executemany("INSERT OR REPLACE INTO kv (name, value) VALUES (?, ?)", rows)
        return [True] * len(rows)

    def delete(self, keys: Sequence[StoreKey], /) -> None:
        with self._lock:
            self._db.executemany("DELETE FROM kv WHERE name = ?", [(key.name,) for key in keys])

    def close(self) -> None:
        with self._lock:
            self._db.close()


def _marks(keys: Sequence[StoreKey]) -> str:
    return ",".join("?" * len(keys))


class SQLiteStore(StoreConnector):
    """An HMA-capable prefix store in a SQLite file; configurations name it with ``{"root": ...}``."""

    extra_config_options: ClassVar[ConnectorOptions] = ConnectorOptions(takes_spec=True, root=Option(str))
    backend_class: ClassVar[type[SQLiteBackend]] = SQLiteBackend

    def __init__(self, spec: KVSpec, *, root: str | None = None) -> None:
        directory = Path(root if root is not None else tempfile.mkdtemp(prefix="capkv-sqlite-"))
        directory.mkdir(parents=True, exist_ok=True)
        super().__init__(spec, self.backend_class(str(directory / f"{type(self).__name__}.sqlite3")))


# ---- the planted bugs, one per store ---------------------------------------------------------------


class WrongRowsBackend(SQLiteBackend):
    """``get`` answers the rows in the database's order, not in the order of the keys asked."""

    def get(self, keys: Sequence[StoreKey], /) -> list[bytes | None]:
        with self._lock:
            rows = self._db.execute(
                f"SELECT value FROM kv WHERE name IN ({_marks(keys)}) ORDER BY rowid DESC", [k.name for k in keys]
            ).fetchall()
        values: list[bytes | None] = [value for (value,) in rows]
        return values + [None] * (len(keys) - len(values))


class DropsOneInTenBackend(SQLiteBackend):
    """``put`` drops every tenth value and answers ``True`` for it."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self._puts = 0

    def put(self, items: Sequence[tuple[StoreKey, memoryview]], /) -> list[bool]:
        kept: list[tuple[StoreKey, memoryview]] = []
        for item in items:
            self._puts += 1
            if self._puts % 10:
                kept.append(item)
        super().put(kept)
        return [True] * len(items)


class ContainsEverythingBackend(SQLiteBackend):
    """``contains`` answers yes to every key."""

    def contains(self, keys: Sequence[StoreKey], /) -> list[bool]:
        return [True] * len(keys)


class DropsEverythingBackend(SQLiteBackend):
    """``put`` stores nothing and answers ``True``."""

    def put(self, items: Sequence[tuple[StoreKey, memoryview]], /) -> list[bool]:
        return [True] * len(items)


class RaisingGetBackend(SQLiteBackend):
    """``get`` raises."""

    def get(self, keys: Sequence[StoreKey], /) -> list[bytes | None]:
        raise sqlite3.OperationalError("database disk image is malformed")


class WrongRows(SQLiteStore):
    backend_class = WrongRowsBackend


class DropsOneInTen(SQLiteStore):
    backend_class = DropsOneInTenBackend


class ContainsEverything(SQLiteStore):
    backend_class = ContainsEverythingBackend


class DropsEverything(SQLiteStore):
    backend_class = DropsEverythingBackend


class RaisingGet(SQLiteStore):
    backend_class = RaisingGetBackend


PLANTED: dict[str, type[SQLiteStore]] = {
    "get returns another key's bytes": WrongRows,
    "put drops one value in ten, claiming success": DropsOneInTen,
    "contains answers yes to everything": ContainsEverything,
    "put drops everything": DropsEverything,
    "get raises": RaisingGet,
}
"""Each planted bug, by what it does, and the store that has it."""
