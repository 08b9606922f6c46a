"""The contracts as beartype hints, for signatures written outside capkv."""

from __future__ import annotations

import pytest
import torch
from beartype.door import die_if_unbearable

from capkv import ContractError, KVGroupSpec, KVSpec
from capkv.devmode import (
    block_groups_hint,
    block_ids_hint,
    contract_hint,
    kv_caches_hint,
    kv_layer_hint,
    single_group_hint,
)

SPEC = KVSpec(num_groups=2, num_blocks=8, groups=(KVGroupSpec(layer_names=("a",), kv_shape=(8, 2)), KVGroupSpec()))
SITE = {"connector": "Mine", "method": "run"}


class Unprintable(torch.Tensor):
    """A tensor whose values must not be read: error messages show tensors by metadata."""

    def __new__(cls) -> Unprintable:
        return torch.Tensor._make_subclass(cls, torch.zeros(8, 2))  # type: ignore[no-any-return]

    def __repr__(self, *args: object, **kwargs: object) -> str:
        raise AssertionError("a contract error printed tensor values")


def test_every_hint_passes_good_values_and_names_bad_ones() -> None:
    cases: list[tuple[object, object, object, str]] = [
        (block_groups_hint(SPEC, **SITE), ([1, 0, 0], []), ([1, 1], []), "block_ids group 0, position 1: 1 repeats"),
        (block_ids_hint(SPEC, group=1, **SITE), [7, 0, 0], [8], "block_ids group 1, position 0: 8 is outside the pool"),
        (single_group_hint(SPEC, **SITE), None, [1], r"block_ids: \[1\] is a single group's ids but the KV cache has 2 groups"),
        (kv_caches_hint(SPEC, **SITE), {"a": torch.empty(8, 2, device="meta")}, {"a": torch.empty(8, 3, device="meta")},
         r"kv_caches\['a'\] group 0, position 1: 3 is the size of dimension 1"),
        (kv_layer_hint(SPEC, **SITE), ("a", torch.empty(8, 2, device="meta")), ("a", Unprintable(), "x"),
         r"kv_layer: \('a', <tensor \(8, 2\) torch.float32 on cpu>, 'x'\) is not a pair"),
        (kv_layer_hint(SPEC, **SITE), ("a", torch.empty(8, 2, device="meta")), (3, torch.empty(8, 2)),
         r"layer_name: 3 is a int; expected a layer name"),
    ]
    for hint, good, bad, message in cases:
        if good is not None:
            die_if_unbearable(good, hint)
        with pytest.raises(ContractError, match=rf"^Mine\.run: {message}"):
            die_if_unbearable(bad, hint)


def test_any_check_becomes_a_hint() -> None:
    def even(value: object) -> None:
        if not isinstance(value, int) or value % 2:
            raise ContractError(f"{value!r} is odd", method="even", value=value)

    hint = contract_hint(even)
    die_if_unbearable(4, hint)
    with pytest.raises(ContractError, match="3 is odd"):
        die_if_unbearable(3, hint)
