"""``RedisStoreConnector``: the prefix store kept in Redis, so engines on many machines share it.

The same design as the other stores (:class:`~capkv.connectors._base.PrefixStoreConnector`):
the scheduler side asks a :class:`RedisIndex` which blocks Redis holds — one
``STRLEN`` per block, all of a request's blocks in one pipeline, and a value
of the wrong length is a miss; the worker side (:class:`RedisStoreWorker`)
fetches a step's loads in one batch and saves on a background thread, every
queued save in one batch. Keys are the namespace, the memory layout's
fingerprint (the worker tells the scheduler side, ``SaveReport.layout``), the
group and the block's chained prefix digest; each value is a
self-checking block (:mod:`capkv.connectors._redis_value`), so a damaged or
foreign value is a load error, never loaded.

Redis failing is routine, not an error: a lookup that cannot be answered is a
miss, a load that cannot be read is a per-group load error (the engine
recomputes), a save that cannot be written is dropped and counted
(``failed_save_blocks``), and every call is bounded by ``timeout_s``
(:mod:`capkv.connectors._redis_client`). Evictions (``maxmemory``) are misses.
"""

from __future__ import annotations

import hashlib
import queue
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from typing import ClassVar
from urllib.parse import quote

import torch

from capkv._homes import publish
from capkv.config._options import ConnectorOptions, Option
from capkv.connectors._redis_client import RedisKV
from capkv.connectors._redis_value import FINGERPRINT_SIZE, HEADER_SIZE, ValueCheck, check_value, pack_header
from capkv.connectors._base import PrefixStoreConnector, require_store_spec
from capkv.connectors._block_file import tensor_memory
from capkv.connectors._keys import BlockKey
from capkv.connectors._metadata import BlockMove, StoreMetadata
from capkv.connectors._worker import Landing, StoreWorker
from capkv.contracts._arguments import argument_error, is_finite_number, require_instance, require_str
from capkv.contracts._engine import BlockIds, ComputedTokenRequest, KVTransferParams
from capkv.contracts._spec import KVSpec
from capkv.transfer._copier import BlockCopier
from capkv.transfer._handle import FINISHED, CopyHandle
from capkv.transfer._layout import spec_block_nbytes

__all__ = ["RedisIndex", "RedisKeys", "RedisStoreConnector", "RedisStoreWorker"]


class RedisKeys:
    """Redis key names: ``capkv:<namespace>:<layout>:g<group>:<digest>``.

    ``<layout>`` is the group's memory-layout fingerprint (the order and sizes
    of the bytes a block is stored as, from the registered KV cache), so
    engines whose layouts differ keep separate blocks under one namespace,
    and ``SCAN capkv:<namespace>:*`` finds a model's blocks. The namespace is
    percent-encoded where it would split the name or, in a cluster, pin every
    key to one hash slot (``:``, ``{``, ``}``).
    """

    __slots__ = ("_prefixes",)

    def __init__(self, namespace: str, layouts: tuple[bytes, ...]) -> None:
        space = quote(namespace, safe="")
        self._prefixes = tuple(
            f"capkv:{space}:{layout[:8].hex()}:g{group}:".encode() for group, layout in enumerate(layouts)
        )

    def __call__(self, key: BlockKey) -> bytes:
        return self._prefixes[key.group] + key.digest.hex().encode()


def layout_fingerprints(spec: KVSpec, copier: BlockCopier) -> tuple[bytes, ...]:
    """Per group, what fixes the meaning of a stored block's bytes: dtype and the runs' order and sizes."""
    return tuple(
        hashlib.blake2b(repr((str(spec.dtype), group.signature)).encode(), digest_size=FINGERPRINT_SIZE).digest()
        for group in copier.layout.groups
    )


class RedisIndex:
    """The scheduler side's view of Redis: a block is loadable when its value has the full length.

    Answers come from one batched ``STRLEN`` per :meth:`lookup` and hold until
    :meth:`forget` (the step's metadata is built); a key asked about without a
    lookup costs a round trip of its own. Saves planned here and not yet
    reported over are *pending*: held, not loadable. Key names need the
    worker's memory layout (:meth:`set_layout`); until it is known nothing is
    loadable.
    """

    def __init__(self, kv: RedisKV, spec: KVSpec, *, namespace: str, owner: str) -> None:
        self._kv = kv
        self._namespace = namespace
        self._names: RedisKeys | None = None
        self._sizes = tuple(HEADER_SIZE + spec_block_nbytes(spec, g, owner=owner) for g in range(spec.num_groups))
        self._known: dict[BlockKey, bool] = {}
        self._pending: set[BlockKey] = set()
        self.lookups: int = 0
        """Round trips made to answer lookups."""
        self.unanswered: int = 0
        """Keys whose lookup failed (server down or slow): taken as misses."""

    def set_layout(self, fingerprints: tuple[bytes, ...], /) -> None:
        """The worker's memory-layout fingerprint per group: the key names follow."""
        self._names = RedisKeys(self._namespace, fingerprints)
        self._known.clear()

    def lookup(self, keys: Sequence[BlockKey], /) -> None:
        names = self._names
        unknown = list(dict.fromkeys(k for k in keys if k not in self._known))
        if not unknown:
            return
        if names is None:
            self._known.update(dict.fromkeys(unknown, False))
            return
        self.lookups += 1
        lengths = self._kv.strlen([names(k) for k in unknown])
        for key, length in zip(unknown, lengths, strict=True):
            if not isinstance(length, int):
                self.unanswered += 1
            self._known[key] = isinstance(length, int) and length == self._sizes[key.group]

    def forget(self) -> None:
        self._known.clear()

    def loadable(self, key: BlockKey, /) -> bool:
        if key in self._pending:
            return False
        if key not in self._known:
            self.lookup((key,))
        return self._known[key]

    def holds(self, key: BlockKey, /) -> bool:
        return key in self._pending or self.loadable(key)

    def touch(self, key: BlockKey, /) -> None:
        return None  # Redis keeps its own LRU clock: reads touch

    def pin(self, key: BlockKey, /) -> int | None:
        """Redis cannot pin: a block evicted before its load runs is a load error then."""
        return 0 if self.loadable(key) else None

    def unpin(self, key: BlockKey, /) -> None:
        return None

    def reserve(self, key: BlockKey, /) -> int | None:
        self._pending.add(key)
        return 0

    def commit(self, key: BlockKey, /) -> None:
        self._pending.discard(key)
        self._known.pop(key, None)

    def release(self, key: BlockKey, /) -> None:
        self._pending.discard(key)


class _Save:
    """A save on its way to Redis: the rows (header + block per row) once gathered, then sealed."""

    __slots__ = ("copied", "entries", "landing", "move", "rows")

    def __init__(self, move: BlockMove, rows: torch.Tensor, copied: CopyHandle) -> None:
        self.move = move
        self.rows = rows
        self.copied = copied
        self.entries: list[tuple[BlockKey, bytes, memoryview]] = []
        """(key, Redis key name, value) per block, once sealed (headers written)."""
        self.landing: Future[tuple[BlockKey, ...]] = Future()


class RedisStoreWorker(StoreWorker):
    """Fetches a step's loads in one batch; writes saves from a background thread, batched."""

    def __init__(self, spec: KVSpec, kv: RedisKV, *, namespace: str, owner: str) -> None:
        super().__init__(spec, owner=owner)
        self._kv = kv
        self._namespace = namespace
        self._names = RedisKeys(namespace, ())
        self._fingerprints: tuple[bytes, ...] = ()
        self._fetched: dict[BlockKey, bytes | None] = {}
        self._sealing: queue.SimpleQueue[_Save | None] = queue.SimpleQueue()
        self._to_send: queue.SimpleQueue[_Save | None] = queue.SimpleQueue()
        self._threads: tuple[threading.Thread, ...] = ()
        self._threads_lock = threading.Lock()
        self.damaged_values: int = 0
        """Values that failed their checks at load time (removed from Redis)."""
        self.foreign_values: int = 0
        """Values of another KV layout found under this layout's keys (left alone)."""
        self.write_failures: list[Exception] = []
        """Unexpected errors on the writer thread (server faults are not errors: they fail saves)."""

    def _attached(self, copier: BlockCopier) -> None:
        self._fingerprints = layout_fingerprints(self._spec, copier)
        self._names = RedisKeys(self._namespace, self._fingerprints)
        self.announce_layout(self._fingerprints)

    @property
    def fingerprints(self) -> tuple[bytes, ...]:
        """The registered KV cache's layout fingerprint per group (empty before ``register_kv_caches``)."""
        return self._fingerprints

    def key_name(self, key: BlockKey) -> bytes:
        """``key``'s Redis key name (after ``register_kv_caches``)."""
        return self._names(key)

    # ---- loads ---------------------------------------------------------------------------

    def load(self, metadata: StoreMetadata) -> None:
        """Fetch every block the step loads in one batch, then scatter them move by move."""
        keys = [key for move in metadata.loads for key in move.keys]
        if keys:
            values = self._kv.get([self._names(k) for k in keys])
            self._fetched = {k: v if isinstance(v, bytes) else None for k, v in zip(keys, values, strict=True)}
        try:
            super().load(metadata)
        finally:
            self._fetched = {}

    def _load(self, copier: BlockCopier, move: BlockMove) -> tuple[CopyHandle, set[int]]:
        nbytes = copier.block_nbytes(move.group)
        rows = copier.host_rows(len(move.block_ids), nbytes)
        fingerprint = self._fingerprints[move.group]
        good: list[int] = []
        failed: set[int] = set()
        damaged: list[bytes] = []
        for index, key in enumerate(move.keys):
            value = self._fetched.get(key)
            found = check_value(value, key, fingerprint, nbytes)
            if found is ValueCheck.OK and value is not None:
                tensor_memory(rows[index])[:] = memoryview(value)[HEADER_SIZE:]
                good.append(index)
                continue
            failed.add(move.block_ids[index])
            if found is ValueCheck.DAMAGED:
                self.damaged_values += 1
                damaged.append(self._names(key))
            elif found is ValueCheck.FOREIGN:
                self.foreign_values += 1
        if damaged:
            self._kv.delete(damaged)  # so it is not offered again
        if not good:
            return FINISHED, failed
        if failed:
            rows = rows[good]
        return copier.scatter(move.group, [move.block_ids[i] for i in good], rows), failed

    # ---- saves ---------------------------------------------------------------------------

    def _save(self, copier: BlockCopier, move: BlockMove) -> tuple[CopyHandle, Landing]:
        rows = copier.host_rows(len(move.block_ids), HEADER_SIZE + copier.block_nbytes(move.group))
        copied = copier.gather(move.group, move.block_ids, rows[:, HEADER_SIZE:])
        save = _Save(move, rows, copied)
        self._start_threads()
        self._sealing.put(save)
        return copied, save.landing

    def _start_threads(self) -> None:
        """Two stages, so checksums of later saves are computed while earlier ones are on the wire."""
        with self._threads_lock:
            if not self._threads:
                self._threads = (
                    threading.Thread(target=self._seal_loop, name="capkv-redis-seal", daemon=True),
                    threading.Thread(target=self._send_loop, name="capkv-redis-send", daemon=True),
                )
                for thread in self._threads:
                    thread.start()

    def _seal_loop(self) -> None:
        """Wait for each save's copy and write its headers; hand it to the sender. ``None`` ends both."""
        while True:
            save = self._sealing.get()
            if save is None:
                self._to_send.put(None)
                return
            try:
                save.copied.wait()
                save.entries = self._values(save)
            except Exception as error:  # the copy failed: nothing of this save is stored
                self.write_failures.append(error)
                save.landing.set_result(save.move.keys)
                continue
            self._to_send.put(save)

    def _send_loop(self) -> None:
        """Take every sealed save, write them in one batch, repeat; ``None`` ends the loop."""
        while True:
            batch = [self._to_send.get()]
            while batch[-1] is not None:
                try:
                    batch.append(self._to_send.get_nowait())
                except queue.Empty:
                    break
            saves = [s for s in batch if s is not None]
            if saves:
                self._write(saves)
            if batch[-1] is None:
                return

    def _write(self, saves: list[_Save]) -> None:
        """Store sealed ``saves`` in one batch; resolve each one's landing, whatever happens."""
        keys = [name for save in saves for _, name, _ in save.entries]
        values = [value for save in saves for _, _, value in save.entries]
        try:
            landed = self._kv.set(keys, values)
        except Exception as error:  # never leave a landing unresolved: the saves failed, the engine goes on
            self.write_failures.append(error)
            landed = [False] * len(keys)
        answers = iter(landed)
        for save in saves:
            failed = tuple(key for (key, _, _), ok in zip(save.entries, answers) if ok is not True)
            save.landing.set_result(failed)

    def _values(self, save: _Save) -> list[tuple[BlockKey, bytes, memoryview]]:
        """Each block of ``save`` as (key, Redis key name, value): its header written in front of its bytes."""
        nbytes = save.rows.shape[1] - HEADER_SIZE
        fingerprint = self._fingerprints[save.move.group]
        entries: list[tuple[BlockKey, bytes, memoryview]] = []
        for index, key in enumerate(save.move.keys):
            row = tensor_memory(save.rows[index])
            row[:HEADER_SIZE] = pack_header(key, fingerprint, row[HEADER_SIZE : HEADER_SIZE + nbytes])
            entries.append((key, self._names(key), row))
        return entries

    def flush(self) -> None:
        """Wait until every started save is over (stored in Redis, or failed and counted)."""
        self._settle(wait=True)

    def shutdown(self) -> None:
        try:
            super().shutdown()
        finally:
            with self._threads_lock:
                threads, self._threads = self._threads, ()
            if threads:
                self._sealing.put(None)
                for thread in threads:
                    thread.join()


class RedisStoreConnector(PrefixStoreConnector):
    """A prefix cache in Redis for every KV-cache group (HMA-capable), shared by every engine that uses it.

    ``url``: a ``redis://`` URL of a server, or of any node of a Redis Cluster
    (``cluster=None`` asks the server which it is). ``namespace`` separates
    models that share layer names and shapes. ``timeout_s`` bounds every
    network operation; a server that failed is left alone for
    ``retry_interval_s``, then tried again. Needs ``pip install 'capkv[redis]'``.
    Use it as a context manager, or call ``close()`` (``shutdown``) when done.
    """

    extra_config_options: ClassVar[ConnectorOptions] = ConnectorOptions(
        takes_spec=True,
        url=Option(str, help="redis:// URL of the server, or of cluster nodes separated by ','"),
        namespace=Option(str, help="separates models that share layer names and shapes"),
        timeout_s=Option(float, minimum=0.001, help="bound on every network operation, in seconds"),
        retry_interval_s=Option(float, minimum=0, help="how long a failed server is left alone, in seconds"),
        cluster=Option(bool, help="whether url names a Redis Cluster (default: ask the server)"),
    )
    """What a configuration may set (``capkv check`` and the builder refuse anything else)."""

    def __init__(
        self,
        spec: KVSpec,
        *,
        url: str = "redis://127.0.0.1:6379",
        namespace: str = "",
        timeout_s: float = 1.0,
        retry_interval_s: float = 1.0,
        cluster: bool | None = None,
    ) -> None:
        name = type(self).__name__
        method = "__init__"
        require_store_spec(spec, name)
        require_str(url, name, "url", empty=False, connector=name, method=method)
        require_str(namespace, name, "namespace", connector=name, method=method)
        for parameter, seconds, least in (("timeout_s", timeout_s, "> 0"), ("retry_interval_s", retry_interval_s, ">= 0")):
            if not is_finite_number(seconds) or not (seconds > 0 if least == "> 0" else seconds >= 0):
                raise argument_error(
                    name, parameter, seconds, f"a finite number {least} (seconds)", connector=name, method=method
                )
        require_instance(cluster, (bool, type(None)), name, "cluster", "True, False or None", connector=name, method=method)
        self.kv: RedisKV = RedisKV(
            url, owner=name, timeout_s=timeout_s, retry_interval_s=retry_interval_s, cluster=cluster
        )
        """The batched client (its ``servers``, ``server_of``, ``ping``)."""
        self.url: str = url
        self.index: RedisIndex = RedisIndex(self.kv, spec, namespace=namespace, owner=name)
        self._redis_worker = RedisStoreWorker(spec, self.kv, namespace=namespace, owner=name)
        self._closed = False
        super().__init__(spec, self.index, self._redis_worker, namespace=namespace)

    def request_finished_all_groups(
        self, request: ComputedTokenRequest, block_ids: BlockIds, /
    ) -> tuple[bool, KVTransferParams | None]:
        """Save the request's computed full blocks of every group; hold them until they are gathered."""
        return self._finish(request, block_ids, "request_finished_all_groups")

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor], /) -> None:
        super().register_kv_caches(kv_caches)
        self.index.set_layout(self._redis_worker.fingerprints)  # this object is both sides: no need to wait

    def key_name(self, key: BlockKey) -> bytes:
        """``key``'s Redis key name, in this engine's memory layout (after ``register_kv_caches``)."""
        return self._redis_worker.key_name(key)

    def flush(self) -> None:
        """Wait until every started save is over: stored in Redis, or failed (and counted)."""
        self._redis_worker.flush()

    def shutdown(self) -> None:
        """Finish started saves, stop the writer thread, drop connections; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        try:
            super().shutdown()
        finally:
            self.kv.close()


publish(__name__)
