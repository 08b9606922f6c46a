"""Block-id contracts: what the ids handed to a transfer call must be.

A bad id would read or overwrite another request's KV; each check names the connector, the method, the group,
the position and the value (:class:`~capkv.ContractError`).
"""

from __future__ import annotations

from typing import cast

from capkv.contracts._engine import BlockIds
from capkv.contracts._spec import KVSpec
from capkv.contracts._violation import contract_error
from capkv.contracts._id_scan import all_valid, first_bad_id

__all__ = [
    "check_block_copies", "check_block_copy", "check_block_groups", "check_block_ids", "check_pool_ids",
]


def check_block_groups(spec: KVSpec, block_ids: object, *, connector: str, method: str, subject: str = "block_ids") -> None:
    """``block_ids`` has one list per KV-cache group of ``spec``, each of valid, unrepeated ids.

    A request's block ids are one list per KV-cache group. Every id is an ``int`` (not a ``bool``) inside the
    pool, and no real block appears twice in a group — only the null block, which sliding-window groups put
    where blocks left the window. Valid input is decided by whole-list builtins
    (:mod:`capkv.contracts._id_scan`).
    """
    _check_groups(spec, block_ids, spec.num_blocks, spec.null_block_id, connector, method, subject)


def check_block_ids(
    spec: KVSpec, block_ids: object, *, group: int, connector: str, method: str, subject: str = "block_ids"
) -> None:
    """One group's ids (``group`` names it in errors): valid and unrepeated but for the null block."""
    _check_list(block_ids, spec.num_blocks, spec.null_block_id, group, connector, method, subject)


def check_pool_ids(
    ids: object,
    *,
    num_blocks: int,
    repeatable: int | None,
    group: int,
    connector: str,
    method: str,
    subject: str = "block_ids",
    distinct: bool = True,
) -> list[int]:
    """``ids`` (returned as it is) when it is a list of ints in ``[0, num_blocks)`` that repeats no id
    but ``repeatable`` (``None``: none may repeat; ``distinct=False``: any may, as when only reading
    them); the rule every other check here applies per group."""
    return _check_list(ids, num_blocks, repeatable, group, connector, method, subject, distinct)


def check_block_copy(
    spec: KVSpec,
    src_ids: object,
    dst_ids: object,
    *,
    group: int,
    connector: str,
    method: str,
    src_blocks: int | None = None,
    dst_blocks: int | None = None,
) -> None:
    """One group's block copy, ``src_ids[i]`` to ``dst_ids[i]``.

    Each side's ids index the engine's pool (``spec``), or, when ``src_blocks``
    or ``dst_blocks`` is given, a pool of that many blocks with no null block (a
    host buffer). Sources follow the group rule; destinations may not repeat at
    all, the null block included, since two copies into one block race; and the
    two lists have the same length.
    """
    src_size, src_null = _side(spec, src_blocks)
    dst_size, _ = _side(spec, dst_blocks)  # destinations never repeat, null block or not
    src = _check_list(src_ids, src_size, src_null, group, connector, method, "src_ids")
    dst = _check_list(dst_ids, dst_size, None, group, connector, method, "dst_ids")
    _check_lengths(src, dst, group, connector, method)


def check_block_copies(
    spec: KVSpec,
    src_ids: object,
    dst_ids: object,
    *,
    connector: str,
    method: str,
    src_blocks: int | None = None,
    dst_blocks: int | None = None,
) -> None:
    """Every group's block copy at once: one list per KV-cache group on each side, as :func:`check_block_copy`."""
    src_size, src_null = _side(spec, src_blocks)
    dst_size, _ = _side(spec, dst_blocks)  # destinations never repeat, null block or not
    src_groups = _check_groups(spec, src_ids, src_size, src_null, connector, method, "src_ids")
    dst_groups = _check_groups(spec, dst_ids, dst_size, None, connector, method, "dst_ids")
    for group, (src, dst) in enumerate(zip(src_groups, dst_groups, strict=True)):
        _check_lengths(src, dst, group, connector, method)


def _side(spec: KVSpec, blocks: int | None) -> tuple[int, int | None]:
    """A copy side's pool size and null block."""
    return (spec.num_blocks, spec.null_block_id) if blocks is None else (blocks, None)


def _check_groups(
    spec: KVSpec, groups: object, num_blocks: int, repeatable: int | None, connector: str, method: str, subject: str
) -> BlockIds:
    """``groups`` itself, once it is known to be valid."""
    valid = cast(BlockIds, groups)
    if type(groups) is tuple and len(valid) == spec.num_groups and all_valid(valid, num_blocks, repeatable):
        return valid
    if not isinstance(groups, tuple):
        raise contract_error(
            connector, method, subject, value=groups, problem=f"is a {type(groups).__name__}",
            expected=f"a tuple of {spec.num_groups} lists, one per KV-cache group",
        )
    found = cast("tuple[object, ...]", groups)
    if len(found) != spec.num_groups:
        raise contract_error(
            connector, method, subject, value=found, problem=f"has {len(found)} group{'' if len(found) == 1 else 's'}",
            expected=f"one list per KV-cache group ({spec.num_groups})",
        )
    _raise_first_bad(found, num_blocks, repeatable, 0, connector, method, subject)
    return valid


def _check_list(
    ids: object, num_blocks: int, repeatable: int | None, group: int, connector: str, method: str, subject: str,
    distinct: bool = True,
) -> list[int]:
    """``ids`` itself, once it is known to be a valid group."""
    valid = cast("list[int]", ids)
    if type(ids) is list and all_valid((valid,), num_blocks, repeatable, distinct=distinct):
        return valid
    _raise_first_bad((valid,), num_blocks, repeatable, group, connector, method, subject, distinct)
    return valid


def _raise_first_bad(
    groups: tuple[object, ...], num_blocks: int, repeatable: int | None, first_group: int,
    connector: str, method: str, subject: str, distinct: bool = True,
) -> None:
    bad = first_bad_id(groups, num_blocks, repeatable, distinct=distinct)
    if bad is not None:
        raise contract_error(
            connector, method, subject, value=bad.value, problem=bad.problem, expected=bad.expected,
            group=first_group + bad.group, position=bad.position,
        )


def _check_lengths(src: list[int], dst: list[int], group: int, connector: str, method: str) -> None:
    if len(src) != len(dst):
        raise contract_error(
            connector, method, "dst_ids", value=len(dst), problem=f"ids for {len(src)} source ids",
            expected="one destination id per source id", group=group,
        )
