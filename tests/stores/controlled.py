"""A controllable slow backend over any store's backend: faults of every kind, stuck reads, and a check
of every value put.

:class:`Controlled` wraps a real backend (the host pool, the file store's packs, Redis) and declares it
slow, so the store loads on its reader thread. The test arms the next read or put with a
:class:`Fault`; every read and put otherwise passes through to the real backend. Optional members of
the wrapped backend (``get_into``, ``get_into_parts``, ``pin``...) appear exactly when it has them, so
the store takes the same paths as over the real one. Reads are paced by the test: each waits for a
permit (:meth:`Controlled.allow`), so which loads are over when the engine asks is the schedule's choice,
not the threads'. Each value put is compared with the bytes the
model computes for its key (``expected``): a mismatch is a block saved that the engine never filled.
Every wait is bounded.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from capkv.connectors import CPUOffloadConnector, FileStoreConnector, RedisStoreConnector
from capkv.connectors._cpu_offload import HostPool
from capkv.connectors._host_pool import HostPoolIndex
from capkv.contracts._spec import KVSpec
from capkv.stores import Backend, ReadsInto, StoreConnector, StoreKey
from capkv.stores._backend import ReadsIntoParts
from capkv.stores._base import PrefixStoreConnector
from capkv.stores._keys import BlockKey
from capkv.stores._value import HEADER_SIZE
from capkv.stores._worker import StoreWorker
from capkv.transfer import BlockCopier

Expected = Callable[[BlockKey], "bytes | None"]

READS = tuple(sorted(
    name for protocol in (Backend, ReadsInto, ReadsIntoParts) for name in vars(protocol) if name.startswith("get")
))
STUCK_MAX_S = 60.0
"""A stuck call returns on its own after this long (the test never hangs on one it forgot)."""


class ThreadDeath(BaseException):
    """Not an ``Exception``: what a background thread may meet (a ``SystemExit``, a C extension's bug)."""


@dataclass
class Fault:
    """What the next armed call does: ``raise`` (before it runs), ``raise_after`` (after it ran: a read
    that landed values and then failed), ``damage`` (a read returns one value with a byte flipped),
    ``refuse`` (a put answers ``False``), ``stuck`` (waits until released, at most :data:`STUCK_MAX_S`)."""

    kind: str
    error: BaseException | None = None
    released: threading.Event | None = None

    def wait(self) -> None:
        if self.released is not None:
            self.released.wait(STUCK_MAX_S)


class Controlled:
    """``inner`` declared slow, its reads and puts controlled; see the module docstring."""

    slow = True

    def __init__(self, inner: Backend, expected: Expected) -> None:
        self.inner = inner
        self._expected = expected
        self._lock = threading.Lock()
        self._reads: list[Fault] = []
        self._puts: list[Fault] = []
        self.counts: Counter[str] = Counter()
        """Faults that fired, by kind and call (``"read raise"``, ``"put stuck"``...)."""
        self.unfilled: list[str] = []
        """Values put whose bytes are not what the model computes for their key."""
        self.put_keys: set[StoreKey] = set()
        """Every key a put was asked to store."""
        self.stuck: Counter[str] = Counter()
        """Calls waiting at a stuck fault now, by call (``"read"``, ``"put"``)."""
        self._permits = 0
        self._free_running = False
        self._paced = threading.Condition(self._lock)
        self.waiting_for_permit = 0
        """Reads waiting for a permit now."""

    def allow(self, reads: int) -> None:
        """``reads`` more reads may run."""
        with self._paced:
            self._permits += reads
            self._paced.notify_all()

    def run_freely(self, free: bool = True) -> None:
        """Reads no longer wait for permits (``free=False``: they do again)."""
        with self._paced:
            self._free_running = free
            self._paced.notify_all()

    def _permit(self) -> None:
        with self._paced:
            self.waiting_for_permit += 1
            try:
                self._paced.wait_for(lambda: self._free_running or self._permits > 0, timeout=STUCK_MAX_S)
                if not self._free_running and self._permits > 0:
                    self._permits -= 1
            finally:
                self.waiting_for_permit -= 1

    def arm_read(self, fault: Fault) -> None:
        with self._lock:
            self._reads.append(fault)

    def arm_put(self, fault: Fault) -> None:
        with self._lock:
            self._puts.append(fault)

    def disarm(self) -> None:
        """No more faults; stuck calls are released."""
        with self._lock:
            armed, self._reads, self._puts = self._reads + self._puts, [], []
        for fault in armed:
            if fault.released is not None:
                fault.released.set()

    def _next(self, armed: list[Fault], call: str) -> Fault | None:
        with self._lock:
            fault = armed.pop(0) if armed else None
            if fault is not None:
                kind = fault.kind if fault.error is None else f"{fault.kind} {type(fault.error).__name__}"
                self.counts[f"{call} {kind}"] += 1
        return fault

    # ---- reads ---------------------------------------------------------------------------

    def __getattr__(self, name: str) -> Any:
        """The inner backend's optional members (reads controlled); missing ones stay missing."""
        member = getattr(self.inner, name)
        if name == "get_into":
            return self._get_into
        if name == "get_into_parts":
            return self._get_into_parts
        return member

    def _before(self, fault: Fault | None, call: str) -> None:
        if fault is None:
            return
        if fault.kind == "stuck":
            with self._lock:
                self.stuck[call] += 1
            try:
                fault.wait()
            finally:
                with self._lock:
                    self.stuck[call] -= 1
        elif fault.kind == "raise" and fault.error is not None:
            raise fault.error

    def _after(self, fault: Fault | None) -> None:
        if fault is not None and fault.kind == "raise_after" and fault.error is not None:
            raise fault.error

    def get(self, keys: Sequence[StoreKey], /) -> Sequence[bytes | bytearray | memoryview | None]:
        self._permit()
        fault = self._next(self._reads, "read")
        self._before(fault, "read")
        values = list(self.inner.get(keys))
        if fault is not None and fault.kind == "damage":
            for index, value in enumerate(values):
                if value is not None and len(value) > HEADER_SIZE:
                    damaged = bytearray(value)
                    damaged[-1] ^= 0xFF
                    values[index] = bytes(damaged)
                    break
        self._after(fault)
        return values

    def _get_into(self, keys: Sequence[StoreKey], buffers: Sequence[memoryview], /) -> Sequence[int | None]:
        self._permit()
        fault = self._next(self._reads, "read")
        self._before(fault, "read")
        inner: Any = self.inner
        lengths = list(inner.get_into(keys, buffers))
        if fault is not None and fault.kind == "damage":
            for length, buffer in zip(lengths, buffers, strict=True):
                if isinstance(length, int) and length > HEADER_SIZE:
                    buffer[length - 1] ^= 0xFF
                    break
        self._after(fault)
        return lengths

    def _get_into_parts(
        self, keys: Sequence[StoreKey], parts: Sequence[Sequence[memoryview]], /,
        *, landed: Callable[[int, int], None] | None = None,
    ) -> Sequence[int | None]:
        self._permit()
        fault = self._next(self._reads, "read")
        self._before(fault, "read")
        damaged = [fault is None or fault.kind != "damage"]

        def damage(index: int) -> None:
            if not damaged[0] and len(parts[index]) > 1 and len(parts[index][-1]):
                parts[index][-1][-1] ^= 0xFF  # the last payload byte, in the engine's block, before it is checked
                damaged[0] = True

        def landing(index: int, count: int) -> None:
            damage(index)
            if landed is not None:
                landed(index, count)

        inner: Any = self.inner
        lengths = list(inner.get_into_parts(keys, parts, landed=landing))
        self._after(fault)
        return lengths

    # ---- writes ----------------------------------------------------------------------------

    def put(self, items: Sequence[tuple[StoreKey, memoryview]], /) -> Sequence[bool]:
        fault = self._next(self._puts, "put")
        self._before(fault, "put")
        for key, value in items:
            self.put_keys.add(key)
            expected = self._expected(key.block)
            if expected is None or bytes(value[HEADER_SIZE:]) != expected:
                with self._lock:
                    self.unfilled.append(f"group {key.group} block {key.digest.hex()[:12]}")
        if fault is not None and fault.kind == "refuse":
            return [False] * len(items)
        stored = self.inner.put(items)
        self._after(fault)
        return stored

    def evict_everything(self) -> None:
        """Every value goes, as another engine sharing the store (or Redis's ``maxmemory``) may make it go."""
        self.inner.delete(list(self.put_keys))

    def contains(self, keys: Sequence[StoreKey], /) -> Sequence[bool]:
        return self.inner.contains(keys)

    def delete(self, keys: Sequence[StoreKey], /) -> None:
        self.inner.delete(keys)

    def close(self) -> None:
        self.disarm()
        self.run_freely()
        self.inner.close()


# ---- capkv's stores, their backends controlled ---------------------------------------------------------


class _PoolWorker(StoreWorker):
    def __init__(self, spec: KVSpec, pool: HostPool, backend: Backend, *, owner: str) -> None:
        super().__init__(spec, backend, owner=owner, background=None)
        self._pool = pool

    def _attached(self, copier: BlockCopier) -> None:
        self._pool.allocate(max(self.value_sizes), pinned=False)


class ControlledHostPool(CPUOffloadConnector):
    """The host pool, its memory behind :class:`Controlled` (declared slow: loaded on the reader)."""

    def __init__(self, spec: KVSpec, *, capacity_blocks: int, expected: Expected) -> None:
        name = type(self).__name__
        self.pool = HostPoolIndex(capacity_blocks)
        self.memory = HostPool(capacity_blocks, owner=name)
        self.controlled = Controlled(self.memory, expected)
        worker = _PoolWorker(spec, self.memory, self.controlled, owner=name)
        PrefixStoreConnector.__init__(self, spec, self.pool, worker, namespace="")


class _Controls(StoreConnector):
    """Between a store's class and :class:`StoreConnector`: the shared layer sees the store's backend wrapped."""

    _expected: Expected

    def __init__(self, spec: KVSpec, backend: Backend, **options: Any) -> None:
        self.controlled = Controlled(backend, self._expected)
        super().__init__(spec, self.controlled, **options)


class ControlledFileStore(FileStoreConnector, _Controls):
    def __init__(self, spec: KVSpec, *, expected: Expected, **options: Any) -> None:
        self._expected = expected
        super().__init__(spec, **options)


class ControlledRedisStore(RedisStoreConnector, _Controls):
    def __init__(self, spec: KVSpec, *, expected: Expected, **options: Any) -> None:
        self._expected = expected
        super().__init__(spec, **options)
