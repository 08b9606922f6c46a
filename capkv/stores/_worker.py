"""The worker side of a store: run the metadata's loads and saves against a backend.

Saves go to the writer, loads to :mod:`capkv.stores._worker_loads`; ``flush`` and ``close`` are bounded
(docs/internals.md, "The worker side").
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING, cast

from capkv.contracts._engine import LoadErrors
from capkv.contracts._spec import KVSpec
from capkv.errors import ConfigError
from capkv.stores._backend import Backend, StoreKey
from capkv.stores._failures import raise_failures
from capkv.stores._fingerprint import layout_fingerprints
from capkv.stores._gathering import gather_checksummed
from capkv.stores._keys import BlockKey
from capkv.stores._metadata import BlockMove, SaveReport, StoreMetadata
from capkv.stores._staging import RowCache
from capkv.stores._value import HEADER_SIZE
from capkv.stores._worker_loads import WorkerLoads
from capkv.stores._writer import DEFAULT_BATCH_BYTES, SaveJob, Writer

if TYPE_CHECKING:  # torch loads with the KV cache, not with the store classes
    import torch

    import capkv.transfer._copier
    import capkv.transfer._handle

__all__ = ["DRAIN_TIMEOUT_S", "StoreWorker"]

DRAIN_TIMEOUT_S = 60.0
"""How long ``flush`` and ``close`` wait, at most, for the loads and saves under way (as long as the
writer gives a save at close): past it, loads still running are reported failed."""


class StoreWorker:
    """Loads and saves of one store's worker side, over ``backend``.

    ``background``: whether saves are written on the writer's threads (``None``:
    only when the KV cache is on CUDA, where waiting for a copy would stall the
    step; a backend whose ``put`` is slow — files, a network — wants ``True``).
    """

    def __init__(
        self, spec: KVSpec, backend: Backend, *, owner: str, background: bool | None = True,
        batch_bytes: int = DEFAULT_BATCH_BYTES,
    ) -> None:
        self._spec = spec
        self._backend = backend
        self._owner = owner
        self._background = background
        self._batch_bytes = batch_bytes
        self._copier = cast("capkv.transfer._copier.BlockCopier | None", None)
        self._rows: RowCache | None = None
        """The host rows saves are gathered into (made on the first save, reused)."""
        self._writer: Writer | None = None
        self._layouts: tuple[bytes, ...] = ()
        self._sizes: tuple[int, ...] = ()
        self._sending = cast("dict[str, list[capkv.transfer._handle.CopyHandle]]", {})
        self._landing: list[tuple[BlockMove, SaveJob]] = []
        """Started saves (their rows go back to ``_rows`` once written: :class:`SaveJob`'s ``release``)."""
        self._stored: set[BlockKey] = set()
        self._failed: set[BlockKey] = set()
        self._counts: Counter[str] = Counter()
        self._reported_through = 0  # the last step whose loads were reported over
        self._loads = WorkerLoads(backend, owner=owner, copier=self.copier, store_key=self.store_key, counts=self._counts)
        self._layout_news: tuple[bytes, ...] | None = None
        """The layout fingerprint per group, not yet reported (see ``SaveReport.layout``)."""
        self._closed = False

    @property
    def damaged_values(self) -> int:
        """Values that failed their checks at load time (deleted from the backend)."""
        return self._loads.damaged_values

    # ---- the KV cache ----------------------------------------------------------------------

    def register(self, kv_caches: Mapping[str, torch.Tensor]) -> None:
        from capkv.transfer._copier import BlockCopier  # noqa: PLC0415 (torch loads with the KV cache)

        copier = BlockCopier(self._spec, kv_caches, owner=self._owner)
        layouts = layout_fingerprints(self._spec, copier)
        self._sizes = tuple(HEADER_SIZE + copier.block_nbytes(g) for g in range(self._spec.num_groups))
        self._copier, self._layouts = copier, layouts
        self._loads.clear_rows()  # rows for the previous KV cache's device
        self._rows = None
        self._layout_news = layouts
        if self._writer is None:
            background = copier.device.type == "cuda" if self._background is None else self._background
            self._writer = Writer(
                self._backend.put, self._backend.delete, owner=self._owner, background=background,
                batch_bytes=self._batch_bytes,
            )
        self._attached(copier)

    def release(self) -> None:
        """Finish every copy out of the registered KV cache, then drop the views of it (and the staging
        rows on its device) until :meth:`register` is called again. Saves already copied out are written on."""
        for handles in self._sending.values():
            for handle in handles:
                handle.wait()
        self._loads.release()  # loads scatter into the cache being released
        self._copier = None

    def _attached(self, copier: capkv.transfer._copier.BlockCopier) -> None:
        """The engine registered its KV cache (a store sizes its memory here)."""

    @property
    def backend(self) -> Backend:
        """Where the values live."""
        return self._backend

    @property
    def fingerprints(self) -> tuple[bytes, ...]:
        """The registered KV cache's layout fingerprint per group (empty before ``register_kv_caches``)."""
        return self._layouts

    @property
    def value_sizes(self) -> tuple[int, ...]:
        """Per group, the length of a stored value (header and block; empty before ``register_kv_caches``)."""
        return self._sizes

    def copier(self, method: str) -> capkv.transfer._copier.BlockCopier:
        if self._copier is None:
            raise ConfigError(
                f"{self._owner}.{method}: register_kv_caches has not been called; there is no KV cache to copy",
                connector=self._owner, method=method,
            )
        return self._copier

    def _writer_for(self, method: str) -> Writer:
        self.copier(method)
        if self._writer is None:  # made with the copier
            raise ConfigError(f"{self._owner}.{method}: no writer", connector=self._owner, method=method)
        return self._writer

    def store_key(self, key: BlockKey) -> StoreKey:
        """``key``'s physical key in this worker's layout (after ``register_kv_caches``)."""
        return StoreKey(key, self._layouts[key.group], self._sizes[key.group])

    # ---- loads (:mod:`capkv.stores._worker_loads`) ---------------------------------------------

    def receive(self, metadata: StoreMetadata, method: str) -> None:
        """Start the step's asynchronous loads on the reader thread, as soon as the metadata is bound."""
        self._loads.receive(metadata, self._sizes, method)

    def load(self, metadata: StoreMetadata) -> None:
        """Run the step's loads (the asynchronous ones start here at the latest)."""
        self._loads.load(metadata, self._sizes)

    def loads_failed(self, request_ids: Collection[str]) -> None:
        """Loads of these requests failed this step elsewhere in a stack: they save nothing this step."""
        self._loads.loads_failed(request_ids)

    def received(self) -> set[str] | None:
        """Requests whose asynchronous load is over (``get_finished``'s receiving set)."""
        return self._loads.received()

    def take_load_errors(self) -> LoadErrors:
        """Blocks that could not be loaded since the last call, per group."""
        return self._loads.take_errors()

    # ---- saves -------------------------------------------------------------------------------

    def save(self, metadata: StoreMetadata) -> None:
        """Start the step's finished-request saves (and its evictions, ordered before them); their
        requests are reported by :meth:`finished`."""
        if metadata.evicted:
            self._writer_for("start_load_kv").delete([self.store_key(key) for key in metadata.evicted])
        for move in metadata.saves:
            job = self._start_save(move, "start_load_kv")
            copies = self._sending.setdefault(move.request_id, [])  # reported, even with every save dropped
            if job is not None:
                copies.append(job.copied)

    def save_computed(self, metadata: StoreMetadata) -> None:
        """Start saving the blocks this step filled; order the engine's stream after the copies."""
        for move in metadata.step_saves:
            if move.request_id in self._loads.failed_now:
                self._failed.update(move.keys)  # computed on a failed load: not stored, saveable again
                continue
            job = self._start_save(move, "wait_for_save")
            if job is not None:
                job.copied.stream_wait()

    def _start_save(self, move: BlockMove, method: str) -> SaveJob | None:
        """Gather ``move``'s blocks into reused rows and hand them to the writer (``None``: dropped, the
        background writer being full; its keys are reported failed, so they stay saveable). The step pays
        only the copy: a background writer checksums the rows on its own thread. Inline on CPU the copy
        goes a chunk at a time and each chunk's checksums are computed while it is still in the CPU's
        cache (the seal then only writes headers)."""
        copier = self.copier(method)
        writer = self._writer_for(method)
        count, size = len(move.block_ids), self._sizes[move.group]
        if not writer.has_room(count * size):
            self._failed.update(move.keys)
            self._counts["dropped_save_blocks"] += count
            return None
        cache = self._row_cache(copier)
        rows, buffer = cache.rows(count, size)
        keys = [self.store_key(key) for key in move.keys]
        if copier.device.type == "cpu" and not writer.background:
            step = self._loads.staging_ring(copier).rows_per_chunk(size)
            copied, checksums = gather_checksummed(copier, move.group, move.block_ids, rows, keys, step)
        else:
            copied, checksums = copier.gather(move.group, move.block_ids, rows[:, HEADER_SIZE:]), None
        job = SaveJob(keys, rows, copied, checksums=checksums, release=lambda: cache.give(buffer))
        self._landing.append((move, job))
        writer.submit(job)
        self._counts["saved_blocks"] += len(move.block_ids)
        self._counts["saved_bytes"] += len(move.block_ids) * (self._sizes[move.group] - HEADER_SIZE)
        return job

    def _row_cache(self, copier: capkv.transfer._copier.BlockCopier) -> RowCache:
        """The host rows saves are gathered into (pinned on CUDA), reused once their write is over."""
        cache = self._rows
        if cache is None:
            cache = self._rows = RowCache(lambda nbytes: copier.host_rows(1, nbytes)[0])
        return cache

    def finished(self) -> set[str] | None:
        """Requests whose every save has read its blocks (they may be freed now)."""
        done = {rid for rid, handles in self._sending.items() if all(h.done() for h in handles)}
        for request_id in done:
            del self._sending[request_id]
        return done or None

    # ---- reports -----------------------------------------------------------------------------

    def report(self) -> SaveReport | None:
        """The saves that ended since the last call, stored or failed, the loads reported received, and
        the last step whose loads ran (``None`` when there is no news)."""
        self._settle(wait=False)
        through = self._loads.loaded_through()
        loaded_through = through if through > self._reported_through else None
        news = self._stored or self._failed or self._loads.has_news()
        if not news and loaded_through is None and self._layout_news is None:
            return None
        report = SaveReport(
            frozenset(self._stored), frozenset(self._failed), loaded_through, self._layout_news,
            self._spec.shard.index, lost=self._loads.take_lost(), received=self._loads.take_received(),
        )
        self._stored, self._failed, self._layout_news = set(), set(), None
        self._reported_through = max(self._reported_through, through)
        return report

    def _settle(self, *, wait: bool) -> None:
        """Move the saves that are over (every save, waiting, when ``wait``) into the next report."""
        landing: list[tuple[BlockMove, SaveJob]] = []
        for move, job in self._landing:
            if not (wait or job.landing.done()):
                landing.append((move, job))
                continue
            failed = set(job.landing.result())
            self._failed |= failed
            self._stored.update(key for key in move.keys if key not in failed)
            self._counts["failed_save_blocks"] += len(failed)
        self._landing = landing

    def take_counts(self) -> dict[str, int]:
        """Blocks and bytes loaded, saved and failed since the last call (non-zero counters only)."""
        counts = dict(+self._counts)
        self._counts.clear()
        return counts

    # ---- draining ------------------------------------------------------------------------------

    def flush(self, timeout_s: float = DRAIN_TIMEOUT_S) -> None:
        """Wait until every started save and load is over, for at most ``timeout_s`` (then the loads still
        running are reported failed, and a ``TimeoutError`` says what was left); raise the failures since
        the last call, each once."""
        deadline = time.monotonic() + timeout_s
        saved = self._writer is None or self._writer.wait(timeout_s)
        if not self._loads.reader.wait(max(0.0, deadline - time.monotonic())):
            running = self._loads.reader.running()
            stuck = self._loads.reader.abandon()
            what = f"{running - stuck} given up, reported failed" + (
                f"; {stuck} still reading into the KV cache, reported when their reads return" if stuck else ""
            )
            self._loads.keep_failure(TimeoutError(f"{self._owner}: {running} loads still running after {timeout_s:g} s ({what})"))
        if not saved:
            self._loads.keep_failure(TimeoutError(f"{self._owner}: saves still being written after {timeout_s:g} s"))
        self._settle(wait=saved)
        self._raise_failures()

    def _raise_failures(self) -> None:
        failures, dropped = self._writer.take_failures() if self._writer is not None else ([], 0)
        reads = self._loads.take_failures()
        raise_failures(self._owner, reads + failures, dropped, reads=len(reads))

    def shutdown(self, timeout_s: float = DRAIN_TIMEOUT_S) -> None:
        """Let every started save complete and every load end (for at most ``timeout_s``: then the loads
        still running are reported failed and the saves not written fail), stop the threads, close the
        backend; raise the failures not raised yet. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        deadline = time.monotonic() + timeout_s
        try:
            for handles in self._sending.values():
                for handle in handles:
                    handle.wait()
            abandoned = self._loads.reader.close(timeout_s)
            self._loads.collect()  # their failures are raised below; their receives still reported
            if abandoned:
                self._loads.keep_failure(TimeoutError(
                    f"{self._owner}: {abandoned} loads still running after {timeout_s:g} s at close, reported failed"
                ))
            if self._writer is not None:
                self._writer.close(max(0.0, deadline - time.monotonic()))
            self._settle(wait=True)
            self._loads.clear_rows()
            if self._rows is not None:
                self._rows.clear()
        finally:
            try:
                self._backend.close()
            finally:
                self._raise_failures()
