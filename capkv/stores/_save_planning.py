"""Which computed blocks a store saves, and when: as each step fills them, and what is left at finish.

Saves follow computation, so a sliding-window block is stored before it leaves the window (docs/internals.md,
"The scheduler side").
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

from capkv.contracts._engine import BlockIds, ComputedTokenRequest, TokenRequest
from capkv.contracts._spec import KVSpec
from capkv.stores._hits import GroupGeometry
from capkv.stores._index_contract import BatchedStoreIndex, ChainAwareIndex, StoreIndex
from capkv.stores._keys import BlockKey, RequestKeys
from capkv.stores._metadata import BlockMove
from capkv.stores._step import scheduled_blocks

__all__ = ["SavePlanner"]

_Candidate = tuple[int, int, int]
"""``(token end, group, block index)``: sorted, a plan follows token order across groups."""

CheckBlocks = Callable[[BlockIds, str], None]


@dataclass
class _Live:
    """A request the engine has allocated blocks for, as far as saves are concerned."""

    request: TokenRequest
    keys: RequestKeys
    tables: list[list[int]]
    """Per group, the block table as the scheduler outputs told it (stale ids may remain where
    a sliding window dropped blocks: only blocks inside the window are ever read)."""
    next_block: list[int]
    """Per group, the first block whose save is not yet decided."""
    foreign: list[tuple[int, int]] = field(default_factory=lambda: list[tuple[int, int]]())
    """Token ranges other connectors of a stack loaded and this store must not save (see
    :meth:`SavePlanner.loaded_elsewhere`); a new allocation starts afresh."""


class SavePlanner:
    """Save planning for every KV-cache group of one spec, over a store's index.

    A key is planned at most once: from the plan until the worker's report it is
    held (never planned again) but not loadable. Per request and group a cursor
    remembers how far saves were planned; it moves back when
    ``num_computed_tokens`` does (a preemption, a failed load recomputed), and
    blocks already held are not planned again.
    """

    def __init__(self, spec: KVSpec, index: StoreIndex, *, owner: str, check_blocks: CheckBlocks) -> None:
        self._owner = owner
        self._index = index
        # the index's optional capabilities, asked once (a runtime protocol check costs microseconds)
        self._batched = index if isinstance(index, BatchedStoreIndex) else None
        self._chained = index if isinstance(index, ChainAwareIndex) else None
        self._geometry = tuple(GroupGeometry(group.block_size or 1, group.sliding_window) for group in spec.groups)
        self._null = spec.null_block_id
        self._check_blocks = check_blocks
        self._live: dict[str, _Live] = {}
        self._saves: list[BlockMove] = []
        self._step_saves: list[BlockMove] = []

    def allocated(self, request: TokenRequest, keys: RequestKeys, blocks: BlockIds) -> None:
        """The engine allocated ``blocks`` for ``request`` (again, when it resumes after a preemption:
        the scheduler output then says the table)."""
        live = self._live.get(request.request_id)
        if live is None:
            self._live[request.request_id] = _Live(
                request, keys, [list(ids) for ids in blocks], [0] * len(self._geometry)
            )
        else:
            live.request, live.keys = request, keys
            live.foreign = []

    def loaded_elsewhere(self, request_id: str, start: int, end: int, save: bool) -> None:
        """Tokens ``[start, end)`` of an allocated request were loaded by another connector of the
        stack: saved here only when ``save`` (the stack promotes them into this store)."""
        live = self._live.get(request_id)
        if live is not None and not save and end > start:
            live.foreign.append((start, end))

    def keys(self, request_id: str) -> RequestKeys | None:
        """The keys of an allocated request (``None``: never allocated here)."""
        live = self._live.get(request_id)
        return None if live is None else live.keys

    def live(self) -> list[str]:
        """The requests allocated here and not finished."""
        return list(self._live)

    def forget(self, request_id: str) -> None:
        """The request is gone and saves nothing."""
        self._live.pop(request_id, None)

    # ---- at finish ---------------------------------------------------------------------

    def finished(
        self, request: ComputedTokenRequest, keys: RequestKeys, block_ids: BlockIds, computed: int, method: str
    ) -> bool:
        """Plan the save of a finished request's ``computed`` tokens' full blocks not saved yet (the null
        block's are skipped); ``True`` when its blocks must be held until those saves have read them."""
        live = self._live.pop(request.request_id, None)
        candidates = _own(sorted(
            ((block + 1) * geometry.block_size, group, block)
            for group, geometry in enumerate(self._geometry)
            for block in range(min(computed // geometry.block_size, len(block_ids[group])))
        ), self._geometry, live.foreign if live is not None else None)
        self._look_up(
            [(keys, group, block) for _, group, block in candidates if block_ids[group][block] != self._null], method
        )
        return self._plan(
            request.request_id, keys, candidates, lambda g, b: block_ids[g][b], None, self._saves, method
        )

    # ---- as steps fill blocks ----------------------------------------------------------

    def step(self, scheduler_output: object, skip: Collection[str], method: str) -> None:
        """Plan the saves of every block the step fills, for the scheduled requests not in ``skip`` (a
        load they were promised failed this step: their KV from it on is recomputed later)."""
        steps: list[tuple[_Live, list[_Candidate]]] = []
        for view in scheduled_blocks(scheduler_output, owner=self._owner):
            live = self._live.get(view.request_id)
            if live is None:  # never allocated through this connector: its tokens are unknown
                continue
            if view.block_ids is not None:
                self._check_blocks(view.block_ids, method)
                if view.replace:
                    live.tables = [list(ids) for ids in view.block_ids]
                else:
                    for table, ids in zip(live.tables, view.block_ids, strict=True):
                        table.extend(ids)
            if view.request_id not in skip:
                before = view.num_computed_tokens
                steps.append((live, self._step_candidates(live, before, before + view.num_scheduled_tokens)))
        self._look_up(
            [(live.keys, g, b) for live, candidates in steps for _, g, b in candidates if live.tables[g][b] != self._null],
            method,
        )
        for live, candidates in steps:
            if candidates:
                self._plan(
                    live.request.request_id, live.keys, candidates, _table_reader(live.tables), live.next_block,
                    self._step_saves, method,
                )

    def take(self) -> tuple[tuple[BlockMove, ...], tuple[BlockMove, ...]]:
        """The saves planned since the last call: finished requests', and the steps' (``step_saves``)."""
        saves, step_saves = tuple(self._saves), tuple(self._step_saves)
        self._saves, self._step_saves = [], []
        return saves, step_saves

    def _step_candidates(self, live: _Live, before: int, after: int) -> list[_Candidate]:
        """The blocks a step fills (tokens ``[before, after)`` computed) whose save is not decided yet."""
        tokens = live.request.all_token_ids
        live.keys.update(tokens)
        after = min(after, len(tokens))  # tokens not known yet (speculative) have no key
        candidates: list[_Candidate] = []
        for group, geometry in enumerate(self._geometry):
            size = geometry.block_size
            # Back to where computation restarts; never before the window (those blocks may be gone).
            first = max(min(live.next_block[group], before // size), geometry.first_kept(before))
            live.next_block[group] = first
            table = live.tables[group]
            candidates += (((b + 1) * size, group, b) for b in range(first, min(after // size, len(table))))
        return _own(sorted(candidates), self._geometry, live.foreign)

    # ---- planning ----------------------------------------------------------------------

    def _look_up(self, wanted: list[tuple[RequestKeys, int, int]], method: str) -> None:
        """Tell a batched index every ``(keys, group, block)`` about to be asked about: one round trip."""
        if self._batched is not None and wanted:
            self._batched.lookup([keys.key(group, block, method=method) for keys, group, block in wanted])

    def _plan(
        self,
        request_id: str,
        keys: RequestKeys,
        candidates: list[_Candidate],
        block_id: Callable[[int, int], int],
        cursors: list[int] | None,
        into: list[BlockMove],
        method: str,
    ) -> bool:
        """Reserve and plan ``candidates`` in order, skipping null and held blocks, until the store
        is full; ``cursors`` (per group) advance past every block decided. Whether any was planned.

        Held blocks are marked used tail first, so a chain's head is its most recent block; a
        chain-aware index also keeps the request's own chain from being evicted by its saves."""
        chains = self._chains(keys, candidates, method)
        planned: dict[int, list[tuple[int, BlockKey, int]]] = {}
        touched: list[BlockKey] = []
        for _, group, block in candidates:
            engine_block = block_id(group, block)
            if engine_block != self._null:
                key = keys.key(group, block, method=method)
                if self._index.holds(key):
                    touched.append(key)
                else:
                    slot = self._index.reserve(key)
                    if slot is None:
                        break  # full: keep whole prefixes, retry later
                    planned.setdefault(group, []).append((engine_block, key, slot))
            if cursors is not None:
                cursors[group] = block + 1
        if chains is not None and self._chained is not None:
            self._chained.end_use()  # stamps the chains, the blocks just reserved in their places
        else:
            for key in reversed(touched):
                self._index.touch(key)
        for group, entries in sorted(planned.items()):
            ids, group_keys, slots = zip(*entries, strict=True)
            into.append(BlockMove(request_id, group, ids, group_keys, slots))
        return bool(planned)

    def _chains(self, keys: RequestKeys, candidates: list[_Candidate], method: str) -> list[list[BlockKey]] | None:
        """For a chain-aware index: each group's chain up to the last candidate, marked in use."""
        chained = self._chained
        if chained is None or not candidates:
            return None
        ends: dict[int, int] = {}
        for _, group, block in candidates:
            ends[group] = max(ends.get(group, 0), block + 1)
        chains = [[keys.key(group, block, method=method) for block in range(end)] for group, end in sorted(ends.items())]
        for chain in chains:
            chained.use(chain)
        return chains


def _own(
    candidates: list[_Candidate], geometry: Sequence[GroupGeometry], foreign: list[tuple[int, int]] | None
) -> list[_Candidate]:
    """``candidates`` without the blocks that lie within a range another connector loaded."""
    if not foreign:
        return candidates
    return [
        (end, group, block) for end, group, block in candidates
        if not any(start <= end - geometry[group].block_size and end <= stop for start, stop in foreign)
    ]


def _table_reader(tables: list[list[int]]) -> Callable[[int, int], int]:
    """``(group, block) -> engine block id`` over a request's block tables."""
    return lambda group, block: tables[group][block]
