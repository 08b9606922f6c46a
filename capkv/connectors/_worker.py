"""The worker side of a prefix-keyed store: run the metadata's loads and saves.

Loads run first, in ``start_load_kv``, and the engine's stream is ordered
after them before any layer computes; saves of finished requests (whose blocks
the engine holds) are started right after and never waited for: a request is
reported in ``get_finished``'s sending set once every copy of its blocks has
completed, and only then may the engine free them. Saves of the blocks a step
filled start in ``wait_for_save``, after the forward pass; the engine's stream
is ordered after their copies (on CPU they are done on return), so the engine
may free and reuse those blocks at once — no request is held for them. A
request whose load failed this step saves nothing this step (its later blocks
were computed on KV it never got); those keys are reported failed, so they can
be saved once recomputed. A save may land in the store later than its copy
(a file written in the background): each one's outcome, stored or failed, goes
back to the scheduler side in the worker metadata.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Collection, Mapping
from typing import Protocol, runtime_checkable

import torch

from capkv.connectors._keys import BlockKey
from capkv.connectors._metadata import BlockMove, SaveReport, StoreMetadata
from capkv.contracts._engine import LoadErrors
from capkv.contracts._spec import KVSpec
from capkv.errors import ConfigError
from capkv.transfer._copier import BlockCopier
from capkv.transfer._handle import CopyHandle

__all__ = ["Landing", "StoreWorker", "StoredWhenCopied", "consecutive_runs"]


def consecutive_runs(slots: tuple[int, ...]) -> list[tuple[int, int, int]]:
    """``(first index, count, first slot)`` for each run of consecutive slots, in order."""
    runs: list[tuple[int, int, int]] = []
    start = 0
    for index in range(1, len(slots) + 1):
        if index == len(slots) or slots[index] != slots[index - 1] + 1:
            runs.append((start, index - start, slots[start]))
            start = index
    return runs


@runtime_checkable
class Landing(Protocol):
    """A started save, seen from the store: over once its blocks are stored, or failed to be.

    A ``concurrent.futures.Future`` of the failed keys is one.
    """

    def done(self) -> bool:
        """Whether the save is over (never blocks)."""
        ...

    def result(self) -> Collection[BlockKey]:
        """Block until the save is over; the keys it did not store."""
        ...


class StoredWhenCopied:
    """The landing of a store whose copy *is* the store (a host pool): over with the copy, never failed."""

    __slots__ = ("_copy",)

    def __init__(self, copy: CopyHandle) -> None:
        self._copy = copy

    def done(self) -> bool:
        return self._copy.done()

    def result(self) -> Collection[BlockKey]:
        self._copy.wait()
        return ()


class StoreWorker(ABC):
    """Shared worker-side flow; a store supplies how one move is loaded and saved."""

    def __init__(self, spec: KVSpec, *, owner: str) -> None:
        self._spec = spec
        self._owner = owner
        self._copier: BlockCopier | None = None
        self._sending: dict[str, list[CopyHandle]] = {}
        self._landing: list[tuple[BlockMove, Landing]] = []
        self._stored: set[BlockKey] = set()
        self._failed: set[BlockKey] = set()
        self._errors: LoadErrors = {}
        self._counts: Counter[str] = Counter()
        self._loaded_through: int | None = None
        """The last step whose loads ran, until reported."""
        self._load_failed: set[str] = set()
        """Requests whose load failed in the step being run."""
        self._layout: tuple[bytes, ...] | None = None
        """A layout fingerprint per group not yet reported (see ``SaveReport.layout``)."""

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
        self._load_failed = set()
        if not metadata.loads:
            self._loaded_through = metadata.step
            return
        copier = self.copier("start_load_kv")
        handles: list[CopyHandle] = []
        for move in metadata.loads:
            handle, failed = self._load(copier, move)
            handles.append(handle)
            if failed:
                self._errors.setdefault(move.group, set()).update(failed)
                self._load_failed.add(move.request_id)
            loaded = len(move.block_ids) - len(failed)
            self._counts["loaded_blocks"] += loaded
            self._counts["loaded_bytes"] += loaded * copier.block_nbytes(move.group)
            self._counts["failed_blocks"] += len(failed)
        for handle in handles:
            handle.stream_wait()
        self._loaded_through = metadata.step  # stream-ordered: the engine reads them after this

    def loads_failed(self, request_ids: Collection[str]) -> None:
        """Loads of these requests failed this step elsewhere in a stack: they save nothing this step."""
        self._load_failed.update(request_ids)

    def save(self, metadata: StoreMetadata) -> None:
        """Start the step's saves; their requests are reported by :meth:`finished`."""
        if not metadata.saves:
            return
        copier = self.copier("start_load_kv")
        for move in metadata.saves:
            copied, landing = self._save(copier, move)
            self._sending.setdefault(move.request_id, []).append(copied)
            self._landing.append((move, landing))
            self._counts["saved_blocks"] += len(move.block_ids)
            self._counts["saved_bytes"] += len(move.block_ids) * copier.block_nbytes(move.group)

    def save_computed(self, metadata: StoreMetadata) -> None:
        """Start saving the blocks this step filled; order the engine's stream after the copies."""
        if not metadata.step_saves:
            return
        copier = self.copier("wait_for_save")
        for move in metadata.step_saves:
            if move.request_id in self._load_failed:
                self._failed.update(move.keys)  # computed on a failed load: not stored, saveable again
                continue
            copied, landing = self._save(copier, move)
            copied.stream_wait()
            self._landing.append((move, landing))
            self._counts["saved_blocks"] += len(move.block_ids)
            self._counts["saved_bytes"] += len(move.block_ids) * copier.block_nbytes(move.group)

    def finished(self) -> set[str] | None:
        """Requests whose every save has completed (their blocks may be freed now)."""
        done = {rid for rid, handles in self._sending.items() if all(h.done() for h in handles)}
        for request_id in done:
            del self._sending[request_id]
        return done or None

    def report(self) -> SaveReport | None:
        """The saves that ended since the last call, stored or failed, and the last step whose loads
        ran (``None`` when there is no news)."""
        self._settle(wait=False)
        if not self._stored and not self._failed and self._loaded_through is None and self._layout is None:
            return None
        report = SaveReport(frozenset(self._stored), frozenset(self._failed), self._loaded_through, self._layout)
        self._stored, self._failed, self._loaded_through, self._layout = set(), set(), None, None
        return report

    def announce_layout(self, fingerprints: tuple[bytes, ...]) -> None:
        """Report the layout fingerprint per group with the next report (stores whose bytes depend on it)."""
        self._layout = fingerprints

    def _settle(self, *, wait: bool) -> None:
        """Move the saves that are over (every save, waiting, when ``wait``) into the next report."""
        landing: list[tuple[BlockMove, Landing]] = []
        for move, save in self._landing:
            if not (wait or save.done()):
                landing.append((move, save))
                continue
            failed = set(save.result())
            self._failed |= failed
            self._stored.update(key for key in move.keys if key not in failed)
            self._counts["failed_save_blocks"] += len(failed)
        self._landing = landing

    def take_counts(self) -> dict[str, int]:
        """Blocks and bytes loaded, saved and failed since the last call (non-zero counters only)."""
        counts, self._counts = dict(+self._counts), Counter()
        return counts

    def take_load_errors(self) -> LoadErrors:
        """Blocks that could not be loaded since the last call, per group."""
        errors, self._errors = self._errors, {}
        return errors

    def shutdown(self) -> None:
        """Let every started save complete."""
        for handles in self._sending.values():
            for handle in handles:
                handle.wait()
        self._settle(wait=True)

    @abstractmethod
    def _attached(self, copier: BlockCopier) -> None:
        """The engine registered its KV cache."""

    @abstractmethod
    def _load(self, copier: BlockCopier, move: BlockMove) -> tuple[CopyHandle, set[int]]:
        """Start loading ``move``; its handle and the engine block ids that could not be loaded."""

    @abstractmethod
    def _save(self, copier: BlockCopier, move: BlockMove) -> tuple[CopyHandle, Landing]:
        """Start saving ``move``: a handle that completes when the engine's blocks are no longer
        read, and the save's landing in the store."""
