"""Faults for the vLLM fault campaign: damaged values, failing backends, children that raise.

:class:`Faults` wraps a store's backend (the contract of :mod:`capkv.stores._backend`). While
armed it damages what reads return — every damage kind of :data:`DAMAGES`, applied to the value
as the store reads it back, which is what the store sees when the stored bytes are damaged — or
raises in the named members (an I/O error). Disarmed it passes every call through. Its
``get_into`` reads through its ``get`` (whose values it can cut, pad and swap); it forwards
``pin``/``unpin``.

:class:`FaultFileStoreConnector`, :class:`FaultRedisStoreConnector` and
:class:`FaultCPUOffloadConnector` are capkv's stores with their backend wrapped, configurable by
name in a ``kv_transfer_config`` stack; :class:`SwitchFaulty` is ``tests.vllm.faulty.Faulty`` whose
raising member is chosen at run time. The campaign arms every wrapper built in the process (an
in-process engine: both roles' connectors) through :func:`arm` / :func:`disarm`.
Benchmark code, not capkv's: nothing in ``capkv/`` imports it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any, ClassVar

from capkv.config._options import ConnectorOptions
from capkv.connectors import CPUOffloadConnector, FileStoreConnector, RedisStoreConnector
from capkv.contracts._spec import KVSpec
from capkv.stores import Backend, StoreConnector, StoreKey
from capkv.stores._value import HEADER_SIZE
from tests.vllm.faulty import Faulty

HEADER_FIELDS = {
    "magic": 0, "version": 4, "flags": 6, "group": 8, "length": 12, "digest": 16, "layout": 32, "checksum": 48,
}
"""Offsets of the value header's fields (``capkv/stores/_value.py``: ``<4sHHII16s16s16s``, 64 bytes)."""

DAMAGES = (*(f"header:{name}" for name in HEADER_FIELDS), "payload", "truncate", "extend", "swap")
"""Every kind of damage to a stored value."""

IO_ERRORS = ("get", "contains", "put")
"""Backend members an I/O error is injected into (``get`` covers every read)."""


STUCK_S = 2.0
"""How long a stuck read blocks (a hung disk or network that comes back)."""


class InjectedIOError(OSError):
    """The backend failed on purpose."""


class InjectedBaseException(BaseException):
    """The backend failed on purpose with what no ``except Exception`` catches (as ``KeyboardInterrupt``,
    ``SystemExit`` or a C extension's error would), on a store's reader or writer thread."""


def damage(kind: str, value: bytes, other: bytes | None = None) -> bytes:
    """``value`` damaged as ``kind`` says; ``swap`` gives ``other`` (another key's value) instead.

    Header kinds flip one bit of the field's first byte; ``payload`` flips the middle payload byte;
    ``truncate`` drops the last 16 bytes; ``extend`` appends 16 zero bytes."""
    data = bytearray(value)
    if kind.startswith("header:"):
        offset = HEADER_FIELDS[kind.removeprefix("header:")]
        data[offset] ^= 0x01
    elif kind == "payload":
        if len(data) <= HEADER_SIZE:
            raise ValueError(f"damage: a value of {len(data)} bytes has no payload")
        data[HEADER_SIZE + (len(data) - HEADER_SIZE) // 2] ^= 0x10
    elif kind == "truncate":
        del data[-16:]
    elif kind == "extend":
        data += bytes(16)
    elif kind == "swap":
        if other is None or bytes(other) == value:
            raise ValueError("damage: swap needs another key's (different) value")
        return bytes(other)
    else:
        raise ValueError(f"damage: unknown kind {kind!r}")
    return bytes(data)


def swapped(values: Sequence[bytes | None], spare: dict[int, bytes]) -> list[bytes | None]:
    """Each value replaced by another key's value of the same length: rotated among the values of
    that length in ``values``, or taken from ``spare`` (a value per length seen before) when alone."""
    out: list[bytes | None] = list(values)
    by_length: dict[int, list[int]] = {}
    for index, value in enumerate(values):
        if value is not None:
            by_length.setdefault(len(value), []).append(index)
    for length, indexes in by_length.items():
        distinct = {values[i] for i in indexes}
        if len(distinct) > 1:
            for position, index in enumerate(indexes):
                out[index] = values[indexes[(position + 1) % len(indexes)]]
        else:
            other = spare.get(length)
            for index in indexes:
                out[index] = other if other is not None and other != values[index] else damage("header:digest", values[index] or b"")
    return out


class Faults:
    """``inner`` with faults while armed: reads damaged (``damage_kind``), members raising an I/O error
    (``raising``) or a ``BaseException`` (``base_raising``), or stuck for :data:`STUCK_S` (``stuck``)."""

    def __init__(self, inner: Backend) -> None:
        self.inner: Backend = inner
        self.slow: bool = inner.slow
        """The inner backend's declaration: a file store's loads run on its reader thread, as without faults."""
        self.damage_kind: str | None = None
        self.raising: frozenset[str] = frozenset()
        self.base_raising: frozenset[str] = frozenset()
        self.stuck: frozenset[str] = frozenset()
        self.fired: int = 0
        """Values damaged and calls failed so far."""
        self.puts: int = 0
        """``put`` calls returned (or raised) so far."""
        self.putting: int = 0
        """``put`` calls under way (a store's writer threads)."""
        self._spare: dict[int, bytes] = {}
        self._lock = threading.Lock()
        self.raising = frozenset(RAISE_FROM_THE_START)
        _BUILT.append(self)

    def __getattr__(self, name: str) -> Any:
        if name in ("pin", "unpin"):
            return getattr(self.inner, name)
        raise AttributeError(name)

    def _raise(self, member: str) -> None:
        if member in self.stuck:
            with self._lock:
                self.fired += 1
            time.sleep(STUCK_S)
        if member in self.base_raising:
            with self._lock:
                self.fired += 1
            raise InjectedBaseException(f"injected BaseException in {member}")
        if member in self.raising:
            with self._lock:
                self.fired += 1
            raise InjectedIOError(f"injected I/O error in {member}")

    def contains(self, keys: Sequence[StoreKey], /) -> Sequence[bool]:
        self._raise("contains")
        return self.inner.contains(keys)

    def get(self, keys: Sequence[StoreKey], /) -> Sequence[bytes | bytearray | memoryview | None]:
        self._raise("get")
        values = [None if v is None else bytes(v) for v in self.inner.get(keys)]
        kind = self.damage_kind
        if kind is None or not any(v is not None for v in values):
            for value in values:
                if value is not None:
                    self._spare[len(value)] = value
            return values
        with self._lock:
            self.fired += sum(v is not None for v in values)
        if kind == "swap":
            return swapped(values, self._spare)
        return [None if v is None else damage(kind, v) for v in values]

    def get_into(self, keys: Sequence[StoreKey], buffers: Sequence[memoryview], /) -> list[int | None]:
        """Reads through :meth:`get` (so damaged alike): a value longer than its buffer fills it and says
        its own length, as a backend that returned too much would."""
        read: list[int | None] = []
        for value, buffer in zip(self.get(keys), buffers, strict=True):
            if value is None:
                read.append(None)
                continue
            count = min(len(value), len(buffer))
            buffer[:count] = memoryview(value).cast("B")[:count]
            read.append(len(value))
        return read

    def put(self, items: Sequence[tuple[StoreKey, memoryview]], /) -> Sequence[bool]:
        with self._lock:
            self.putting += 1
        try:
            self._raise("put")
            return self.inner.put(items)
        finally:
            with self._lock:
                self.putting -= 1
                self.puts += 1

    def delete(self, keys: Sequence[StoreKey], /) -> None:
        self.inner.delete(keys)

    def close(self) -> None:
        self.inner.close()


RAISE_FROM_THE_START: set[str] = set()
"""Members every wrapper built from now on raises in from its construction (until disarmed)."""

_BUILT: list[Faults] = []
"""Every wrapper built in this process (the campaign forgets them per engine)."""


def arm(
    *, damage_kind: str | None = None, raising: Sequence[str] = (), base_raising: Sequence[str] = (),
    stuck: Sequence[str] = (),
) -> None:
    """Every wrapper built since :func:`forget` damages its reads and/or raises in ``raising``; the wrappers of
    slow backends (whose reads run on the store's reader thread, and writes on its writer) also raise a
    ``BaseException`` in ``base_raising`` and block in ``stuck`` (a store running these in the engine's step
    rightly lets a ``BaseException`` through)."""
    for faults in _BUILT:
        faults.damage_kind = damage_kind
        faults.raising = frozenset(raising)
        faults.base_raising = frozenset(base_raising) if faults.slow else frozenset()
        faults.stuck = frozenset(stuck) if faults.slow else frozenset()


def disarm() -> None:
    arm()


def fired() -> int:
    return sum(f.fired for f in _BUILT)


def puts() -> tuple[int, int]:
    """``put`` calls done and under way, over every wrapper."""
    return sum(f.puts for f in _BUILT), sum(f.putting for f in _BUILT)


POOLS: list[Any] = []
"""The host pools (``HostPool``) of every :class:`FaultCPUOffloadConnector` built since :func:`forget`."""


def forget() -> None:
    _BUILT.clear()
    POOLS.clear()
    RAISE_FROM_THE_START.clear()
    SwitchFaulty.armed = ""


class _WrapsBackend(StoreConnector):
    """Between a store's class and :class:`StoreConnector` in the method order: the store's backend is
    wrapped in :class:`Faults` before the shared layer sees it."""

    def __init__(self, spec: KVSpec, backend: Backend, **options: Any) -> None:
        self.faults: Faults = Faults(backend)
        super().__init__(spec, self.faults, **options)


class FaultFileStoreConnector(FileStoreConnector, _WrapsBackend):
    """:class:`FileStoreConnector` over a :class:`Faults` backend."""

    extra_config_options: ClassVar[ConnectorOptions] = FileStoreConnector.extra_config_options


class FaultRedisStoreConnector(RedisStoreConnector, _WrapsBackend):
    """:class:`RedisStoreConnector` over a :class:`Faults` backend."""

    extra_config_options: ClassVar[ConnectorOptions] = RedisStoreConnector.extra_config_options


class FaultCPUOffloadConnector(CPUOffloadConnector):
    """:class:`CPUOffloadConnector` whose host pool's reads and writes go through a :class:`Faults`
    (the pool is built inside the connector: its members are replaced on the instance)."""

    def __init__(self, spec: KVSpec, **options: Any) -> None:
        super().__init__(spec, **options)
        pool = self.memory
        faults = Faults(_PoolMembers(pool.contains, pool.get, pool.put, pool.delete, pool.close, slow=pool.slow))
        pool.contains = faults.contains  # type: ignore[method-assign,assignment]
        pool.get = faults.get  # type: ignore[method-assign,assignment]
        pool.put = faults.put  # type: ignore[method-assign,assignment]
        pool.get_into = faults.get_into  # type: ignore[method-assign]
        self.faults = faults
        POOLS.append(pool)


class _PoolMembers:
    """The host pool's own members, captured before they are replaced on the instance."""

    def __init__(self, contains: Any, get: Any, put: Any, delete: Any, close: Any, *, slow: bool) -> None:
        self.contains, self.get, self.put, self.delete, self.close = contains, get, put, delete, close
        self.slow = slow


CHILD_MEMBERS = (
    "get_num_new_matched_tokens", "update_state_after_alloc", "build_connector_meta", "update_connector_output",
    "request_finished_all_groups", "take_events", "bind_connector_metadata", "start_load_kv",
    "wait_for_layer_load", "save_kv_layer", "wait_for_save", "get_finished", "get_block_ids_with_load_errors",
    "build_connector_worker_meta",
)
"""Every member :class:`Faulty` can raise in."""
LOADING_MEMBERS = frozenset({
    "update_state_after_alloc", "build_connector_meta", "bind_connector_metadata", "start_load_kv",
    "wait_for_layer_load", "get_block_ids_with_load_errors",
})
"""Members a load depends on: while one raises, the child claims prefixes (so a load is under way)."""
CHILD_FAULTS = (*(f"raise:{m}" for m in CHILD_MEMBERS), "fail_load:sync", "fail_load:async")


class SwitchFaulty(Faulty):
    """:class:`Faulty` whose fault is chosen at run time (:attr:`armed`, one of :data:`CHILD_FAULTS`, or
    ``""``: an honest child that offers nothing)."""

    armed: ClassVar[str] = ""

    def __init__(self) -> None:
        super().__init__()

    def _maybe_raise(self, method: str) -> None:
        fault = SwitchFaulty.armed
        self.claim = fault.startswith("fail_load") or fault.removeprefix("raise:") in LOADING_MEMBERS
        self.fail_load = fault.startswith("fail_load")
        self.load_async = fault == "fail_load:async"
        if fault == f"raise:{method}":
            raise RuntimeError(f"SwitchFaulty: {method} fails on purpose")
