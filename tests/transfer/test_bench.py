"""``capkv bench transfer`` (and ``benchmarks/transfer.py``) times copies that move the bytes: each baseline copy
and each block copy is checked here on a small case, so none can look fast by moving nothing."""

from __future__ import annotations

import torch

from capkv.cli._bench import _Shape, transfer_rows
from capkv.engine._presets import model_preset
from capkv.stores._host import row_memory
from capkv.transfer._bench import transfer_case


def _blocks(memory: list[list[memoryview]] | None) -> list[bytes]:
    """Each block's bytes where they lie in the paged cache, runs in a row's order."""
    return [b"".join(bytes(part) for part in parts) for parts in memory or []]


def test_every_operation_of_a_transfer_case_moves_the_bytes() -> None:
    case = transfer_case(16, device=torch.device("cpu"), layers=2, kv_heads=2, head_dim=64, nbytes=64 << 10)
    assert len(case.ids) == 4 and case.rows.shape == (4, case.block_nbytes)  # 16 KiB blocks, 64 KiB moved
    case.on_device.random_(0, 256)
    case.host.zero_()
    case.operations["contiguous_out"]()
    assert torch.equal(case.host, case.on_device)
    case.host.random_(0, 256)
    case.on_device.zero_()
    case.operations["contiguous_in"]()
    assert torch.equal(case.on_device, case.host)
    case.rows.zero_()
    case.operations["gather"]()
    stored = _blocks(case.copier.block_memory(0, case.ids))
    assert [bytes(row_memory(row)) for row in case.rows] == stored, "gather did not copy the blocks"
    case.rows.random_(0, 256)
    case.operations["scatter"]()
    landed = _blocks(case.copier.block_memory(0, case.ids))
    assert landed == [bytes(row_memory(row)) for row in case.rows], "scatter did not write the blocks"


def test_a_preset_table_has_a_row_per_block_size_and_large_blocks_are_fewer_not_smaller() -> None:
    preset = model_preset("llama-70b")  # 80 layers: 5 MiB per 16-token block
    shape = _Shape(preset.describe(), 80, preset.num_kv_heads, preset.head_dim, preset.dtype)
    rows = list(transfer_rows(shape, torch.device("cpu"), [16], 1 << 20, 1))
    assert len(rows) == 3
    assert rows[2].split()[:2] == ["16", "2"]  # 1 MiB asked: two 5 MiB blocks moved, not a cut-down block
