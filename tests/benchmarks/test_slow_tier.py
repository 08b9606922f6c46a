"""The benchmarks' slow tier (benchmarks/_slow_tier.py): reads wait, everything else passes through."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from benchmarks._slow_tier import (
    LOAD_MODES, READS, DelayedReads, SlowFileStoreConnector, SlowRedisStoreConnector, built, forget_built,
)
from capkv.connectors import FileStoreConnector
from capkv.errors import ConfigError
from capkv.stores import MemoryBackend, PinningBackend, ReadsInto, StoreKey
from capkv.stores._keys import BlockKey
from tests.connectors.conftest import tokens
from tests.connectors.engine import MiniEngine
from tests.paged import Group, make_spec

KEY = StoreKey(BlockKey(0, b"\x01" * 16), b"\x02" * 16, 4)
GROUPS = [Group(16), Group(16, window=32)]
PROMPT = tokens(30, 100)  # six full blocks in group 0; the window needs two of group 1's


class FastPaths(MemoryBackend):
    """A backend with both optional members (a stand-in for the file store's)."""

    def get_into(self, keys: Sequence[StoreKey], buffers: Sequence[memoryview], /) -> list[int | None]:
        counts: list[int | None] = []
        for key, buffer in zip(keys, buffers, strict=True):
            value = self.values.get(key)
            if value is not None:
                buffer[: len(value)] = value
            counts.append(None if value is None else len(value))
        return counts

    def pin(self, keys: Sequence[StoreKey], /) -> list[bool]:
        return [key in self.values for key in keys]

    def unpin(self, keys: Sequence[StoreKey], /) -> None:
        pass


def test_every_read_waits_and_is_counted_other_calls_pass_through() -> None:
    inner = FastPaths()
    delayed = DelayedReads(inner, 0.02)
    assert delayed.put([(KEY, memoryview(b"abcd"))]) == [True]
    assert delayed.contains([KEY]) == [True]
    assert delayed.reads == 0
    began = time.perf_counter()
    assert delayed.get([KEY]) == [b"abcd"]
    buffer = bytearray(4)
    assert delayed.get_into([KEY], [memoryview(buffer)]) == [4]
    assert time.perf_counter() - began >= 0.04
    assert buffer == b"abcd"
    assert delayed.reads == 2 and delayed.read_seconds >= 0.04
    assert delayed.pin([KEY]) == [True]  # not a read: no delay, not counted
    assert delayed.reads == 2
    delayed.delete([KEY])
    assert inner.values == {}


def test_optional_members_appear_exactly_when_the_inner_backend_has_them() -> None:
    assert isinstance(DelayedReads(FastPaths(), 0.0), ReadsInto)
    assert isinstance(DelayedReads(FastPaths(), 0.0), PinningBackend)
    plain = DelayedReads(MemoryBackend(), 0.0)
    assert not isinstance(plain, ReadsInto) and not isinstance(plain, PinningBackend)
    with pytest.raises(AttributeError):
        plain.get_scattered  # noqa: B018


def test_slow_is_declared_only_when_asked() -> None:
    assert DelayedReads(MemoryBackend(), 0.0, slow=True).slow is True
    assert DelayedReads(MemoryBackend(), 0.0, slow=False).slow is False
    assert DelayedReads(MemoryBackend(), 0.0).slow is False  # the inner backend's own (MemoryBackend: fast)
    with pytest.raises(ValueError, match="delay_s"):
        DelayedReads(MemoryBackend(), -0.001)


@pytest.mark.parametrize("cls", [SlowFileStoreConnector, SlowRedisStoreConnector])
def test_the_slow_stores_take_their_store_options_and_the_two_new_ones(cls: type) -> None:
    options = cls.extra_config_options
    base = {"root": "/tmp/x"} if cls is SlowFileStoreConnector else {"url": "redis://127.0.0.1:1"}
    options.check({**base, "read_delay_ms": 5, "load_mode": "async"}, connector=cls.__name__)
    with pytest.raises(ConfigError, match="read_delay_ms"):
        options.check({**base, "read_delay_ms": -1}, connector=cls.__name__)
    with pytest.raises(ConfigError, match="load_mode"):
        options.check({**base, "load_mode": "later"}, connector=cls.__name__)


def test_the_read_members_are_the_backend_protocols_get_members() -> None:
    """A fast path added to the backend contract is delayed without this module knowing of it."""
    assert set(READS) == {"get", "get_into", "get_into_parts"}


@pytest.mark.parametrize("load_mode", LOAD_MODES)
def test_a_file_store_load_through_the_slow_tier_pays_the_delay(tmp_path: Path, load_mode: str) -> None:
    """Whichever member the store reads with (``get_into_parts`` on the file store), the load waits and
    is counted: a read that bypasses the wrapper would leave the benchmark's tier fast."""
    spec = make_spec(GROUPS, num_blocks=64)
    writer = FileStoreConnector(spec, root=tmp_path)
    MiniEngine(spec, writer).run("first", PROMPT)
    writer.shutdown()
    forget_built()
    reader = SlowFileStoreConnector(make_spec(GROUPS, num_blocks=64), root=tmp_path, read_delay_ms=20,
                                    load_mode=load_mode)
    began = time.perf_counter()
    run = MiniEngine(reader.spec, reader).run("again", [*PROMPT, 1])
    took = time.perf_counter() - began
    reader.shutdown()
    (delayed,) = built()
    assert run.hit_tokens == 96 and not run.load_errors
    assert delayed.reads >= 1 and delayed.read_seconds >= 0.02 * delayed.reads and took >= 0.02
