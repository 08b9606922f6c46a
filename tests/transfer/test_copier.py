"""BlockCopier: bit-exact gather and scatter for every group, layout and dtype."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from capkv import ConfigError, ContractError, KVGroupSpec, KVSpec
from capkv.transfer import BlockCopier, spec_block_nbytes
from capkv.transfer._cuda import chunk_spans, copy_rows
from tests.paged import LAYOUTS, Group, block_bytes, block_dim, empty_caches, make_spec, randomize, same_bits

TWO_GROUPS = (Group(block_size=16, layers=2), Group(block_size=32, layers=3, window=64))
DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.int8, torch.float8_e4m3fn)


def _copier(layout: str = "flash", dtype: torch.dtype = torch.float16, seed: int = 0) -> tuple[BlockCopier, dict[str, torch.Tensor]]:
    spec = make_spec(TWO_GROUPS, layout=layout, dtype=dtype)
    caches = empty_caches(spec, layout)
    randomize(caches, seed)
    return BlockCopier(spec, caches), caches


@pytest.mark.parametrize("layout", [lay for lay in LAYOUTS if lay != "hnd"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gather_puts_each_block_of_every_layer_in_its_row(layout: str, dtype: torch.dtype) -> None:
    copier, caches = _copier(layout, dtype)
    spec = copier.layout.spec
    for group, described in enumerate(spec.groups):
        ids = [7, 0, 31, 7, 12]  # a repeated id is fine for a gather
        rows = copier.host_rows(len(ids), copier.block_nbytes(group))
        copier.gather(group, ids, rows).wait()
        for row, block in zip(rows, ids, strict=True):
            expected = torch.cat([block_bytes(caches[name], block_dim(layout), block) for name in described.layer_names])
            assert torch.equal(row, expected), (group, block)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_scatter_restores_gathered_blocks_bit_exact_and_touches_nothing_else(layout: str, dtype: torch.dtype) -> None:
    source, caches = _copier(layout, dtype, seed=1)
    spec = source.layout.spec
    target_caches = empty_caches(spec, layout)
    target = BlockCopier(spec, target_caches)
    dim = block_dim(layout)
    for group, described in enumerate(spec.groups):
        src_ids, dst_ids = [3, 9, 30, 17], [5, 6, 1, 28]
        rows = source.host_rows(len(src_ids), source.block_nbytes(group))
        source.gather(group, src_ids, rows).wait()
        target.scatter(group, dst_ids, rows).wait()
        for name in described.layer_names:
            for s, d in zip(src_ids, dst_ids, strict=True):
                assert same_bits(target_caches[name].select(dim, d), caches[name].select(dim, s))
            untouched = [b for b in range(spec.num_blocks) if b not in dst_ids]
            assert not torch.index_select(target_caches[name], dim, torch.tensor(untouched)).view(-1).view(torch.uint8).any()


def test_groups_with_different_block_sizes_have_their_own_block_bytes() -> None:
    copier, _ = _copier()
    spec = copier.layout.spec
    assert copier.block_nbytes(0) == 2 * (2 * 16 * 2 * 8) * 2
    assert copier.block_nbytes(1) == 3 * (2 * 32 * 2 * 8) * 2
    assert [spec_block_nbytes(spec, g) for g in range(2)] == [copier.block_nbytes(g) for g in range(2)]


def test_signalling_nan_words_survive_the_wide_word_copy() -> None:
    spec = make_spec([Group(block_size=16)], dtype=torch.float64)
    caches = empty_caches(spec)
    patterns = torch.tensor([0x7FF0000000000001, 0x7FF4000000000000, -1, 0xFFF0000000000001 - (1 << 64)], dtype=torch.int64)
    for tensor in caches.values():
        tensor.view(torch.int64).copy_(patterns.repeat(tensor.numel() // 4).view(tensor.shape))
    copier = BlockCopier(spec, caches)
    rows = copier.host_rows(3, copier.block_nbytes(0))
    copier.gather(0, [1, 2, 3], rows)
    blank = empty_caches(spec)
    BlockCopier(spec, blank).scatter(0, [4, 5, 6], rows)
    for name in caches:
        assert torch.equal(blank[name][:, 4:7].view(torch.int64), caches[name][:, 1:4].view(torch.int64))


def test_host_rows_may_be_unaligned_and_strided_slices_of_a_pool() -> None:
    copier, caches = _copier(seed=2)
    spec = copier.layout.spec
    nbytes = copier.block_nbytes(1)
    pool = torch.zeros((8, nbytes + 5), dtype=torch.uint8)
    rows = pool[2:6, 3 : 3 + nbytes]  # odd offset, row stride longer than a block
    copier.gather(1, [4, 8, 15, 16], rows)
    reference = copier.host_rows(4, nbytes)
    copier.gather(1, [4, 8, 15, 16], reference)
    assert torch.equal(rows, reference)
    assert not pool[:2].any() and not pool[6:].any() and not pool[:, :3].any() and not pool[:, 3 + nbytes :].any()
    blank = empty_caches(spec)
    BlockCopier(spec, blank).scatter(1, [0, 1, 2, 3], rows)
    for name in spec.groups[1].layer_names:
        assert same_bits(blank[name][:, 0:4], caches[name][:, [4, 8, 15, 16]])


def test_empty_calls_copy_nothing_and_are_finished() -> None:
    copier, _ = _copier()
    handle = copier.gather(0, [], copier.host_rows(0, 1))
    assert handle.done()
    assert copier.scatter(1, [], copier.host_rows(0, 1)).done()


@pytest.mark.parametrize(
    ("call", "ids", "match"),
    [
        ("gather", [0, 32], "block_ids group 0, position 1: 32 is outside the pool"),
        ("scatter", [-1, 2], "block_ids group 0, position 0: -1 is outside the pool"),
        ("scatter", [4, 5, 4], "block_ids group 0, position 2: 4 repeats the id at position 0"),
        ("gather", [True], "block_ids group 0, position 0: True is a bool"),
        ("scatter", (3, 3), "block_ids group 0, position 1: 3 repeats"),
    ],
)
def test_bad_block_ids_are_refused_with_group_and_value(call: str, ids: list[object] | tuple[int, ...], match: str) -> None:
    copier, _ = _copier()
    rows = copier.host_rows(len(ids), copier.block_nbytes(0))
    with pytest.raises(ContractError, match=match) as caught:
        getattr(copier, call)(0, ids, rows)
    assert caught.value.group == 0 and caught.value.method == call and caught.value.connector == "BlockCopier"


@pytest.mark.parametrize(
    "rows",
    [
        torch.zeros((2, 10), dtype=torch.uint8),  # too short
        torch.zeros((3, 4096), dtype=torch.uint8),  # wrong count
        torch.zeros((2, 4096), dtype=torch.int16),  # wrong dtype
        torch.zeros((4096, 2), dtype=torch.uint8).t(),  # rows not contiguous
    ],
)
def test_bad_host_rows_are_refused(rows: torch.Tensor) -> None:
    copier, _ = _copier()
    with pytest.raises(ContractError, match="needs host rows"):
        copier.gather(0, [1, 2], rows)


@pytest.mark.parametrize("group", [2, -1, "0"])
def test_unknown_group_is_refused(group: object) -> None:
    copier, _ = _copier()
    # A wrongly typed group is caught by dev mode's type checks first, when they are on.
    with pytest.raises(ContractError, match="does not exist|violates type hint"):
        copier.gather(group, [1], copier.host_rows(1, 4096))  # type: ignore[arg-type]


def test_registration_is_checked_against_the_spec() -> None:
    spec = make_spec(TWO_GROUPS)
    caches = empty_caches(spec)
    missing = dict(caches)
    del missing["g1.layer2"]
    with pytest.raises(ConfigError, match="layer 'g1.layer2' of group 1 was not registered") as caught:
        BlockCopier(spec, missing, owner="Mine")
    assert caught.value.group == 1 and caught.value.connector == "Mine"
    with pytest.raises(ConfigError, match="layers the spec does not list"):
        BlockCopier(spec, {**caches, "extra": torch.zeros(1)})
    with pytest.raises(ConfigError, match="has dtype torch.float32"):
        BlockCopier(spec, {**caches, "g0.layer1": caches["g0.layer1"].float()})
    with pytest.raises(ConfigError, match="has shape"):
        BlockCopier(spec, {**caches, "g0.layer0": caches["g0.layer0"][:, :4]})
    with pytest.raises(ConfigError, match="device"):
        BlockCopier(KVSpec(**{**_fields(spec), "device": torch.device("meta")}), caches)
    with pytest.raises(ConfigError, match="describes 0"):
        BlockCopier(KVSpec(num_groups=2, num_blocks=32), caches)


def test_a_padded_layout_is_refused_rather_than_copied_with_its_neighbours() -> None:
    spec = KVSpec(
        num_groups=1, num_blocks=4, block_dim=0, dtype=torch.float16,
        groups=(KVGroupSpec(layer_names=("a",), block_size=2, kv_shape=(4, 2, 3)),),
    )
    padded = torch.zeros((4, 2, 5), dtype=torch.float16)[:, :, :3]  # rows padded to 5 elements
    with pytest.raises(ConfigError, match="not dense inside a block"):
        BlockCopier(spec, {"a": padded})
    overlapping = torch.zeros(9, dtype=torch.float16).as_strided((4, 2, 3), (1, 3, 1))
    with pytest.raises(ConfigError, match="blocks overlap"):
        BlockCopier(spec, {"a": overlapping})


def _fields(spec: KVSpec) -> dict[str, object]:
    return {name: getattr(spec, name) for name in ("num_groups", "num_blocks", "null_block_id", "groups", "block_dim", "dtype")}


@settings(max_examples=40, deadline=None)
@given(
    layout=st.sampled_from(LAYOUTS),
    block_sizes=st.lists(st.sampled_from([1, 2, 4, 16]), min_size=1, max_size=3),
    dim=st.sampled_from([1, 3, 8]),
    dtype=st.sampled_from([torch.float16, torch.float32, torch.uint8]),
    seed=st.integers(0, 2**16),
)
def test_any_layout_round_trips_any_blocks(layout: str, block_sizes: list[int], dim: int, dtype: torch.dtype, seed: int) -> None:
    spec = make_spec([Group(b, layers=1 + b % 3) for b in block_sizes], num_blocks=12, layout=layout, dtype=dtype, dim=dim)
    caches = empty_caches(spec, layout)
    randomize(caches, seed)
    blank = empty_caches(spec, layout)
    source, target = BlockCopier(spec, caches), BlockCopier(spec, blank)
    rng = random.Random(seed)
    for group, described in enumerate(spec.groups):
        count = rng.randint(0, 12)
        src_ids = [rng.randrange(12) for _ in range(count)]
        dst_ids = rng.sample(range(12), count)
        rows = source.host_rows(count, source.block_nbytes(group) + rng.randint(0, 3))
        source.gather(group, src_ids, rows)
        target.scatter(group, dst_ids, rows)
        axis = block_dim(layout)
        for name in described.layer_names:
            for s, d in zip(src_ids, dst_ids, strict=True):
                assert same_bits(blank[name].select(axis, d), caches[name].select(axis, s))


def test_cuda_chunks_cover_every_block_once_within_the_staging_bound() -> None:
    for blocks, nbytes, staging in [(0, 10, 100), (7, 10, 30), (7, 10, 5), (10, 10, 100), (10, 10, 1000)]:
        spans = chunk_spans(blocks, nbytes, staging)
        covered = [i for start, stop in spans for i in range(start, stop)]
        assert covered == list(range(blocks))
        assert all(stop - start <= max(1, staging // nbytes) for start, stop in spans)


def test_copy_rows_handles_strided_rows_one_row_at_a_time() -> None:
    source = torch.arange(2 * 3 * 4, dtype=torch.int64).view(2, 3, 4)
    pool = torch.zeros((2, 20), dtype=torch.int64)
    strided = pool[:, :12].view(2, 3, 4)
    copy_rows(strided, source)
    assert torch.equal(strided, source) and not pool[:, 12:].any()


def test_unevenly_spaced_runs_scatter_one_run_at_a_time() -> None:
    """Padding between outer indices: the runs are not one slab, and still round-trip."""
    spec = KVSpec(
        num_groups=1, num_blocks=6, block_dim=2, dtype=torch.float32,
        groups=(KVGroupSpec(layer_names=("a", "b"), block_size=3, kv_shape=(2, 3, 6, 4)),),
    )
    bases = {name: torch.zeros((2, 4, 6, 4), dtype=torch.float32) for name in ("a", "b", "ta", "tb")}
    source = {"a": bases["a"][:, :3], "b": bases["b"][:, :3]}  # outer offsets 0, 24, 48, 96, ...: uneven
    randomize(source, seed=9)
    copier = BlockCopier(spec, source)
    assert copier.layout.groups[0].layers[0].slab(4) is None
    rows = copier.host_rows(3, copier.block_nbytes(0))
    copier.gather(0, [5, 0, 2], rows)
    target = {"a": bases["ta"][:, :3], "b": bases["tb"][:, :3]}
    BlockCopier(spec, target).scatter(0, [1, 3, 4], rows)
    for name in source:
        for s, d in zip([5, 0, 2], [1, 3, 4], strict=True):
            assert same_bits(target[name][:, :, d], source[name][:, :, s])
        assert not target[name][:, :, [0, 2, 5]].any()
    assert not bases["ta"][:, 3].any() and not bases["tb"][:, 3].any()  # the padding is left alone
