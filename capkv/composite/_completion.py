"""Completion bookkeeping across a composite's children, on the worker side.

Tracked by child, not counted: blocks freed while a second saving child still read them, and a receive
reported twice, were field failures (docs/internals.md, "Completions").
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping
from enum import Enum
from typing import Any

from capkv._homes import publish

__all__ = [
    "ENDS_IN_RECEIVE", "ENDS_IN_SEND", "Drop", "DroppedReports", "ReceiveTracker", "ReportQueue", "SendTracker",
]

_log = logging.getLogger("capkv.composite")


class Drop(Enum):
    """Why a child's completion report was not passed to the engine."""

    SEND_REPEATED = "reported a finished send it had already reported"
    SEND_NOT_SAVING = "reported a finished send of a request whose save it did not accept (delay_free=False)"
    SEND_NOT_PENDING = "reported a finished send of a request with no save pending (never asked, or already reported)"
    RECV_NOT_LOADER = (
        "reported a finished receive of a request none of whose pending loads it owes (other children load it, "
        "or it already reported its part)"
    )
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


ENDS_IN_SEND = 1
"""A completed save's request is reported in ``finished_sending``: the engine keeps its blocks until then."""
ENDS_IN_RECEIVE = 2
"""A completed save's request has a receive waiting for it: the engine keeps its blocks until that receive."""


class SendTracker:
    """Holds back a finished send until every child that accepted its save has reported it.

    The scheduler side tells which children accepted an asynchronous save of each
    finished request, as a bit mask of child indices: :meth:`expect` where the engine
    keeps the request's blocks until its send, :meth:`fold` where it keeps them until
    the receive of the request's asynchronous load (the request was aborted mid-load):
    those saves end in that receive (:meth:`ReceiveTracker.fold`), never in a send.
    """

    __slots__ = ("_pending",)

    def __init__(self) -> None:
        self._pending: dict[str, list[int]] = {}  # request id -> [savers mask, still owed mask, what it ends in]

    def expect(self, savers: Mapping[str, int]) -> None:
        for request_id, mask in savers.items():
            self._add(request_id, mask, ENDS_IN_SEND)

    def fold(self, request_id: str, mask: int) -> None:
        self._add(request_id, mask, ENDS_IN_RECEIVE)

    def _add(self, request_id: str, mask: int, outcome: int) -> None:
        entry = self._pending.get(request_id)
        if entry is None:
            self._pending[request_id] = [mask, mask, outcome]
        else:  # the same id finished again while a save of it is pending: wait for both
            entry[0] |= mask
            entry[1] |= mask
            entry[2] |= outcome

    def report(self, index: int, request_id: str) -> Drop | int:
        """Child ``index`` finished sending: ``0`` while other children still owe theirs; once it was
        the last one owed, what that completes (:data:`ENDS_IN_SEND`: a send to report;
        :data:`ENDS_IN_RECEIVE`: a receive waiting for it; or both); or why the report is dropped."""
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
            return 0
        del self._pending[request_id]
        return entry[2]

    def __len__(self) -> int:
        return len(self._pending)

    def state(self) -> dict[str, list[int]]:
        return {request_id: list(entry) for request_id, entry in self._pending.items()}

    def restore(self, state: Mapping[str, list[int]]) -> None:
        self._pending = {request_id: [*entry, ENDS_IN_SEND][:3] for request_id, entry in state.items()}


class ReportQueue:
    """Loads that are over and not reported yet, each to be named once in ``finished_recving``.

    A set names a request once, so a call hands out at most one load per request
    (the oldest); a reused id's later load waits for the next call. Loads are
    known by number (:meth:`take` says which it reported).
    """

    __slots__ = ("_ready",)

    def __init__(self) -> None:
        self._ready: dict[str, list[int]] = {}  # request id -> numbers of the loads over, oldest first

    def add(self, request_id: str, number: int) -> None:
        """Load ``number`` of the request is over."""
        numbers = self._ready.get(request_id)
        if numbers is None:
            self._ready[request_id] = [number]
        else:
            numbers.append(number)

    def withdraw(self, request_id: str, number: int) -> list[int]:
        """Take load ``number`` of the request back, with the id's later loads (they are reported after
        it), if it is over and not handed out yet: the numbers taken back, oldest first."""
        numbers = self._ready.get(request_id)
        if numbers is None or number not in numbers:
            return []
        at = numbers.index(number)
        taken = numbers[at:]
        del numbers[at:]
        if not numbers:
            del self._ready[request_id]
        return taken

    def take(self) -> tuple[set[str] | None, list[int]]:
        """The requests to report now (``None``: none), and the numbers of the loads that reports."""
        ready = self._ready
        if not ready:
            return None, []
        now = set(ready)
        numbers: list[int] = []
        for request_id in now:
            left = ready[request_id]
            numbers.append(left.pop(0))
            if not left:
                del ready[request_id]
        return now, numbers

    def __len__(self) -> int:
        return sum(len(numbers) for numbers in self._ready.values())

    def state(self) -> dict[str, list[int]]:
        return {request_id: list(numbers) for request_id, numbers in self._ready.items()}

    def restore(self, state: Mapping[str, list[int]]) -> None:
        self._ready = {request_id: list(numbers) for request_id, numbers in state.items()}


class ReceiveTracker:
    """Reports a finished receive once per load, when every child loading a slice of it asynchronously has.

    The scheduler side numbers its loads and tells (:meth:`expect`) which children
    load each one asynchronously, as a bit mask. Loads of one request are kept in
    order, and a child's report completes the oldest load of that request it still
    owes: a late report for an earlier load is never taken for a later one, and a
    report by a child that owes no load of the request — a repeat of a report
    already counted, a child loading nothing of it, or a load nobody started — is
    dropped. A load completes, and the request is reported, once its last owed child
    reported; loads of one request are reported in order. A load pending when its
    request finishes stays pending: an engine keeps an aborted request's blocks until
    its receive is reported, so that receive also waits for the saves folded into it
    (:meth:`fold`). Synchronous loads are not awaited: the engine does not wait for a
    report.

    A report may complete several loads of one request at once (an earlier load of a
    reused id, owed by another child, completing after the later one did): each is
    reported, one per :meth:`take` (:class:`ReportQueue`), the rest at the next calls.
    """

    __slots__ = ("_pending", "_ready")

    def __init__(self) -> None:
        self._pending: dict[str, list[list[int]]] = {}  # request id -> [[load number, owed mask], ...]
        self._ready = ReportQueue()

    def expect(self, loads: Iterable[tuple[str, int, int]]) -> None:
        pending = self._pending
        for request_id, number, mask in loads:
            if mask:
                entries = pending.get(request_id)
                if entries is None:
                    pending[request_id] = [[number, mask]]
                else:
                    entries.append([number, mask])

    def report(self, index: int, request_id: str) -> Drop | bool:
        """Child ``index`` finished receiving: ``True`` when loads of the request completed (each is
        handed out by :meth:`take`), ``False`` when it still waits for other children, or why the
        report is dropped."""
        entries = self._pending.get(request_id)
        if entries is None:
            return Drop.RECV_NOT_PENDING
        bit = 1 << index
        for entry in entries:
            if entry[1] & bit:
                entry[1] &= ~bit
                break
        else:
            return Drop.RECV_NOT_LOADER
        return self._complete(request_id, entries)

    def fold(self, request_id: str, number: int, bit: int) -> bool:
        """Load ``number`` of the request completes only once ``bit`` is cleared too (:meth:`sent`): the
        saves of a request the engine keeps until this load's receive. ``False`` when that receive was
        handed out already (the engine frees the blocks at it: the fold came too late)."""
        entries = self._pending.get(request_id)
        for entry in entries or ():
            if entry[0] == number:
                entry[1] |= bit
                return True
        taken = self._ready.withdraw(request_id, number)
        if not taken:
            return False
        # over and not handed out yet: it waits again, and the id's loads reported after it wait behind it
        waiting = [[number, bit], *([later, 0] for later in taken[1:])]
        if entries is None:
            self._pending[request_id] = waiting
        else:
            at = sum(1 for entry in entries if entry[0] < number)
            entries[at:at] = waiting
        return True

    def sent(self, request_id: str, bit: int) -> bool:
        """Every save folded into the request's loads (``bit``) was reported: ``True`` when loads completed."""
        entries = self._pending.get(request_id)
        if entries is None:
            return False
        for entry in entries:
            entry[1] &= ~bit
        return self._complete(request_id, entries)

    def _complete(self, request_id: str, entries: list[list[int]]) -> bool:
        """Hand the request's loads that completed, oldest first, to the queue of reports."""
        if entries[0][1]:
            return False
        while entries and not entries[0][1]:
            self._ready.add(request_id, entries[0][0])
            del entries[0]
        if not entries:
            del self._pending[request_id]
        return True

    def take(self) -> set[str] | None:
        """The requests to report now: each with a completed load not reported yet, once."""
        return self._ready.take()[0]

    def __len__(self) -> int:
        return len(self._pending)

    def state(self) -> dict[str, object]:
        return {
            "pending": {request_id: [list(entry) for entry in entries] for request_id, entries in self._pending.items()},
            "ready": self._ready.state(),
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        pending: Mapping[str, list[list[int]]] = state["pending"]
        self._pending = {request_id: [list(entry) for entry in entries] for request_id, entries in pending.items()}
        self._ready.restore(state["ready"])


publish(__name__)
