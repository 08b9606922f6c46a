"""The six defects issue 9 confirmed, one test each, written against what both the old and the new
stores offer (constructors, the engine protocol, ``os``), so each was seen failing on the old code
(main at 70028fb) and passing now.
"""

from __future__ import annotations

import errno
import gc
import os
import resource
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from capkv.connectors import CPUOffloadConnector, FileStoreConnector
from capkv.engine import Engine, ModelShape
from capkv.engine._request import Request
from tests.connectors.conftest import tokens
from tests.connectors.engine import MiniEngine
from tests.paged import Group, empty_caches, make_spec

WINDOWED = [Group(16), Group(16, window=32)]
PROMPT = tokens(30, 100)  # six full blocks in group 0; the window needs two of group 1's


def _stored(root: Path) -> None:
    spec = make_spec(WINDOWED, num_blocks=64)
    connector = FileStoreConnector(spec, root=root)
    MiniEngine(spec, connector).run("first", PROMPT)
    connector.shutdown()


def _files(root: Path) -> set[str]:
    return {p.name for p in root.iterdir() if not p.name.startswith(".")}


def test_1_running_out_of_file_descriptors_during_a_load_keeps_every_file(tmp_path: Path) -> None:
    """EMFILE during one load took a store from 8 block files to 0."""
    _stored(tmp_path)
    before = _files(tmp_path)
    spec = make_spec(WINDOWED, num_blocks=64)
    connector = FileStoreConnector(spec, root=tmp_path)
    files = connector.files
    reads = {name: getattr(files, name) for name in ("get_into", "get_into_parts")}  # on the reader thread

    def starving(read: Any) -> Any:
        def starved(keys: Any, buffers: Any, /, **options: Any) -> Any:
            soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            probe = os.open(os.devnull, os.O_RDONLY)  # the next descriptor number: at the limit, nothing opens
            os.close(probe)
            resource.setrlimit(resource.RLIMIT_NOFILE, (probe, hard))
            try:
                return read(keys, buffers, **options)
            finally:
                resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

        return starved

    for name, read in reads.items():
        setattr(files, name, starving(read))
    engine = MiniEngine(spec, connector)
    run = engine.run("starved", PROMPT + [1])
    assert run.hit_tokens == 96 and sum(len(ids) for ids in run.load_errors.values()) == 8
    assert _files(tmp_path) == before  # a failed read says nothing about the file: all kept
    for name, read in reads.items():
        setattr(files, name, read)
    assert engine.run("fed", PROMPT + [2]).load_errors == {}
    connector.shutdown()


@pytest.fixture
def full_disk(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Every atomic rename (the last step of every store write) fails with ENOSPC; the attempts."""
    attempts: list[int] = []
    real = os.replace

    def no_space(source: Any, target: Any) -> None:
        if str(target).endswith((".kvblock", ".kvpack")):
            attempts.append(1)
            raise OSError(errno.ENOSPC, "No space left on device (injected)")
        real(source, target)

    monkeypatch.setattr(os, "replace", no_space)
    yield attempts


def _injected() -> list[BaseException]:
    gc.collect()
    return [o for o in gc.get_objects() if type(o) is OSError and "(injected)" in str(o)]


def test_2_write_failures_are_each_raised_once_and_not_kept(tmp_path: Path, full_disk: list[int]) -> None:
    """40 failures with a full disk: 1 raised, 39 never, and all kept forever with their frames and buffers."""
    spec = make_spec(WINDOWED, num_blocks=512)
    connector = FileStoreConnector(spec, root=tmp_path)
    engine = MiniEngine(spec, connector)
    for index in range(40):
        engine.run(f"r{index}", tokens(100 + index, 40))
    raised: list[BaseException] = []
    for _ in range(3):  # however often it is asked, each failure comes out once
        try:
            connector.flush()
        except ExceptionGroup as group:
            raised += group.exceptions
            message = str(group)
        except OSError as error:
            raised.append(error)
            message = ""
    kept = 64
    assert len(full_disk) > 1  # several writes failed (one per pack here; one per block on the old store)
    assert len(raised) == min(len(full_disk), kept)
    assert len(raised) == len(full_disk) or f"{len(full_disk)} background writes failed" in message
    assert all(error.__traceback__ is None or len(raised) == 1 for error in raised)
    del raised
    assert _injected() == []  # nothing retained once raised
    connector.shutdown()


def _external_hits(store: CPUOffloadConnector, prompt: list[int], runs: int) -> list[int]:
    shape = ModelShape(num_layers=1, pattern="F", num_kv_heads=1, head_dim=8, block_size=16, num_blocks=64)
    engine = Engine(shape, store)
    hits: list[int] = []
    for index in range(runs):
        engine.reset_prefix_cache()
        engine.stats.reset()
        engine.run([Request(f"r{index}", prompt, max_tokens=2)])
        hits.append(engine.stats.external_hit_tokens)
    return hits


def test_3_a_4_slot_pool_serving_a_6_block_prompt_keeps_the_head_of_the_chain() -> None:
    """The pool evicted the chain's head first: 0, 64, 0, 64 ... tokens. Six blocks cannot fit in four
    slots, so the best any pool can do is the first four blocks (64 tokens) on every run after the first."""
    shape = ModelShape(num_layers=1, pattern="F", num_kv_heads=1, head_dim=8, block_size=16, num_blocks=64)
    store = CPUOffloadConnector(shape.kv_spec(), capacity_blocks=4)
    assert _external_hits(store, tokens(9, 6 * 16 + 1), 6) == [0, 64, 64, 64, 64, 64]


def test_4_blocks_of_another_layout_are_not_offered_and_do_not_stop_this_engines_saves(tmp_path: Path) -> None:
    """Another layout's files were offered on every lookup, failed every load, and this engine never saved its own."""
    _stored(tmp_path)  # the flash layout
    flash_files = _files(tmp_path)
    spec = make_spec(WINDOWED, num_blocks=64, layout="hnd")
    hnd = FileStoreConnector(spec, root=tmp_path)
    engine = MiniEngine(spec, hnd, layout="hnd")
    for index in range(2):
        run = engine.run(f"hnd{index}", PROMPT + [index])
        hnd.flush()
        assert run.load_errors == {}
        assert run.hit_tokens == (0 if index == 0 else 96)  # nothing foreign offered; its own copy saved
    assert flash_files < _files(tmp_path)  # the flash engine's files are left alone
    hnd.shutdown()
    flash_spec = make_spec(WINDOWED, num_blocks=64)
    flash = FileStoreConnector(flash_spec, root=tmp_path)
    again = MiniEngine(flash_spec, flash, seed=4).run("flash", PROMPT + [3])
    assert again.hit_tokens == 96 and again.load_errors == {}
    flash.shutdown()


@pytest.fixture
def held_fsync(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """The store's writer waits before its fsync until the test sets the event."""
    gate = threading.Event()
    real = os.fsync

    def held(descriptor: int) -> None:
        if threading.current_thread() is not threading.main_thread() and not gate.wait(timeout=60):
            raise AssertionError("the test never released the writer")
        real(descriptor)

    monkeypatch.setattr(os, "fsync", held)
    yield gate
    gate.set()


def test_5_the_layout_is_taken_when_the_save_starts(tmp_path: Path, held_fsync: threading.Event) -> None:
    """Re-registering another layout while writes were queued stamped old bytes with the new layout:
    a reader of the new layout loaded wrong KV that passed every header and CRC check."""
    spec = make_spec(WINDOWED, num_blocks=64)
    connector = FileStoreConnector(spec, root=tmp_path)
    MiniEngine(spec, connector).run("flash", PROMPT)  # its writes wait at the fsync
    hnd_spec = make_spec(WINDOWED, num_blocks=64, layout="hnd")
    connector.register_kv_caches(empty_caches(hnd_spec, "hnd"))  # another layout while the writes wait
    held_fsync.set()
    connector.flush()
    connector.shutdown()
    hnd = FileStoreConnector(hnd_spec, root=tmp_path)
    # The MiniEngine checks every loaded block bit for bit: flash bytes read as hnd would fail it.
    run = MiniEngine(hnd_spec, hnd, layout="hnd").run("hnd", PROMPT + [1])
    assert run.hit_tokens == 0 and run.load_errors == {}
    hnd.shutdown()


def test_6_the_file_store_is_bounded(tmp_path: Path) -> None:
    """The file store had no capacity bound."""
    spec = make_spec(WINDOWED, num_blocks=256)
    block_bytes = 2 * 16 * 2 * 8 * 2 * 2  # K and V, 16 tokens, 2 heads of 8, float16, 2 layers per group
    capacity = 3 * 8 * (block_bytes + 512)
    make: Callable[..., FileStoreConnector] = FileStoreConnector
    connector = make(spec, root=tmp_path, capacity_bytes=capacity)
    engine = MiniEngine(spec, connector)
    prompts = [tokens(200 + i, 100) for i in range(8)]
    for index, prompt in enumerate(prompts):
        engine.run(f"p{index}", prompt)
        connector.flush()
        assert sum(p.stat().st_size for p in tmp_path.iterdir()) <= capacity
    assert engine.run("newest", prompts[-1] + [1]).hit_tokens == 96  # what was used last is kept
    assert engine.run("oldest", prompts[0] + [1]).hit_tokens == 0
    connector.shutdown()
