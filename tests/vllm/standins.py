"""Local stand-ins for the hub models vLLM's own connector tests name, in an offline hub cache.

vLLM's ``tests/v1/kv_connector/unit`` build configurations of ``facebook/opt-125m``
and serve ``meta-llama/Llama-3.2-1B-Instruct``; the test machines reach no hub. Each
name gets a tiny seeded Llama (all full attention, :func:`tests.vllm.model.write_model`)
with a word-level tokenizer, written where ``huggingface_hub`` looks for a cached
snapshot, and the hub is put offline: vLLM resolves the names to these folders as it
would to downloaded ones.

The tokenizer splits on whitespace and punctuation, so ``"Hi " * 100 + "Hello, my name
is"`` is 106 tokens with its BOS — seven blocks of 16, the count vLLM's tests expect of
the real tokenizer.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.vllm.model import VOCAB, write_model

STANDINS = ("facebook/opt-125m", "meta-llama/Llama-3.2-1B-Instruct")
_REVISION = "0" * 40
_WORDS = ("Hi", "Hello", ",", "my", "name", "is", "The", "capital", "of", "France")


def write_standins(cache: Path) -> Path:
    """Write every stand-in as a cached hub snapshot under ``cache``; returns ``cache``."""
    for name in STANDINS:
        repo = cache / f"models--{name.replace('/', '--')}"
        snapshot = write_model(repo / "snapshots" / _REVISION, hybrid=False)
        _write_tokenizer(snapshot)
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / "main").write_text(_REVISION)
    return cache


def go_offline(cache: Path) -> None:
    """Point ``huggingface_hub`` at ``cache`` and take it offline (also when it is already imported)."""
    os.environ["HF_HUB_CACHE"] = str(cache)
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    import huggingface_hub.constants as constants

    constants.HF_HUB_CACHE = str(cache)
    constants.HF_HUB_OFFLINE = True


def _write_tokenizer(folder: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    specials = ["<unk>", "<s>", "</s>"]
    words = [*specials, *_WORDS]
    vocab = {token: index for index, token in enumerate(words + [f"w{i}" for i in range(VOCAB - len(words))])}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "model_max_length": 4096,
    }))
