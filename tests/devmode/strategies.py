"""Hypothesis strategies: KV pools, valid block-id groups, and groups with one planted fault."""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st


@dataclass(frozen=True)
class Pool:
    num_groups: int
    num_blocks: int
    null: int

    @property
    def real_ids(self) -> list[int]:
        return [i for i in range(self.num_blocks) if i != self.null]


@dataclass(frozen=True)
class Fault:
    """Block-id groups with exactly one violation, and where it must be reported."""

    groups: object
    group: int | None
    position: int | None
    value: object
    kind: str


class BlockNumber(int):
    """An int subclass: not an ``int`` id."""


class Slot(enum.IntEnum):
    THREE = 3


pools = st.builds(
    lambda groups, blocks, data: Pool(groups, blocks, data.draw(st.integers(0, blocks - 1))),
    st.integers(1, 4),
    st.integers(1, 300),
    st.data(),
)


@st.composite
def group_ids(draw: st.DrawFn, pool: Pool, *, max_size: int = 40, nulls: bool = True) -> list[int]:
    """Distinct real ids, with the null block sprinkled in (sliding-window style) when ``nulls``."""
    real = pool.real_ids
    ids = draw(st.lists(st.sampled_from(real), unique=True, max_size=min(max_size, len(real)))) if real else []
    for _ in range(draw(st.integers(0, 4)) if nulls else 0):
        ids.insert(draw(st.integers(0, len(ids))), pool.null)
    return ids


@st.composite
def valid_groups(draw: st.DrawFn, pool: Pool) -> tuple[list[int], ...]:
    return tuple(draw(group_ids(pool)) for _ in range(pool.num_groups))


def _bad_types(pool: Pool) -> st.SearchStrategy[object]:
    near = st.integers(0, pool.num_blocks - 1)
    return st.one_of(
        st.sampled_from([True, False, None, "3", b"3", (1,), [1]]),
        near.map(float),
        near.map(BlockNumber),
        near.map(np.int64),
        st.just(Slot.THREE),
        st.floats(allow_nan=True),
    )


def _out_of_range(pool: Pool) -> st.SearchStrategy[int]:
    return st.one_of(
        st.integers(pool.num_blocks, pool.num_blocks + 5),
        st.integers(-5, -1),
        st.sampled_from([2**31 - 1, 2**31, -(2**31), -(2**31) - 1, 2**63, 2**64 + 1]).filter(
            lambda v: not 0 <= v < pool.num_blocks
        ),
    )


@st.composite
def faulty_groups(draw: st.DrawFn, pool: Pool) -> Fault:
    """One bad id (wrong type, outside the pool, or a repeated real id) planted in valid groups."""
    groups = [list(g) for g in draw(valid_groups(pool))]
    g = draw(st.integers(0, pool.num_groups - 1))
    kind = draw(st.sampled_from(["type", "range", "repeat"]))
    if kind == "repeat":
        real = [i for i in groups[g] if i != pool.null]
        assume(real)
        value: object = draw(st.sampled_from(real))
        groups[g].insert(draw(st.integers(0, len(groups[g]))), value)  # type: ignore[arg-type]
        position = [i for i, v in enumerate(groups[g]) if v == value][1]
    else:
        value = draw(_bad_types(pool) if kind == "type" else _out_of_range(pool))
        position = draw(st.integers(0, len(groups[g])))
        groups[g].insert(position, value)  # type: ignore[arg-type]
    return Fault(tuple(groups), g, position, value, kind)


@st.composite
def malformed_groups(draw: st.DrawFn, pool: Pool) -> Fault:
    """The container is wrong: not a tuple, the wrong number of groups, or a group that is not a list."""
    groups = list(draw(valid_groups(pool)))
    kind = draw(st.sampled_from(["list", "count", "group"]))
    if kind == "list":
        return Fault(groups, None, None, groups, kind)
    if kind == "count":
        if draw(st.booleans()) or pool.num_groups == 1:
            groups.append([])
        else:
            groups.pop()
        counted = tuple(groups)
        return Fault(counted, None, None, counted, kind)
    g = draw(st.integers(0, pool.num_groups - 1))
    groups[g] = draw(st.sampled_from([tuple, set, frozenset]))(groups[g])  # type: ignore[call-overload]
    return Fault(tuple(groups), g, None, groups[g], kind)
