"""Loads through a hosted stack, as vLLM needs them reported: every failure ends or recomputes a request.

With several KV-cache groups vLLM takes failures only per request, for loads it was told are asynchronous, so
every load is reported that way (docs/internals.md, "Loads in vLLM").
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import cast

from capkv.contracts._engine import BlockIds, LoadErrors
from capkv.contracts._spec import KVSpec

__all__ = ["LoadPlanner", "LoadTracker", "PlannedLoad", "Settled"]

_log = logging.getLogger("capkv.vllm")


@dataclass(frozen=True, slots=True)
class PlannedLoad:
    """One request's load, as the scheduler side planned it (shipped in the step's metadata)."""

    request_id: str
    block_ids: BlockIds
    """The request's blocks per group when the load was planned: where its failed ids belong."""
    host_async: bool
    """vLLM was told asynchronous, the stack loads synchronously: the worker side reports it finished."""
    stack_async: bool
    """The stack itself loads asynchronously: its ``finished_recving`` reports it."""
    failed: bool = False
    """The scheduler side could not start it (a child failed planning it): report it failed."""
    start: int = 0
    """The first token it loads (the engine's local hit ends there)."""
    tokens: int = 0
    """How many tokens it loads: with ``start``, the blocks that fail when it fails as a whole."""


@dataclass(frozen=True, slots=True)
class Settled:
    """What one worker step's loads come to, on vLLM's channels and for the scheduler side."""

    finished_recving: set[str]
    """The stack's finished receives plus the loads the host made asynchronous that ran this step."""
    failed_recving: set[str]
    """Finished receives that failed (several groups)."""
    flat_errors: set[int]
    """vLLM's flat load-error set (one group; empty with several)."""
    errors: LoadErrors
    """The attributed errors per group, for the stack's scheduler side."""
    landed: frozenset[str]
    """Loads that ended this step with every block loaded."""
    failed: frozenset[str]
    """Loads that ended this step with a failed block."""


_NOTHING = Settled(set(), set(), set(), {}, frozenset(), frozenset())


class LoadPlanner:
    """The scheduler side's books of loads: answers to vLLM, loads to ship, confirmations."""

    __slots__ = ("_spec", "_groups", "_workers", "_asked", "_planned", "_host_async", "_unconfirmed", "_landings",
                 "_no_reload")

    def __init__(self, spec: KVSpec | None) -> None:
        self._spec = spec
        self._groups = 0 if spec is None else spec.num_groups
        self._workers = 1 if spec is None else spec.shard.count
        """Every tensor- and pipeline-parallel worker loads its shard: a load landed once each reported it."""
        self._landings: dict[str, int] = {}
        """Request -> how many workers reported its unconfirmed load landed so far."""
        self._asked: dict[str, tuple[int, bool]] = {}
        """Request -> (local computed tokens, the stack's load_async) of its last answered lookup with a hit."""
        self._planned: list[PlannedLoad] = []
        self._host_async: set[str] = set()
        self._unconfirmed: dict[str, int] = {}
        """Request -> its local computed tokens (where its load starts), until the load landed."""
        self._no_reload: set[str] = set()

    @property
    def via_requests(self) -> bool:
        """Whether failures must name requests (several groups) rather than blocks."""
        return self._groups > 1

    def refuses(self, request_id: str) -> bool:
        """A request whose load failed is recomputed: never offered a load again."""
        return request_id in self._no_reload

    def answer(self, request_id: str, num_computed_tokens: int, tokens: int | None, load_async: bool) -> tuple[int | None, bool]:
        """The stack's answer to a lookup, as vLLM must hear it."""
        if not tokens:
            self._asked.pop(request_id, None)
            return tokens, load_async
        self._asked[request_id] = (num_computed_tokens, load_async)
        return tokens, load_async or self.via_requests

    def allocated(self, request_id: str, block_ids: BlockIds, num_external_tokens: int, *, failed: bool = False) -> None:
        """vLLM allocated ``block_ids``; a positive ``num_external_tokens`` is a load to ship."""
        asked = self._asked.pop(request_id, None)
        if num_external_tokens <= 0 or asked is None:
            return
        start, stack_async = asked
        host_async = self.via_requests and not stack_async
        self._planned.append(
            PlannedLoad(request_id, block_ids, host_async, stack_async, failed, start, num_external_tokens)
        )
        self._unconfirmed[request_id] = start
        if host_async:
            self._host_async.add(request_id)

    def take(self, *, fail_all: bool = False) -> tuple[PlannedLoad, ...]:
        """This step's loads, for its metadata; ``fail_all``: the stack's metadata could not be built."""
        if not self._planned:
            return ()
        planned, self._planned = self._planned, []
        if fail_all:
            return tuple(dataclasses.replace(p, failed=True) for p in planned)
        return tuple(planned)

    def reported(
        self, finished_recving: Iterable[str], landed: Mapping[str, int] | Iterable[str], failed: Iterable[str]
    ) -> frozenset[str]:
        """The workers' news (``landed``: by how many workers, or one each); returns the finished receives the
        stack itself expected. A load is confirmed once every worker reported it landed."""
        counted: Iterable[tuple[str, int]] = (
            cast("Mapping[str, int]", landed).items() if isinstance(landed, Mapping)
            else ((request_id, 1) for request_id in landed)
        )
        for request_id, workers in counted:
            if request_id not in self._unconfirmed:
                continue
            seen = self._landings.pop(request_id, 0) + workers
            if seen >= self._workers:
                del self._unconfirmed[request_id]
            else:
                self._landings[request_id] = seen
        for request_id in failed:
            self._unconfirmed.pop(request_id, None)
            self._landings.pop(request_id, None)
            self._no_reload.add(request_id)
        host_async = self._host_async
        if not host_async:
            return frozenset(finished_recving)
        own: set[str] = set()
        for request_id in finished_recving:
            if request_id in host_async:
                host_async.discard(request_id)
            else:
                own.add(request_id)
        return frozenset(own)

    def finishing(self, request_id: str, block_ids: BlockIds, *, landed: bool = False) -> BlockIds:
        """The blocks the stack may read at finish: from an unconfirmed load on, none (the null block).
        ``landed``: the engine computed on the request's KV (it finished normally), so every load it
        had landed, in the very step that ran the last one too (vLLM finishes a request before it
        hands the connector that step's report)."""
        self._asked.pop(request_id, None)
        self._no_reload.discard(request_id)
        start = self._unconfirmed.pop(request_id, None)
        self._landings.pop(request_id, None)
        if start is None or landed or self._spec is None:
            return block_ids
        null = self._spec.null_block_id
        kept: list[list[int]] = []
        for group, ids in zip(self._spec.groups, block_ids):
            first = start // (group.block_size or 1)
            kept.append(list(ids[:first]) + [null] * max(len(ids) - first, 0))
        return tuple(kept)


class LoadTracker:
    """The worker side's books of loads in flight: attribution of errors, and vLLM's report of them."""

    __slots__ = (
        "_groups", "_null", "_sizes", "_owner", "_holder", "_loads", "_step", "_failed", "_step_failed", "dropped",
    )

    def __init__(self, spec: KVSpec | None, *, owner: str) -> None:
        self._groups = 0 if spec is None else spec.num_groups
        self._null = 0 if spec is None else spec.null_block_id
        self._sizes = () if spec is None else tuple(group.block_size or 1 for group in spec.groups)
        self._owner = owner
        self._holder: list[dict[int, str]] = [{} for _ in range(max(self._groups, 1))]
        """Per group: block id -> the request whose latest planned load holds it."""
        self._loads: dict[str, PlannedLoad] = {}
        self._step: list[PlannedLoad] = []
        self._failed: set[str] = set()
        """Asynchronous loads with a failed block, not finished yet."""
        self._step_failed = False
        self.dropped = 0
        """Load errors no load in flight held (reported late, e.g. for an aborted request)."""

    def bind(self, loads: Sequence[PlannedLoad]) -> None:
        """The step's planned loads (from its metadata)."""
        self._step = list(loads)
        self._step_failed = False
        for load in loads:
            self._loads[load.request_id] = load
            for group, ids in enumerate(load.block_ids[: len(self._holder)]):
                holder = self._holder[group]
                for block_id in ids:
                    if block_id != self._null:
                        holder[block_id] = load.request_id

    @property
    def host_async_in_step(self) -> bool:
        """Whether a load the host made asynchronous runs in this step (it must be over by the step's end)."""
        return any(load.host_async for load in self._step)

    def fail_step(self) -> None:
        """The stack could not run this step's loads (it raised): every one of them failed."""
        self._step_failed = True

    def settle(
        self, recving: Iterable[str] | None, errors: LoadErrors, failed_receives: AbstractSet[str] = frozenset()
    ) -> Settled:
        """Attribute ``errors``, finish this step's loads, and say it on vLLM's channels.

        ``failed_receives``: receives vLLM's connectors in the stack reported failed, in vLLM's words;
        they pass through as ``failed_recving`` (with any group count, as vLLM's composite passes them),
        and the blocks that failed are only those the connectors reported."""
        step, self._step = self._step, []
        if not step and not errors and not recving and not self._loads and not failed_receives:
            return _NOTHING
        loads = self._loads
        kept: LoadErrors = {}
        failed_now: set[str] = {request_id for request_id in failed_receives if request_id in loads}
        for load in step:
            if load.failed or self._step_failed:
                failed_now.add(load.request_id)
                self._add_blocks(kept, load)
        for group, ids in errors.items():
            holder = self._holder[group] if 0 <= group < len(self._holder) else {}
            for block_id in ids:
                request_id = holder.get(block_id)
                if request_id is None or request_id not in loads:
                    self._drop(group, block_id)
                    continue
                failed_now.add(request_id)
                kept.setdefault(group, set()).add(block_id)
        finished = set(recving or ())
        ended: set[str] = {load.request_id for load in step if not load.stack_async}
        finished.update(load.request_id for load in step if load.host_async)
        ended.update(request_id for request_id in finished if request_id in loads)
        pending_failed = self._failed
        pending_failed.update(failed_now)
        failed = pending_failed & ended
        pending_failed -= failed
        for request_id in ended:
            loads.pop(request_id, None)
        landed = frozenset(ended - failed)
        if self._groups > 1:
            return Settled(finished, (failed & finished) | failed_receives, set(), kept, landed, frozenset(failed))
        flat: set[int] = set()
        for ids in kept.values():
            flat |= ids
        return Settled(finished, set(failed_receives), flat, kept, landed, frozenset(failed))

    def _add_blocks(self, errors: LoadErrors, load: PlannedLoad) -> None:
        """A load that failed as a whole: the blocks it was loading failed, not the request's local hit."""
        end = load.start + load.tokens
        for group, ids in enumerate(load.block_ids[: len(self._holder)]):
            size = self._sizes[group] if group < len(self._sizes) else 1
            loaded = ids[load.start // size : -(-end // size)]
            real = {block_id for block_id in loaded if block_id != self._null}
            if real:
                errors.setdefault(group, set()).update(real)

    def _drop(self, group: int, block_id: int) -> None:
        if not self.dropped:
            _log.warning(
                "%s: a load error for block %d of group %d, which no load in flight holds (its request "
                "finished or was aborted meanwhile); dropped (further ones are only counted in the host's "
                "stats as dropped_load_errors)", self._owner, block_id, group,
            )
        self.dropped += 1

