"""Completion bookkeeping across a composite's children, on the worker side.

Two field failures live here: blocks freed while a second saving child still
read them (data corruption), and a receive reported twice (a dead engine: vLLM
asserts the request still exists). So completions are tracked *by child*, not
counted: :class:`SendTracker` reports a send once, after every child that
accepted an asynchronous save of it has reported it; :class:`ReceiveTracker`
reports a receive once per asynchronous load, from the child that loads it.
Any other report is dropped and counted in :class:`DroppedReports`.

A request id alone cannot tell two requests that share it apart: a child's late
report for a request whose id was reused after it finished is taken as a report
for the new request.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from enum import Enum

from capkv._homes import publish

__all__ = ["Drop", "DroppedReports", "ReceiveTracker", "SendTracker"]

_log = logging.getLogger("capkv.composite")


class Drop(Enum):
    """Why a child's completion report was not passed to the engine."""

    SEND_REPEATED = "reported a finished send it had already reported"
    SEND_NOT_SAVING = "reported a finished send of a request whose save it did not accept (delay_free=False)"
    SEND_NOT_PENDING = "reported a finished send of a request with no save pending (never asked, or already reported)"
    RECV_NOT_LOADER = "reported a finished receive of a request another child is loading"
    RECV_NOT_PENDING = (
        "reported a finished receive with no asynchronous load of it pending (never started, or already reported)"
    )


class DroppedReports(Mapping[tuple[str, Drop], int]):
    """How many reports each child had dropped, by reason; the first of each kind is logged."""

    __slots__ = ("_counts",)

    def __init__(self) -> None:
        self._counts: dict[tuple[str, Drop], int] = {}

    def add(self, child: str, reason: Drop, request_id: str) -> None:
        key = (child, reason)
        count = self._counts.get(key, 0)
        if not count:
            _log.warning(
                "%s %s (request %r); dropped, not passed to the engine (further ones are only counted "
                "in the stack's dropped_reports)", child, reason.value, request_id,
            )
        self._counts[key] = count + 1

    def __getitem__(self, key: tuple[str, Drop]) -> int:
        return self._counts[key]

    def __iter__(self) -> Iterator[tuple[str, Drop]]:
        return iter(self._counts)

    def __len__(self) -> int:
        return len(self._counts)

    def __repr__(self) -> str:
        return f"DroppedReports({self._counts!r})"


class SendTracker:
    """Holds back a finished send until every child that accepted its save has reported it.

    The scheduler side tells (:meth:`expect`) which children accepted an
    asynchronous save of each finished request, as a bit mask of child indices.
    """

    __slots__ = ("_pending",)

    def __init__(self) -> None:
        self._pending: dict[str, list[int]] = {}  # request id -> [savers mask, still owed mask]

    def expect(self, savers: Mapping[str, int]) -> None:
        pending = self._pending
        for request_id, mask in savers.items():
            entry = pending.get(request_id)
            if entry is None:
                pending[request_id] = [mask, mask]
            else:  # the same id finished again while a save of it is pending: wait for both
                entry[0] |= mask
                entry[1] |= mask

    def report(self, index: int, request_id: str) -> Drop | bool:
        """Child ``index`` finished sending: ``True`` when it was the last one owed, else
        ``False`` (still waiting) or why the report is dropped."""
        entry = self._pending.get(request_id)
        if entry is None:
            return Drop.SEND_NOT_PENDING
        bit = 1 << index
        if not entry[0] & bit:
            return Drop.SEND_NOT_SAVING
        if not entry[1] & bit:
            return Drop.SEND_REPEATED
        owed = entry[1] & ~bit
        if owed:
            entry[1] = owed
            return False
        del self._pending[request_id]
        return True

    def __len__(self) -> int:
        return len(self._pending)

    def state(self) -> dict[str, list[int]]:
        return {request_id: list(entry) for request_id, entry in self._pending.items()}

    def restore(self, state: Mapping[str, list[int]]) -> None:
        self._pending = {request_id: list(entry) for request_id, entry in state.items()}


class ReceiveTracker:
    """Reports a finished receive once per asynchronous load, when the child loading it does.

    The scheduler side tells (:meth:`expect`) which child started an
    asynchronous load of a request. Its first report is passed on; a report by
    another child, a second report, or one for a load nobody started is
    dropped. A load pending when its request finishes stays pending: an engine
    keeps an aborted request's blocks until its receive is reported. A request
    loaded again (after a preemption) is expected, and reported, again.
    Synchronous loads are not awaited: the engine does not wait for a report.
    """

    __slots__ = ("_loaders",)

    def __init__(self) -> None:
        self._loaders: dict[str, int] = {}

    def expect(self, loaders: Mapping[str, int]) -> None:
        self._loaders.update(loaders)

    def report(self, index: int, request_id: str) -> Drop | None:
        """Child ``index`` finished receiving: ``None`` to pass it on, else why it is dropped."""
        loader = self._loaders.get(request_id)
        if loader == index:
            del self._loaders[request_id]
            return None
        return Drop.RECV_NOT_PENDING if loader is None else Drop.RECV_NOT_LOADER

    def __len__(self) -> int:
        return len(self._loaders)

    def state(self) -> dict[str, int]:
        return dict(self._loaders)

    def restore(self, state: Mapping[str, int]) -> None:
        self._loaders = dict(state)


publish(__name__)
