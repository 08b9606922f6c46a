"""Exhaustive checks of block-id lists, at C speed when the ids are valid.

A contract must see every id (beartype samples one element), and a Python loop costs ~30 ns per id: valid
lists are decided by whole-list builtins, and only a failing one is walked to say what is wrong where.
"""

from __future__ import annotations

import marshal
import sys
import threading
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    import torch

__all__ = ["BadId", "all_valid", "expected_id", "first_bad_id"]

WALK_BELOW = 32
"""Below this many ids in all, a Python walk is faster than the whole-list builtins."""
VECTOR_THRESHOLD = 2048
"""Total ids from which :func:`all_valid` hands range and repeat checks to torch."""

SCRATCH_PER_ID = 16
SCRATCH_MIN = 1 << 16
"""The repeat check scatters into a buffer of one slot per possible key only while that buffer has
at most ``SCRATCH_PER_ID`` slots per id checked (plus ``SCRATCH_MIN``); beyond, it sorts the ids."""

_TUPLE = ord("(")
_LIST = ord("[")
_HEADER = 5


@dataclass(frozen=True, slots=True)
class BadId:
    """The first thing wrong in a tuple of block-id groups."""

    group: int
    position: int | None
    """Index in the group; ``None`` when the group itself is malformed."""
    value: object
    problem: str
    """What is wrong, in words."""
    expected: str
    """What was expected, in words."""


def expected_id(num_blocks: int) -> str:
    """What a block id must be, in words."""
    return f"an int block id in [0, {num_blocks})"


def all_valid(groups: tuple[object, ...], num_blocks: int, repeatable: int | None, *, distinct: bool = True) -> bool:
    """``True`` only if every group is a list of distinct ints in ``[0, num_blocks)``.

    ``repeatable`` (the null block) may occur any number of times; ``None``: no id
    may repeat; ``distinct=False``: any id may. ``False`` means "look closer" with :func:`first_bad_id`: it may
    also be a valid but unusual input (a list subclass, an id of 2**31 or more).

    Exact ``int`` ids are recognised through :mod:`marshal`. Format 0 writes a list as ``[`` and a 4-byte
    length, and an ``int`` that fits in 32 bits as ``i`` and 4 little-endian bytes: when every group is a
    plain list of such ints, the bytes after the tuple header are a grid of 5-byte records whose first bytes
    spell ``[ii…[i…`` exactly. Anything else — a ``bool`` (``T``/``F``), a float, a big int, a string, a
    nested list — is either refused by :mod:`marshal` (``int`` subclasses, numpy integers) or starts on the
    grid with another code, because every element before the first odd one is a 5-byte record. The last byte
    of a record is the sign byte, so ``isascii()`` over that column says no id is negative.

    What is left — the upper bound and repeats — is a ``set`` and a ``max`` per group, or, for many ids, a few
    vectorised torch operations over the same bytes. Memory follows the ids checked, never the pool size: a
    pool of 2**31 blocks costs no more to check than one of 2,048.
    """
    lists = cast("tuple[list[int], ...]", groups)  # only if the bytes below say so
    try:
        sizes = [len(lists[0])] if len(lists) == 1 else [len(group) for group in lists]
    except TypeError:
        return False
    total = sum(sizes)
    if total < WALK_BELOW:
        return first_bad_id(lists, num_blocks, repeatable, distinct=distinct) is None
    try:
        codes = marshal.dumps(lists, 0)
    except ValueError:  # an int subclass, a numpy integer, a list subclass...
        return False
    grid = b"[" + b"i" * total if len(sizes) == 1 else b"".join([b"[" + b"i" * size for size in sizes])
    if codes[0] != _TUPLE or len(codes) != _HEADER + _HEADER * len(grid) or codes[5::5] != grid:
        return False
    if not codes[9::5].isascii():  # a negative id (list lengths are < 2**31)
        return False
    if not distinct:
        return all(max(group) < num_blocks for group in lists if group)
    if total >= VECTOR_THRESHOLD and sys.byteorder == "little":
        return _vector_valid(codes, len(lists), num_blocks, repeatable)
    for group in lists:
        if group:
            unique = set(group)
            if max(unique) >= num_blocks:
                return False
            repeats = len(group) - len(unique)
            if repeats and (repeatable is None or repeats != group.count(repeatable) - 1):
                return False
    return True


class _Scratch(threading.local):
    """A per-thread buffer the repeat check scatters into, reused to avoid page faults."""

    buffer: torch.Tensor | None = None

    def get(self, size: int) -> torch.Tensor:
        import torch

        if self.buffer is None or self.buffer.numel() < size:
            self.buffer = torch.empty(size, dtype=torch.int32)
        return self.buffer


_scratch = _Scratch()


def _vector_valid(codes: bytes, num_groups: int, num_blocks: int, repeatable: int | None) -> bool:
    """Range and repeats over the marshal grid (already checked) with torch.

    Each id gets a key ``group * num_blocks + id``; scattering the ids' positions
    into a buffer at those keys and reading them back returns every position
    unchanged exactly when no key repeats. Group headers and the null block are
    sent to one throw-away slot past the real keys, and not read back.
    """
    import torch  # only for many ids: light imports stay light

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # a read-only buffer: we only read it
        records = torch.frombuffer(codes, dtype=torch.uint8, offset=_HEADER).view(-1, _HEADER)
    values = records[:, 1:].clone(memory_format=torch.contiguous_format).view(torch.int32).view(-1).long()
    throwaway = num_groups * num_blocks
    if num_groups == 1:  # record 0 is the only header: leave it out
        keys = values[1:]
        if not keys.numel():
            return True
        if int(keys.max()) >= num_blocks:
            return False
        skip = None if repeatable is None else keys == repeatable
    else:
        is_header = records[:, 0] == _LIST
        if int(values.masked_fill(is_header, 0).max()) >= num_blocks:
            return False
        skip = is_header if repeatable is None else is_header | (values == repeatable)
        keys = (is_header.cumsum(0) - 1) * num_blocks + values
    if skip is not None:
        keys = keys.masked_fill(skip, throwaway)
    if throwaway + 1 > SCRATCH_PER_ID * keys.numel() + SCRATCH_MIN:
        # A pool far larger than the ids given (2**31 blocks: 8 GiB per group): sort the ids
        # instead, so memory follows the ids, never the pool.
        real = keys if skip is None else keys[~skip]
        ordered = torch.sort(real).values
        return not bool((ordered[1:] == ordered[:-1]).any())
    positions = torch.arange(keys.numel(), dtype=torch.int32)
    buffer = _scratch.get(throwaway + 1)
    buffer.scatter_(0, keys, positions)
    back = buffer.index_select(0, keys)
    return torch.equal(back, positions) if skip is None else bool(((back == positions) | skip).all())


def first_bad_id(
    groups: Sequence[object], num_blocks: int, repeatable: int | None, *, distinct: bool = True
) -> BadId | None:
    """The first malformed group or bad id, group by group, position by position (rules as :func:`all_valid`)."""
    for index, group in enumerate(groups):
        if not isinstance(group, list):
            return BadId(index, None, group, f"is a {type(group).__name__}", "a list of block ids")
        ids = cast("list[object]", group)
        seen: set[int] = set()
        for position, block in enumerate(ids):
            if type(block) is not int:
                return BadId(index, position, block, f"is a {type(block).__name__}", expected_id(num_blocks))
            if not 0 <= block < num_blocks:
                return BadId(index, position, block, "is outside the pool", expected_id(num_blocks))
            if not distinct or block == repeatable:
                continue
            if block in seen:
                return BadId(
                    index, position, block, f"repeats the id at position {ids.index(block)}",
                    "each real block id at most once per group"
                    + ("" if repeatable is None else f" (only the null block {repeatable} may repeat)"),
                )
            seen.add(block)
    return None
