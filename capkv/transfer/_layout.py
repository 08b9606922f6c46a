"""The registered KV cache as the copy ops see it: each group's layers, as runs.

Checked against the :class:`~capkv.KVSpec` at registration, so a mismatch is a :class:`~capkv.ConfigError`
there, not wrong bytes later.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

from capkv._homes import publish
from capkv.contracts._arguments import require_instance
from capkv.contracts._kv_tensors import check_kv_cache_types
from capkv.contracts._spec import KVSpec
from capkv.errors import ConfigError
from capkv.transfer._runs import LayerRuns, layer_runs, widest_word

if TYPE_CHECKING:
    import torch
else:  # torch loads with the first tensor operation, not with this module
    from capkv._torch import torch

__all__ = ["GroupRuns", "KVLayout", "spec_block_nbytes"]


def spec_block_nbytes(spec: KVSpec, group: int, *, owner: str = "KVSpec") -> int:
    """Bytes of one block of ``group`` (all its layers), from the spec alone."""
    if not 0 <= group < len(spec.groups):
        raise ConfigError(
            f"{owner}: the spec describes {len(spec.groups)} groups, not group {group}",
            connector=owner, method="spec_block_nbytes", group=group, value=group,
        )
    described = spec.groups[group]
    if described.kv_shape is None or spec.dtype is None or not described.layer_names:
        raise ConfigError(
            f"{owner}: group {group} needs layer_names, kv_shape and the spec's dtype to size its blocks",
            connector=owner, method="spec_block_nbytes", group=group, value=described,
        )
    per_layer = math.prod(described.kv_shape) // spec.num_blocks
    return per_layer * spec.dtype.itemsize * len(described.layer_names)


@dataclass(frozen=True, eq=False)
class GroupRuns:
    """One KV-cache group's layers, in the spec's order."""

    index: int
    layers: tuple[LayerRuns, ...]
    _planes: dict[int, tuple[torch.Tensor, ...]] = field(default_factory=lambda: dict[int, tuple[torch.Tensor, ...]]())
    _slabs: dict[int, tuple[tuple[int, torch.Tensor], ...]] = field(
        default_factory=lambda: dict[int, tuple[tuple[int, torch.Tensor], ...]]()
    )

    @cached_property
    def block_nbytes(self) -> int:
        """Bytes of one block of this group, all layers together."""
        return sum(layer.block_nbytes for layer in self.layers)

    @cached_property
    def alignment(self) -> int:
        """The widest word every plane of this group can be read in."""
        return widest_word(*(layer.alignment for layer in self.layers))

    @property
    def run_nbytes(self) -> int:
        """Bytes of one run; the same for every layer of the group."""
        return self.layers[0].run_nbytes

    @cached_property
    def runs_per_block(self) -> int:
        """Runs making up one block of the group (layers x outer indices)."""
        return sum(len(layer.run_offsets) for layer in self.layers)

    @property
    def signature(self) -> tuple[tuple[int, tuple[tuple[int, int], ...], tuple[tuple[int, int], ...]], ...]:
        """What fixes the meaning of a block's bytes: each layer's run order and sizes (not its address)."""
        return tuple((layer.run_nbytes, layer.inner_dims, layer.outer_dims) for layer in self.layers)

    def planes(self, word: int) -> tuple[torch.Tensor, ...]:
        """Every run of every layer as a ``(num_blocks, run_nbytes // word)`` plane (cached)."""
        planes = self._planes.get(word)
        if planes is None:
            planes = tuple(plane for layer in self.layers for plane in layer.planes(word))
            self._planes[word] = planes
        return planes

    def slabs(self, word: int) -> tuple[tuple[int, torch.Tensor], ...]:
        """``(first run, slab)`` covering every run in order: a layer's runs as one
        ``(runs, num_blocks, width)`` view where they are evenly spaced, else one run each (cached)."""
        slabs = self._slabs.get(word)
        if slabs is None:
            found: list[tuple[int, torch.Tensor]] = []
            first = 0
            for layer in self.layers:
                slab = layer.slab(word)
                if slab is not None:
                    found.append((first, slab))
                else:
                    found.extend((first + i, plane.unsqueeze(0)) for i, plane in enumerate(layer.planes(word)))
                first += len(layer.run_offsets)
            slabs = self._slabs[word] = tuple(found)
        return slabs


class KVLayout:
    """Every group's runs, validated against the spec."""

    __slots__ = ("device", "groups", "spec")

    def __init__(self, spec: KVSpec, kv_caches: Mapping[str, torch.Tensor], *, owner: str) -> None:
        require_instance(spec, KVSpec, owner, "spec", "a capkv.KVSpec", connector=owner, method="register_kv_caches")
        kv_caches = check_kv_cache_types(kv_caches, connector=owner, method="register_kv_caches", spec=spec)
        if len(spec.groups) != spec.num_groups:
            raise ConfigError(
                f"{owner}: the spec must describe each of its {spec.num_groups} groups (layer names, "
                f"kv_shape) to copy blocks; it describes {len(spec.groups)}",
                connector=owner, method="register_kv_caches", value=len(spec.groups),
            )
        known = {name for group in spec.groups for name in group.layer_names}
        unknown = sorted(set(kv_caches) - known)
        if unknown:
            raise ConfigError(
                f"{owner}: register_kv_caches got layers the spec does not list: {unknown}",
                connector=owner, method="register_kv_caches", value=unknown,
            )
        devices = {tensor.device for tensor in kv_caches.values()}
        if len(devices) > 1:
            raise ConfigError(
                f"{owner}: the KV tensors are on several devices ({sorted(map(str, devices))}); "
                "one connector copies for one device",
                connector=owner, method="register_kv_caches", value=sorted(map(str, devices)),
            )
        self.spec: KVSpec = spec
        self.device: torch.device = devices.pop() if devices else torch.device("cpu")
        if spec.device is not None and not _same_device(spec.device, self.device):
            raise ConfigError(
                f"{owner}: the spec says device {spec.device}, the KV tensors are on {self.device}",
                connector=owner, method="register_kv_caches", value=str(self.device),
            )
        self.groups: tuple[GroupRuns, ...] = tuple(
            self._group(spec, index, kv_caches, owner) for index in range(spec.num_groups)
        )

    @staticmethod
    def _group(spec: KVSpec, index: int, kv_caches: Mapping[str, torch.Tensor], owner: str) -> GroupRuns:
        described = spec.groups[index]
        if not described.layer_names:
            raise ConfigError(
                f"{owner}: group {index} lists no layer_names; its blocks could not be copied",
                connector=owner, method="register_kv_caches", group=index, value=described,
            )
        layers: list[LayerRuns] = []
        for name in described.layer_names:
            tensor = kv_caches.get(name)
            if tensor is None:
                raise ConfigError(
                    f"{owner}: layer {name!r} of group {index} was not registered",
                    connector=owner, method="register_kv_caches", group=index, value=name,
                )
            expected = described.kv_shape
            if expected is not None and tuple(tensor.shape) != expected:
                raise ConfigError(
                    f"{owner}: layer {name!r} of group {index} has shape {tuple(tensor.shape)}, "
                    f"the spec says {expected}",
                    connector=owner, method="register_kv_caches", group=index, value=tuple(tensor.shape),
                )
            if spec.dtype is not None and tensor.dtype != spec.dtype:
                raise ConfigError(
                    f"{owner}: layer {name!r} of group {index} has dtype {tensor.dtype}, the spec says {spec.dtype}",
                    connector=owner, method="register_kv_caches", group=index, value=tensor.dtype,
                )
            runs = layer_runs(tensor, spec.block_dim, layer=name, group=index, owner=owner)
            if runs.num_blocks != spec.num_blocks:
                raise ConfigError(
                    f"{owner}: layer {name!r} of group {index} has {runs.num_blocks} blocks, "
                    f"the spec says num_blocks={spec.num_blocks}",
                    connector=owner, method="register_kv_caches", group=index, value=runs.num_blocks,
                )
            if layers and runs.run_nbytes != layers[0].run_nbytes:
                raise ConfigError(
                    f"{owner}: layer {name!r} of group {index} stores {runs.run_nbytes}-byte runs per block, "
                    f"layer {described.layer_names[0]!r} {layers[0].run_nbytes}; a group's layers must share a layout",
                    connector=owner, method="register_kv_caches", group=index, value=runs.run_nbytes,
                )
            layers.append(runs)
        return GroupRuns(index, tuple(layers))


def _same_device(said: torch.device, actual: torch.device) -> bool:
    """``cuda`` matches any ``cuda:N``; explicit indices must agree."""
    if said.type != actual.type:
        return False
    return ":" not in str(said) or ":" not in str(actual) or str(said) == str(actual)


publish(__name__)
