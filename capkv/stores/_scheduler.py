"""The scheduler side of a prefix-keyed store: what to load, what to save, where.

It decides and records; the worker side executes and reports, and the two share no state (docs/internals.md,
"The scheduler side").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from capkv.stores._hits import GroupGeometry, longest_hit
from capkv.stores._index_contract import (
    BatchedStoreIndex, ChainAwareIndex, EvictingIndex, LayoutAwareIndex, LossAwareIndex, StoreIndex,
)
from capkv.stores._keys import BlockKey, PrefixHasher, RequestKeys
from capkv.stores._metadata import BlockMove, SaveReport, StoreMetadata
from capkv.stores._step import scheduled_blocks
from capkv.contracts._engine import BlockIds, ComputedTokenRequest, KVConnectorOutput, TokenRequest
from capkv.contracts._key_inputs import request_key_inputs
from capkv.contracts._spec import KVSpec
from capkv.contracts._token_requests import check_token_request
from capkv.contracts._block_ids import check_block_groups
from capkv.errors import ContractError, MetadataError

__all__ = ["StoreIndex", "StoreScheduler"]


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
    :meth:`StoreScheduler.loaded_elsewhere`); a new allocation starts afresh."""


_Candidate = tuple[int, int, int]
"""``(token end, group, block index)``: sorted, a plan follows token order across groups."""


class StoreScheduler:
    """Hit lookup, load and save planning for every KV-cache group of one spec."""

    def __init__(
        self, spec: KVSpec, index: StoreIndex, hasher: PrefixHasher, *, owner: str, load_async: bool = False
    ) -> None:
        self._owner = owner
        self.load_async = load_async
        """Whether hits are loaded asynchronously (a slow backend: :mod:`capkv.stores._reader`)."""
        self._receiving: dict[str, None] = {}
        """Requests whose asynchronous load was planned and not reported received (``finished_recving``)."""
        self._receiving_now: list[str] = []
        self._spec = spec
        self._index = index
        # the index's optional capabilities, asked once (a runtime protocol check costs microseconds)
        self._batched = index if isinstance(index, BatchedStoreIndex) else None
        self._chained = index if isinstance(index, ChainAwareIndex) else None
        self._evicting = index if isinstance(index, EvictingIndex) else None
        self._layout_aware = index if isinstance(index, LayoutAwareIndex) else None
        self._loss_aware = index if isinstance(index, LossAwareIndex) else None
        self._hasher = hasher
        self._geometry = tuple(
            GroupGeometry(group.block_size or 1, group.sliding_window) for group in spec.groups
        )
        self._null = spec.null_block_id
        self._keys: dict[str, RequestKeys] = {}
        self._live: dict[str, _Live] = {}
        self._load_failed: set[str] = set()
        """Requests that cannot load a promised block this step: they save nothing this step."""
        self._step_saves: list[BlockMove] = []
        self._offers: dict[str, tuple[int, int]] = {}
        self._loads: list[BlockMove] = []
        self._saves: list[BlockMove] = []
        self._unavailable: list[tuple[int, int]] = []
        self._pinned: list[BlockKey] = []
        self._step = 0
        """The step number of the last metadata built."""
        self._pinned_by_step: dict[int, list[BlockKey]] = {}
        self._shards = spec.shard.count
        self._stored_by: dict[BlockKey, set[int]] = {}
        """Keys some shards reported stored and others not yet (several workers): not loadable yet."""
        self.hit_tokens: int = 0
        """Tokens offered and accepted since the last :meth:`take_hit_tokens`."""
        self._stale: set[str] = set()
        """Requests live at the last :meth:`reset`: their KV is from before it, so they save nothing."""

    def reset(self) -> None:
        """Forget every block (a cache reset): keys from now on never equal one from before, and the
        requests live now (computed before the reset) save nothing more."""
        self._hasher.reset()
        self._keys.clear()
        self._offers.clear()
        self._stale.update(self._live)

    # ---- lookups -------------------------------------------------------------------

    def matched_tokens(self, request: TokenRequest, num_computed_tokens: int) -> int:
        """Tokens beyond ``num_computed_tokens`` that every group can load (block-aligned)."""
        method = "get_num_new_matched_tokens"
        check_token_request(request, connector=self._owner, method=method)
        keys = self._request_keys(request, method)
        total = len(request.all_token_ids)
        self._check_token_count(num_computed_tokens, total, request.request_id, method, "num_computed_tokens")
        limit = total - 1  # the engine must compute at least the last token

        if self._batched is not None:
            self._batched.lookup([
                keys.key(group, block, method=method)
                for group, geometry in enumerate(self._geometry)
                for block in range(num_computed_tokens // geometry.block_size, limit // geometry.block_size)
            ])

        def present(group: int, block: int) -> bool:
            return self._index.loadable(keys.key(group, block, method=method))

        end = longest_hit(self._geometry, num_computed_tokens, limit, present)
        if end > num_computed_tokens:
            self._offers[request.request_id] = (num_computed_tokens, end)
        else:
            self._offers.pop(request.request_id, None)
        return end - num_computed_tokens

    def allocated(self, request: TokenRequest, blocks: BlockIds, num_external_tokens: int) -> None:
        """Plan the load of the offered blocks into the engine's newly allocated ``blocks``."""
        method = "update_state_after_alloc"
        check_token_request(request, connector=self._owner, method=method)
        offer = self._offers.pop(request.request_id, None)
        accepted = self._accepted(request.request_id, offer, num_external_tokens) if num_external_tokens else None
        self._check_block_ids(blocks, method)
        keys = self._request_keys(request, method)
        live = self._live.get(request.request_id)
        if live is None:
            self._live[request.request_id] = _Live(
                request, keys, [list(ids) for ids in blocks], [0] * len(self._geometry)
            )
        else:  # allocated again (resumed after a preemption): the scheduler output will say the table
            live.request, live.keys = request, keys
            live.foreign = []
        if accepted is None:
            return
        if self.load_async:
            self._receiving[request.request_id] = None
            self._receiving_now.append(request.request_id)
        start, end = accepted
        for group, geometry in enumerate(self._geometry):
            ids = blocks[group]
            needed = geometry.needed(start, end)
            if len(ids) < needed.stop:
                raise ContractError(
                    f"{self._owner}.{method}: group {group} of request {request.request_id!r} has "
                    f"{len(ids)} block ids; loading up to token {end} needs {needed.stop}",
                    connector=self._owner, method=method, group=group, value=len(ids),
                )
            move_ids: list[int] = []
            move_keys: list[BlockKey] = []
            slots: list[int] = []
            for block in needed:
                block_id = ids[block]
                if block_id == self._null:  # outside the window: the engine does not hold it
                    continue
                key = keys.key(group, block, method=method)
                slot = self._index.pin(key)
                if slot is None:
                    self._unavailable.append((group, block_id))
                    self._load_failed.add(request.request_id)
                    continue
                self._pinned.append(key)
                move_ids.append(block_id)
                move_keys.append(key)
                slots.append(slot)
            if move_ids:
                self._loads.append(
                    BlockMove(request.request_id, group, tuple(move_ids), tuple(move_keys), tuple(slots))
                )
            if self._chained is not None:
                self._chained.use([keys.key(group, block, method=method) for block in range(needed.stop)])
        if self._chained is not None:
            self._chained.end_use()
        self.hit_tokens += num_external_tokens

    def _accepted(self, request_id: str, offer: tuple[int, int] | None, num_external_tokens: int) -> tuple[int, int]:
        method = "update_state_after_alloc"
        if offer is None:
            raise ContractError(
                f"{self._owner}.{method}: num_external_tokens={num_external_tokens} for request "
                f"{request_id!r}, but get_num_new_matched_tokens offered it nothing",
                connector=self._owner, method=method, value=num_external_tokens,
            )
        start, offered_end = offer
        end = start + num_external_tokens
        misaligned = [g for g, geo in enumerate(self._geometry) if end % geo.block_size]
        if end > offered_end or misaligned:
            why = "more than offered" if end > offered_end else f"not a whole number of group {misaligned[0]}'s blocks"
            raise ContractError(
                f"{self._owner}.{method}: num_external_tokens={num_external_tokens} for request "
                f"{request_id!r} is {why} (offered {offered_end - start} beyond {start})",
                connector=self._owner, method=method,
                group=misaligned[0] if misaligned and end <= offered_end else None,
                value=num_external_tokens,
            )
        return start, end

    def loaded_elsewhere(self, request_id: str, start: int, end: int, save: bool) -> None:
        """Tokens ``[start, end)`` of an allocated request were loaded by another connector of the
        stack: saved here only when ``save`` (the stack promotes them into this store)."""
        live = self._live.get(request_id)
        if live is not None and not save and end > start:
            live.foreign.append((start, end))

    # ---- saves ---------------------------------------------------------------------

    def finished(self, request: ComputedTokenRequest, block_ids: BlockIds, method: str) -> bool:
        """Plan the save of a finished request's computed full blocks not saved yet; ``True`` when
        its blocks must be held until those saves have read them."""
        check_token_request(request, connector=self._owner, method=method)
        request_id = request.request_id
        self._offers.pop(request_id, None)
        live = self._live.pop(request_id, None)
        if request_id in self._receiving:  # its load may still be writing: the engine holds the blocks until
            del self._receiving[request_id]  # it is received; nothing of it is saved (the engine frees once)
            self._keys.pop(request_id, None)
            return False
        if request_id in self._stale:
            self._stale.discard(request_id)
            self._keys.pop(request_id, None)
            return False
        keys = self._keys.pop(request_id, None) or (live.keys if live is not None else None)
        if keys is None:
            keys = RequestKeys(self._hasher, request.all_token_ids, request_key_inputs(request, connector=self._owner, method=method))
        keys.update(request.all_token_ids)
        self._check_block_ids(block_ids, method)
        computed = self._computed_tokens(request, method)
        candidates = _own(sorted(
            ((block + 1) * geometry.block_size, group, block)
            for group, geometry in enumerate(self._geometry)
            for block in range(min(computed // geometry.block_size, len(block_ids[group])))
        ), self._geometry, live.foreign if live is not None else None)
        self._look_up(
            [(keys, group, block) for _, group, block in candidates if block_ids[group][block] != self._null], method
        )
        return self._plan(request_id, keys, candidates, lambda g, b: block_ids[g][b], None, self._saves, method)

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

    def take_hit_tokens(self) -> int:
        """Tokens loaded into the engine since the last call."""
        tokens, self.hit_tokens = self.hit_tokens, 0
        return tokens

    # ---- step boundaries -------------------------------------------------------------

    def build(self, scheduler_output: object = None) -> StoreMetadata:
        """This step's metadata: loads, finished requests' saves, and the saves of the blocks the
        step fills; the loads' pins last until the worker reports this step's loads done."""
        method = "build_connector_meta"
        steps: list[tuple[_Live, list[_Candidate]]] = []
        for view in scheduled_blocks(scheduler_output, owner=self._owner):
            live = self._live.get(view.request_id)
            if live is None:  # never allocated through this connector: its tokens are unknown
                continue
            if view.block_ids is not None:
                self._check_block_ids(view.block_ids, method)
                if view.replace:
                    live.tables = [list(ids) for ids in view.block_ids]
                else:
                    for table, ids in zip(live.tables, view.block_ids, strict=True):
                        table.extend(ids)
            if view.request_id not in self._load_failed and view.request_id not in self._stale:
                before = view.num_computed_tokens
                steps.append((live, self._step_candidates(live, before, before + view.num_scheduled_tokens)))
        self._look_up(
            [(live.keys, g, b) for live, candidates in steps for _, g, b in candidates if live.tables[g][b] != self._null],
            method,
        )
        for live, candidates in steps:
            if candidates:
                self._plan(
                    live.request.request_id, live.keys, candidates, _reader(live.tables), live.next_block,
                    self._step_saves, method,
                )
        self._step += 1
        evicted = tuple(self._evicting.take_evicted()) if self._evicting is not None else ()
        metadata = StoreMetadata(
            tuple(self._loads), tuple(self._saves), tuple(self._unavailable), self._step, tuple(self._step_saves),
            evicted, tuple(self._receiving_now),
        )
        self._receiving_now = []
        if self._pinned:
            self._pinned_by_step[self._step] = self._pinned
        self._loads, self._saves, self._unavailable, self._pinned = [], [], [], []
        self._step_saves = []
        self._load_failed.clear()
        if self._batched is not None:
            self._batched.forget()
        return metadata

    def output(self, connector_output: KVConnectorOutput) -> None:
        """The worker reported: release the pins of every step whose loads ran; saves reported
        stored become loadable, failed ones saveable."""
        method = "update_connector_output"
        report: object = getattr(connector_output, "worker_meta", _MISSING)
        if report is _MISSING:
            raise ContractError(
                f"{self._owner}.{method}: expected a KVConnectorOutput (with worker_meta), got {connector_output!r}",
                connector=self._owner, method=method, value=connector_output,
            )
        for request_id in getattr(connector_output, "finished_recving", None) or ():
            self._receiving.pop(request_id, None)
        if report is None:
            return
        if not isinstance(report, SaveReport):
            raise MetadataError(
                f"{self._owner}.{method}: expected SaveReport worker metadata, got {report!r}",
                connector=self._owner, method=method, value=report,
            )
        parts = report.parts()
        for part in parts:
            if not 0 <= part.shard < self._shards:
                raise MetadataError(
                    f"{self._owner}.{method}: a report from shard {part.shard}; the KV cache has "
                    f"{self._shards} shard(s) (KVSpec.shard)",
                    connector=self._owner, method=method, value=part.shard,
                )
            if part.layout is not None and self._layout_aware is not None:
                self._layout_aware.set_layout(part.layout, part.shard)
        if report.loaded_through is not None:
            for step in [step for step in self._pinned_by_step if step <= report.loaded_through]:
                for key in self._pinned_by_step.pop(step):
                    self._index.unpin(key)
        if self._loss_aware is not None:
            for key in {key for part in parts for key in part.lost}:
                self._loss_aware.lost(key)
        failed = {key for part in parts for key in part.failed}
        for key in failed:  # one shard's failure fails the block: every shard saves it again
            self._stored_by.pop(key, None)
            self._index.release(key)
        for part in parts:
            for key in part.stored - failed:
                if self._shards > 1:
                    shards = self._stored_by.setdefault(key, set())
                    shards.add(part.shard)
                    if len(shards) < self._shards:
                        continue  # loadable once every shard holds its part
                    del self._stored_by[key]
                self._index.commit(key)

    # ---- helpers -------------------------------------------------------------------

    def _request_keys(self, request: TokenRequest, method: str) -> RequestKeys:
        keys = self._keys.get(request.request_id)
        if keys is None:
            inputs = request_key_inputs(request, connector=self._owner, method=method)
            keys = self._keys[request.request_id] = RequestKeys(self._hasher, request.all_token_ids, inputs)
        else:
            keys.update(request.all_token_ids)
        return keys

    def _check_block_ids(self, blocks: BlockIds, method: str) -> None:
        check_block_groups(self._spec, blocks, connector=self._owner, method=method, subject="block_ids")

    def _computed_tokens(self, request: ComputedTokenRequest, method: str) -> int:
        """The request's ``num_computed_tokens``, required: saving blocks whose KV was never
        computed (a request aborted before prefill) would offer garbage to later requests."""
        computed: object = getattr(request, "num_computed_tokens", _MISSING)
        if computed is _MISSING:
            raise ContractError(
                f"{self._owner}.{method}: request {request.request_id!r} ({type(request).__name__}) has no "
                "num_computed_tokens; a store saves only computed KV, so the request must say how much "
                "there is (see capkv.ComputedTokenRequest)",
                connector=self._owner, method=method, value=request,
            )
        total = len(request.all_token_ids)
        return self._check_token_count(computed, total, request.request_id, method, "num_computed_tokens")

    def _check_token_count(self, count: object, total: int, request_id: str, method: str, name: str) -> int:
        if type(count) is not int or not 0 <= count <= total:
            raise ContractError(
                f"{self._owner}.{method}: {name}={count!r} for request {request_id!r}; expected an int "
                f"in [0, {total}] (the request has {total} tokens)",
                connector=self._owner, method=method, value=count,
            )
        return count


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


def _reader(tables: list[list[int]]) -> Callable[[int, int], int]:
    """``(group, block) -> engine block id`` over a request's block tables."""
    return lambda group, block: tables[group][block]


_MISSING = object()
