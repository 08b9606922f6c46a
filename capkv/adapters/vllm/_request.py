"""vLLM's ``Request`` as capkv's stores key it: the inputs besides its tokens that change its KV.

Read from the request, not from its ``block_hashes``, whose values depend on the engine's hash settings and
block size; capkv's core never imports vLLM.
"""

from __future__ import annotations

import hashlib
import weakref
from typing import Any

import torch
from vllm.v1.request import Request

from capkv.contracts._key_inputs import KeyInputs, MultimodalItem, register_key_inputs
from capkv.stores._value import row_memory

__all__ = ["read_vllm_requests", "vllm_key_inputs"]

_seen: weakref.WeakKeyDictionary[Request, KeyInputs | None] = weakref.WeakKeyDictionary()
"""Each request's inputs, read once (its prompt embeddings are hashed once, whichever store asks)."""


def vllm_key_inputs(request: object) -> KeyInputs | None:
    """``request``'s key inputs: its cache salt, LoRA adapter (name and path), multimodal items (content
    hash and placeholder range) and a digest per prompt-embedding row."""
    if not isinstance(request, Request):
        return None
    if request in _seen:
        return _seen[request]
    lora: Any = request.lora_request
    adapter = None if not lora else repr((lora.lora_name, lora.lora_path))
    items = tuple(
        MultimodalItem(feature.identifier, feature.mm_position.offset, feature.mm_position.length)
        for feature in request.mm_features or ()
    )
    inputs = KeyInputs(request.cache_salt or None, adapter, items, _embeds_digests(request.prompt_embeds))
    found = None if inputs.empty else inputs
    _seen[request] = found
    return found


def _embeds_digests(embeds: torch.Tensor | None) -> tuple[bytes, ...]:
    if embeds is None:
        return ()
    rows = embeds.detach().to("cpu").contiguous()
    rows = rows.reshape(rows.shape[0], -1).view(torch.uint8)
    return tuple(hashlib.blake2b(row_memory(rows[i]), digest_size=16).digest() for i in range(rows.shape[0]))


def read_vllm_requests() -> None:
    """Let capkv's stores read the key inputs of vLLM's requests (idempotent)."""
    register_key_inputs(Request, vllm_key_inputs)
