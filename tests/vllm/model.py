"""A tiny hybrid Llama written to disk: full and sliding-window layers, seeded random weights.

Random weights (not ``load_format="dummy"``, whose near-uniform logits hide
wrong KV) are scaled so greedy tokens and logprobs depend sharply on the KV a
step reads: a wrong block changes the output.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

VOCAB = 1024
HIDDEN = 128
HEADS = 4
KV_HEADS = 2
HEAD_DIM = 32
LAYERS = 4
WINDOW = 64


def write_model(
    root: Path, *, seed: int = 1234, hybrid: bool = True, layers: int = LAYERS, hidden: int = HIDDEN,
    heads: int = HEADS, kv_heads: int = KV_HEADS, head_dim: int = HEAD_DIM,
) -> Path:
    """Write ``config.json`` and ``model.safetensors`` under ``root``; returns ``root``.

    ``hybrid=False`` makes every layer full attention (one KV-cache group). The sizes default to the
    tiny test model; ``benchmarks/vllm_ttft.py`` writes a larger one, whose prefill dominates.
    """
    from safetensors.torch import save_file

    HIDDEN, HEADS, KV_HEADS, HEAD_DIM, LAYERS = hidden, heads, kv_heads, head_dim, layers  # noqa: N806
    root.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": VOCAB,
        "hidden_size": HIDDEN,
        "intermediate_size": 4 * HIDDEN,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "layer_types": ["full_attention" if i % 2 == 0 or not hybrid else "sliding_attention" for i in range(LAYERS)],
        "sliding_window": WINDOW,
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    (root / "config.json").write_text(json.dumps(config, indent=1))
    gen = torch.Generator().manual_seed(seed)

    fan_in = (128 / HIDDEN) ** 0.5  # the tiny model's scales, kept for wider layers (1.0 at hidden 128)

    def rand(*shape: int, scale: float) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * scale * (fan_in if shape[-1] == HIDDEN else 1.0)).to(torch.bfloat16)

    q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    weights = {
        "model.embed_tokens.weight": rand(VOCAB, HIDDEN, scale=1.0),
        "model.norm.weight": torch.ones(HIDDEN, dtype=torch.bfloat16),
        "lm_head.weight": rand(VOCAB, HIDDEN, scale=0.5),
    }
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        weights |= {
            p + "input_layernorm.weight": torch.ones(HIDDEN, dtype=torch.bfloat16),
            p + "post_attention_layernorm.weight": torch.ones(HIDDEN, dtype=torch.bfloat16),
            p + "self_attn.q_proj.weight": rand(q, HIDDEN, scale=0.3),
            p + "self_attn.k_proj.weight": rand(kv, HIDDEN, scale=0.3),
            p + "self_attn.v_proj.weight": rand(kv, HIDDEN, scale=0.3),
            p + "self_attn.o_proj.weight": rand(HIDDEN, q, scale=0.1),
            p + "mlp.gate_proj.weight": rand(4 * HIDDEN, HIDDEN, scale=0.1),
            p + "mlp.up_proj.weight": rand(4 * HIDDEN, HIDDEN, scale=0.1),
            p + "mlp.down_proj.weight": rand(HIDDEN, 4 * HIDDEN, scale=0.05),
        }
    save_file(weights, str(root / "model.safetensors"))
    return root


def prompts(count: int, length: int, *, seed: int) -> list[list[int]]:
    """``count`` random prompts of ``length`` token ids (ids 3 and up: no BOS/EOS)."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, VOCAB, (length,), generator=gen).tolist() for _ in range(count)]
