"""The one writer: whatever a batch raises, its saves fail once, the writer goes on, and close never hangs."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from capkv import ContractError
from capkv.connectors import FileStoreConnector
from capkv.stores import MemoryBackend, StoreConnector, StoreKey
from tests.connectors.conftest import tokens
from tests.connectors.engine import MiniEngine
from tests.paged import Group, make_spec

WINDOWED = [Group(16), Group(16, window=32)]
PROMPT = tokens(30, 100)
BLOCKS = 8  # PROMPT's computed full blocks the engine still holds at finish: 6 full-attention, 2 in the window


class Faulty(MemoryBackend):
    """A memory backend whose next ``put`` raises ``error``, or answers ``answer`` (wrong-shaped) instead."""

    def __init__(self) -> None:
        super().__init__()
        self.error: BaseException | None = None
        self.answer: list[bool] | None = None
        self.hold: threading.Event | None = None

    def put(self, items: Sequence[tuple[StoreKey, memoryview]], /) -> list[bool]:
        if self.hold is not None:
            self.hold.wait(60)
        if self.error is not None:
            error, self.error = self.error, None
            raise error
        if self.answer is not None:
            answer, self.answer = self.answer, None
            return answer
        return super().put(items)


def _engine(backend: MemoryBackend, *, background: bool | None = True) -> MiniEngine:
    spec = make_spec(WINDOWED, num_blocks=64)
    return MiniEngine(spec, StoreConnector(spec, backend, background=background))


def _failed_saves(engine: MiniEngine) -> int:
    stats = engine.connector.get_kv_connector_stats() or {}
    return int(stats.get("failed_save_blocks", 0))


@pytest.mark.parametrize("background", [True, False], ids=["background", "inline"])
@pytest.mark.parametrize(
    "fault",
    [OSError(28, "No space left on device"), MemoryError(), RuntimeError("a bug in the backend"), KeyboardInterrupt()],
    ids=["OSError", "MemoryError", "RuntimeError", "KeyboardInterrupt"],
)
def test_a_raising_put_fails_its_saves_once_and_the_writer_goes_on(fault: BaseException, background: bool) -> None:
    backend = Faulty()
    engine = _engine(backend, background=background)
    backend.error = fault
    engine.run("first", PROMPT)
    with pytest.raises(BaseException) as raised:
        engine.connector.flush()
    assert raised.value is fault or (isinstance(raised.value, RuntimeError) and repr(fault) in str(raised.value))
    engine.step()  # the report of the failed saves
    failed = _failed_saves(engine)  # the first put's batch: group 0's six blocks, with or without the window's two
    assert failed in (6, BLOCKS) and len(backend.values) == BLOCKS - failed
    engine.connector.flush()  # raised once: nothing left to raise
    again = engine.run("again", PROMPT + [1])  # group 0 is missing: a miss, and its saves are planned again
    assert again.hit_tokens == 0
    engine.connector.flush()
    assert len(backend.values) == BLOCKS
    assert engine.run("third", PROMPT + [2]).hit_tokens == 96  # the writer survived: these landed
    engine.connector.close()


def test_a_wrong_shaped_answer_fails_the_batch_with_a_contract_error() -> None:
    backend = Faulty()
    engine = _engine(backend)
    backend.answer = [True]  # one answer for eight values
    engine.run("first", PROMPT)
    with pytest.raises(ContractError, match="answered 1 results for"):
        engine.connector.flush()
    engine.step()
    assert _failed_saves(engine) in (6, BLOCKS)
    engine.connector.close()


def test_close_never_hangs_on_a_stuck_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    from capkv.stores import _writer

    backend = Faulty()
    backend.hold = threading.Event()  # every put blocks until released
    engine = _engine(backend)
    engine.run("first", PROMPT)
    original = _writer.Writer.close
    monkeypatch.setattr(_writer.Writer, "close", lambda self, timeout_s=60.0: original(self, 0.5))
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="still running"):
        engine.connector.close()
    assert time.monotonic() - started < 10
    backend.hold.set()


def test_a_file_store_writer_survives_a_failure_after_the_pack_is_written(tmp_path: Path) -> None:
    """Issue 15: an exception outside the old writer's narrow ``try`` (here: adding the written pack to the
    catalog) killed the writer thread, and ``flush``/``close`` then waited forever."""
    spec = make_spec(WINDOWED, num_blocks=64)
    connector = FileStoreConnector(spec, root=tmp_path)
    engine = MiniEngine(spec, connector)
    original = connector.catalog.add
    calls = {"n": 0}

    def add_once_failing(*args: object, **kwargs: object) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("catalog failure (injected)")
        original(*args, **kwargs)  # type: ignore[arg-type]

    connector.catalog.add = add_once_failing  # type: ignore[method-assign]
    engine.run("first", PROMPT)
    outcome: list[BaseException | None] = []

    def flush() -> None:
        try:
            connector.flush()
            outcome.append(None)
        except BaseException as error:  # noqa: BLE001
            outcome.append(error)

    flusher = threading.Thread(target=flush, daemon=True)
    flusher.start()
    flusher.join(30)
    assert not flusher.is_alive(), "flush hung: the writer thread died"
    assert isinstance(outcome[0], RuntimeError) and "injected" in str(outcome[0])
    engine.step()
    assert _failed_saves(engine) in (6, BLOCKS)  # the pack that was written but never listed
    engine.run("again", PROMPT + [1])  # saved again, and this time it lands
    connector.flush()
    assert engine.run("third", PROMPT + [2]).hit_tokens == 96
    connector.close()


def test_save_rows_are_reused_only_once_their_write_is_over(monkeypatch: pytest.MonkeyPatch) -> None:
    """Saves gather into host rows the store keeps: rows go back for reuse only after the backend's
    ``put`` returned, so saves started while a write is stuck get other rows, and every value lands intact."""
    from capkv.transfer import BlockCopier

    allocations: list[int] = []
    host_rows = BlockCopier.host_rows
    monkeypatch.setattr(
        BlockCopier, "host_rows", lambda self, n, size: allocations.append(n * size) or host_rows(self, n, size)
    )
    backend = Faulty()
    backend.hold = threading.Event()  # every put waits until the test releases it
    engine = _engine(backend)
    other = tokens(31, 100)
    engine.run("first", PROMPT)  # its rows are held by the stuck put
    engine.run("second", other)  # gathered meanwhile: into other rows, or the first values would change
    backend.hold.set()
    engine.connector.flush()
    assert len(backend.values) == 2 * BLOCKS
    engine.step()
    before = len(allocations)
    assert engine.run("third", tokens(32, 100)).hit_tokens == 0  # saves of the same sizes: rows reused
    engine.connector.flush()
    assert len(allocations) == before
    for name, prompt in (("first again", PROMPT), ("second again", other)):  # bit-exact, checked by the engine
        run = engine.run(name, prompt + [1])
        assert run.hit_tokens == 96 and run.load_errors == {}
    engine.connector.close()


def test_a_full_background_writer_drops_saves_counted_and_they_are_saved_once_it_keeps_up() -> None:
    """Backpressure: while the saves in flight fill the writer's bound, new ones are dropped (never a
    stalled step), counted in ``dropped_save_blocks``, and stay saveable."""
    backend = Faulty()
    backend.hold = threading.Event()
    engine = _engine(backend)
    connector = engine.connector
    engine.run("first", PROMPT)  # registers the KV cache; its saves now wait in the backend's put
    writer = connector._store._writer
    assert writer is not None
    writer._max_pending_bytes = 1  # one save in flight fills it
    began = time.monotonic()
    engine.run("second", tokens(31, 100))
    assert time.monotonic() - began < 30  # the step never waited for the held put (60 s)
    stats = connector.get_kv_connector_stats() or {}
    assert stats.get("dropped_save_blocks", 0) == BLOCKS
    backend.hold.set()
    connector.flush()
    writer._max_pending_bytes = 1 << 30
    engine.run("second again", tokens(31, 100))  # dropped, so not held: saved now
    connector.flush()
    assert len(backend.values) == 2 * BLOCKS


def test_background_saves_checksum_on_the_writer_and_load_back_exact() -> None:
    engine = _engine(MemoryBackend())
    engine.run("first", PROMPT)
    engine.connector.flush()
    assert engine.run("again", PROMPT + [1]).load_errors == {}
