"""The worker side of a prefix-keyed store: run the metadata's loads and saves.

Loads run first, in ``start_load_kv``, and the engine's stream is ordered
after them before any layer computes; saves (of finished requests, whose blocks
the engine holds) are started right after and never waited for: a request is
reported in ``get_finished``'s sending set once every copy of its blocks has
completed, and only then may the engine free them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping

import torch

from capkv.connectors.metadata import BlockMove, StoreMetadata
from capkv.contracts.engine import LoadErrors
from capkv.contracts.spec import KVSpec
from capkv.errors import ConfigError
from capkv.transfer.copier import BlockCopier
from capkv.transfer.handle import CopyHandle

__all__ = ["StoreWorker", "consecutive_runs"]


def consecutive_runs(slots: tuple[int, ...]) -> list[tuple[int, int, int]]:
    """``(first index, count, first slot)`` for each run of consecutive slots, in order."""
    runs: list[tuple[int, int, int]] = []
    start = 0
    for index in range(1, len(slots) + 1):
        if index == len(slots) or slots[index] != slots[index - 1] + 1:
            runs.append((start, index - start, slots[start]))
            start = index
    return runs


class StoreWorker(ABC):
    """Shared worker-side flow; a store supplies how one move is loaded and saved."""

    def __init__(self, spec: KVSpec, *, owner: str) -> None:
        self._spec = spec
        self._owner = owner
        self._copier: BlockCopier | None = None
        self._sending: dict[str, list[CopyHandle]] = {}
        self._errors: LoadErrors = {}
        self.loaded_blocks = 0
        self.saved_blocks = 0

    def register(self, kv_caches: Mapping[str, torch.Tensor]) -> None:
        self._copier = BlockCopier(self._spec, kv_caches, owner=self._owner)
        self._attached(self._copier)

    def copier(self, method: str) -> BlockCopier:
        if self._copier is None:
            raise ConfigError(
                f"{self._owner}.{method}: register_kv_caches has not been called; there is no KV cache to copy",
                connector=self._owner, method=method,
            )
        return self._copier

    def load(self, metadata: StoreMetadata) -> None:
        """Run the step's loads and order the engine's stream after them."""
        for group, block_id in metadata.unavailable:
            self._errors.setdefault(group, set()).add(block_id)
        if not metadata.loads:
            return
        copier = self.copier("start_load_kv")
        handles: list[CopyHandle] = []
        for move in metadata.loads:
            handle, failed = self._load(copier, move)
            handles.append(handle)
            if failed:
                self._errors.setdefault(move.group, set()).update(failed)
            self.loaded_blocks += len(move.block_ids) - len(failed)
        for handle in handles:
            handle.stream_wait()

    def save(self, metadata: StoreMetadata) -> None:
        """Start the step's saves; their requests are reported by :meth:`finished`."""
        if not metadata.saves:
            return
        copier = self.copier("start_load_kv")
        for move in metadata.saves:
            self._sending.setdefault(move.request_id, []).append(self._save(copier, move))
            self.saved_blocks += len(move.block_ids)

    def finished(self) -> set[str] | None:
        """Requests whose every save has completed (their blocks may be freed now)."""
        done = {rid for rid, handles in self._sending.items() if all(h.done() for h in handles)}
        for request_id in done:
            del self._sending[request_id]
        return done or None

    def take_load_errors(self) -> LoadErrors:
        """Blocks that could not be loaded since the last call, per group."""
        errors, self._errors = self._errors, {}
        return errors

    def shutdown(self) -> None:
        """Let every started copy complete."""
        for handles in self._sending.values():
            for handle in handles:
                handle.wait()

    @abstractmethod
    def _attached(self, copier: BlockCopier) -> None:
        """The engine registered its KV cache."""

    @abstractmethod
    def _load(self, copier: BlockCopier, move: BlockMove) -> tuple[CopyHandle, set[int]]:
        """Start loading ``move``; its handle and the engine block ids that could not be loaded."""

    @abstractmethod
    def _save(self, copier: BlockCopier, move: BlockMove) -> CopyHandle:
        """Start saving ``move``; the handle completes when the engine's blocks are no longer read."""
