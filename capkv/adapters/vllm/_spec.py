"""The engine's KV cache as capkv sees it: a :class:`~capkv.KVSpec` from vLLM's ``KVCacheConfig``.

Both roles need the same spec — capkv's stores key blocks by each group's
layout, so the scheduler side (which never sees a tensor) must know the shapes
the worker side will register. vLLM 0.32 views every layer's paged KV as
``[blocks, heads, states, content bytes]`` (blocks in dimension 0) and says so
through ``compute_layer_kv_cache_shape_bytes``; the spec takes that view, in
elements of the group's dtype, and the worker side checks every registered
tensor against it before the stack sees one.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.v1.kv_cache_interface import KVCacheConfig, compute_layer_kv_cache_shape_bytes

from capkv.contracts._spec import KVSpec
from capkv.errors import ConfigError

__all__ = ["engine_spec", "registered_caches"]


def engine_spec(kv_cache_config: KVCacheConfig, *, owner: str) -> KVSpec:
    """The spec of vLLM's KV cache: groups, block sizes, windows, per-layer shapes, dtype."""

    def shape(kv_cache_spec: Any, num_blocks: int) -> tuple[int, ...]:
        blocks, heads, states, content = compute_layer_kv_cache_shape_bytes(kv_cache_spec, num_blocks)
        dtype: torch.dtype = kv_cache_spec.dtype
        if blocks != num_blocks or content % dtype.itemsize:
            raise ConfigError(
                f"{owner}: vLLM's KV view {(blocks, heads, states, content)} (bytes) of "
                f"{type(kv_cache_spec).__name__} is not {num_blocks} blocks of {dtype} elements",
                connector=owner, method="__init__", value=(blocks, heads, states, content),
            )
        return (blocks, heads, states, content // dtype.itemsize)

    return KVSpec.from_kv_cache_config(kv_cache_config, kv_shape=shape, block_dim=0)


def registered_caches(spec: KVSpec, kv_caches: dict[str, torch.Tensor], *, owner: str) -> dict[str, torch.Tensor]:
    """The tensors of the spec's layers, each checked against its group's shape and dtype.

    Layers vLLM registers beyond the spec's (a layer sharing another's KV) are
    left out: their bytes are the other layer's.
    """
    method = "register_kv_caches"
    chosen: dict[str, torch.Tensor] = {}
    for group_index, group in enumerate(spec.groups):
        for name in group.layer_names:
            tensor = kv_caches.get(name)
            if tensor is None:
                raise ConfigError(
                    f"{owner}.{method}: vLLM registered no KV cache for layer {name!r} of group {group_index}",
                    connector=owner, method=method, group=group_index, value=name,
                )
            if tuple(tensor.shape) != group.kv_shape or tensor.dtype != spec.dtype:
                raise ConfigError(
                    f"{owner}.{method}: layer {name!r} of group {group_index} is {tuple(tensor.shape)} "
                    f"{tensor.dtype}; vLLM's KV-cache config describes {group.kv_shape} {spec.dtype}, "
                    "which the scheduler side keys blocks by",
                    connector=owner, method=method, group=group_index, value=tuple(tensor.shape),
                )
            chosen[name] = tensor
    return chosen
