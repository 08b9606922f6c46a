"""``benchmarks/file_store.py`` measures what it says: a round moves real bytes through the store and the floor."""

from __future__ import annotations

from pathlib import Path

from benchmarks.file_store import bare_read_and_check, throughput


def test_a_round_saves_loads_and_times_the_floor_over_the_bytes_loaded(tmp_path: Path) -> None:
    measured = throughput(tmp_path, 2, 64, block_size=16)
    assert measured.loaded_bytes > 0 and measured.saved_bytes >= measured.loaded_bytes
    assert min(measured.load_s, measured.read_s, measured.bare_s) > 0


def test_the_floor_reads_every_value_of_the_buffer_from_the_file(tmp_path: Path) -> None:
    data = bytes(range(256)) * 64
    path = tmp_path / "plain.bin"
    path.write_bytes(data)
    buffer = memoryview(bytearray(len(data)))
    assert bare_read_and_check(path, buffer, 1024) > 0
    assert bytes(buffer) == data, "each value's bytes where the plain read puts them"
