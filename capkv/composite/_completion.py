"""Completion bookkeeping across a composite's children, on the worker side.

Two field failures live here: blocks freed while a second saving child still
read them (data corruption), and a receive reported twice by two children
(a dead engine). :class:`SendCountdown` reports a send finished only when the
*last* saving child does; :class:`ReceiveFromLoader` reports a receive when the
child that loads it does.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

__all__ = ["ReceiveFromLoader", "SendCountdown"]


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


class ReceiveFromLoader:
    """Reports a finished receive when the child that was chosen to load reports it.

    The scheduler side chose one child per load and said which in the metadata
    (:meth:`expect`); a receive reported by any other child for that load — in
    the same step or later — is a duplicate and dropped. A request loaded again
    (after a preemption) is announced again and reported again. A receive nobody
    announced (an engine that bypasses the metadata) is reported once per step.
    Requests are forgotten when the engine says they finished.
    """

    __slots__ = ("_loaders", "_received")

    def __init__(self) -> None:
        self._loaders: dict[str, int] = {}
        self._received: set[str] = set()

    def expect(self, loaders: Mapping[str, int]) -> None:
        """Loads the scheduler side started: request id -> index of the loading child."""
        self._loaders.update(loaders)
        self._received.difference_update(loaders)

    def reports(self, by_child: list[set[str]], finished_req_ids: Iterable[str]) -> set[str]:
        """The receives to report, from each child's reports (in child order), this step."""
        reported: set[str] = set()
        for index, recving in enumerate(by_child):
            for request_id in recving:
                loader = self._loaders.get(request_id)
                if loader == index:
                    del self._loaders[request_id]
                    self._received.add(request_id)
                    reported.add(request_id)
                elif loader is None and request_id not in self._received:
                    reported.add(request_id)
        for request_id in finished_req_ids:
            self._loaders.pop(request_id, None)
            self._received.discard(request_id)
        return reported
