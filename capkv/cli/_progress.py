"""A progress display that also reads well in CI logs.

Redrawn in place on a terminal; elsewhere a line at each quarter, so logs stay short and ordered.
"""

from __future__ import annotations

import time
from typing import Protocol, runtime_checkable

__all__ = ["Progress", "TextStream"]


@runtime_checkable
class TextStream(Protocol):
    """Where the demo writes: ``sys.stdout``, or anything that writes text like it."""

    def write(self, text: str, /) -> int: ...
    def flush(self) -> None: ...
    def isatty(self) -> bool: ...

_WIDTH = 24


class Progress:
    """``label [#####-----] done/total unit``, updated as work completes."""

    def __init__(self, label: str, total: int, stream: TextStream, *, unit: str = "requests") -> None:
        self.label = label
        self.total: int = total
        self.stream = stream
        self.unit = unit
        self._live = stream.isatty()
        self._next_quarter = 1
        self._last_draw = 0.0
        self._started = time.perf_counter()
        self._done = False

    def __call__(self, done: int, total: int | None = None) -> None:
        if total is not None:
            self.total = total
        if self._live:
            now = time.perf_counter()
            if now - self._last_draw > 0.05 or done >= self.total:
                self._last_draw = now
                self.stream.write("\r" + self._line(done))
                self.stream.flush()
            return
        crossed = False
        while self._next_quarter <= 4 and done * 4 >= self._next_quarter * self.total:
            self._next_quarter += 1
            crossed = True
        if crossed:
            self.stream.write(self._line(done) + "\n")

    def close(self, done: int) -> None:
        """Finish the display (a newline on a terminal)."""
        if self._done:
            return
        self._done = True
        if self._live:
            self.stream.write("\r" + self._line(done))
            self.stream.write("\n")
            self.stream.flush()

    def _line(self, done: int) -> str:
        filled = _WIDTH * done // self.total if self.total else _WIDTH
        bar = "#" * filled + "-" * (_WIDTH - filled)
        elapsed = time.perf_counter() - self._started
        return f"  {self.label:<5} [{bar}] {done:>{len(str(self.total))}}/{self.total} {self.unit}  {elapsed:5.1f} s"
