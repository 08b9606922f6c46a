"""``benchmarks/file_store.py`` measures what it says: a round moves real bytes through the store, and every plain
strategy it compares with (and every reference) really moves the same bytes, so none can win by doing less."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from benchmarks._plain_io import paged_reads, read_strategies, timed_rounds, write_strategies
from benchmarks.file_store import prompts_for, throughput
from capkv.engine._presets import model_preset
from capkv.stores._host import row_memory

VALUE = 4096


@pytest.mark.parametrize("name", ["demo", "llama-1b"])
def test_a_round_saves_loads_and_times_every_baseline_over_the_bytes_loaded(tmp_path: Path, name: str) -> None:
    measured = throughput(tmp_path, model_preset(name), 2, 64, block_size=16)
    assert measured.loaded_bytes > 0 and measured.saved_bytes >= measured.loaded_bytes
    assert min(measured.save_s, measured.load_s, *measured.writes.values(), *measured.reads.values()) > 0
    assert len(measured.paged) == 2 and min(measured.paged.values()) > 0


def test_a_preset_too_big_for_the_budget_is_scaled_in_prompts_not_in_value_size() -> None:
    preset = model_preset("llama-70b")
    assert prompts_for(preset, 1 << 20, 1024, 16) == 1  # one prompt at least, whatever the budget
    assert prompts_for(model_preset("llama-1b"), 256 << 20, 1024, 16) == 8  # 32 MiB a prompt


def _file(tmp_path: Path, count: int) -> tuple[Path, bytes]:
    data = os.urandom(count * VALUE)
    path = tmp_path / "plain.bin"
    path.write_bytes(data)
    return path, data


def test_every_read_strategy_lands_the_files_bytes_in_the_destination(tmp_path: Path) -> None:
    path, data = _file(tmp_path, 1500)  # more values than one preadv call takes (IOV_MAX)
    destination = torch.zeros(len(data), dtype=torch.uint8)
    for name, strategy in read_strategies(path, destination, VALUE).items():
        destination.zero_()
        assert strategy() == len(data), name
        assert bytes(row_memory(destination)) == data, f"{name} did not land the file's bytes"


def test_every_write_strategy_writes_the_sources_bytes(tmp_path: Path) -> None:
    source = torch.randint(0, 256, (1500 * VALUE,), dtype=torch.uint8)
    path = tmp_path / "written.bin"
    for name, strategy in write_strategies(path, source, VALUE).items():
        path.unlink(missing_ok=True)
        assert strategy() == source.numel(), name
        assert path.read_bytes() == bytes(row_memory(source)), f"{name} did not write the source's bytes"


def test_the_paged_references_land_each_value_in_its_parts(tmp_path: Path) -> None:
    path, data = _file(tmp_path, 6)
    kept = torch.zeros(2 * len(data), dtype=torch.uint8)  # a view of a tensor's memory does not keep it alive
    memory = row_memory(kept)
    # Each value in two runs far apart, as K and V of a paged layer are.
    parts = [[memory[i * 2048 : (i + 1) * 2048], memory[len(data) + i * 2048 : len(data) + (i + 1) * 2048]]
             for i in range(6)]
    for name, strategy in paged_reads(path, parts).items():
        memory[:] = bytes(len(memory))
        assert strategy() == len(data), name
        assert b"".join(bytes(part) for value in parts for part in value) == data, name


def test_a_baseline_that_moves_fewer_bytes_is_refused(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="moved 10 bytes, not 20"):
        timed_rounds({"lazy": lambda: 10}, 20)
