"""``KVSpec`` from a vLLM-shaped ``KVCacheConfig``, and the lookups the contracts use."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch

from capkv import ConfigError, KVGroupSpec, KVSpec


@dataclass(frozen=True)
class FullAttentionSpec:
    block_size: int
    num_kv_heads: int
    head_size: int
    dtype: torch.dtype


@dataclass(frozen=True)
class SlidingWindowSpec(FullAttentionSpec):
    sliding_window: int


@dataclass
class KVCacheGroupSpec:
    layer_names: list[str]
    kv_cache_spec: object


@dataclass
class KVCacheConfig:
    num_blocks: int
    kv_cache_tensors: list[object] = field(default_factory=list)
    kv_cache_groups: list[KVCacheGroupSpec] = field(default_factory=list)


def hybrid(dtype: torch.dtype = torch.bfloat16, sliding_dtype: torch.dtype | None = None) -> KVCacheConfig:
    return KVCacheConfig(
        num_blocks=512,
        kv_cache_groups=[
            KVCacheGroupSpec(["layers.0.attn", "layers.2.attn"], FullAttentionSpec(32, 2, 64, dtype)),
            KVCacheGroupSpec(["layers.1.attn", "layers.3.attn"], SlidingWindowSpec(32, 2, 64, sliding_dtype or dtype, 64)),
        ],
    )


def flash_layout(spec: FullAttentionSpec, num_blocks: int) -> tuple[int, ...]:
    return (2, num_blocks, spec.block_size, spec.num_kv_heads, spec.head_size)


def test_from_a_vllm_shaped_config() -> None:
    spec = KVSpec.from_kv_cache_config(hybrid(), kv_shape=flash_layout, block_dim=1, device="cpu")
    assert spec == KVSpec(
        num_groups=2,
        num_blocks=512,
        groups=(
            KVGroupSpec(layer_names=("layers.0.attn", "layers.2.attn"), block_size=32, kv_shape=(2, 512, 32, 2, 64)),
            KVGroupSpec(
                layer_names=("layers.1.attn", "layers.3.attn"), block_size=32, sliding_window=64,
                kv_shape=(2, 512, 32, 2, 64),
            ),
        ),
        block_dim=1,
        dtype=torch.bfloat16,
        device=torch.device("cpu"),
    )
    assert spec.group_of_layer("layers.3.attn") == 1
    assert spec.layer_names == ("layers.0.attn", "layers.2.attn", "layers.1.attn", "layers.3.attn")


def test_what_the_config_does_not_settle_is_left_open() -> None:
    spec = KVSpec.from_kv_cache_config(hybrid(torch.float16, torch.float32), num_blocks=100, null_block_id=7)
    assert (spec.num_blocks, spec.null_block_id, spec.dtype, spec.device) == (100, 7, None, None)
    assert spec.kv_shape_of(0) is None and spec.kv_shape_of(None) is None


def test_a_config_without_num_blocks_needs_one() -> None:
    @dataclass
    class Groups:
        kv_cache_groups: list[KVCacheGroupSpec]

    with pytest.raises(ConfigError, match="has no int num_blocks"):
        KVSpec.from_kv_cache_config(Groups(hybrid().kv_cache_groups))
    assert KVSpec.from_kv_cache_config(Groups(hybrid().kv_cache_groups), num_blocks=8).num_groups == 2


def test_the_shape_template_of_an_unknown_layer_is_the_shared_one() -> None:
    same = KVSpec(num_groups=2, num_blocks=4, groups=(KVGroupSpec(kv_shape=(4, 2)), KVGroupSpec(kv_shape=(4, 2))))
    differ = KVSpec(num_groups=2, num_blocks=4, groups=(KVGroupSpec(kv_shape=(4, 2)), KVGroupSpec(kv_shape=(4, 3))))
    assert same.kv_shape_of(None) == (4, 2)
    assert differ.kv_shape_of(None) is None and differ.kv_shape_of(1) == (4, 3)
    assert KVSpec(num_groups=3, num_blocks=4).kv_shape_of(2) is None
