"""Which loads the engine has not heard the end of, on the scheduler side: their blocks are never saved.

Until a load completes its blocks hold whatever the pool had, so no tier may save, promote or offer them.
One mechanism for a stack and for capkv's stores: loads are numbered, never confused by a reused request id
(docs/internals.md, "Settling loads").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

from capkv.contracts._spec import KVSpec

__all__ = ["LoadSettling", "unfilled_masked"]


class LoadSettling:
    """The scheduler side's loads the engine has not heard the end of.

    ``pending``, ``shipped``, ``builds`` and ``outputs`` are read by the stack's
    ``update_connector_output``: with no load pending or shipped, :meth:`output` would only
    count the output (``outputs += 1`` while below ``builds``), and the stack does that inline:
    no call per step in the common case.
    """

    __slots__ = ("pending", "unbuilt", "shipped", "builds", "outputs")

    def __init__(self) -> None:
        self.pending: dict[str, list[list[int]]] = {}
        """Request id -> [[load number, first token, asynchronous (0/1), request live (0/1)], ...], in order."""
        self.unbuilt: list[tuple[str, int]] = []
        """Synchronous loads not yet in metadata that was built (with none, a build only counts: the stack
        does ``builds += 1`` inline, no call per step)."""
        self.shipped: list[tuple[int, str, int]] = []
        """(step, request id, load number) of synchronous loads, by the step whose metadata carried them."""
        self.builds = 0
        self.outputs = 0

    def started(self, request_id: str, number: int, first: int, load_async: bool) -> None:
        """A load of tokens from ``first`` on started (``update_state_after_alloc``)."""
        entry = [number, first, 1 if load_async else 0, 1]
        entries = self.pending.get(request_id)
        if entries is None:
            self.pending[request_id] = [entry]
        else:
            entries.append(entry)
        if not load_async:
            self.unbuilt.append((request_id, number))

    def built(self, ok: bool) -> None:
        """A step's metadata was built; ``ok``: with the loads started since (a failed build re-sends them)."""
        self.builds += 1
        if ok and self.unbuilt:
            step = self.builds
            self.shipped.extend((step, request_id, number) for request_id, number in self.unbuilt)
            self.unbuilt = []

    def output(self, finished_recving: object) -> None:
        """A step's output came back (``update_connector_output``)."""
        if self.outputs < self.builds:  # a report before any step (a handshake's) settles nothing
            self.outputs += 1
            self.ran_through(self.outputs)
        if finished_recving and self.pending:
            for request_id in cast("Sequence[str]", finished_recving):
                entries = self.pending.get(request_id)
                if entries is None:
                    continue
                for entry in entries:
                    if entry[2]:
                        self.settle(request_id, entry[0])
                        break

    def ran_through(self, step: int) -> None:
        """The synchronous loads shipped in steps up to ``step`` ran, and the engine has heard how."""
        shipped = self.shipped
        if shipped and shipped[0][0] <= step:
            done = 0
            for shipped_step, request_id, number in shipped:
                if shipped_step > step:
                    break
                self.settle(request_id, number)
                done += 1
            del shipped[:done]

    def settle(self, request_id: str, number: int) -> None:
        """Load ``number`` of the request is over, and the engine has heard how."""
        entries = self.pending.get(request_id)
        if entries is None:
            return
        for position, entry in enumerate(entries):
            if entry[0] == number:
                del entries[position]
                break
        if not entries:
            del self.pending[request_id]

    def landed(self, request_id: str) -> None:
        """The engine says the request's synchronous loads landed (it computed on them): settle them now."""
        entries = self.pending.get(request_id)
        if entries is None:
            return
        kept = [entry for entry in entries if entry[2]]
        if kept:
            self.pending[request_id] = kept
        else:
            del self.pending[request_id]

    def receiving(self, request_id: str) -> bool:
        """Whether the live request has an asynchronous load the engine has not heard the end of (its
        blocks are still being written: nothing of them may be saved, nor freed before the receive)."""
        return self.awaited(request_id) is not None

    def awaited(self, request_id: str) -> int | None:
        """The number of the live request's asynchronous load the engine waits for, if any: an engine
        keeps such a request's blocks until that load's receive, and frees them then."""
        for entry in self.pending.get(request_id, ()):
            if entry[2] and entry[3]:
                return entry[0]
        return None

    def in_flight(self) -> bool:
        """Whether a step whose output has not come back may have run: its worker may have reported a
        receive the scheduler side has not heard of yet (or the engine skipped an empty output)."""
        return self.outputs < self.builds

    def finishing(self, request_id: str) -> int | None:
        """The request finished: the first token of its earliest unsettled load, if any. Its synchronous
        loads are forgotten; its asynchronous ones wait for their reports (the id may be reused)."""
        entries = self.pending.get(request_id)
        if entries is None:
            return None
        first: int | None = None
        kept: list[list[int]] = []
        for entry in entries:
            if entry[3]:
                first = entry[1] if first is None else min(first, entry[1])
                entry[3] = 0
            if entry[2]:
                kept.append(entry)
        if kept:
            self.pending[request_id] = kept
        else:
            del self.pending[request_id]
        return first

    def unsettled(self, request_id: str) -> int:
        """How many loads of the request (live or finished) the engine has not heard the end of."""
        return len(self.pending.get(request_id, ()))

    def state(self) -> dict[str, object]:
        return {
            "pending": {request_id: [list(entry) for entry in entries] for request_id, entries in self.pending.items()},
            "unbuilt": list(self.unbuilt), "shipped": list(self.shipped),
            "builds": self.builds, "outputs": self.outputs,
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        pending: Mapping[str, list[list[int]]] = state["pending"]
        self.pending = {request_id: [list(entry) for entry in entries] for request_id, entries in pending.items()}
        self.unbuilt = [tuple(item) for item in state["unbuilt"]]
        self.shipped = [tuple(item) for item in state["shipped"]]
        self.builds = state["builds"]
        self.outputs = state["outputs"]


def unfilled_masked(block_ids: Any, first: int, spec: KVSpec | None, single: bool) -> Any:
    """``block_ids`` (one group's list when ``single``, else one list per group) with the null block from
    token ``first`` on; without a spec, no blocks at all."""
    groups: Sequence[Sequence[int]] = [block_ids] if single else block_ids
    masked: list[list[int]] = []
    for index, ids in enumerate(groups):
        if spec is None or index >= len(spec.groups):
            masked.append([])
            continue
        size = spec.groups[index].block_size or 1
        keep = min(first // size, len(ids))
        masked.append(list(ids[:keep]) + [spec.null_block_id] * (len(ids) - keep))
    return masked[0] if single else tuple(masked)
