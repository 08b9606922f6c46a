"""The scheduler side of a prefix-keyed store: what to load, what to save, where.

It decides and records; the worker side executes what the metadata says and
reports which saves ended (:class:`SaveReport`, its worker metadata). The two
share no state, so the pair would work split across processes as well as
inside one object. A key is planned for saving at most once: from the plan
until the report it is held (never planned again) but not loadable.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from capkv.connectors.hits import GroupGeometry, longest_hit
from capkv.connectors.keys import BlockKey, PrefixHasher, RequestKeys
from capkv.connectors.metadata import BlockMove, SaveReport, StoreMetadata
from capkv.contracts.engine import BlockIds, KVConnectorOutput, TokenRequest
from capkv.contracts.spec import KVSpec
from capkv.errors import ContractError, MetadataError

__all__ = ["StoreIndex", "StoreScheduler"]


@runtime_checkable
class StoreIndex(Protocol):
    """What the scheduler side knows of a store's contents."""

    def loadable(self, key: BlockKey, /) -> bool:
        """Stored completely, so a load may read it."""
        ...

    def holds(self, key: BlockKey, /) -> bool:
        """Stored, or reserved and not yet reported over (no need to save it again)."""
        ...

    def touch(self, key: BlockKey, /) -> None:
        """``key`` was just used (LRU stores)."""
        ...

    def pin(self, key: BlockKey, /) -> int | None:
        """Keep ``key`` until the load that reads it has run; its slot, or ``None`` when not loadable."""
        ...

    def unpin(self, key: BlockKey, /) -> None: ...

    def reserve(self, key: BlockKey, /) -> int | None:
        """A slot to save ``key`` into (``key`` is held from now on), or ``None`` when the store has no room."""
        ...

    def commit(self, key: BlockKey, /) -> None:
        """The save of ``key`` has landed: it is loadable."""
        ...

    def release(self, key: BlockKey, /) -> None:
        """The save of ``key`` failed: forget the reservation, so it may be saved again."""
        ...


class StoreScheduler:
    """Hit lookup, load and save planning for every KV-cache group of one spec."""

    def __init__(self, spec: KVSpec, index: StoreIndex, hasher: PrefixHasher, *, owner: str) -> None:
        self._owner = owner
        self._index = index
        self._hasher = hasher
        self._geometry = tuple(
            GroupGeometry(group.block_size or 1, group.sliding_window) for group in spec.groups
        )
        self._null = spec.null_block_id
        self._num_blocks = spec.num_blocks
        self._keys: dict[str, RequestKeys] = {}
        self._offers: dict[str, tuple[int, int]] = {}
        self._loads: list[BlockMove] = []
        self._saves: list[BlockMove] = []
        self._unavailable: list[tuple[int, int]] = []
        self._pinned: list[BlockKey] = []
        self._pinned_by_step: deque[list[BlockKey]] = deque()
        self.hit_tokens: int = 0
        """Tokens offered and accepted since the last :meth:`take_hit_tokens`."""

    # ---- lookups -------------------------------------------------------------------

    def matched_tokens(self, request: TokenRequest, num_computed_tokens: int) -> int:
        """Tokens beyond ``num_computed_tokens`` that every group can load (block-aligned)."""
        keys = self._request_keys(request)
        limit = len(request.all_token_ids) - 1  # the engine must compute at least the last token

        def present(group: int, block: int) -> bool:
            return self._index.loadable(keys.key(group, block, method="get_num_new_matched_tokens"))

        end = longest_hit(self._geometry, num_computed_tokens, limit, present)
        if end > num_computed_tokens:
            self._offers[request.request_id] = (num_computed_tokens, end)
        else:
            self._offers.pop(request.request_id, None)
        return end - num_computed_tokens

    def allocated(self, request: TokenRequest, blocks: BlockIds, num_external_tokens: int) -> None:
        """Plan the load of the offered blocks into the engine's newly allocated ``blocks``."""
        method = "update_state_after_alloc"
        offer = self._offers.pop(request.request_id, None)
        if num_external_tokens == 0:
            return
        start, end = self._accepted(request.request_id, offer, num_external_tokens)
        self._check_block_ids(blocks, method)
        keys = self._request_keys(request)
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
                    continue
                self._pinned.append(key)
                move_ids.append(block_id)
                move_keys.append(key)
                slots.append(slot)
            if move_ids:
                self._loads.append(
                    BlockMove(request.request_id, group, tuple(move_ids), tuple(move_keys), tuple(slots))
                )
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

    # ---- saves ---------------------------------------------------------------------

    def finished(self, request: TokenRequest, block_ids: BlockIds, method: str) -> bool:
        """Plan the save of a finished request's computed full blocks; ``True`` when its blocks must be held."""
        request_id = request.request_id
        self._offers.pop(request_id, None)
        keys = self._keys.pop(request_id, None) or RequestKeys(self._hasher, request.all_token_ids)
        keys.update(request.all_token_ids)
        self._check_block_ids(block_ids, method)
        computed = _computed_tokens(request)
        # Token order across groups, so a store that fills up keeps whole prefixes.
        candidates = sorted(
            ((block + 1) * geometry.block_size, group, block)
            for group, geometry in enumerate(self._geometry)
            for block in range(min(computed // geometry.block_size, len(block_ids[group])))
            if block_ids[group][block] != self._null
        )
        planned: dict[int, list[tuple[int, BlockKey, int]]] = {}
        for _, group, block in candidates:
            key = keys.key(group, block, method=method)
            if self._index.holds(key):
                self._index.touch(key)
                continue
            slot = self._index.reserve(key)
            if slot is None:
                break
            planned.setdefault(group, []).append((block_ids[group][block], key, slot))
        if not planned:
            return False
        for group, entries in sorted(planned.items()):
            ids, group_keys, slots = zip(*entries, strict=True)
            self._saves.append(BlockMove(request_id, group, ids, group_keys, slots))
        return True

    def take_hit_tokens(self) -> int:
        """Tokens loaded into the engine since the last call."""
        tokens, self.hit_tokens = self.hit_tokens, 0
        return tokens

    # ---- step boundaries -------------------------------------------------------------

    def build(self) -> StoreMetadata:
        """This step's metadata; the loads' pins last until this step's output comes back."""
        metadata = StoreMetadata(tuple(self._loads), tuple(self._saves), tuple(self._unavailable))
        self._pinned_by_step.append(self._pinned)
        self._loads, self._saves, self._unavailable, self._pinned = [], [], [], []
        return metadata

    def output(self, connector_output: KVConnectorOutput) -> None:
        """A step ran: release its loads' pins; saves reported stored become loadable, failed ones saveable."""
        if self._pinned_by_step:
            for key in self._pinned_by_step.popleft():
                self._index.unpin(key)
        report = connector_output.worker_meta
        if report is None:
            return
        if not isinstance(report, SaveReport):
            method = "update_connector_output"
            raise MetadataError(
                f"{self._owner}.{method}: expected SaveReport worker metadata, got {report!r}",
                connector=self._owner, method=method, value=report,
            )
        for key in report.stored:
            self._index.commit(key)
        for key in report.failed:
            self._index.release(key)

    # ---- helpers -------------------------------------------------------------------

    def _request_keys(self, request: TokenRequest) -> RequestKeys:
        keys = self._keys.get(request.request_id)
        if keys is None:
            keys = self._keys[request.request_id] = RequestKeys(self._hasher, request.all_token_ids)
        else:
            keys.update(request.all_token_ids)
        return keys

    def _check_block_ids(self, blocks: BlockIds, method: str) -> None:
        if len(blocks) != len(self._geometry):
            raise ContractError(
                f"{self._owner}.{method}: got block ids for {len(blocks)} KV-cache group(s); "
                f"the spec has {len(self._geometry)}",
                connector=self._owner, method=method, value=len(blocks),
            )
        for group, ids in enumerate(blocks):
            _check_group_ids(ids, group, self._null, self._num_blocks, self._owner, method)


def _check_group_ids(ids: Sequence[int], group: int, null: int, num_blocks: int, owner: str, method: str) -> None:
    seen: set[int] = set()
    for block_id in ids:
        if type(block_id) is not int or not 0 <= block_id < num_blocks:
            raise ContractError(
                f"{owner}.{method}: block id {block_id!r} of group {group} is outside the pool [0, {num_blocks})",
                connector=owner, method=method, group=group, value=block_id,
            )
        if block_id == null:
            continue  # the null block may repeat (sliding windows)
        if block_id in seen:
            raise ContractError(
                f"{owner}.{method}: block id {block_id} appears twice in group {group} "
                f"(only the null block {null} may repeat)",
                connector=owner, method=method, group=group, value=block_id,
            )
        seen.add(block_id)


def _computed_tokens(request: TokenRequest) -> int:
    """Tokens whose KV the engine has computed: ``num_computed_tokens`` when the request has it
    (vLLM's does), else every token but the last (whose KV is never computed)."""
    total = len(request.all_token_ids)
    computed: object = getattr(request, "num_computed_tokens", None)
    if type(computed) is int:
        return max(0, min(computed, total))
    return max(0, total - 1)
