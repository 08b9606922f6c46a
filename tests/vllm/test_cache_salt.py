"""Tenants: a prefix saved with one ``cache_salt`` is never loaded for another tenant, and is for its own.

vLLM keeps tenants' prefix caches apart by their salt; capkv's stores key blocks
by it too (capkv/stores/_keys.py). Three fresh in-process engines over one file
store: tenant A saves (and serves again from its local prefix cache: the
reference), tenant B with the same tokens loads nothing, tenant A loads every
prefix, bit-equal to the reference. Before issue 15 tenant B loaded A's KV.
"""

from __future__ import annotations

from pathlib import Path

from tests.vllm.engine import counter, file_store_host, serve
from tests.vllm.model import prompts

PROMPTS = prompts(2, 200, seed=3)


def test_another_tenant_loads_nothing_and_the_same_tenant_loads_bit_equal(model_dir: Path, tmp_path: Path) -> None:
    config = file_store_host(tmp_path / "store")
    saved = serve(model_dir, PROMPTS, max_tokens=8, runs=2, kv_transfer_config=config, cache_salt="tenant-a")
    assert saved.runs[1].cached == [192, 192] and counter(saved.stats, "saved_blocks") > 0

    other = serve(model_dir, PROMPTS, max_tokens=8, kv_transfer_config=config, cache_salt="tenant-b")
    assert other.runs[0].cached == [0, 0]
    assert counter(other.stats, "hit_tokens") == 0, other.stats
    assert other.runs[0].tokens == saved.runs[0].tokens  # the same model and tokens: the salt changes no output

    same = serve(model_dir, PROMPTS, max_tokens=8, kv_transfer_config=config, cache_salt="tenant-a")
    assert same.runs[0].cached == [192, 192]
    assert counter(same.stats, "hit_tokens") == 2 * 192, same.stats
    assert same.runs[0].tokens == saved.runs[1].tokens and same.runs[0].logprobs == saved.runs[1].logprobs
