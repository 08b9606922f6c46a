"""Prefix keys, hit search and the host pool's bookkeeping, on their own."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from capkv.stores._hits import GroupGeometry, longest_hit
from capkv.connectors._host_pool import HostPoolIndex
from capkv.stores._keys import BlockKey, PrefixHasher, RequestKeys
from tests.paged import Group, make_spec

ROOT = Path(__file__).resolve().parents[2]
SPEC = make_spec([Group(16), Group(32, window=64)])


def _key(spec_tokens: list[int], group: int, index: int, namespace: str = "") -> BlockKey:
    return RequestKeys(PrefixHasher(SPEC, namespace, owner="t"), spec_tokens).key(group, index, method="t")


def test_a_key_names_the_whole_prefix_up_to_its_block() -> None:
    tokens = list(range(100))
    changed_late = tokens[:50] + [999] + tokens[51:]
    assert _key(tokens, 0, 2) == _key(changed_late, 0, 2)  # block 2 ends at token 48
    assert _key(tokens, 0, 3) != _key(changed_late, 0, 3)
    changed_early = [999] + tokens[1:]
    assert _key(tokens, 0, 5) != _key(changed_early, 0, 5)  # chained: an early change reaches every later block
    assert _key(tokens, 0, 0) != _key(tokens, 1, 0)  # groups chain separately
    assert _key(tokens, 0, 1) != _key(tokens, 0, 1, namespace="other model")


def test_keys_are_the_same_in_another_process() -> None:
    code = (
        "from tests.connectors.test_planning import _key; "
        "print(_key(list(range(100)), 1, 2).digest.hex())"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == _key(list(range(100)), 1, 2).digest.hex()


def test_keys_grow_with_the_request() -> None:
    hasher = PrefixHasher(SPEC, owner="t")
    keys = RequestKeys(hasher, list(range(40)))
    first = keys.key(0, 1, method="t")
    keys.update(list(range(80)))
    assert keys.key(0, 1, method="t") == first
    assert keys.key(0, 4, method="t") == _key(list(range(80)), 0, 4)


def test_needed_blocks_follow_the_window() -> None:
    full, window = GroupGeometry(16), GroupGeometry(16, sliding_window=32)
    assert full.needed(0, 96) == range(0, 6)
    assert full.needed(40, 96) == range(2, 6)  # the block holding token 40 is completed by the load
    assert window.needed(0, 96) == range(4, 6)  # tokens 65..95 are inside the window ending at 96
    assert window.needed(0, 16) == range(0, 1)
    assert GroupGeometry(16, sliding_window=33).needed(0, 96) == range(4, 6)
    assert GroupGeometry(16, sliding_window=34).needed(0, 96) == range(3, 6)


geometries = st.lists(
    st.builds(GroupGeometry, st.sampled_from([1, 2, 4, 8]), st.one_of(st.none(), st.integers(1, 24))),
    min_size=1, max_size=3,
)


@settings(max_examples=300, deadline=None)
@given(geometries, st.integers(0, 40), st.integers(0, 64), st.sets(st.tuples(st.integers(0, 2), st.integers(0, 63))))
def test_longest_hit_is_the_largest_complete_aligned_end(
    groups: list[GroupGeometry], start: int, limit: int, stored: set[tuple[int, int]]
) -> None:
    def present(group: int, block: int) -> bool:
        return (group, block) in stored

    def complete(end: int) -> bool:
        return all(
            end % g.block_size == 0 and all(present(i, b) for b in g.needed(start, end))
            for i, g in enumerate(groups)
        )

    brute = max((end for end in range(start + 1, limit + 1) if complete(end)), default=start)
    assert longest_hit(groups, start, limit, present) == brute


def test_the_pool_evicts_least_recently_used_and_never_pinned_or_pending_blocks() -> None:
    pool = HostPoolIndex(3)
    a, b, c, d = (BlockKey(0, bytes([i]) * 16) for i in range(4))
    for key in (a, b, c):
        assert pool.reserve(key) is not None
        pool.commit(key)
    assert [pool.loadable(k) for k in (a, b, c)] == [True, True, True]
    pool.touch(a)  # b is now the least recently used
    assert pool.pin(c) is not None
    slot = pool.reserve(d)
    assert slot is not None and not pool.loadable(b) and pool.evictions == 1
    assert not pool.loadable(d) and pool.holds(d)  # pending until committed
    pool.touch(c)
    assert pool.reserve(BlockKey(1, b"e" * 16)) is not None  # evicts a: c is pinned, d is pending
    assert not pool.loadable(a) and pool.loadable(c)
    assert pool.reserve(BlockKey(1, b"f" * 16)) is None  # c pinned, d and e pending: nothing to evict
    pool.unpin(c)
    assert pool.reserve(BlockKey(1, b"f" * 16)) is not None and not pool.loadable(c)


def test_pool_slots_are_handed_out_lowest_first_so_saves_are_consecutive() -> None:
    pool = HostPoolIndex(8)
    slots = [pool.reserve(BlockKey(0, bytes([i]) * 16)) for i in range(5)]
    assert slots == [0, 1, 2, 3, 4]
