"""FileStoreConnector: survives a restart, and never reads back a half-written or damaged block."""

from __future__ import annotations

import dataclasses
import errno
import gc
import json
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch

from capkv import ConfigError
from capkv.connectors import _file_store as file_store

from capkv.connectors import FileStoreConnector
from capkv.connectors._block_file import (
    HEADER_SIZE,
    PackRecord,
    RecordHeader,
    read_values,
    scan_pack,
    sweep_temporary_files,
    write_pack,
)
from capkv.stores import StoreKey
from capkv.stores._checksum import block_identity, payload_checksums
from capkv.stores._keys import BlockKey
from capkv.stores._value import ValueCheck, check_values, row_memory
from tests.connectors.conftest import tokens
from tests.connectors.engine import MiniEngine
from tests.paged import Group, empty_caches, make_spec

ROOT = Path(__file__).resolve().parents[2]
WINDOWED = [Group(16), Group(16, window=32)]
PROMPT = tokens(30, 100)

CHILD_PRELUDE = """
import json, sys
from capkv.connectors import FileStoreConnector
from tests.connectors.conftest import tokens
from tests.connectors.engine import MiniEngine
from tests.paged import Group, empty_caches, make_spec
spec = make_spec([Group(16), Group(16, window=32)], num_blocks=64)
"""


def _child(code: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", CHILD_PRELUDE + code, *args],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def _store(tmp_path: Path) -> None:
    spec = make_spec(WINDOWED, num_blocks=64)
    connector = FileStoreConnector(spec, root=tmp_path)
    MiniEngine(spec, connector).run("first", PROMPT)
    connector.shutdown()


def test_a_new_process_finds_and_loads_the_blocks(tmp_path: Path) -> None:
    _store(tmp_path)
    child = _child(
        """
engine = MiniEngine(spec, FileStoreConnector(spec, root=sys.argv[1]), seed=5)
run = engine.run("reopened", tokens(30, 100) + [1])
print(json.dumps({"hit": run.hit_tokens, "loaded": {g: len(ids) for g, ids in run.loaded.items()},
                  "errors": {g: sorted(ids) for g, ids in run.load_errors.items()}}))
""",
        str(tmp_path),
    )
    out, err = child.communicate(timeout=120)
    assert child.returncode == 0, err  # the child's engine checks every loaded block bit for bit
    assert json.loads(out) == {"hit": 96, "loaded": {"0": 6, "1": 2}, "errors": {}}


def test_a_writer_killed_mid_write_leaves_nothing_that_is_read_back(tmp_path: Path) -> None:
    marker = tmp_path / "writing"
    store = tmp_path / "store"
    child = _child(
        """
import os, time
def stall(fd):  # the block's bytes are in the temporary file; the process dies before the rename
    open(sys.argv[2], "w").close()
    time.sleep(600)
os.fsync = stall
engine = MiniEngine(spec, FileStoreConnector(spec, root=sys.argv[1]))
engine.run("first", tokens(30, 100))
time.sleep(600)
""",
        str(store), str(marker),
    )
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            if child.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"the writer never started: {child.communicate()[1]}")
            time.sleep(0.05)
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    leftovers = [p for p in os.listdir(store) if p.endswith(".tmp")]
    assert leftovers and not [p for p in os.listdir(store) if p.endswith(".kvpack")]

    spec = make_spec(WINDOWED, num_blocks=64)
    reopened = FileStoreConnector(spec, root=store)  # sweeps the dead writer's temporary file
    assert not [p for p in os.listdir(store) if p.endswith(".tmp")]
    engine = MiniEngine(spec, reopened)
    assert engine.run("again", PROMPT + [1]).hit_tokens == 0


def _packs(root: Path) -> list[Path]:
    return sorted(root.glob("*.kvpack"))


def test_a_truncated_pack_offers_only_its_intact_records(tmp_path: Path) -> None:
    _store(tmp_path)
    for victim in _packs(tmp_path):
        with open(victim, "r+b") as file:
            file.truncate(victim.stat().st_size // 2)
    spec = make_spec(WINDOWED, num_blocks=64)
    run = MiniEngine(spec, FileStoreConnector(spec, root=tmp_path)).run("again", PROMPT + [1])
    assert run.hit_tokens < 96 and run.load_errors == {}  # what is offered loads bit-exact


def test_a_corrupted_block_is_reported_never_copied_and_dropped(tmp_path: Path) -> None:
    _store(tmp_path)
    victim = _packs(tmp_path)[0]
    first = next(scan_pack(victim))
    with open(victim, "r+b") as file:
        file.seek(first.offset + HEADER_SIZE + 100)
        byte = file.read(1)
        file.seek(first.offset + HEADER_SIZE + 100)
        file.write(bytes([byte[0] ^ 0x40]))
    spec = make_spec(WINDOWED, num_blocks=64)
    engine = MiniEngine(spec, FileStoreConnector(spec, root=tmp_path))
    run = engine.run("again", PROMPT + [1])
    assert run.hit_tokens == 96  # the record looked complete
    assert list(run.load_errors) == [first.key.group] and len(run.load_errors[first.key.group]) == 1
    (bad_block,) = run.load_errors[first.key.group]
    assert len(run.loaded[0]) + len(run.loaded[1]) == 7  # every other block was loaded bit-exact
    assert bad_block not in run.loaded.get(first.key.group, [])
    # The damaged record was dropped (a tombstone; its pack's good records stay); the engine
    # recomputed the block and the store saved it afresh.
    assert victim.exists() and len(list(tmp_path.glob("*.dead"))) == 1
    engine.connector.flush()
    third = engine.run("third", PROMPT + [2])
    assert third.hit_tokens == 96 and third.load_errors == {}
    # Another process sees the tombstone and never offers the damaged record.
    fresh = MiniEngine(spec, FileStoreConnector(spec, root=tmp_path), seed=3).run("fresh", PROMPT + [3])
    assert fresh.hit_tokens == 96 and fresh.load_errors == {}


def test_a_pack_is_values_back_to_back_and_reads_them_back(tmp_path: Path) -> None:
    """A pack adds nothing to the store's values: its records' headers are its index, a record read back
    is the value as sealed, and the store's checks (tests/stores/test_value.py) see damage in it."""
    keys = [BlockKey(1, b"k" * 16), BlockKey(0, b"o" * 16)]
    layout = b"f" * 16
    payloads = torch.arange(2 * 1024, dtype=torch.int64).remainder(251).to(torch.uint8).view(2, 1024)
    sums = payload_checksums(payloads, [block_identity(k, layout) for k in keys])
    name, records = write_pack(
        tmp_path, [PackRecord(k, layout, row_memory(payloads[i]), sums[i]) for i, k in enumerate(keys)]
    )
    assert list(scan_pack(tmp_path / name)) == records
    assert [r.offset for r in records] == [0, HEADER_SIZE + 1024]
    store_keys = [StoreKey(k, layout, HEADER_SIZE + 1024) for k in keys]
    rows = torch.zeros((2, HEADER_SIZE + 1024), dtype=torch.uint8)
    descriptor = os.open(tmp_path / name, os.O_RDONLY)
    try:
        counts = read_values(descriptor, records, [row_memory(rows[0]), row_memory(rows[1])])
    finally:
        os.close(descriptor)
    assert counts == [HEADER_SIZE + 1024] * 2 and torch.equal(rows[:, HEADER_SIZE:], payloads)
    assert check_values(rows, store_keys, counts) == [ValueCheck.OK, ValueCheck.OK]
    with open(tmp_path / name, "r+b") as file:  # a pack cut in its second record
        file.truncate(HEADER_SIZE + 1024 + HEADER_SIZE + 10)
    assert list(scan_pack(tmp_path / name)) == records[:1]
    descriptor = os.open(tmp_path / name, os.O_RDONLY)
    try:
        counts = read_values(descriptor, records, [row_memory(rows[0]), row_memory(rows[1])])
    finally:
        os.close(descriptor)
    assert counts == [HEADER_SIZE + 1024, HEADER_SIZE + 10]
    assert check_values(rows, store_keys, counts) == [ValueCheck.OK, ValueCheck.DAMAGED]


def test_sweep_removes_only_dead_writers_temporary_files(tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)
    mine = tmp_path / f".aa.kvpack.{os.getpid()}.tmp"
    theirs = tmp_path / f".bb.kvpack.{dead.stdout.strip()}.tmp"
    mine.write_bytes(b"partial")
    theirs.write_bytes(b"partial")
    assert sweep_temporary_files(tmp_path) == 1
    assert mine.exists() and not theirs.exists()


# ---- defects of issue 9 --------------------------------------------------------------------------


class _Flaky:
    """``os`` as the file store sees it, whose ``open`` of a pack fails with ``code`` while armed."""

    def __init__(self, code: int) -> None:
        self.code = code
        self.armed = False

    def __getattr__(self, name: str) -> object:
        return getattr(os, name)

    def open(self, path: object, flags: int, *args: object) -> int:
        if self.armed and str(path).endswith(".kvpack"):
            raise OSError(self.code, os.strerror(self.code), str(path))
        return os.open(path, flags, *args)  # type: ignore[arg-type]


@pytest.mark.parametrize("code", [errno.EMFILE, errno.EIO, errno.EACCES])
def test_a_read_error_that_is_not_absence_fails_the_load_and_keeps_the_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    """Defect 1, every errno: any OSError but "not found" was taken for damage and the file deleted."""
    _store(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    flaky = _Flaky(code)
    monkeypatch.setattr(file_store, "os", flaky)
    spec = make_spec(WINDOWED, num_blocks=64)
    engine = MiniEngine(spec, FileStoreConnector(spec, root=tmp_path))
    flaky.armed = True
    run = engine.run("again", PROMPT + [1])
    flaky.armed = False
    assert run.hit_tokens == 96 and sum(len(ids) for ids in run.load_errors.values()) == 8
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) >= before  # nothing removed
    assert not list(tmp_path.glob("*.dead"))
    retry = engine.run("retry", PROMPT + [2])  # the next step's load works: the files were kept
    assert retry.hit_tokens == 96 and retry.load_errors == {}


def test_the_store_is_a_context_manager(tmp_path: Path) -> None:
    spec = make_spec(WINDOWED, num_blocks=64)
    with FileStoreConnector(spec, root=tmp_path) as connector:
        MiniEngine(spec, connector).run("one", PROMPT)
    assert _packs(tmp_path)  # closing waited for the writes
    with pytest.raises(ConfigError, match="capacity_bytes"):
        FileStoreConnector(spec, root=tmp_path, capacity_bytes=0)


def test_two_stores_sharing_a_root_evict_each_others_packs_safely(tmp_path: Path) -> None:
    """Two engines (each with its own view of the directory, as two processes have) share one bounded
    root: what one evicts the other finds gone (a miss, or a load error it recomputes), an open pack
    stays readable after the other removed it, and nothing ever loads wrong KV (both engines check
    every loaded block bit for bit)."""
    spec = make_spec(WINDOWED, num_blocks=256)
    capacity = 2 * 8 * (HEADER_SIZE + 2 * 16 * 2 * 8 * 2 * 2)  # about two prompts' packs
    with FileStoreConnector(spec, root=tmp_path, capacity_bytes=capacity) as one, FileStoreConnector(
        spec, root=tmp_path, capacity_bytes=capacity
    ) as two:
        writer, reader = MiniEngine(spec, one, seed=1), MiniEngine(spec, two, seed=2)
        prompts = [tokens(300 + i, 100) for i in range(6)]
        outcomes: list[tuple[int, int]] = []
        for index, prompt in enumerate(prompts):
            writer.run(f"w{index}", prompt)
            one.flush()
            fresh = reader.run(f"r{index}", prompt + [1])
            assert fresh.hit_tokens == 96 and fresh.load_errors == {}  # the other engine's blocks, exact
            two.flush()
            old = reader.run(f"old{index}", prompts[0] + [2])  # evicted long ago, or still open
            outcomes.append((old.hit_tokens, sum(len(ids) for ids in old.load_errors.values())))
            assert sum(p.stat().st_size for p in tmp_path.glob("*.kvpack")) <= capacity + 8 * 16 * 1024
        assert one.catalog.evictions + two.catalog.evictions > 0  # bounded by evicting, not by luck
        assert all(errors == 0 for _, errors in outcomes)  # leased packs are never taken from a load
