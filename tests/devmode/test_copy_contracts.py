"""Block copies: sources valid, destinations valid and never written twice, one to one.

These checks are called by copy ops themselves (``check_block_copy``) or through a
beartype hint, so they hold whatever the mode: they are what dev mode switches on.
"""

from __future__ import annotations

from typing import Any

import pytest
from beartype import beartype
from hypothesis import assume, given
from hypothesis import strategies as st

from capkv import ContractError, KVSpec
from capkv.devmode import block_copy_hint, forced_off
from capkv.contracts._block_ids import check_block_copies, check_block_copy
from tests.devmode.strategies import Pool, group_ids, pools

SITE = {"connector": "Offload", "method": "copy_blocks"}


@st.composite
def copies(draw: st.DrawFn, pool: Pool) -> tuple[list[int], list[int]]:
    """A valid copy: distinct real sources padded with null blocks, distinct destinations."""
    dst = draw(st.lists(st.integers(0, pool.num_blocks - 1), unique=True, max_size=30))
    src = draw(st.permutations(pool.real_ids))[: len(dst)]
    src += [pool.null] * (len(dst) - len(src))
    return draw(st.permutations(src)), dst


def spec_of(pool: Pool) -> KVSpec:
    return KVSpec(num_groups=pool.num_groups, num_blocks=pool.num_blocks, null_block_id=pool.null)


@given(data=st.data())
def test_valid_copies_pass(data: st.DataObject) -> None:
    pool = data.draw(pools)
    src, dst = data.draw(copies(pool))
    check_block_copy(spec_of(pool), src, dst, group=0, **SITE)
    nulls = [pool.null] * len(dst)
    check_block_copy(spec_of(pool), nulls, dst, group=0, **SITE)


@given(data=st.data())
def test_a_destination_written_twice_is_refused_even_the_null_block(data: st.DataObject) -> None:
    pool = data.draw(pools)
    src, dst = data.draw(copies(pool))
    assume(dst)
    index = data.draw(st.integers(0, len(dst) - 1))
    again = data.draw(st.integers(index + 1, len(dst)))
    dst.insert(again, dst[index])
    src.insert(again, pool.null)
    with pytest.raises(ContractError) as info:
        check_block_copy(spec_of(pool), src, dst, group=2, **SITE)
    error = info.value
    assert (error.group, error.position, error.value) == (2, again, dst[index])
    assert str(error).startswith(f"Offload.copy_blocks: dst_ids group 2, position {again}: {dst[index]} repeats")


@given(data=st.data())
def test_lengths_must_match(data: st.DataObject) -> None:
    pool = data.draw(pools)
    src, dst = data.draw(copies(pool))
    assume(dst)
    dst.pop()
    with pytest.raises(ContractError, match=rf"dst_ids group 0: {len(dst)} ids for {len(src)} source ids"):
        check_block_copy(spec_of(pool), src, dst, group=0, **SITE)


@given(data=st.data())
def test_each_side_is_checked_against_its_own_pool(data: st.DataObject) -> None:
    pool = data.draw(pools)
    host = data.draw(st.integers(1, 50))
    src = data.draw(group_ids(pool, max_size=host, nulls=False))
    dst = list(range(len(src)))
    assume(len(dst) <= host)
    check_block_copy(spec_of(pool), src, dst, group=0, dst_blocks=host, **SITE)
    check_block_copy(spec_of(pool), dst, src, group=0, src_blocks=host, **SITE)
    with pytest.raises(ContractError, match=rf"dst_ids group 0, position 0: {host} is outside the pool"):
        check_block_copy(spec_of(pool), [pool.null], [host], group=0, dst_blocks=host, **SITE)
    with pytest.raises(ContractError, match=r"src_ids group 0, position 1: 0 repeats"):
        check_block_copy(spec_of(pool), [0, 0], [0, 1] if pool.num_blocks > 1 else [0, 0], group=0, src_blocks=host, **SITE)


def test_bad_source_ids_are_named() -> None:
    spec = KVSpec(num_groups=1, num_blocks=4)
    with pytest.raises(ContractError, match=r"src_ids group 3, position 1: True is a bool"):
        check_block_copy(spec, [1, True], [2, 3], group=3, **SITE)
    with pytest.raises(ContractError, match=r"src_ids group 0: \(1, 2\) is a tuple; expected a list of block ids"):
        check_block_copy(spec, (1, 2), [2, 3], group=0, **SITE)


def test_all_groups_at_once() -> None:
    spec = KVSpec(num_groups=2, num_blocks=8)
    check_block_copies(spec, ([1, 2], [0, 0, 3]), ([3, 4], [5, 6, 7]), **SITE)
    with pytest.raises(ContractError, match=r"dst_ids group 1: 2 ids for 3 source ids"):
        check_block_copies(spec, ([1, 2], [0, 0, 3]), ([3, 4], [5, 6]), **SITE)
    with pytest.raises(ContractError, match=r"src_ids: \(\[1, 2\],\) has 1 group; expected one list per KV-cache group \(2\)"):
        check_block_copies(spec, ([1, 2],), ([3, 4], []), **SITE)


def test_beartype_hint_form() -> None:
    spec = KVSpec(num_groups=1, num_blocks=8)

    def copy_blocks(mapping: Any) -> None:
        pass

    copy_blocks.__annotations__ = {"mapping": block_copy_hint(spec, **SITE)}
    checked = beartype(copy_blocks)
    checked((([1, 2],), ([3, 4],)))
    if forced_off():  # beartype is the identity under python -O: production pays nothing
        assert checked is copy_blocks
        checked((([1, 2],), ([3, 3],)))
        return
    with pytest.raises(ContractError, match=r"dst_ids group 0, position 1: 3 repeats"):
        checked((([1, 2],), ([3, 3],)))
    with pytest.raises(ContractError, match=r"copy: .* is not a pair"):
        checked(([1, 2],))
