"""The engine's KV-cache shape, as the contracts check it and the copy ops walk it.

Everything optional is checked only when given, so a spec can be as coarse as the engine knows.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, cast

from capkv._homes import publish
from capkv.contracts._arguments import (
    argument_error,
    require_device,
    require_instance,
    require_dtype,
    require_int,
    require_names,
    require_optional_int,
    require_shape,
)
from capkv.errors import ConfigError

if TYPE_CHECKING:  # torch loads only where KV is moved, not with the contracts
    import torch

__all__ = ["KVGroupSpec", "KVShard", "KVSpec"]


@dataclass(frozen=True, kw_only=True)
class KVShard:
    """Which part of the model's KV cache one worker holds: its tensor- and pipeline-parallel rank and size.

    Tensor-parallel ranks hold different KV heads, pipeline-parallel ranks
    different layers; a stored block's bytes are one shard's, so stores key
    them by shard (one rank never reads another's) and offer a block only once
    every shard holds its part. The scheduler side, which holds no shard of its
    own, reads only the sizes (:attr:`count`).
    """

    tp_rank: int = 0
    tp_size: int = 1
    pp_rank: int = 0
    pp_size: int = 1

    def __post_init__(self) -> None:
        owner = "KVShard"
        for kind in ("tp", "pp"):
            size = require_int(getattr(self, f"{kind}_size"), owner, f"{kind}_size", minimum=1)
            require_int(getattr(self, f"{kind}_rank"), owner, f"{kind}_rank", minimum=0, maximum=size - 1)

    @property
    def count(self) -> int:
        """How many shards the KV cache has (every tensor- and pipeline-parallel rank)."""
        return self.tp_size * self.pp_size

    @property
    def index(self) -> int:
        """This shard's number, ``0 .. count - 1``."""
        return self.pp_rank * self.tp_size + self.tp_rank


@dataclass(frozen=True, kw_only=True)
class KVGroupSpec:
    """One KV-cache group: layers sharing a block table."""

    layer_names: tuple[str, ...] = ()
    block_size: int | None = None
    """Tokens per block."""
    sliding_window: int | None = None
    """Window in tokens; ``None`` for full attention."""
    kv_shape: tuple[int, ...] | None = None
    """Shape of each layer's paged KV tensor, the block dimension included."""

    def __post_init__(self) -> None:
        # Checked whatever the dev-mode switch says: a str of layer names, a bool or a
        # float block size would be accepted here and misread much later.
        owner = "KVGroupSpec"
        _set(self, "layer_names", require_names(self.layer_names, owner, "layer_names"))
        _set(self, "block_size", require_optional_int(self.block_size, owner, "block_size", minimum=1))
        _set(self, "sliding_window", require_optional_int(self.sliding_window, owner, "sliding_window", minimum=1))
        if self.kv_shape is not None:
            _set(self, "kv_shape", require_shape(self.kv_shape, owner, "kv_shape"))


@dataclass(frozen=True, kw_only=True)
class KVSpec:
    """The paged KV cache an engine serves from.

    One ``KVSpec`` describes the whole paged cache: how many KV-cache groups (one per attention kind under the
    hybrid allocator), how many blocks the pool has, which id is the null block, and — optionally — each
    group's layers, block size, sliding window and per-layer tensor shape. Everything optional is checked only
    when given, so a spec can be as coarse as the engine knows.
    """

    num_groups: int
    num_blocks: int
    null_block_id: int = 0
    groups: tuple[KVGroupSpec, ...] = ()
    """Empty, or one entry per group."""
    block_dim: int = 0
    """Which dimension of a layer's KV tensor indexes blocks."""
    dtype: torch.dtype | None = None
    device: torch.device | None = None
    shard: KVShard = KVShard()
    """The part of the model's KV cache this spec's worker holds (every part, for a single worker)."""

    def __post_init__(self) -> None:
        owner = "KVSpec"
        _set(self, "num_groups", require_int(self.num_groups, owner, "num_groups", minimum=1))
        _set(self, "num_blocks", require_int(self.num_blocks, owner, "num_blocks", minimum=1))
        _set(self, "null_block_id", require_int(self.null_block_id, owner, "null_block_id", minimum=0, maximum=self.num_blocks - 1))
        _set(self, "block_dim", require_int(self.block_dim, owner, "block_dim", minimum=0))
        require_dtype(self.dtype, owner)
        _set(self, "device", require_device(self.device, owner))
        require_instance(self.shard, KVShard, owner, "shard", "a capkv.KVShard")
        require_instance(self.groups, (tuple, list), owner, "groups", "a tuple of KVGroupSpec, one per group, or ()")
        _set(self, "groups", tuple(cast("tuple[object, ...]", self.groups)))
        for index, group in enumerate(cast("tuple[object, ...]", self.groups)):
            if not isinstance(group, KVGroupSpec):
                raise argument_error(owner, f"groups[{index}]", group, "a KVGroupSpec", group=index)
        if self.groups and len(self.groups) != self.num_groups:
            raise ConfigError(
                f"KVSpec: {len(self.groups)} group specs given for num_groups={self.num_groups}",
                method="KVSpec", value=len(self.groups),
            )
        seen: dict[str, int] = {}
        for index, group in enumerate(self.groups):
            for name in group.layer_names:
                if name in seen:
                    raise ConfigError(
                        f"KVSpec: layer {name!r} is in group {seen[name]} and group {index}",
                        method="KVSpec", group=index, value=name,
                    )
                seen[name] = index
            shape = group.kv_shape
            if shape is None:
                continue
            if not 0 <= self.block_dim < len(shape):
                raise ConfigError(
                    f"KVSpec: block_dim {self.block_dim} is not a dimension of group {index}'s "
                    f"kv_shape {shape}",
                    method="KVSpec", group=index, value=shape,
                )
            if shape[self.block_dim] != self.num_blocks:
                raise ConfigError(
                    f"KVSpec: group {index}'s kv_shape {shape} has {shape[self.block_dim]} blocks "
                    f"in dimension {self.block_dim}, expected num_blocks={self.num_blocks}",
                    method="KVSpec", group=index, value=shape,
                )

    @classmethod
    def from_kv_cache_config(
        cls,
        config: object,
        *,
        num_blocks: int | None = None,
        null_block_id: int = 0,
        kv_shape: Callable[[Any, int], tuple[int, ...]] | None = None,
        block_dim: int = 0,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
        shard: KVShard | None = None,
    ) -> KVSpec:
        """The spec of a vLLM-shaped ``KVCacheConfig``, read by duck typing.

        Reads ``config.num_blocks`` (unless ``num_blocks`` is given) and, per
        ``config.kv_cache_groups[i]``, ``layer_names`` and ``kv_cache_spec.block_size``
        and ``.sliding_window`` (when present). The tensor layout belongs to the
        attention backend, not the config: pass ``kv_shape(kv_cache_spec, num_blocks)``
        to get shape templates, e.g. ``lambda s, n: (2, n, s.block_size, s.num_kv_heads,
        s.head_size)`` with ``block_dim=1`` for vLLM's FlashAttention layout.
        ``dtype`` defaults to the groups' ``kv_cache_spec.dtype`` when they all agree;
        ``shard`` says which tensor- and pipeline-parallel rank the config is for.
        """
        groups: Sequence[Any] = getattr(config, "kv_cache_groups", ())
        blocks = num_blocks if num_blocks is not None else getattr(config, "num_blocks", None)
        if type(blocks) is not int:
            raise ConfigError(
                f"KVSpec.from_kv_cache_config: {type(config).__name__} has no int num_blocks "
                f"(got {blocks!r}); pass num_blocks=",
                method="from_kv_cache_config", value=blocks,
            )
        specs = [group.kv_cache_spec for group in groups]
        dtypes = {getattr(spec, "dtype", None) for spec in specs}
        if dtype is None and len(dtypes) == 1:
            dtype = next(iter(dtypes))
        return cls(
            num_groups=len(groups),
            num_blocks=blocks,
            null_block_id=null_block_id,
            groups=tuple(
                KVGroupSpec(
                    layer_names=tuple(group.layer_names),
                    block_size=getattr(spec, "block_size", None),
                    sliding_window=getattr(spec, "sliding_window", None),
                    kv_shape=None if kv_shape is None else tuple(kv_shape(spec, blocks)),
                )
                for group, spec in zip(groups, specs, strict=True)
            ),
            block_dim=block_dim,
            dtype=dtype,
            device=None if device is None else _device(device),
            shard=KVShard() if shard is None else shard,
        )

    @cached_property
    def layer_groups(self) -> Mapping[str, int]:
        """The group of every layer the spec names, by layer name (empty when it names none)."""
        return MappingProxyType({name: i for i, group in enumerate(self.groups) for name in group.layer_names})

    @property
    def layer_names(self) -> tuple[str, ...]:
        """Every layer the spec names, group by group (empty when it names none)."""
        return tuple(self.layer_groups)

    def group_of_layer(self, layer_name: str) -> int | None:
        """The group holding ``layer_name``, or ``None`` when the spec does not say."""
        return self.layer_groups.get(layer_name)

    def kv_shape_of(self, group: int | None) -> tuple[int, ...] | None:
        """A group's KV tensor shape template; for ``None`` (group unknown), the one every group shares, if any."""
        if group is not None:
            return self.groups[group].kv_shape if self.groups else None
        return self._shared_kv_shape

    @cached_property
    def _shared_kv_shape(self) -> tuple[int, ...] | None:
        shapes = {group.kv_shape for group in self.groups}
        return shapes.pop() if len(shapes) == 1 else None


def _set(spec: object, name: str, value: object) -> None:
    """Store a normalised field (a list made a tuple, a device name a device) on a frozen dataclass."""
    if getattr(spec, name) is not value:
        object.__setattr__(spec, name, value)


def _device(device: torch.device | str) -> torch.device:
    import torch  # the one runtime use: a spec read from the engine, where torch is loaded anyway

    return torch.device(device)


publish(__name__)
