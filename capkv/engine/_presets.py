"""Real models' KV-cache shapes in one table, so every benchmark measures what users store (16-160x the demo's
32 KiB per block). A benchmark too big for its machine scales a preset in blocks, never in value size."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from capkv.engine._model import FULL, ModelShape

__all__ = ["MODEL_PRESETS", "ModelPreset", "model_preset", "model_presets"]


@dataclass(frozen=True)
class ModelPreset:
    """A model's attention layers and KV-cache geometry, without a pool size."""

    name: str
    model: str
    """The model whose configuration (``config.json``) this copies."""
    num_layers: int
    pattern: str
    """``F`` full attention, ``S`` sliding window, repeated over the layers (as :class:`ModelShape`)."""
    num_kv_heads: int
    head_dim: int
    sliding_window: int = 128
    dtype: torch.dtype = torch.bfloat16

    def shape(self, *, block_size: int = 16, num_blocks: int = 1024, device: str = "cpu") -> ModelShape:
        """This model as a :class:`ModelShape` of ``num_blocks`` blocks (the null block included)."""
        return ModelShape(
            num_layers=self.num_layers, pattern=self.pattern, sliding_window=self.sliding_window,
            num_kv_heads=self.num_kv_heads, head_dim=self.head_dim, block_size=block_size,
            num_blocks=num_blocks, dtype=self.dtype, device=device,
        )

    @property
    def hybrid(self) -> bool:
        """Whether some layers attend through a sliding window."""
        return set(self.pattern) != {FULL}

    def layout(self) -> ModelShape:
        """The shape at its smallest pool (for its groups and layer counts, not for its tensors)."""
        return self.shape(num_blocks=2)

    def value_nbytes(self, block_size: int = 16) -> int:
        """Bytes of one block of one KV-cache group: every layer of the group (what a store keeps per value).
        Every group of a preset holds as many layers, so one figure fits them all."""
        group_layers = len(self.layout().groups[0].layer_names)
        return group_layers * 2 * block_size * self.num_kv_heads * self.head_dim * self.dtype.itemsize

    def block_nbytes(self, block_size: int = 16) -> int:
        """Bytes of one block across every layer of the model (every group)."""
        return len(self.layout().groups) * self.value_nbytes(block_size)

    def blocks_within(self, budget_bytes: int, *, block_size: int = 16, minimum: int = 2) -> int:
        """How many blocks (each in every group) fit ``budget_bytes``, at least ``minimum``: the way a
        benchmark scales a model too big for its machine (fewer blocks, the same values)."""
        return max(minimum, budget_bytes // self.block_nbytes(block_size))

    def describe(self, block_size: int = 16) -> str:
        """One line: the model, its groups and a value's size."""
        groups = self.layout().groups
        kinds = f"{len(groups)} groups of {len(groups[0].layer_names)} layers" if len(groups) > 1 else "1 group"
        window = f", sliding window {self.sliding_window}" if self.hybrid else ""
        value = self.value_nbytes(block_size)
        size = f"{value >> 20} MiB" if value >= 1 << 20 and value % (1 << 20) == 0 else f"{value >> 10} KiB"
        return (
            f"{self.name} ({self.model}: {self.num_layers} layers, {kinds}{window}, {self.num_kv_heads} KV heads x "
            f"{self.head_dim}, {str(self.dtype).removeprefix('torch.')}; {size} per {block_size}-token value)"
        )


MODEL_PRESETS: dict[str, ModelPreset] = {
    preset.name: preset
    for preset in (
        ModelPreset("demo", "capkv's demo model", num_layers=6, pattern="FSS", num_kv_heads=4, head_dim=64),
        ModelPreset("llama-1b", "Llama-3.2-1B", num_layers=16, pattern=FULL, num_kv_heads=8, head_dim=64),
        ModelPreset("llama-8b", "Llama-3.1-8B", num_layers=32, pattern=FULL, num_kv_heads=8, head_dim=128),
        ModelPreset("llama-70b", "Llama-3.1-70B", num_layers=80, pattern=FULL, num_kv_heads=8, head_dim=128),
        # Gemma 3 12B: five sliding-window layers (1024 tokens) then one global layer, 48 layers; the engine
        # groups them as vLLM's hybrid allocator does: 1 full group and 5 sliding groups of 8 layers each.
        ModelPreset(
            "gemma3-12b", "Gemma-3-12B", num_layers=48, pattern="SSSSSF", num_kv_heads=8, head_dim=256,
            sliding_window=1024,
        ),
    )
}
"""Every preset by name: the demo model, Llama-3.2-1B/3.1-8B/3.1-70B (full attention, 512 KiB, 2 MiB and
5 MiB per 16-token block) and Gemma-3-12B (hybrid: 1 MiB per 16-token block of each of its 6 groups)."""


def model_preset(name: str) -> ModelPreset:
    """The preset called ``name``; a :class:`KeyError` naming the known ones otherwise."""
    try:
        return MODEL_PRESETS[name]
    except KeyError:
        raise KeyError(f"no model preset {name!r}; known: {', '.join(MODEL_PRESETS)}") from None


def model_presets(names: list[str] | tuple[str, ...]) -> list[ModelPreset]:
    """The presets ``names`` stands for, in order (``all``: every preset)."""
    if "all" in names:
        return list(MODEL_PRESETS.values())
    return [model_preset(name) for name in dict.fromkeys(names)]

