"""A wrapped vLLM connector's failed receives, said in the words of whoever runs the stack.

vLLM names a failed receive by request (``failed_recving``) and the blocks that
failed, if any, by the connector's own load errors. A host inside vLLM passes both
on as they are (:meth:`FailedReceives.take`). capkv's contract has no request-level
failure: run by another engine, a failed receive fails every block of its load.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from capkv.contracts._engine import BlockIds, LoadErrors

__all__ = ["FailedReceives"]


class FailedReceives:
    """One wrapped connector's failed receives, until a host takes them or they become load errors."""

    __slots__ = ("_null", "_loading", "_failed", "_hosted")

    def __init__(self, null_block_id: int) -> None:
        self._null = null_block_id
        self._loading: dict[str, BlockIds] = {}
        """The block tables of loads in flight (for capkv's channel)."""
        self._failed: set[str] = set()
        self._hosted = False
        """A host takes them (vLLM's words): no load error is made of them."""

    def planned(self, loads: Mapping[str, BlockIds]) -> None:
        if not self._hosted:
            self._loading.update(loads)

    def reported(self, failed: set[str], finished: Iterable[str]) -> None:
        """The connector's report: ``failed`` receives; ``finished`` requests (their loads are over)."""
        self._failed |= failed
        for request_id in finished:
            if request_id not in self._failed:
                self._loading.pop(request_id, None)

    def take(self) -> set[str]:
        """The failed receives since the last call, for a host that passes them on (from now on it does)."""
        self._hosted = True
        self._loading.clear()
        failed, self._failed = self._failed, set()
        return failed

    def errors(self) -> LoadErrors:
        """Outside a host: every block of each failed receive's load, per group (capkv's channel)."""
        errors: LoadErrors = {}
        if self._hosted or not self._failed:
            return errors
        for request_id in self._failed:
            for group, ids in enumerate(self._loading.pop(request_id, ())):
                failed = {block_id for block_id in ids if block_id != self._null}
                if failed:
                    errors.setdefault(group, set()).update(failed)
        self._failed = set()
        return errors
