"""The contracts as beartype type hints, for parameters of your own functions.

The same exhaustive checks :func:`~capkv.devmode.instrument` applies, so your functions and capkv's agree.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, cast

from beartype.vale import Is

from capkv._homes import publish
from capkv.contracts._spec import KVSpec
from capkv.contracts._block_ids import check_block_copies, check_block_groups, check_block_ids
from capkv.contracts._violation import contract_error
from capkv.contracts._id_scan import all_valid
from capkv.contracts._kv_tensors import check_kv_caches, check_kv_tensor

__all__ = [
    "block_copy_hint",
    "block_groups_hint",
    "block_ids_hint",
    "contract_hint",
    "kv_caches_hint",
    "kv_layer_hint",
    "single_group_hint",
]


def contract_hint(check: Callable[[object], None]) -> object:
    """``Annotated[object, Is[...]]`` for any check that raises on a bad value and returns otherwise.

    Each factory here binds a :class:`~capkv.KVSpec` and a call site and returns ``Annotated[object,
    Is[validator]]``: put it on a parameter of a function you decorate with ``@beartype`` (or check a value
    with ``beartype.door.die_if_unbearable``). The validator sits on the *outer* value and walks every id or
    tensor; its :class:`~capkv.ContractError` propagates unchanged through beartype.

    The base type is ``object``, not ``BlockIds``: beartype checks a typed base first, by sampling one element
    of each list, and would report some bad inputs with its own, vaguer error at random. The exhaustive
    validator is the one judge.
    """

    def validator(value: object) -> bool:
        check(value)
        return True

    return Annotated[object, Is[validator]]


def block_groups_hint(spec: KVSpec, *, connector: str, method: str, subject: str = "block_ids") -> object:
    """A request's block ids, one list per KV-cache group (:func:`~capkv.contracts._block_ids.check_block_groups`)."""
    num_groups, num_blocks, null = spec.num_groups, spec.num_blocks, spec.null_block_id

    def validator(value: object) -> bool:
        # Every valid call takes this path, so it is inlined; the check explains a failure.
        groups = cast("tuple[object, ...]", value)
        if type(value) is tuple and len(groups) == num_groups and all_valid(groups, num_blocks, null):
            return True
        check_block_groups(spec, groups, connector=connector, method=method, subject=subject)
        return True

    return Annotated[object, Is[validator]]


def block_ids_hint(spec: KVSpec, *, group: int, connector: str, method: str, subject: str = "block_ids") -> object:
    """One group's block ids (:func:`~capkv.contracts._block_ids.check_block_ids`)."""
    return contract_hint(
        lambda value: check_block_ids(spec, value, group=group, connector=connector, method=method, subject=subject)
    )


def single_group_hint(spec: KVSpec, *, connector: str, method: str, subject: str = "block_ids") -> object:
    """The ids of a single-group call (``request_finished``): only valid when the cache has one group.

    With several groups, a single list is group 0 alone — the silent truncation
    that hands the wrong KV to a connector — so the call itself is the violation.
    """

    def check(value: object) -> None:
        if spec.num_groups != 1:
            raise contract_error(
                connector, method, subject, value=value,
                problem=f"is a single group's ids but the KV cache has {spec.num_groups} groups",
                expected="request_finished_all_groups with one list per group",
            )
        check_block_ids(spec, value, group=0, connector=connector, method=method, subject=subject)

    return contract_hint(check)


def block_copy_hint(
    spec: KVSpec, *, connector: str, method: str, src_blocks: int | None = None, dst_blocks: int | None = None
) -> object:
    """A ``(src_ids, dst_ids)`` pair of block-id groups (:func:`~capkv.contracts._block_ids.check_block_copies`)."""

    def check(value: object) -> None:
        src, dst = _pair(value, connector, method, "copy", "a (src_ids, dst_ids) pair of block-id groups")
        check_block_copies(
            spec, src, dst, connector=connector, method=method, src_blocks=src_blocks, dst_blocks=dst_blocks
        )

    return contract_hint(check)


def kv_caches_hint(spec: KVSpec, *, connector: str, method: str) -> object:
    """A ``layer name -> KV tensor`` dict (:func:`~capkv.contracts._kv_tensors.check_kv_caches`)."""
    return contract_hint(lambda value: check_kv_caches(spec, value, connector=connector, method=method))


def kv_layer_hint(spec: KVSpec, *, connector: str, method: str) -> object:
    """A ``(layer_name, tensor)`` pair: the tensor must fit its layer's group (:func:`~capkv.contracts._kv_tensors.check_kv_tensor`).

    The pair, not the tensor alone, because the shape depends on the layer.
    """

    def check(value: object) -> None:
        layer_name, tensor = _pair(value, connector, method, "kv_layer", "a (layer name, tensor) pair")
        if not isinstance(layer_name, str):
            raise contract_error(
                connector, method, "layer_name", value=layer_name, problem=f"is a {type(layer_name).__name__}",
                expected="a layer name (str)",
            )
        check_kv_tensor(spec, layer_name, tensor, connector=connector, method=method)

    return contract_hint(check)


def _pair(value: object, connector: str, method: str, subject: str, expected: str) -> tuple[object, object]:
    pair = cast("tuple[object, ...]", value)
    if type(value) is not tuple or len(pair) != 2:
        raise contract_error(connector, method, subject, value=pair, problem="is not a pair", expected=expected)
    return pair[0], pair[1]


publish(__name__)
