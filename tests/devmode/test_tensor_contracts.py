"""KV tensors handed to an instrumented connector: shape, dtype and device, from metadata only.

The tensors live on the ``meta`` device: they have shape, dtype and device but no
data, and reading a value raises — so a passing check proves it read metadata only
(on CUDA, a value read would synchronise the device on every call).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from capkv import ContractError, KVGroupSpec, KVSpec
from capkv.devmode import instrument
from capkv.contracts._kv_tensors import check_kv_tensor
from tests.fakes import HMA

META = torch.device("meta")
DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.int8]


@dataclass(frozen=True)
class Cache:
    spec: KVSpec
    tensors: dict[str, torch.Tensor]


@st.composite
def caches(draw: st.DrawFn) -> dict[str, object]:
    """How a KV cache looks: per-group shape templates and layer names, one dtype.

    Only plain values: the spec is built in the test (:func:`build`), because capkv's
    own constructors run under beartype, whose sampling uses ``random``.
    """
    ndim = draw(st.integers(1, 5))
    block_dim = draw(st.integers(0, ndim - 1))
    num_blocks = draw(st.integers(1, 64))
    shapes = []
    for _ in range(draw(st.integers(1, 3))):
        shape = draw(st.lists(st.integers(1, 8), min_size=ndim, max_size=ndim))
        shape[block_dim] = num_blocks
        shapes.append((tuple(shape), draw(st.integers(1, 3))))
    return {"shapes": shapes, "block_dim": block_dim, "num_blocks": num_blocks, "dtype": draw(st.sampled_from(DTYPES))}


def build(description: dict[str, Any]) -> Cache:
    """The spec, and a matching meta tensor for every layer."""
    groups = tuple(
        KVGroupSpec(layer_names=tuple(f"g{index}.l{i}" for i in range(layers)), kv_shape=shape)
        for index, (shape, layers) in enumerate(description["shapes"])
    )
    dtype = description["dtype"]
    spec = KVSpec(
        num_groups=len(groups), num_blocks=description["num_blocks"], groups=groups,
        block_dim=description["block_dim"], dtype=dtype, device=META,
    )
    tensors = {
        name: torch.empty(group.kv_shape or (), dtype=dtype, device=META)
        for group in groups for name in group.layer_names
    }
    return Cache(spec, tensors)


def registered(dev: bool, cache: Cache, tensors: dict[str, object]) -> ContractError | None:
    connector = HMA()
    checked = instrument(connector, cache.spec)
    if not dev:
        checked.register_kv_caches(tensors)
        assert connector.calls == [("register_kv_caches", (tensors,))]
        return None
    with pytest.raises(ContractError) as info:
        checked.register_kv_caches(tensors)
    assert connector.calls == []
    return info.value


@given(caches())
def test_matching_tensors_pass(dev: bool, description: dict[str, Any]) -> None:
    cache = build(description)
    connector = HMA()
    checked = instrument(connector, cache.spec)
    checked.register_kv_caches(cache.tensors)
    for name, tensor in cache.tensors.items():
        checked.save_kv_layer(name, tensor, "attn", step=3)
    assert connector.calls[0] == ("register_kv_caches", (cache.tensors,))
    assert [args for _, args in connector.calls[1:]] == [
        (name, tensor, "attn", {"step": 3}) for name, tensor in cache.tensors.items()
    ]


@given(caches(), st.data())
def test_a_wrong_dimension_is_named(dev: bool, description: dict[str, Any], data: st.DataObject) -> None:
    cache = build(description)
    name = data.draw(st.sampled_from(sorted(cache.tensors)))
    shape = list(cache.tensors[name].shape)
    dim = data.draw(st.integers(0, len(shape) - 1))
    shape[dim] += data.draw(st.sampled_from([-1, 1])) if shape[dim] > 1 else 1
    bad = {**cache.tensors, name: torch.empty(shape, dtype=cache.spec.dtype, device=META)}
    error = registered(dev, cache, bad)
    if error is None:
        return
    group = cache.spec.group_of_layer(name)
    assert (error.method, error.group, error.position, error.value) == ("register_kv_caches", group, dim, shape[dim])
    assert f"kv_caches[{name!r}] group {group}, position {dim}: {shape[dim]} is the size of dimension {dim}" in str(error)
    assert f"expected shape {cache.spec.kv_shape_of(group)}" in str(error)


@given(caches(), st.data())
def test_wrong_rank_dtype_device_or_type_is_refused(dev: bool, description: dict[str, Any], data: st.DataObject) -> None:
    cache = build(description)
    name = data.draw(st.sampled_from(sorted(cache.tensors)))
    good = cache.tensors[name]
    kind = data.draw(st.sampled_from(["rank", "dtype", "device", "type"]))
    other_dtype = data.draw(st.sampled_from([d for d in DTYPES if d != good.dtype]))
    replacement: object = {
        "rank": torch.empty((*good.shape, 1), dtype=good.dtype, device=META),
        "dtype": torch.empty(good.shape, dtype=other_dtype, device=META),
        "device": torch.empty(good.shape, dtype=good.dtype, device="cpu"),
        "type": good.shape,
    }[kind]
    error = registered(dev, cache, {**cache.tensors, name: replacement})
    if error is None:
        return
    expected = {"rank": "dimensions; expected shape", "dtype": "is its dtype; expected dtype",
                "device": "is its device; expected device meta", "type": "expected a torch.Tensor"}[kind]
    assert expected in str(error)
    assert error.group == cache.spec.group_of_layer(name)


def test_unknown_layer_and_bad_containers(dev: bool) -> None:
    spec = KVSpec(num_groups=1, num_blocks=4, groups=(KVGroupSpec(layer_names=("a",), kv_shape=(4, 2)),))
    checked = instrument(HMA(), spec)
    good = torch.empty(4, 2, device=META)
    checked.save_kv_layer("a", good, None)
    if dev:
        with pytest.raises(ContractError, match=r"save_kv_layer: layer_name: 'b' is not a layer of the KV cache"):
            checked.save_kv_layer("b", good, None)
        with pytest.raises(ContractError, match=r"save_kv_layer: kv_layer group 0, position 0: 3 is the size"):
            checked.save_kv_layer("a", torch.empty(3, 2, device=META), None)
        with pytest.raises(ContractError, match=r"register_kv_caches: kv_caches: \[.*\] is a list"):
            checked.register_kv_caches([good])
        with pytest.raises(ContractError, match=r"register_kv_caches: kv_caches: 0 is a int key"):
            checked.register_kv_caches({0: good})


def test_what_the_spec_leaves_out_is_not_checked() -> None:
    coarse = KVSpec(num_groups=2, num_blocks=4)
    check_kv_tensor(coarse, "anything", torch.empty(1, 2, 3, device=META), connector="C", method="m")
    shared = KVSpec(num_groups=2, num_blocks=4, groups=(KVGroupSpec(kv_shape=(4, 2)), KVGroupSpec(kv_shape=(4, 2))))
    with pytest.raises(ContractError, match=r"expected shape \(4, 2\)"):
        check_kv_tensor(shared, "unnamed", torch.empty(4, 3, device=META), connector="C", method="m")


def test_a_device_without_index_matches_any_index() -> None:
    spec = KVSpec(num_groups=1, num_blocks=2, device=torch.device("cpu"))
    check_kv_tensor(spec, "x", torch.empty(2), connector="C", method="m")
    indexed = KVSpec(num_groups=1, num_blocks=2, device=torch.device("meta", 0))
    with pytest.raises(ContractError, match="expected device meta:0"):
        check_kv_tensor(indexed, "x", torch.empty(2, device=META), connector="C", method="m")


@given(caches(), st.data())
def test_a_missing_layer_is_named_with_its_group(dev: bool, description: dict[str, Any], data: st.DataObject) -> None:
    cache = build(description)
    name = data.draw(st.sampled_from(sorted(cache.tensors)))
    error = registered(dev, cache, {key: value for key, value in cache.tensors.items() if key != name})
    if error is None:
        return
    group = cache.spec.group_of_layer(name)
    assert (error.method, error.group, error.value) == ("register_kv_caches", group, name)
    assert str(error) == (
        f"HMA.register_kv_caches: kv_caches group {group}: {name!r} is a layer of the KV cache with no tensor; "
        f"expected a KV tensor for every one of the spec's {len(cache.tensors)} layers"
    )


@given(caches(), st.data())
def test_an_unknown_layer_is_refused(dev: bool, description: dict[str, Any], data: st.DataObject) -> None:
    cache = build(description)
    known = sorted(cache.tensors)
    tensor = cache.tensors[data.draw(st.sampled_from(known))]
    stranger = data.draw(st.text(min_size=1, max_size=8).filter(lambda name: name not in cache.tensors))
    where = data.draw(st.integers(0, len(known)))  # anywhere among the good entries
    entries = [*cache.tensors.items()]
    error = registered(dev, cache, dict([*entries[:where], (stranger, tensor), *entries[where:]]))
    if error is None:
        return
    assert (error.method, error.group, error.value) == ("register_kv_caches", None, stranger)
    assert f"kv_caches: {stranger!r} is not a layer of the KV cache; expected one of the spec's {len(known)} layers" in str(error)


def test_a_spec_without_layer_names_takes_any_layers(dev: bool) -> None:
    spec = KVSpec(num_groups=2, num_blocks=4, groups=(KVGroupSpec(kv_shape=(4, 2)), KVGroupSpec(kv_shape=(4, 2))))
    connector = HMA()
    tensors = {"whatever": torch.empty(4, 2, device=META)}
    instrument(connector, spec).register_kv_caches(tensors)
    assert connector.calls == [("register_kv_caches", (tensors,))]
