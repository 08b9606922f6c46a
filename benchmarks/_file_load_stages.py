"""Where a file-store load's CPU time goes: the backend's reads, the value checks, the scatters, the rest.

Wraps the functions the shared store layer calls while a benchmark's load runs (``--stages``), in thread
CPU time, and puts them back after.
"""

from __future__ import annotations

import time

__all__ = ["StageTimers"]


class StageTimers:
    """The load's stages in CPU time: the backend's reads, the value checks, the scatters (rest: planning,
    bookkeeping). Wraps the functions the shared layer calls, until :meth:`stop`."""

    def __init__(self) -> None:
        from capkv.stores import _loading  # noqa: PLC0415
        from capkv.transfer._copier import BlockCopier  # noqa: PLC0415

        self.seconds: dict[str, float] = {"read": 0.0, "check": 0.0, "scatter": 0.0}
        self._undo: list[tuple[object, str, object]] = []
        self._nested: list[float] = []
        self._wrap(_loading._Reads, "next", "read")
        self._wrap(_loading._Reads, "into_parts", "read")  # read in place, into the engine's blocks
        self._wrap(_loading, "check_memory", "check")
        self._wrap(_loading, "check_part", "check")
        self._wrap(BlockCopier, "scatter", "scatter")
        self._started = time.process_time()

    def _wrap(self, owner: object, name: str, stage: str) -> None:
        original = getattr(owner, name)
        seconds = self.seconds

        nested = self._nested  # a stage called inside another (a check as a read lands) counts once, as its own

        def timed(*args: object, **kwargs: object) -> object:
            started = time.thread_time()
            nested.append(0.0)
            try:
                return original(*args, **kwargs)
            finally:
                spent = time.thread_time() - started
                seconds[stage] += spent - nested.pop()
                if nested:
                    nested[-1] += spent

        setattr(owner, name, timed)
        self._undo.append((owner, name, original))

    def stop(self) -> dict[str, float]:
        total = time.process_time() - self._started
        for owner, name, original in self._undo:
            setattr(owner, name, original)
        return {**self.seconds, "other": total - sum(self.seconds.values())}
