"""Connectors broken on purpose, each the way a field bug breaks one: the kit must fail every one.

All derive from the engine tests' in-memory ``BlockStore`` (correct as it is),
changing one thing each.
"""

from __future__ import annotations

from typing import Any

from capkv import BlockIds, KVSpec, KVTransferParams, LoadErrors
from capkv.engine._request import Request
from tests.engine.connectors import BlockStore, Group0Only, OffByOne

__all__ = [
    "EarlyFree",
    "FlatLoadErrors",
    "Group0Only",
    "NeverReports",
    "OffByOne",
    "ReportsTwice",
    "WrongGroupLoadErrors",
]


class FinishSaver(BlockStore):
    """The store, saving whole requests when they finish (asynchronously: delay_free)."""

    def __init__(self, spec: KVSpec, **kwargs: Any) -> None:
        super().__init__(spec, save="finish", **kwargs)


class EarlyFree(FinishSaver):
    """Lets the engine free a finished request's blocks at once, and copies them in the next step."""

    def request_finished_all_groups(self, request: Request, block_ids: BlockIds, /) -> tuple[bool, KVTransferParams | None]:
        _, params = super().request_finished_all_groups(request, block_ids)
        return False, params

    def get_finished(self, finished_req_ids: set[str], /) -> tuple[set[str] | None, set[str] | None]:
        _, recving = super().get_finished(finished_req_ids)
        return None, recving


class NeverReports(FinishSaver):
    """Keeps the blocks (delay_free) and never reports the save done."""

    def get_finished(self, finished_req_ids: set[str], /) -> tuple[set[str] | None, set[str] | None]:
        _, recving = super().get_finished(finished_req_ids)
        return None, recving


class ReportsTwice(FinishSaver):
    """Reports every finished save again in the next step."""

    def __init__(self, spec: KVSpec, **kwargs: Any) -> None:
        super().__init__(spec, **kwargs)
        self.last: set[str] = set()

    def get_finished(self, finished_req_ids: set[str], /) -> tuple[set[str] | None, set[str] | None]:
        sending, recving = super().get_finished(finished_req_ids)
        now = set(sending or ())
        again, self.last = self.last | now, now
        return again or None, recving


class FlatLoadErrors(BlockStore):
    """vLLM's flat set of failed block ids, where capkv needs them per group."""

    def get_block_ids_with_load_errors(self) -> Any:
        return {1, 2}


class WrongGroupLoadErrors(BlockStore):
    """Reports group 0's first loaded block as failed in the last group."""

    def __init__(self, spec: KVSpec, **kwargs: Any) -> None:
        super().__init__(spec, **kwargs)
        self.errors: LoadErrors = {}

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        meta = self.connector_metadata
        for _, copies in getattr(meta, "loads", []):
            first = next((c for c in copies if c.group == 0), None)
            if first is not None:
                self.errors.setdefault(self.spec.num_groups - 1, set()).add(first.block_id)
        super().start_load_kv(forward_context, **kwargs)

    def get_block_ids_with_load_errors(self) -> LoadErrors:
        errors, self.errors = self.errors, {}
        return errors


class SlicesClaimed(BlockStore):
    """Says it loads slices, but offers a hit only when asked at the start of the prompt."""

    def loads_slices(self) -> bool:
        return True

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int, /) -> tuple[int | None, bool]:
        if num_computed_tokens:
            return 0, False
        return super().get_num_new_matched_tokens(request, num_computed_tokens)


class WritesNullBlocks(BlockStore):
    """Loads every block of its slice, the null block included (the sliding-window places outside the window)."""

    def update_state_after_alloc(self, request: Request, blocks: BlockIds, num_external_tokens: int, /) -> None:
        nulls = tuple([i if i != self.spec.null_block_id else -1 for i in table] for table in blocks)
        super().update_state_after_alloc(request, nulls, num_external_tokens)
        for _, copies in self.pending_loads:
            copies[:] = [c if c.block_id != -1 else type(c)(c.key, c.group, self.spec.null_block_id) for c in copies]
