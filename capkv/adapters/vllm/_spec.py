"""The engine's KV cache as capkv sees it: a :class:`~capkv.KVSpec` from vLLM's ``KVCacheConfig``, and the worker's shard.

Both roles need the same spec: the scheduler side never sees a tensor, yet stores key blocks by each group's
layout.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    SlidingWindowSpec,
    compute_layer_kv_cache_shape_bytes,
)

from capkv.contracts._spec import KVShard, KVSpec
from capkv.errors import ConfigError

__all__ = ["engine_shard", "engine_spec", "registered_caches"]


def engine_shard(parallel_config: Any, role: KVConnectorRole, *, owner: str) -> KVShard:
    """The shard of the KV cache this connector's role holds: a worker's tensor- and pipeline-parallel
    rank (vLLM's parallel groups), the scheduler's rank 0; the sizes from vLLM's parallel config."""
    for name in ("decode_context_parallel_size", "prefill_context_parallel_size"):
        size = getattr(parallel_config, name, 1)
        if size != 1:
            raise ConfigError(
                f"{owner}: {name}={size}: capkv's stores key a block by tensor- and pipeline-parallel shard, "
                "and do not split its tokens across context-parallel ranks",
                connector=owner, method="__init__", value=size,
            )
    tp_size, pp_size = parallel_config.tensor_parallel_size, parallel_config.pipeline_parallel_size
    if role != KVConnectorRole.WORKER or tp_size * pp_size == 1:
        return KVShard(tp_size=tp_size, pp_size=pp_size)
    from vllm.distributed import parallel_state  # noqa: PLC0415 (set up in the worker before its connector)

    if not parallel_state.model_parallel_is_initialized():
        raise ConfigError(
            f"{owner}: a worker of a {tp_size}x{pp_size}-way parallel engine, but vLLM's parallel groups are not "
            "set up: its shard is unknown",
            connector=owner, method="__init__", value=(tp_size, pp_size),
        )
    return KVShard(
        tp_rank=parallel_state.get_tensor_model_parallel_rank(), tp_size=tp_size,
        pp_rank=parallel_state.get_pipeline_model_parallel_rank(), pp_size=pp_size,
    )


def engine_spec(kv_cache_config: KVCacheConfig, *, owner: str, shard: KVShard | None = None) -> KVSpec:
    """The spec of vLLM's KV cache: groups, block sizes, windows, per-layer shapes, dtype, and the shard."""

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

    spec = KVSpec.from_kv_cache_config(kv_cache_config, kv_shape=shape, block_dim=0, shard=shard)
    windows = tuple(_window(group.kv_cache_spec, index, owner) for index, group in enumerate(kv_cache_config.kv_cache_groups))
    return dataclasses.replace(
        spec, groups=tuple(dataclasses.replace(g, sliding_window=w) for g, w in zip(spec.groups, windows, strict=True))
    )


def _window(kv_cache_spec: object, group: int, owner: str) -> int | None:
    """The window capkv must assume for a group: what vLLM's block manager keeps, not what the layers compute.

    With the hybrid allocator off, vLLM serves sliding-window layers from a
    full-attention group (a ``FullAttentionSpec`` that still carries the
    window): every block is kept, and full-attention layers in the same group
    read them all, so capkv treats the group as full attention.
    """
    if isinstance(kv_cache_spec, SlidingWindowSpec):
        return kv_cache_spec.sliding_window
    if isinstance(kv_cache_spec, FullAttentionSpec):
        return None
    raise ConfigError(
        f"{owner}: KV-cache group {group} is a {type(kv_cache_spec).__name__}; capkv's stacks serve "
        "full-attention and sliding-window groups",
        connector=owner, method="__init__", group=group, value=type(kv_cache_spec).__name__,
    )


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
