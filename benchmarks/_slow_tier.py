"""A slow tier for benchmarks: capkv's file and Redis stores with an injected delay on every read.

A store on this machine answers from the page cache or a loopback socket, far faster than a
disk or a network would. :class:`DelayedReads` wraps a store's backend (the small contract of
:mod:`capkv.stores._backend`) and sleeps ``delay_s`` before each read call — one round trip per
batch, as a disk or a remote server would cost — and passes every other call through unchanged,
so what the shared store layer does with a slow read (stall the step, or load in the background)
is what the benchmark measures. Benchmark code, not capkv's: nothing in ``capkv/`` imports it.

:class:`SlowFileStoreConnector` and :class:`SlowRedisStoreConnector` are the stores with their
backend wrapped, configurable by name in a vLLM ``kv_transfer_config`` stack
(``"kv_connector": "benchmarks._slow_tier:SlowFileStoreConnector"``) with two more options:
``read_delay_ms`` and ``load_mode``. ``load_mode`` sets the one knob the asynchronous loads of
issue 25 read (the backend's ``slow`` declaration: ``"async"`` declares it, ``"sync"`` declares
the backend fast); a capkv without asynchronous loads ignores it and loads synchronously, which
the benchmark detects (no request waits for remote KV) and reports instead of numbers.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from capkv.config._options import ConnectorOptions, Option
from capkv.connectors import FileStoreConnector, RedisStoreConnector
from capkv.contracts._spec import KVSpec
from capkv.stores import Backend, ReadsInto, StoreConnector, StoreKey
from capkv.stores._backend import ReadsIntoParts

__all__ = ["LOAD_MODES", "READS", "DelayedReads", "SlowFileStoreConnector", "SlowRedisStoreConnector", "built", "forget_built"]

LOAD_MODES = ("sync", "async")

READS = tuple(sorted(
    name for protocol in (Backend, ReadsInto, ReadsIntoParts) for name in vars(protocol) if name.startswith("get")
))
"""The backend members that read values: the contract's ``get`` and its optional fast paths, read from the
protocols, so a new fast path cannot bypass the delay (``get_into_parts`` once did, unnoticed)."""


class DelayedReads:
    """``inner`` with ``delay_s`` of sleep before every read call; counts the calls and the time.

    ``slow``: the backend's declaration that its reads take long (what capkv's asynchronous loads
    key on); ``None`` leaves the inner backend's own. Optional members of ``inner``
    (``get_into``, ``pin``, ...) appear here exactly when ``inner`` has them, so the store takes the
    same paths as over ``inner``.
    """

    def __init__(self, inner: Backend, delay_s: float, *, slow: bool | None = None) -> None:
        if delay_s < 0:
            raise ValueError(f"DelayedReads: delay_s must be >= 0, got {delay_s!r}")
        self.inner: Backend = inner
        self.delay_s: float = delay_s
        self.reads: int = 0
        """Read calls so far (each paid ``delay_s``)."""
        self.read_seconds: float = 0.0
        """Time spent in read calls, the delay included."""
        self._lock = threading.Lock()  # reads may come from the engine's thread and a store's reader
        self.slow: bool = slow if slow is not None else getattr(inner, "slow", False) is True

    def _timed(self, read: Callable[..., Any]) -> Callable[..., Any]:
        def delayed(*args: Any, **kwargs: Any) -> Any:
            began = time.perf_counter()
            if self.delay_s:
                time.sleep(self.delay_s)
            try:
                return read(*args, **kwargs)
            finally:
                with self._lock:
                    self.reads += 1
                    self.read_seconds += time.perf_counter() - began

        return delayed

    def __getattr__(self, name: str) -> Any:
        """The inner backend's optional members (reads delayed); missing ones stay missing."""
        member = getattr(self.inner, name)
        return self._timed(member) if name in READS else member

    def contains(self, keys: Sequence[StoreKey], /) -> Sequence[bool]:
        return self.inner.contains(keys)

    def get(self, keys: Sequence[StoreKey], /) -> Sequence[bytes | bytearray | memoryview | None]:
        result: Sequence[bytes | bytearray | memoryview | None] = self._timed(self.inner.get)(keys)
        return result

    def put(self, items: Sequence[tuple[StoreKey, memoryview]], /) -> Sequence[bool]:
        return self.inner.put(items)

    def delete(self, keys: Sequence[StoreKey], /) -> None:
        self.inner.delete(keys)

    def close(self) -> None:
        self.inner.close()


def _slow(mode: str) -> bool:
    if mode not in LOAD_MODES:
        raise ValueError(f"load_mode must be one of {', '.join(LOAD_MODES)}, got {mode!r}")
    return mode == "async"


_BUILT: list[DelayedReads] = []
"""Every wrapper built in this process (the benchmark reads their counters; it forgets them per engine)."""

_OPTIONS = {
    "read_delay_ms": Option(float, minimum=0, help="sleep before every backend read call, in ms (default 0)"),
    "load_mode": Option(str, choices=LOAD_MODES, help="declare the backend slow (async) or fast (sync)"),
}


class _DelaysReads(StoreConnector):
    """Between a store's class and :class:`StoreConnector` in the method order: the backend the
    store hands up is wrapped in :class:`DelayedReads` before the shared layer sees it."""

    _read_delay_s: float = 0.0
    _load_mode: str = "sync"

    def __init__(self, spec: KVSpec, backend: Backend, **options: Any) -> None:
        self.delayed: DelayedReads = DelayedReads(backend, self._read_delay_s, slow=_slow(self._load_mode))
        _BUILT.append(self.delayed)
        super().__init__(spec, self.delayed, **options)


class SlowFileStoreConnector(FileStoreConnector, _DelaysReads):
    """:class:`FileStoreConnector` whose every read waits ``read_delay_ms`` first (a disk)."""

    extra_config_options: ClassVar[ConnectorOptions] = ConnectorOptions(
        takes_spec=True, **FileStoreConnector.extra_config_options.options, **_OPTIONS
    )

    def __init__(self, spec: KVSpec, *, read_delay_ms: float = 0.0, load_mode: str = "sync", **options: Any) -> None:
        self._read_delay_s, self._load_mode = read_delay_ms / 1e3, load_mode
        super().__init__(spec, **options)


class SlowRedisStoreConnector(RedisStoreConnector, _DelaysReads):
    """:class:`RedisStoreConnector` whose every read waits ``read_delay_ms`` first (a network)."""

    extra_config_options: ClassVar[ConnectorOptions] = ConnectorOptions(
        takes_spec=True, **RedisStoreConnector.extra_config_options.options, **_OPTIONS
    )

    def __init__(self, spec: KVSpec, *, read_delay_ms: float = 0.0, load_mode: str = "sync", **options: Any) -> None:
        self._read_delay_s, self._load_mode = read_delay_ms / 1e3, load_mode
        super().__init__(spec, **options)


def built() -> list[DelayedReads]:
    """Every :class:`DelayedReads` built since the last :func:`forget_built` (both roles' of an engine)."""
    return list(_BUILT)


def forget_built() -> None:
    _BUILT.clear()
