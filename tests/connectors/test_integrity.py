"""What storage does to bytes never reaches an engine: every damage pattern, on the file store.

Each pattern damages a real pack written by a real store, then two readers load the prompt: the
store that wrote it (its index lists the records where they were) and a fresh store (it scans the
damaged pack). ``MiniEngine`` checks every loaded block bit for bit, so a damaged block that loads
fails the test; a damaged block must be a miss or a load error (the engine recomputes it).
"""

from __future__ import annotations

import os
import shutil
import struct
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from capkv.connectors import FileStoreConnector
from capkv.connectors._block_file import HEADER_SIZE, RecordHeader, scan_pack
from capkv.stores._checksum import CHECKSUM_SIZE, block_identity, checksum
from capkv.stores._keys import BlockKey
from tests.connectors.conftest import tokens
from tests.connectors.engine import MiniEngine, Run
from tests.paged import Group, make_spec

WINDOWED = [Group(16), Group(16, window=32)]
PROMPT = tokens(30, 100)
BLOCKS = 8
"""PROMPT's stored blocks: 6 of the full group, 2 inside the window."""
CHECKSUM_AT = HEADER_SIZE - CHECKSUM_SIZE
LAYOUT_AT, LAYOUT_SIZE = 4 + 2 + 2 + 4 + 4 + 16, 16
"""Where a value header (capkv/stores/_value.py) keeps the layout fingerprint."""


def _flip(path: Path, at: int, mask: int) -> None:
    with open(path, "r+b") as file:
        file.seek(at)
        byte = file.read(1)[0]
        file.seek(at)
        file.write(bytes([byte ^ mask]))


def _read(path: Path, at: int, size: int) -> bytes:
    with open(path, "rb") as file:
        file.seek(at)
        return file.read(size)


def _write(path: Path, at: int, data: bytes) -> None:
    with open(path, "r+b") as file:
        file.seek(at)
        file.write(data)


def one_bit(path: Path, records: list[RecordHeader]) -> None:
    _flip(path, records[0].offset + HEADER_SIZE + 100, 0x40)


def two_bit(path: Path, records: list[RecordHeader]) -> None:
    """The top bit of two 8-byte words: a position-weighted sum mod 2**64 does not move."""
    payload = records[0].offset + HEADER_SIZE
    _flip(path, payload + 3 * 8 + 7, 0x80)
    _flip(path, payload + 17 * 8 + 7, 0x80)


def truncated(path: Path, records: list[RecordHeader]) -> None:
    os.truncate(path, records[1].offset + HEADER_SIZE + records[1].length // 2)


def swapped(path: Path, records: list[RecordHeader]) -> None:
    first, second = records[0], records[1]
    size = HEADER_SIZE + first.length
    a, b = _read(path, first.offset, size), _read(path, second.offset, size)
    _write(path, first.offset, b)
    _write(path, second.offset, a)


def moved(path: Path, records: list[RecordHeader]) -> None:
    """Record 0, whole, lands at record 1's offset (record 1 is gone)."""
    _write(path, records[1].offset, _read(path, records[0].offset, HEADER_SIZE + records[0].length))


def spliced(path: Path, records: list[RecordHeader]) -> None:
    """Record 0's payload and checksum under record 1's header: intact bytes, the wrong key."""
    first, second = records[0], records[1]
    _write(path, second.offset + CHECKSUM_AT, _read(path, first.offset + CHECKSUM_AT, CHECKSUM_SIZE + first.length))


def foreign(path: Path, records: list[RecordHeader]) -> None:
    """Record 0 now claims another memory layout."""
    _write(path, records[0].offset + LAYOUT_AT, b"\xee" * LAYOUT_SIZE)


PATTERNS: dict[str, Callable[[Path, list[RecordHeader]], None]] = {
    "one-bit": one_bit, "two-bit": two_bit, "truncated": truncated, "swapped": swapped,
    "moved": moved, "spliced": spliced, "foreign": foreign,
}
LOST = {"one-bit": 1, "two-bit": 1, "truncated": 1, "swapped": 0, "moved": 1, "spliced": 1, "foreign": 1}
"""Records whose bytes are no longer in the pack under their own key (at least: truncation takes the tail)."""


def _loaded(run: Run) -> int:
    return sum(len(ids) for ids in run.loaded.values())


def _errors(run: Run) -> int:
    return sum(len(ids) for ids in run.load_errors.values())


@pytest.mark.parametrize("pattern", list(PATTERNS))
def test_no_damage_pattern_is_ever_loaded(pattern: str, tmp_path: Path) -> None:
    spec = make_spec(WINDOWED, num_blocks=64)
    root, copy = tmp_path / "store", tmp_path / "copy"
    with FileStoreConnector(spec, root=root) as warm:
        writer = MiniEngine(spec, warm)
        writer.run("first", PROMPT)
        warm.flush()
        pack = max(root.glob("*.kvpack"), key=lambda path: len(list(scan_pack(path))))
        records = list(scan_pack(pack))
        assert len(records) >= 2 and records[0].length == records[1].length
        PATTERNS[pattern](pack, records)
        shutil.copytree(root, copy)  # for a fresh store: the writer recomputes and saves the block again
        # The writer's own index still lists every record where it was written.
        again = writer.run("again", PROMPT + [1])  # raises on any wrong byte
        assert _loaded(again) <= BLOCKS - (2 if pattern == "swapped" else LOST[pattern])
        assert _errors(again) >= 1 or again.hit_tokens < 96  # found out: a load error, or no longer offered
    with FileStoreConnector(spec, root=copy) as cold:
        fresh = MiniEngine(spec, cold, seed=3).run("fresh", PROMPT + [2])  # raises on any wrong byte
        assert _loaded(fresh) <= BLOCKS - LOST[pattern]


def test_the_checksum_changes_with_every_pattern_and_is_bound_to_the_record() -> None:
    generator = torch.Generator().manual_seed(1)
    payload = bytearray(torch.randint(0, 256, (32 << 10,), dtype=torch.uint8, generator=generator).numpy().tobytes())
    key, fingerprint = BlockKey(0, b"k" * 16), b"f" * 16
    identity = block_identity(key, fingerprint)
    base = checksum(payload, identity)
    assert len(base) == CHECKSUM_SIZE and checksum(bytes(payload), identity) == base
    damaged: list[bytes] = []
    for bit in range(0, len(payload) * 8, 61):  # every single-bit error sampled across the block
        copy = bytearray(payload)
        copy[bit // 8] ^= 1 << (bit % 8)
        damaged.append(bytes(copy))
    for i, j in ((0, 1), (3, 17), (0, 4095), (100, 101)):  # two top bits: what a weighted sum misses
        copy = bytearray(payload)
        copy[i * 8 + 7] ^= 0x80
        copy[j * 8 + 7] ^= 0x80
        damaged.append(bytes(copy))
    words = memoryview(payload).cast("Q")
    swapped = bytearray(payload)
    struct.pack_into("<QQ", swapped, 0, words[1], words[0])
    damaged += [bytes(swapped), bytes(len(payload)), bytes(payload[:-1]), bytes(payload[4096:] + payload[:4096])]
    assert all(checksum(d, identity) != base for d in damaged)
    # Bound: the same bytes under another key or layout do not pass.
    assert checksum(payload, block_identity(BlockKey(1, key.digest), fingerprint)) != base
    assert checksum(payload, block_identity(BlockKey(0, b"j" * 16), fingerprint)) != base
    assert checksum(payload, block_identity(key, b"g" * 16)) != base


def test_a_pack_of_the_previous_format_is_a_miss_never_misread(tmp_path: Path) -> None:
    """Value format 1 (a 64-bit weighted sum) is not read: its records are not offered; the pack still
    counts toward capacity, and goes first when the store needs room."""
    spec = make_spec(WINDOWED, num_blocks=64)
    with FileStoreConnector(spec, root=tmp_path) as store:
        MiniEngine(spec, store).run("first", PROMPT)
    for pack in tmp_path.glob("*.kvpack"):
        for record in scan_pack(pack):
            _write(pack, record.offset + 4, struct.pack("<H", 1))
    with FileStoreConnector(spec, root=tmp_path, capacity_bytes=sum(p.stat().st_size for p in tmp_path.glob("*.kvpack"))) as store:
        old = set(tmp_path.glob("*.kvpack"))
        run = MiniEngine(spec, store, seed=3).run("again", PROMPT + [1])
        assert run.hit_tokens == 0 and run.loaded == {}
        store.flush()  # its own copy pushed the old packs out
        assert not old & set(tmp_path.glob("*.kvpack"))
