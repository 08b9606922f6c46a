"""Requests' inputs besides their tokens, end to end in the reference engine, whose KV depends on them.

A cache salt, an adapter, a multimodal item or a prompt embedding changes the
engine's KV (capkv/engine/_request.py), so a store that serves one tenant's,
adapter's, image's or embedding's KV to another is caught by the engine's
bit-for-bit verification; capkv's stores keep them apart by key.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from capkv import MultimodalItem
from capkv.connectors import CPUOffloadConnector, FileStoreConnector
from capkv.engine import Engine, ModelShape
from capkv.engine._request import Request
from capkv.engine._verify import VerificationError
from capkv.stores import _scheduler

SHAPE = ModelShape(num_layers=2, pattern="FS", sliding_window=32, num_kv_heads=1, head_dim=8, block_size=16, num_blocks=128)
PROMPT = list(range(1000, 1100))

VARIANTS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "cache_salt": ({"cache_salt": "tenant-a"}, {"cache_salt": "tenant-b"}),
    "adapter": ({"adapter": "sql-lora"}, {"adapter": "chat-lora"}),
    "multimodal": ({"multimodal": [MultimodalItem("image-1", 4, 16)]}, {"multimodal": [MultimodalItem("image-2", 4, 16)]}),
    "prompt_embeds": ({"prompt_embeds": [b"a"] * 40}, {"prompt_embeds": [b"a"] * 39 + [b"b"]}),
}

STORES: dict[str, Callable[[Path], Any]] = {
    "cpu": lambda root: CPUOffloadConnector(SHAPE.kv_spec(), capacity_blocks=256),
    "file": lambda root: FileStoreConnector(SHAPE.kv_spec(), root=root),
}


def _serve(engine: Engine, request_id: str, inputs: dict[str, Any]) -> int:
    """Serve one request after forgetting the local prefix cache; the tokens loaded through the store."""
    engine.reset_prefix_cache()
    engine.stats.reset()
    engine.run([Request(request_id, PROMPT, max_tokens=2, **inputs)])
    flush = getattr(engine.connector, "flush", None)
    if flush is not None:
        flush()
    return engine.stats.external_hit_tokens


@pytest.mark.parametrize("store", sorted(STORES))
@pytest.mark.parametrize("component", sorted(VARIANTS))
def test_another_input_loads_nothing_and_the_same_input_loads(component: str, store: str, tmp_path: Path) -> None:
    mine, theirs = VARIANTS[component]
    engine = Engine(SHAPE, STORES[store](tmp_path))
    assert _serve(engine, "first", mine) == 0
    assert _serve(engine, "other", theirs) == (32 if component == "prompt_embeds" else 0)  # embeds differ at 39
    assert _serve(engine, "again", mine) == 96  # verified bit for bit by the engine
    assert _serve(engine, "plain", {}) == 0 and _serve(engine, "plain-again", {}) == 96
    engine.shutdown()


def test_a_store_blind_to_the_salt_hands_one_tenant_the_others_kv_and_the_engine_catches_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What capkv's stores did before issue 15, with the engine as the witness."""
    monkeypatch.setattr(_scheduler, "request_key_inputs", lambda request, **where: None)
    engine = Engine(SHAPE, CPUOffloadConnector(SHAPE.kv_spec(), capacity_blocks=256))
    _serve(engine, "tenant-a", {"cache_salt": "tenant-a"})
    with pytest.raises(VerificationError, match="KV mismatch"):
        _serve(engine, "tenant-b", {"cache_salt": "tenant-b"})
