"""Asynchronous loads: a backend that declares its reads slow is read on the store's reader thread.

The engine's step never waits for such a read; the request is reported received
(``get_finished``'s second set) once its blocks are in the KV cache, its failed
blocks as load errors by then, and the pins of its load last until it is over.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import pytest

from capkv import finish_request
from capkv.errors import ConfigError
from capkv.stores import MemoryBackend, StoreConnector, StoreKey
from tests.connectors.conftest import tokens
from tests.connectors.engine import MiniEngine, Req
from tests.paged import Group, make_spec

WINDOWED = [Group(16), Group(16, window=32)]
PROMPT = tokens(30, 100)


class Gated(MemoryBackend):
    """Slow reads that wait for ``gate`` (bounded), and may raise."""

    slow = True

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.gate.set()
        self.broken = False
        self.reader_threads: set[str] = set()

    def get(self, keys: Sequence[StoreKey], /) -> list[bytes | None]:
        self.reader_threads.add(threading.current_thread().name)
        if not self.gate.wait(timeout=30):
            raise TimeoutError("the test never opened the gate")
        if self.broken:
            raise ConnectionError("backend down")
        return super().get(keys)


def _seeded(backend: MemoryBackend) -> MiniEngine:
    spec = make_spec(WINDOWED, num_blocks=64)
    engine = MiniEngine(spec, StoreConnector(spec, backend))
    engine.run("seed", PROMPT)
    engine.connector.flush()
    return engine


def _start(engine: MiniEngine, request_id: str) -> tuple[Req, tuple[list[int], ...], int]:
    """Look up, allocate and plan a load by hand (as vLLM does for ``load_async=True``), then step once."""
    request = Req(request_id, PROMPT + [1])
    offered, load_async = engine.connector.get_num_new_matched_tokens(request, 0)
    assert (offered, load_async) == (96, True)
    blocks = engine._allocate(len(request.all_token_ids), offered)
    engine.connector.update_state_after_alloc(request, blocks, offered)
    request.num_computed_tokens = offered  # as vLLM sets it while the request waits for its KV
    return request, blocks, offered


def test_a_slow_backend_loads_in_the_background_and_the_kv_is_exact() -> None:
    backend = Gated()
    engine = _seeded(backend)
    run = engine.run("again", PROMPT + [1])  # the engine checks every loaded block bit for bit
    assert run.hit_tokens == 96 and run.load_errors == {}
    assert sum(len(ids) for ids in run.loaded.values()) == 8
    assert backend.reader_threads and all("reader" in name for name in backend.reader_threads)


def test_fast_backends_stay_synchronous() -> None:
    engine = _seeded(MemoryBackend())  # slow = False
    _, load_async = engine.connector.get_num_new_matched_tokens(Req("r", PROMPT + [1]), 0)
    assert load_async is False and engine.connector.loads_async is False


def test_slow_is_part_of_the_contract() -> None:
    """A ``slow`` that is not a bool is refused by name; a backend written without it (or with it misspelt)
    loads synchronously, warned about."""

    class Unsure(MemoryBackend):
        slow = "yes"  # type: ignore[assignment]

    with pytest.raises(ConfigError, match=r"StoreConnector: the backend Unsure declares slow = 'yes'; it must be True or False"):
        StoreConnector(make_spec(WINDOWED, num_blocks=64), Unsure())

    class Old:  # the contract before 0.3.0: no slow
        def __init__(self) -> None:
            self.inner = MemoryBackend()
            self.contains, self.get, self.put = self.inner.contains, self.inner.get, self.inner.put
            self.delete, self.close = self.inner.delete, self.inner.close

    with pytest.warns(DeprecationWarning, match=r"the backend Old does not declare slow .* Set slow = True"):
        store = StoreConnector(make_spec(WINDOWED, num_blocks=64), Old())  # type: ignore[arg-type]
    assert store.loads_async is False
    store.close()


def test_the_step_does_not_wait_for_a_slow_read_and_pins_last_until_it_is_over() -> None:
    backend = Gated()
    engine = _seeded(backend)
    request, blocks, _ = _start(engine, "parked")
    backend.gate.clear()
    began = time.monotonic()
    for _ in range(3):
        engine.step()
    assert time.monotonic() - began < 10  # far below the gate's 30 s: the steps never waited for the read
    assert "parked" not in engine.received
    scheduler = engine.connector._scheduler
    assert scheduler._pinned_by_step  # the keys being read cannot be evicted yet
    backend.gate.set()
    errors = engine._receive("parked")
    assert errors == {}
    for group, described in enumerate(engine.spec.groups):
        for index in range(96 // (described.block_size or 1)):
            block_id = blocks[group][index]
            if block_id != engine.spec.null_block_id:
                assert engine.wrong_positions(request, group, index, block_id) == []
    engine.step()
    assert not scheduler._pinned_by_step


def test_a_failed_background_read_is_reported_with_the_receive_and_raised_once() -> None:
    backend = Gated()
    engine = _seeded(backend)
    backend.broken = True
    _start(engine, "unlucky")
    engine.step()
    errors = engine._receive("unlucky")
    assert sum(len(ids) for ids in errors.values()) == 8  # every block it was promised
    with pytest.raises(ConnectionError):
        engine.connector.flush()
    engine.connector.flush()  # raised once


def test_a_request_finished_while_its_load_runs_saves_nothing_and_is_still_received() -> None:
    backend = Gated()
    engine = _seeded(backend)
    request, blocks, _ = _start(engine, "aborted")
    backend.gate.clear()
    engine.step()
    backend.values.clear()  # evicted meanwhile (by another engine, say): the blocks' keys are not held
    delay_free, _ = finish_request(engine.connector, request, blocks)
    assert delay_free is False  # the engine holds the blocks until the receive, and frees them once
    metadata = engine.connector.build_connector_meta(None)
    assert metadata.saves == () and metadata.step_saves == ()
    engine.connector.bind_connector_metadata(metadata)
    engine.connector.start_load_kv(None)
    engine.connector.clear_connector_metadata()
    backend.gate.set()
    errors = engine._receive("aborted")
    assert sum(len(ids) for ids in errors.values()) == 8  # the values were gone when the read ran
    engine.connector.flush()
    assert backend.values == {}  # the blocks the load never filled were not saved


def test_close_waits_for_a_load_in_flight() -> None:
    backend = Gated()
    engine = _seeded(backend)
    _start(engine, "closing")
    backend.gate.clear()
    engine.step()
    threading.Timer(0.2, backend.gate.set).start()
    engine.connector.close()
    assert backend.gate.is_set()


def test_may_load_async_says_yes_only_for_a_request_whose_first_block_a_slow_store_holds() -> None:
    """vLLM 0.34 asks each time a request enters a waiting queue: one key looked up in the local index."""
    engine = _seeded(Gated())
    store = engine.connector
    assert store.may_load_async(Req("held", PROMPT + [1])) is True
    assert store.may_load_async(Req("other", tokens(7, 100))) is False  # another prefix
    assert store.may_load_async(Req("short", PROMPT[:16])) is False  # no whole block before the last token
    fast = _seeded(MemoryBackend()).connector
    assert fast.may_load_async(Req("held", PROMPT + [1])) is False  # a fast store loads synchronously


def test_a_background_load_writes_a_kv_cache_made_in_inference_mode() -> None:
    """vLLM makes its KV cache under ``torch.inference_mode()``, which is per thread: a load scattered on the
    store's reader thread outside it failed every time ("Inplace update to inference tensor outside
    InferenceMode"), for a slow backend that reads into the store's rows (``get_into``; on CUDA, every one)."""
    import torch

    class SlowInto(MemoryBackend):
        slow = True

        def get_into(self, keys: Sequence[StoreKey], buffers: Sequence[memoryview], /) -> list[int | None]:
            read: list[int | None] = []
            for key, buffer in zip(keys, buffers, strict=True):
                value = self.values.get(key)
                if value is not None:
                    buffer[: len(value)] = value
                read.append(None if value is None else len(value))
            return read

    spec = make_spec(WINDOWED, num_blocks=64)
    with torch.inference_mode():
        engine = MiniEngine(spec, StoreConnector(spec, SlowInto()))
        engine.run("seed", PROMPT)
    engine.connector.flush()
    with torch.inference_mode():  # the engine's thread; the store's reader thread is not
        run = engine.run("again", PROMPT + [1])
    assert run.hit_tokens == 96 and run.load_errors == {}, run.load_errors
    engine.connector.close()
