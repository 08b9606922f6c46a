"""A hosted stack's failure ends the requests it concerns, never vLLM's engine.

Inside vLLM an exception out of a connector call ends the engine — every request, not the one a child failed
on — so the host calls its stack through these guards.
"""

from __future__ import annotations

import logging
from collections import Counter

__all__ = ["Contained"]

_log = logging.getLogger("capkv.vllm")


class Contained:
    """Failures of a hosted stack caught inside vLLM: the first of each kind logged, all counted."""

    __slots__ = ("_owner", "_seen", "counts")

    def __init__(self, owner: str) -> None:
        self._owner = owner
        self._seen: set[str] = set()
        self.counts: Counter[str] = Counter()
        """Caught exceptions by the method they came out of, since the last :meth:`take`."""

    def __call__(self, method: str, exc: BaseException, consequence: str) -> None:
        """Record ``exc`` out of the stack's ``method``; ``consequence`` says what the host did instead."""
        self.counts[method] += 1
        key = f"{method}:{type(exc).__name__}"
        if key not in self._seen:
            self._seen.add(key)
            _log.error(
                "%s: the hosted stack raised in %s; %s (further %s from %s are only counted in the host's "
                "stats as contained_errors)", self._owner, method, consequence, type(exc).__name__, method,
                exc_info=exc,
            )

    def take(self) -> int:
        """How many were caught since the last call."""
        total = sum(self.counts.values())
        self.counts.clear()
        return total
