"""Why a store's load or save failed, in words: what a backend raised, and where; what was wrong with a value.

A store turns every failure into load errors or failed saves, so the engine goes
on; the cause would be lost with it. So each failure carries its cause: a backend's
exception gets a note naming the member that raised it and where (its traceback is
dropped: its frames hold the buffers), and a load that failed is logged (logger
``capkv.stores``) with its blocks and its first cause — the line the conformance
kit and ``capkv demo`` quote.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable

__all__ = ["LoadFailureLog", "backend_fault"]

_log = logging.getLogger("capkv.stores")

_QUIET_S = 60.0
"""After a warning of one kind, a store logs the same kind again only this much later (with a count)."""


def backend_fault(error: BaseException, member: str) -> BaseException:
    """``error``, raised by the backend's ``member``: noted as such with where it was raised, its traceback
    dropped (kept failures outlive the call; its frames would hold the call's buffers)."""
    last = error.__traceback__
    while last is not None and last.tb_next is not None:
        last = last.tb_next
    where = ""
    if last is not None:
        code = last.tb_frame.f_code
        where = f", in {code.co_qualname} at {code.co_filename}:{last.tb_lineno}"
    error.add_note(f"raised by the backend's {member}{where}")
    error.__traceback__ = None
    return error


class LoadFailureLog:
    """One store's warnings about failed loads: each kind of cause when first seen, then at most once a
    minute per kind, with how many failed loads were not logged in between."""

    def __init__(self, owner: str) -> None:
        self._owner = owner
        self._last: dict[str, float] = {}
        self._quiet: Counter[str] = Counter()

    def failed(self, errors: dict[int, set[int]], why: Callable[[], tuple[str, str]]) -> None:
        """A load's failed blocks per group (logged when there are any) and ``why()``: the kind of its first
        failure and its cause in words."""
        if not any(errors.values()):
            return
        kind, cause = why()
        now = time.monotonic()
        last = self._last.get(kind)
        if last is not None and now - last < _QUIET_S:
            self._quiet[kind] += 1
            return
        self._last[kind] = now
        blocks = sum(len(ids) for ids in errors.values())
        groups = ", ".join(f"group {group}: {len(ids)}" for group, ids in sorted(errors.items()) if ids)
        quiet = self._quiet.pop(kind, 0)
        since = f" ({quiet} more failed loads of this kind since the last warning)" if quiet else ""
        _log.warning("%s: %d blocks failed to load (%s): %s%s", self._owner, blocks, groups, cause, since)
