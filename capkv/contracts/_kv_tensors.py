"""KV-tensor contracts: the tensors handed to a connector match the engine's KV cache.

Only metadata is read (shape, dtype, device), never values: reading a CUDA tensor's values would synchronise
the device on every call.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, cast

from capkv.contracts._spec import KVSpec
from capkv._torch import is_tensor
from capkv.contracts._violation import contract_error
from capkv.errors import ContractError

if TYPE_CHECKING:  # a tensor exists only once torch is loaded: capkv._torch
    import torch

__all__ = ["check_kv_cache_types", "check_kv_caches", "check_kv_tensor"]


def check_kv_tensor(
    spec: KVSpec, layer_name: str, tensor: object, *, connector: str, method: str, subject: str = "kv_layer"
) -> None:
    """``tensor`` is layer ``layer_name``'s paged KV: its group's shape, the spec's dtype and device.

    When the spec names its layers, a tensor is for one of them, and ``register_kv_caches`` gets one for every
    one of them (:func:`check_kv_caches`). What the spec leaves out (``None``) is not checked.
    """
    # Fields and cached mappings only: in dev mode, capkv's methods run under beartype.
    group = spec.layer_groups.get(layer_name)
    if group is None and spec.layer_groups:
        raise _unknown_layer(spec, layer_name, connector, method, "layer_name")
    if not is_tensor(tensor):
        raise contract_error(
            connector, method, subject, value=tensor, problem=f"is a {type(tensor).__name__}",
            expected="a torch.Tensor", group=group,
        )
    template = spec.kv_shape_of(None) if group is None else spec.groups[group].kv_shape
    shape = tensor.shape
    if template is not None and shape != template:
        if len(shape) != len(template):
            raise contract_error(
                connector, method, subject, value=tuple(shape), problem=f"has {len(shape)} dimensions",
                expected=f"shape {template}", group=group,
            )
        dim = next(d for d, (got, want) in enumerate(zip(shape, template, strict=True)) if got != want)
        raise contract_error(
            connector, method, subject, value=shape[dim], problem=f"is the size of dimension {dim}",
            expected=f"shape {template}", group=group, position=dim,
        )
    if spec.dtype is not None and tensor.dtype != spec.dtype:
        raise contract_error(
            connector, method, subject, value=tensor.dtype, problem="is its dtype",
            expected=f"dtype {spec.dtype}", group=group,
        )
    device = spec.device
    if device is not None:
        actual = tensor.device
        if actual != device and device != type(actual)(actual.type):  # "cuda" accepts any cuda:N
            raise contract_error(
                connector, method, subject, value=actual, problem="is its device",
                expected=f"device {device}", group=group,
            )


def check_kv_cache_types(
    kv_caches: object, *, connector: str, method: str, spec: KVSpec | None = None
) -> Mapping[str, torch.Tensor]:
    """``kv_caches`` when it is a mapping of layer names (``str``) to ``torch.Tensor`` values.

    What every connector needs before reading anything else from it, so it runs
    in production too (``register_kv_caches`` of capkv's stores): ``None``, a list
    of tensors or a numpy array is a :class:`~capkv.ContractError` naming the
    connector and the value, not an ``AttributeError`` deep inside a copy.
    """
    if not isinstance(kv_caches, Mapping):
        raise contract_error(
            connector, method, "kv_caches", value=kv_caches, problem=f"is a {type(kv_caches).__name__}",
            expected="a dict of KV tensors by layer name",
        )
    tensors = cast("Mapping[object, object]", kv_caches)
    for name, tensor in tensors.items():
        if not isinstance(name, str):
            raise contract_error(
                connector, method, "kv_caches", value=name, problem=f"is a {type(name).__name__} key",
                expected="layer names (str) as keys",
            )
        if not is_tensor(tensor):
            raise contract_error(
                connector, method, f"kv_caches[{name!r}]", value=tensor, problem=f"is a {type(tensor).__name__}",
                expected="a torch.Tensor", group=None if spec is None else spec.layer_groups.get(name),
            )
    return cast("Mapping[str, torch.Tensor]", tensors)


def check_kv_caches(
    spec: KVSpec, kv_caches: object, *, connector: str, method: str
) -> None:
    """Every ``layer name -> tensor`` entry passes :func:`check_kv_tensor`, and none of the spec's layers is missing.

    A missing layer would otherwise surface later and far away — when a copy
    first touches it — or never, as a layer whose KV is silently not moved.
    """
    tensors = check_kv_cache_types(kv_caches, connector=connector, method=method, spec=spec)
    layers = spec.layer_groups
    for name, tensor in tensors.items():
        if layers and name not in layers:
            raise _unknown_layer(spec, name, connector, method, "kv_caches")
        check_kv_tensor(spec, name, tensor, connector=connector, method=method, subject=f"kv_caches[{name!r}]")
    if len(tensors) != len(layers) and layers:
        missing = next(name for name in layers if name not in tensors)
        raise contract_error(
            connector, method, "kv_caches", value=missing, problem="is a layer of the KV cache with no tensor",
            expected=f"a KV tensor for every one of the spec's {len(layers)} layers", group=layers[missing],
        )


def _unknown_layer(spec: KVSpec, layer_name: object, connector: str, method: str, subject: str) -> ContractError:
    return contract_error(
        connector, method, subject, value=layer_name, problem="is not a layer of the KV cache",
        expected=f"one of the spec's {len(spec.layer_groups)} layers ({_short_names(spec.layer_names)})",
    )


def _short_names(names: tuple[str, ...], limit: int = 4) -> str:
    shown = ", ".join(map(repr, names[:limit]))
    return shown if len(names) <= limit else f"{shown}, ... {names[-1]!r}"
