"""Several processes share one file-store root safely (issue 15): each defect, reproduced.

vLLM's scheduler and workers are processes, each with its own view of the directory. Pins are
leases every process honours (and a dead process cannot leave behind); evicted packs are closed at
once; capacity holds over all of them; reads are chunked; a removed directory is recreated; a
lookup miss never lists the directory; a stack whose build fails shuts down what it built.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from capkv import ConfigError
from capkv.config import BuildContext, build_stack, load_stack
from capkv.connectors import FileStoreConnector
from capkv.connectors import _block_file as block_file
from capkv.connectors import _pack_catalog as pack_catalog
from capkv.connectors._block_file import HEADER_SIZE, RecordHeader, read_values, scan_pack
from capkv.stores import StoreKey
from capkv.stores._checksum import block_identity, checksum
from capkv.stores._keys import BlockKey
from capkv.stores._value import ValueCheck, check_values, pack_header, row_memory
from tests.connectors.conftest import tokens
from tests.connectors.engine import MiniEngine
from tests.paged import Group, make_spec

ROOT = Path(__file__).resolve().parents[2]
WINDOWED = [Group(16), Group(16, window=32)]
PACK_BYTES = 8 * (HEADER_SIZE + 2048)
"""One prompt's blocks (6 + 2 of 2 KiB each), as packs."""


def _spec() -> Any:
    return make_spec(WINDOWED, num_blocks=256)


def _packs(root: Path) -> set[str]:
    return {p.name for p in root.glob("*.kvpack")}


def _fill(engine: MiniEngine, first: int, count: int) -> None:
    for index in range(first, first + count):
        engine.run(f"fill{index}", tokens(500 + index, 100))
        engine.connector.flush()


CHILD = """
import json, sys
from pathlib import Path
from capkv.connectors import FileStoreConnector
from tests.connectors.conftest import tokens
from tests.connectors.engine import MiniEngine
from tests.paged import Group, make_spec
root, capacity = Path(sys.argv[1]), int(sys.argv[2])
spec = make_spec([Group(16), Group(16, window=32)], num_blocks=256)
store = FileStoreConnector(spec, root=root, capacity_bytes=capacity)
names = sorted(p.name for p in root.glob("*.kvpack"))
for name in names:
    store.catalog.pin(name)  # what the scheduler's plan does before a load
print(json.dumps(names), flush=True)
if sys.stdin.readline().strip() != "load":
    raise SystemExit(0)  # killed or told to stop
run = MiniEngine(spec, store, seed=9).run("pinned", tokens(30, 100) + [1])  # checks every byte
print(json.dumps({"hit": run.hit_tokens, "errors": sum(len(i) for i in run.load_errors.values()),
                  "loaded": sum(len(i) for i in run.loaded.values())}), flush=True)
store.close()
"""


def _pinning_child(root: Path, capacity: int) -> tuple[subprocess.Popen[str], list[str]]:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(root), str(capacity)], cwd=ROOT, text=True,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    assert child.stdout is not None
    line = child.stdout.readline()
    if not line:
        child.kill()
        raise AssertionError(f"the pinning process failed: {child.communicate(timeout=30)[1]}")
    return child, json.loads(line)


def test_a_pack_another_process_pinned_is_never_evicted_and_a_dead_ones_pins_do_not_last(tmp_path: Path) -> None:
    spec = _spec()
    capacity = 3 * PACK_BYTES
    with FileStoreConnector(spec, root=tmp_path, capacity_bytes=capacity) as store:
        writer = MiniEngine(spec, store)
        writer.run("first", tokens(30, 100))
        store.flush()
        child, pinned = _pinning_child(tmp_path, capacity)
        try:
            assert pinned and set(pinned) <= _packs(tmp_path)
            _fill(writer, 0, 6)  # twice the capacity: everything unpinned goes
            assert set(pinned) <= _packs(tmp_path)  # the other process's pins held
            assert store.catalog.evictions > 0
            out, err = child.communicate("load\n", timeout=120)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait(timeout=30)
        assert child.returncode == 0, err
        assert json.loads(out.splitlines()[-1]) == {"hit": 96, "errors": 0, "loaded": 8}
        # A process that dies holding pins: the kernel drops its leases, and eviction goes on.
        child, pinned = _pinning_child(tmp_path, capacity)
        child.kill()
        child.wait(timeout=30)
        _fill(writer, 10, 4)
        assert not set(pinned) & _packs(tmp_path)


def test_a_pin_never_succeeds_on_a_pack_that_is_gone(tmp_path: Path) -> None:
    spec = _spec()
    with FileStoreConnector(spec, root=tmp_path) as store:
        MiniEngine(spec, store).run("first", tokens(30, 100))
        store.flush()
        (name, *_) = sorted(_packs(tmp_path))
        record = next(scan_pack(tmp_path / name))
        os.unlink(tmp_path / name)  # another process evicted it
        assert store.files.pin([StoreKey(record.key, record.fingerprint, HEADER_SIZE + record.length)]) == [False]
        assert store.catalog.pin(name) is False


def _deleted_descriptors(root: Path) -> list[str]:
    """This process's open descriptors on files under ``root`` that are gone."""
    found: list[str] = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(root)) and target.endswith("(deleted)"):
            found.append(target)
    return found


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
def test_evicted_packs_are_closed_at_once_also_those_another_process_evicted(tmp_path: Path) -> None:
    spec = _spec()
    capacity = 3 * PACK_BYTES
    with FileStoreConnector(spec, root=tmp_path, capacity_bytes=capacity) as one, FileStoreConnector(
        spec, root=tmp_path, capacity_bytes=capacity
    ) as two:
        writer, reader = MiniEngine(spec, one), MiniEngine(spec, two, seed=2)
        _fill(writer, 0, 2)
        for index in range(2):  # both read every pack
            assert writer.run(f"w{index}", tokens(500 + index, 100) + [1]).hit_tokens == 96
            assert reader.run(f"r{index}", tokens(500 + index, 100) + [1]).hit_tokens == 96
        one.flush()
        two.flush()
        _fill(writer, 2, 6)  # evicts the packs both opened
        assert _deleted_descriptors(tmp_path) == []


def test_capacity_holds_with_two_stores_writing(tmp_path: Path) -> None:
    spec = _spec()
    capacity = 4 * PACK_BYTES
    with FileStoreConnector(spec, root=tmp_path, capacity_bytes=capacity) as one, FileStoreConnector(
        spec, root=tmp_path, capacity_bytes=capacity
    ) as two:
        engines = [MiniEngine(spec, one), MiniEngine(spec, two, seed=2)]
        for index in range(12):
            _fill(engines[index % 2], 100 * (index % 2) + index, 1)
            size = sum(p.stat().st_size for p in tmp_path.glob("*.kvpack"))
            assert size <= capacity, (index, size)


class _ShortReads(ModuleType):
    """``os`` as pack reads see it, whose ``preadv`` moves at most ``limit`` bytes a call (as Linux
    does past 2 GiB, and as any read may)."""

    def __init__(self, limit: int) -> None:
        super().__init__("os")
        self.limit = limit
        self.calls = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    def preadv(self, descriptor: int, buffers: list[Any], offset: int) -> int:
        self.calls += 1
        room = self.limit
        kept: list[memoryview] = []
        for buffer in buffers:
            view = memoryview(buffer).cast("B")
            if room <= 0:
                break
            kept.append(view[:room])
            room -= len(kept[-1])
        return os.preadv(descriptor, kept, offset)


def test_a_short_read_is_not_damage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = _spec()
    with FileStoreConnector(spec, root=tmp_path) as store:
        MiniEngine(spec, store).run("first", tokens(30, 100))
    short = _ShortReads(1000)
    monkeypatch.setattr(block_file, "os", short)
    with FileStoreConnector(spec, root=tmp_path) as store:
        run = MiniEngine(spec, store, seed=3).run("again", tokens(30, 100) + [1])
    assert run.hit_tokens == 96 and run.load_errors == {} and short.calls > 8
    assert not list(tmp_path.glob("*.dead"))


def test_a_read_of_more_than_2_gib_reads_every_record(tmp_path: Path) -> None:
    """256 values of 8 MiB in one call (the most a read run holds): Linux moves at most 2 GiB - 4 KiB
    per call. The pack is sparse (zero payloads), so it costs no disk."""
    size, count, layout = 8 << 20, 256, b"f" * 16
    zeros = bytes(size)
    keys = [StoreKey(BlockKey(0, index.to_bytes(16, "little")), layout, HEADER_SIZE + size) for index in range(count)]
    records: list[RecordHeader] = []
    with open(tmp_path / "sparse.kvpack", "wb") as file:
        for index, key in enumerate(keys):  # headers only: the payloads are holes, read back as zeros
            check = checksum(zeros, block_identity(key.block, layout))
            offset = index * key.nbytes
            file.seek(offset)
            file.write(pack_header(key.block, layout, size, check))
            records.append(RecordHeader(key.block, layout, offset, size, check))
        file.truncate(count * (HEADER_SIZE + size))
    assert [(r.key, r.offset) for r in scan_pack(tmp_path / "sparse.kvpack")] == [(r.key, r.offset) for r in records]
    rows = torch.ones((count, HEADER_SIZE + size), dtype=torch.uint8)
    descriptor = os.open(tmp_path / "sparse.kvpack", os.O_RDONLY)
    try:
        counts = read_values(descriptor, records, [row_memory(rows[index]) for index in range(count)])
    finally:
        os.close(descriptor)
    assert counts == [HEADER_SIZE + size] * count
    assert check_values(rows, keys, counts) == [ValueCheck.OK] * count
    assert not rows[:, HEADER_SIZE:].any()


def test_a_removed_store_directory_is_recreated(tmp_path: Path) -> None:
    spec = _spec()
    root = tmp_path / "store"
    with FileStoreConnector(spec, root=root) as store:
        engine = MiniEngine(spec, store)
        engine.run("first", tokens(30, 100))
        store.flush()
        shutil.rmtree(root)  # an operator cleaning up, a tmpfs remounted
        gone = engine.run("gone", tokens(30, 100) + [1])  # still listed here: offered, then recomputed
        assert gone.loaded == {}
        store.flush()  # the save recreated the directory: nothing failed
        assert root.is_dir() and _packs(root)
        again = engine.run("back", tokens(30, 100) + [2])
        assert again.hit_tokens == 96 and again.load_errors == {}


class _CountingOs(ModuleType):
    def __init__(self) -> None:
        super().__init__("os")
        self.listings = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    def listdir(self, path: Any = ".") -> list[str]:
        self.listings += 1
        return os.listdir(path)

    def scandir(self, path: Any = ".") -> Any:
        self.listings += 1
        return os.scandir(path)


def test_a_lookup_miss_never_lists_the_directory_and_still_sees_the_other_processes_packs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = _spec()
    with FileStoreConnector(spec, root=tmp_path) as one, FileStoreConnector(spec, root=tmp_path) as two:
        reader, writer = MiniEngine(spec, one), MiniEngine(spec, two, seed=2)
        _fill(writer, 0, 3)  # long before: known from the start
        counting = _CountingOs()
        monkeypatch.setattr(pack_catalog, "os", counting)
        writer.run("new", tokens(30, 100))  # the other process's fresh packs
        two.flush()
        assert reader.run("hit", tokens(30, 100) + [1]).hit_tokens == 96  # found without a listing
        for index in range(20):
            assert reader.run(f"miss{index}", tokens(900 + index, 100)).hit_tokens == 0
            writer.run(f"more{index}", tokens(700 + index, 100))  # the directory keeps changing
            two.flush()
        assert counting.listings == 0


def _open_under(root: Path) -> list[str]:
    """This process's open descriptors on files under ``root``."""
    found: list[str] = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(root)):
            found.append(target)
    return found


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
def test_a_stack_whose_build_fails_half_way_shuts_down_what_it_built(tmp_path: Path) -> None:
    """The file store built first holds the directory's journal open (and would start writer threads
    with its first save): a build that fails after it must close it."""
    spec = _spec()
    config = {
        "kv_connector": "MultiConnector",
        "kv_connector_extra_config": {"connectors": [
            {"kv_connector": "FileStoreConnector", "kv_connector_extra_config": {"root": str(tmp_path)}},
            {"kv_connector": "tests.config.sample_connectors:BrokenConnector"},
        ]},
    }
    with pytest.raises(ConfigError, match="cannot reach the backing service"):
        build_stack(load_stack(config), context=BuildContext(spec=spec))
    assert _open_under(tmp_path) == []


def test_every_connector_a_failed_build_made_is_shut_down_nested_ones_too() -> None:
    from tests.config.sample_connectors import ShutdownRecorder

    recorder = "tests.config.sample_connectors:ShutdownRecorder"
    config = {
        "kv_connector": "MultiConnector",
        "kv_connector_extra_config": {"connectors": [
            {"kv_connector": recorder},
            {"kv_connector": "MultiConnector", "kv_connector_extra_config": {"connectors": [
                {"kv_connector": recorder},
                {"kv_connector": "tests.config.sample_connectors:BrokenConnector"},
            ]}},
        ]},
    }
    ShutdownRecorder.shut_down.clear()
    with pytest.raises(ConfigError, match="cannot reach the backing service"):
        build_stack(load_stack(config))
    assert len(ShutdownRecorder.shut_down) == 2 and len(set(map(id, ShutdownRecorder.shut_down))) == 2
