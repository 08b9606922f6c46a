"""FileStoreConnector: survives a restart, and never reads back a half-written or damaged block."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from capkv.connectors import FileStoreConnector
from capkv.connectors._block_file import (
    HEADER_SIZE,
    ReadResult,
    read_block_file,
    sweep_temporary_files,
    tensor_memory,
    write_block_file,
)
from capkv.connectors._keys import BlockKey
from tests.connectors.conftest import tokens
from tests.connectors.engine import MiniEngine
from tests.paged import Group, make_spec

ROOT = Path(__file__).resolve().parents[2]
WINDOWED = [Group(16), Group(16, window=32)]
PROMPT = tokens(30, 100)

CHILD_PRELUDE = """
import json, sys
from capkv.connectors import FileStoreConnector
from tests.connectors.conftest import tokens
from tests.connectors.engine import MiniEngine
from tests.paged import Group, make_spec
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
    assert leftovers and not [p for p in os.listdir(store) if p.endswith(".kvblock")]

    spec = make_spec(WINDOWED, num_blocks=64)
    reopened = FileStoreConnector(spec, root=store)  # sweeps the dead writer's temporary file
    assert not [p for p in os.listdir(store) if p.endswith(".tmp")]
    engine = MiniEngine(spec, reopened)
    assert engine.run("again", PROMPT + [1]).hit_tokens == 0


def test_a_truncated_block_file_is_a_miss(tmp_path: Path) -> None:
    _store(tmp_path)
    victim = next(p for p in sorted(tmp_path.iterdir()) if p.name.startswith("g1-"))
    with open(victim, "r+b") as file:
        file.truncate(victim.stat().st_size // 2)
    spec = make_spec(WINDOWED, num_blocks=64)
    run = MiniEngine(spec, FileStoreConnector(spec, root=tmp_path)).run("again", PROMPT + [1])
    assert run.hit_tokens == 0 and run.loaded == {}


def test_a_corrupted_block_is_reported_never_copied_and_dropped(tmp_path: Path) -> None:
    _store(tmp_path)
    victim = next(p for p in sorted(tmp_path.iterdir()) if p.name.startswith("g0-"))
    with open(victim, "r+b") as file:
        file.seek(HEADER_SIZE + 100)
        byte = file.read(1)
        file.seek(HEADER_SIZE + 100)
        file.write(bytes([byte[0] ^ 0x40]))
    spec = make_spec(WINDOWED, num_blocks=64)
    engine = MiniEngine(spec, FileStoreConnector(spec, root=tmp_path))
    run = engine.run("again", PROMPT + [1])
    assert run.hit_tokens == 96  # the file looked complete
    assert list(run.load_errors) == [0] and len(run.load_errors[0]) == 1
    (bad_block,) = run.load_errors[0]
    assert len(run.loaded[0]) == 5 and len(run.loaded[1]) == 2  # every other block was loaded bit-exact
    assert bad_block not in run.loaded[0]
    # The damaged file was dropped; the engine recomputed the block and the store saved it afresh.
    engine.connector.flush()
    third = engine.run("third", PROMPT + [2])
    assert third.hit_tokens == 96 and third.load_errors == {}


def test_blocks_from_another_kv_layout_are_refused(tmp_path: Path) -> None:
    _store(tmp_path)  # written from the flash layout
    spec = make_spec(WINDOWED, num_blocks=64, layout="hnd")
    engine = MiniEngine(spec, FileStoreConnector(spec, root=tmp_path), layout="hnd")
    run = engine.run("hnd", PROMPT + [1])
    assert run.hit_tokens == 96
    assert {g: len(ids) for g, ids in run.load_errors.items()} == {0: 6, 1: 2}
    assert run.loaded == {}
    assert len(list(tmp_path.glob("*.kvblock"))) == 8  # the flash engine's files are left alone


def _rows(payload: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(payload), dtype=torch.uint8)


def test_block_files_check_everything_in_their_header(tmp_path: Path) -> None:
    key, other = BlockKey(1, b"k" * 16), BlockKey(1, b"o" * 16)
    fingerprint = b"f" * 32
    payload = _rows(bytes(range(256)) * 4)
    write_block_file(tmp_path, key, fingerprint, tensor_memory(payload))
    into = torch.zeros(1024, dtype=torch.uint8)
    memory = tensor_memory(into)
    assert read_block_file(tmp_path, key, fingerprint, memory) is ReadResult.OK and torch.equal(into, payload)
    assert read_block_file(tmp_path, key, b"g" * 32, memory) is ReadResult.FOREIGN  # another layout
    assert read_block_file(tmp_path, BlockKey(0, key.digest), fingerprint, memory) is ReadResult.ABSENT
    shorter = tensor_memory(torch.zeros(1000, dtype=torch.uint8))
    assert read_block_file(tmp_path, key, fingerprint, shorter) is ReadResult.FOREIGN  # another block size
    path = tmp_path / f"{key.name}.kvblock"
    os.replace(path, tmp_path / f"{other.name}.kvblock")  # a file under another key's name
    assert read_block_file(tmp_path, other, fingerprint, memory) is ReadResult.DAMAGED
    os.replace(tmp_path / f"{other.name}.kvblock", path)
    with open(path, "ab") as file:
        file.write(b"x")  # trailing bytes
    assert read_block_file(tmp_path, key, fingerprint, memory) is ReadResult.DAMAGED


def test_sweep_removes_only_dead_writers_temporary_files(tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)
    mine = tmp_path / f".g0-aa.kvblock.{os.getpid()}.abc.tmp"
    theirs = tmp_path / f".g0-bb.kvblock.{dead.stdout.strip()}.def.tmp"
    mine.write_bytes(b"partial")
    theirs.write_bytes(b"partial")
    assert sweep_temporary_files(tmp_path) == 1
    assert mine.exists() and not theirs.exists()
