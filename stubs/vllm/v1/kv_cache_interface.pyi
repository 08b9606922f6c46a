from typing import Any

import torch

class KVCacheSpec:
    block_size: int
    is_draft: bool  # vLLM 0.33 (a drafter's layers); absent on 0.32: read it with getattr(spec, "is_draft", False)
    def __init__(
        self, block_size: int, *, dcp_sharded: bool = False, block_stride_alignment: Any = None, is_draft: bool = False
    ) -> None: ...

class AttentionSpec(KVCacheSpec):
    num_kv_heads: int
    head_size: int
    dtype: torch.dtype
    def __init__(
        self,
        block_size: int,
        *,
        dcp_sharded: bool = True,
        block_stride_alignment: Any = None,
        is_draft: bool = False,
        max_tp_shards: int | None = None,
        num_kv_heads: int,
        head_size: int,
        dtype: torch.dtype,
        head_size_v: int | None = None,
        kv_quant_mode: Any = ...,
        page_size_padded: int | None = None,
        num_head_slots: int | None = None,
        state_content_bytes: int | None = None,
        tokens_per_state: Any = 1,
    ) -> None: ...

class FullAttentionSpec(AttentionSpec):
    sliding_window: int | None
    def __init__(
        self,
        block_size: int,
        *,
        dcp_sharded: bool = True,
        block_stride_alignment: Any = None,
        is_draft: bool = False,
        max_tp_shards: int | None = None,
        num_kv_heads: int,
        head_size: int,
        dtype: torch.dtype,
        head_size_v: int | None = None,
        kv_quant_mode: Any = ...,
        page_size_padded: int | None = None,
        num_head_slots: int | None = None,
        state_content_bytes: int | None = None,
        tokens_per_state: Any = 1,
        sliding_window: int | None = None,
        attention_chunk_size: int | None = None,
        non_causal: bool = False,
    ) -> None: ...

class SlidingWindowSpec(AttentionSpec):
    sliding_window: int
    def __init__(
        self,
        block_size: int,
        *,
        dcp_sharded: bool = True,
        block_stride_alignment: Any = None,
        is_draft: bool = False,
        max_tp_shards: int | None = None,
        num_kv_heads: int,
        head_size: int,
        dtype: torch.dtype,
        head_size_v: int | None = None,
        kv_quant_mode: Any = ...,
        page_size_padded: int | None = None,
        num_head_slots: int | None = None,
        state_content_bytes: int | None = None,
        tokens_per_state: Any = 1,
        sliding_window: int,
        extra_retained_tokens: int = 0,
    ) -> None: ...

class KVCacheTensor:
    size: int
    layers: list[str]
    layer_stride: int
    block_stride: int
    offset: int
    def __init__(
        self,
        size: int,
        layers: list[str],
        layer_stride: int,
        block_stride: int,
        offset: int = 0,
        host_resident: bool = False,
    ) -> None: ...

class KVCacheGroupSpec:
    layer_names: list[str]
    kv_cache_spec: KVCacheSpec
    def __init__(
        self,
        layer_names: list[str],
        kv_cache_spec: KVCacheSpec,
        is_eagle_group: bool = False,
        host_resident: bool = False,
        enable_kv_transfer: bool = True,
        role: Any = ...,
    ) -> None: ...

class KVCacheConfig:
    num_blocks: int
    kv_cache_tensors: list[KVCacheTensor]
    kv_cache_groups: list[KVCacheGroupSpec]
    def __init__(
        self,
        num_blocks: int,
        kv_cache_tensors: list[KVCacheTensor],
        kv_cache_groups: list[KVCacheGroupSpec],
        prefix_cache_retention_interval: int | None = None,
        kv_cache_layout: str | None = None,
        hash_block_size: int | None = None,
        cache_hit_alignment_tokens: int | None = None,
        hisparse_host_num_blocks: int | None = None,
        hisparse_host_block_stride: int | None = None,
        hisparse_shared_host_pool: bool = False,
        kv_tp_replicas: int = 1,
    ) -> None: ...

def compute_layer_kv_cache_shape_bytes(
    spec: KVCacheSpec, num_blocks: int, kernel_block_size: int | None = None
) -> tuple[int, ...]: ...
