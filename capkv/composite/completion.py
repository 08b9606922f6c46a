"""Completion bookkeeping across a composite's children, on the worker side.

Two field failures live here: blocks freed while a second saving child still
read them (data corruption), and a receive reported twice by two children
(a dead engine). :class:`SendCountdown` reports a send finished only when the
*last* saving child does; :class:`ReceiveOnce` reports each receive once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

__all__ = ["ReceiveOnce", "SendCountdown"]


class SendCountdown:
    """Holds back ``finished_sending`` until every child that saved asynchronously has reported."""

    __slots__ = ("_owed",)

    def __init__(self) -> None:
        self._owed: dict[str, int] = {}

    def expect(self, extra_reports: Mapping[str, int]) -> None:
        """Requests that owe this many reports *beyond the first* (from the scheduler side)."""
        for request_id, extra in extra_reports.items():
            self._owed[request_id] = self._owed.get(request_id, 0) + extra

    def report(self, request_id: str) -> bool:
        """A child finished sending ``request_id``; ``True`` when it was the last one owed."""
        owed = self._owed.get(request_id)
        if owed is None:
            return True
        if owed == 1:
            del self._owed[request_id]
        else:
            self._owed[request_id] = owed - 1
        return False

    @property
    def pending(self) -> dict[str, int]:
        """Extra reports still owed, by request id (a copy)."""
        return dict(self._owed)


class ReceiveOnce:
    """Reports each finished receive once, however many children (or steps) report it.

    A request id is remembered until the engine says the request finished, after
    which no child can legitimately receive for it again.
    """

    __slots__ = ("_reported",)

    def __init__(self) -> None:
        self._reported: set[str] = set()

    def first_reports(self, recving: set[str], finished_req_ids: Iterable[str]) -> set[str]:
        """The ids in ``recving`` not reported before; then forget requests that finished."""
        fresh = recving - self._reported
        self._reported |= fresh
        self._reported.difference_update(finished_req_ids)
        return fresh
