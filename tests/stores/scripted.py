"""A slow backend whose reads follow a script: the next reads may block on a gate or raise.

Every wait is bounded: a gate the test never opens fails the read with ``TimeoutError``
after ``GATE_TIMEOUT_S`` rather than hanging the suite.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from capkv.stores import MemoryBackend, StoreKey

GATE_TIMEOUT_S = 30.0


class Gate:
    """A read that waits until :meth:`open` (bounded)."""

    def __init__(self, timeout_s: float = GATE_TIMEOUT_S) -> None:
        self._open = threading.Event()
        self._timeout_s = timeout_s
        self.reached = threading.Event()
        """Set once a read is waiting here."""

    def open(self) -> None:
        self._open.set()

    def __call__(self) -> None:
        self.reached.set()
        if not self._open.wait(self._timeout_s):
            raise TimeoutError("the test never opened the gate")


class Raise:
    """A read that raises ``error`` (any ``BaseException``)."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def __call__(self) -> None:
        raise self.error


class ScriptedReads(MemoryBackend):
    """``slow = True``: the store loads on its reader thread; each ``get`` first runs the next scripted step."""

    slow = True

    def __init__(self) -> None:
        super().__init__()
        self._script: list[Gate | Raise] = []
        self._script_lock = threading.Lock()
        self.reads = 0

    def then(self, *steps: Gate | Raise) -> None:
        """The next reads (one step each, in order); reads past the script run plainly."""
        with self._script_lock:
            self._script.extend(steps)

    def get(self, keys: Sequence[StoreKey], /) -> list[bytes | None]:
        with self._script_lock:
            step = self._script.pop(0) if self._script else None
            self.reads += 1
        if step is not None:
            step()
        return super().get(keys)
