"""The scheduler side of a prefix-keyed store: what to load, what to save, where.

It decides and records; the worker side executes and reports, and the two share no state. Every load has a
number of its own (docs/internals.md, "The scheduler side").
"""

from __future__ import annotations

from typing import TypeVar

from capkv.composite._settling import LoadSettling, unfilled_masked
from capkv.contracts._block_ids import check_block_groups
from capkv.contracts._engine import BlockIds, ComputedTokenRequest, KVConnectorOutput, TokenRequest
from capkv.contracts._key_inputs import request_key_inputs
from capkv.contracts._spec import KVSpec
from capkv.contracts._token_requests import check_token_request
from capkv.errors import ContractError, MetadataError
from capkv.stores._hits import GroupGeometry, longest_hit
from capkv.stores._index_contract import (
    BatchedStoreIndex, ChainAwareIndex, EvictingIndex, LayoutAwareIndex, LossAwareIndex, StoreIndex,
)
from capkv.stores._keys import BlockKey, PrefixHasher, RequestKeys
from capkv.stores._metadata import BlockMove, SaveReport, StoreMetadata
from capkv.stores._save_planning import SavePlanner

__all__ = ["StoreIndex", "StoreScheduler"]

_T = TypeVar("_T", BlockKey, int)


class StoreScheduler:
    """Hit lookup, load and save planning for every KV-cache group of one spec."""

    def __init__(
        self, spec: KVSpec, index: StoreIndex, hasher: PrefixHasher, *, owner: str, load_async: bool = False
    ) -> None:
        self._owner = owner
        self.load_async = load_async
        """Whether hits are loaded asynchronously (a slow backend: :mod:`capkv.stores._reader`)."""
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
        self._saving = SavePlanner(spec, index, owner=owner, check_blocks=self._check_block_ids)
        self._keys: dict[str, RequestKeys] = {}
        self._load_failed: set[str] = set()
        """Requests that cannot load a promised block this step: they save nothing this step."""
        self._offers: dict[str, tuple[int, int]] = {}
        self._loads: list[BlockMove] = []
        self._unavailable: list[tuple[int, int]] = []
        self._pinned: list[BlockKey] = []
        self._step = 0
        """The step number of the last metadata built."""
        self._pinned_by_step: dict[int, list[BlockKey]] = {}
        self._settling = LoadSettling()
        """The loads whose end the engine has not heard: their blocks are never saved."""
        self._load_serial = 0
        self._receiving: dict[int, str] = {}
        """Asynchronous loads not reported received, by number: their requests."""
        self._receiving_now: list[tuple[str, int]] = []
        self._shards = spec.shard.count
        self._stored_by: dict[BlockKey, set[int]] = {}
        """Keys some shards reported stored and others not yet (several workers): not loadable yet."""
        self._received_by: dict[int, set[int]] = {}
        """Asynchronous loads some shards reported received and others not yet (several workers)."""
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
        self._stale.update(self._saving.live())

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

    # ---- loads ---------------------------------------------------------------------

    def allocated(self, request: TokenRequest, blocks: BlockIds, num_external_tokens: int) -> None:
        """Plan the load of the offered blocks into the engine's newly allocated ``blocks``."""
        method = "update_state_after_alloc"
        check_token_request(request, connector=self._owner, method=method)
        offer = self._offers.pop(request.request_id, None)
        accepted = self._accepted(request.request_id, offer, num_external_tokens) if num_external_tokens else None
        self._check_block_ids(blocks, method)
        keys = self._request_keys(request, method)
        self._saving.allocated(request, keys, blocks)
        if accepted is None:
            return
        start, end = accepted
        self._load_serial += 1
        number = self._load_serial
        self._settling.started(request.request_id, number, start, self.load_async)
        if self.load_async:
            self._receiving[number] = request.request_id
            self._receiving_now.append((request.request_id, number))
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
        self._saving.loaded_elsewhere(request_id, start, end, save)

    def take_hit_tokens(self) -> int:
        """Tokens loaded into the engine since the last call."""
        tokens, self.hit_tokens = self.hit_tokens, 0
        return tokens

    # ---- saves ---------------------------------------------------------------------

    def finished(self, request: ComputedTokenRequest, block_ids: BlockIds, method: str) -> bool:
        """Plan the save of a finished request's computed full blocks not saved yet; ``True`` when
        its blocks must be held until those saves have read them.

        Blocks from the first token of a load the engine has not heard the end of are not saved (they
        may hold anything); a request whose asynchronous load still runs saves nothing — its blocks
        are being written, and the engine holds them until the receive (and frees them once)."""
        check_token_request(request, connector=self._owner, method=method)
        request_id = request.request_id
        self._offers.pop(request_id, None)
        receiving = self._settling.receiving(request_id)
        unfilled = self._settling.finishing(request_id)
        keys = self._keys.pop(request_id, None) or self._saving.keys(request_id)
        if receiving or request_id in self._stale:
            self._stale.discard(request_id)
            self._saving.forget(request_id)
            return False
        if keys is None:
            keys = RequestKeys(self._hasher, request.all_token_ids, request_key_inputs(request, connector=self._owner, method=method))
        keys.update(request.all_token_ids)
        self._check_block_ids(block_ids, method)
        computed = self._computed_tokens(request, method)
        if unfilled is not None:
            block_ids = unfilled_masked(block_ids, unfilled, self._spec, single=False)
        return self._saving.finished(request, keys, block_ids, computed, method)

    # ---- step boundaries -------------------------------------------------------------

    def build(self, scheduler_output: object = None) -> StoreMetadata:
        """This step's metadata: loads, finished requests' saves, and the saves of the blocks the
        step fills; the loads' pins last until the worker reports this step's loads done."""
        self._saving.step(scheduler_output, self._load_failed | self._stale, "build_connector_meta")
        self._step += 1
        self._settling.built(True)
        evicted = tuple(self._evicting.take_evicted()) if self._evicting is not None else ()
        saves, step_saves = self._saving.take()
        receiving = self._receiving_now
        metadata = StoreMetadata(
            tuple(self._loads), saves, tuple(self._unavailable), self._step, step_saves, evicted,
            tuple(request_id for request_id, _ in receiving), tuple(number for _, number in receiving),
        )
        self._receiving_now = []
        if self._pinned:
            self._pinned_by_step[self._step] = self._pinned
        self._loads, self._unavailable, self._pinned = [], [], []
        self._load_failed.clear()
        if self._batched is not None:
            self._batched.forget()
        return metadata

    def output(self, connector_output: KVConnectorOutput) -> None:
        """The worker reported: release the pins of every step whose loads ran, end the loads that are
        over; saves reported stored become loadable, failed ones saveable."""
        method = "update_connector_output"
        report: object = getattr(connector_output, "worker_meta", _MISSING)
        if report is _MISSING:
            raise ContractError(
                f"{self._owner}.{method}: expected a KVConnectorOutput (with worker_meta), got {connector_output!r}",
                connector=self._owner, method=method, value=connector_output,
            )
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
            self._settling.ran_through(report.loaded_through)
            for step in [step for step in self._pinned_by_step if step <= report.loaded_through]:
                for key in self._pinned_by_step.pop(step):
                    self._index.unpin(key)
        for part in parts:
            for number in part.received:
                if number in self._receiving and self._every_shard(self._received_by, number, part.shard):
                    self._settling.settle(self._receiving.pop(number), number)
        if self._loss_aware is not None:
            for key in {key for part in parts for key in part.lost}:
                self._loss_aware.lost(key)
        failed = {key for part in parts for key in part.failed}
        for key in failed:  # one shard's failure fails the block: every shard saves it again
            self._stored_by.pop(key, None)
            self._index.release(key)
        for part in parts:
            for key in part.stored - failed:
                if self._every_shard(self._stored_by, key, part.shard):
                    self._index.commit(key)

    def _every_shard(self, tally: dict[_T, set[int]], item: _T, shard: int) -> bool:
        """``shard`` reported ``item``: whether every shard has now (then ``item`` leaves ``tally``)."""
        if self._shards == 1:
            return True
        shards = tally.setdefault(item, set())
        shards.add(shard)
        if len(shards) < self._shards:
            return False
        del tally[item]
        return True

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


_MISSING = object()
