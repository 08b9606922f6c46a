"""``MemoryBackend``: values in a dict — the smallest backend, for tests and as a model to write one."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from capkv._homes import publish
from capkv.stores._backend import StoreKey

__all__ = ["MemoryBackend"]


class MemoryBackend:
    """Values in this process's memory, as many as fit in ``capacity_bytes`` (``None``: no bound).

    A put that does not fit is refused (``False``), never evicting: a store of
    your own decides what to drop. ``values`` is the dict itself, for tests that
    inspect or damage what is stored.
    """

    slow: bool = False
    """Memory: loads run in the engine's step."""

    def __init__(self, capacity_bytes: int | None = None) -> None:
        self.capacity_bytes: int | None = capacity_bytes
        self.values: dict[StoreKey, bytes] = {}
        self._nbytes = 0
        self._lock = threading.Lock()

    def contains(self, keys: Sequence[StoreKey], /) -> list[bool]:
        with self._lock:
            return [len(self.values.get(key, b"")) == key.nbytes for key in keys]

    def get(self, keys: Sequence[StoreKey], /) -> list[bytes | None]:
        with self._lock:
            return [self.values.get(key) for key in keys]

    def put(self, items: Sequence[tuple[StoreKey, memoryview]], /) -> list[bool]:
        stored: list[bool] = []
        with self._lock:
            for key, value in items:
                grown = self._nbytes + len(value) - len(self.values.get(key, b""))
                if self.capacity_bytes is not None and grown > self.capacity_bytes:
                    stored.append(False)
                    continue
                self.values[key] = bytes(value)
                self._nbytes = grown
                stored.append(True)
        return stored

    def delete(self, keys: Sequence[StoreKey], /) -> None:
        with self._lock:
            for key in keys:
                self._nbytes -= len(self.values.pop(key, b""))

    def close(self) -> None:
        with self._lock:
            self.values.clear()
            self._nbytes = 0


publish(__name__)
