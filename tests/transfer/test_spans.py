"""CPU copies of consecutive block ids move as strided runs: bit-exact like the indexed copies, for any layout."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from capkv.transfer import BlockCopier
from capkv.transfer import _cpu
from tests.paged import LAYOUTS, Group, block_dim, empty_caches, make_spec, randomize, same_bits


def test_spans_split_where_ids_stop_ascending_by_one() -> None:
    assert _cpu.spans([]) == []
    assert _cpu.spans([4]) == [(0, 1)]
    assert _cpu.spans([4, 5, 6, 9, 10, 3, 3, 2]) == [(0, 3), (3, 5), (5, 6), (6, 7), (7, 8)]


def test_runs_are_coalesced_only_when_long_enough() -> None:
    spec = make_spec([Group(16, layers=2)], num_blocks=256, heads=8, dim=128)  # 64 KiB per layer and block
    copier = BlockCopier(spec, empty_caches(spec))
    slabs = copier.layout.groups[0].slabs(16)
    assert _cpu._coalesced(torch.arange(10, 42), slabs, 16) == [(0, 32, 10)]
    shuffled = torch.tensor(random.Random(0).sample(range(256), 32))
    assert _cpu._coalesced(shuffled, slabs, 16) is None  # runs of one: one indexed copy
    assert _cpu._coalesced(torch.arange(10, 11), slabs, 16) is None  # too few bytes to pay for the calls


def _ids_with_runs(rng: random.Random, pool: int, count: int) -> list[int]:
    """``count`` distinct ids of ``pool``, mostly in ascending runs of random lengths."""
    order = list(range(pool))
    start = rng.randrange(pool)
    order = order[start:] + order[:start]
    ids: list[int] = []
    position = 0
    while len(ids) < count and position < pool:
        length = rng.randint(1, 6)
        ids += order[position : position + length]
        position += length + rng.randint(0, 2)
    ids += [i for i in order if i not in ids][: count - len(ids)]
    pieces = [ids[i : i + 3] for i in range(0, len(ids), 3)]
    rng.shuffle(pieces)  # runs cut and reordered: some ids follow a run they do not continue
    return [i for piece in pieces for i in piece][:count]


@settings(max_examples=40, deadline=None)
@given(
    layout=st.sampled_from(LAYOUTS),
    block_sizes=st.lists(st.sampled_from([1, 2, 4, 16]), min_size=1, max_size=3),
    dtype=st.sampled_from([torch.float16, torch.float32, torch.uint8]),
    seed=st.integers(0, 2**16),
    always=st.booleans(),
)
def test_coalesced_copies_round_trip_any_layout(
    layout: str, block_sizes: list[int], dtype: torch.dtype, seed: int, always: bool
) -> None:
    """With every run coalesced (``SPAN_BYTES = 0``) or by the default rule, gathers and scatters of ids
    with ascending runs put every block's bytes where the indexed copies would, and touch nothing else."""
    spec = make_spec([Group(b, layers=1 + b % 3) for b in block_sizes], num_blocks=24, layout=layout, dtype=dtype)
    caches = empty_caches(spec, layout)
    randomize(caches, seed)
    blank = empty_caches(spec, layout)
    source, target = BlockCopier(spec, caches), BlockCopier(spec, blank)
    rng = random.Random(seed)
    saved = _cpu.SPAN_BYTES
    _cpu.SPAN_BYTES = 0 if always else saved
    try:
        for group, described in enumerate(spec.groups):
            count = rng.randint(0, 20)
            src_ids = _ids_with_runs(rng, 24, count)
            dst_ids = _ids_with_runs(rng, 24, len(src_ids))
            rows = source.host_rows(len(src_ids), source.block_nbytes(group) + rng.randint(0, 3))
            source.gather(group, src_ids, rows)
            target.scatter(group, dst_ids, rows)
            axis = block_dim(layout)
            for name in described.layer_names:
                for s, d in zip(src_ids, dst_ids, strict=True):
                    assert same_bits(blank[name].select(axis, d), caches[name].select(axis, s))
                untouched = [b for b in range(24) if b not in dst_ids]
                assert not torch.index_select(blank[name], axis, torch.tensor(untouched, dtype=torch.int64)).view(-1).view(
                    torch.uint8
                ).any()
    finally:
        _cpu.SPAN_BYTES = saved


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_gather_of_a_repeated_run_reads_it_twice(layout: str) -> None:
    spec = make_spec([Group(4, layers=2)], num_blocks=16, layout=layout)
    caches = empty_caches(spec, layout)
    randomize(caches, 3)
    copier = BlockCopier(spec, caches)
    saved = _cpu.SPAN_BYTES
    _cpu.SPAN_BYTES = 0
    try:
        ids = [2, 3, 4, 2, 3, 4]
        rows = copier.host_rows(len(ids), copier.block_nbytes(0))
        copier.gather(0, ids, rows)
    finally:
        _cpu.SPAN_BYTES = saved
    reference = copier.host_rows(len(ids), copier.block_nbytes(0))
    for index, block in enumerate(ids):
        copier.gather(0, [block], reference[index : index + 1])
    assert torch.equal(rows, reference)
