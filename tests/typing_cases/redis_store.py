"""RedisStoreConnector: exported lazily, yet fully typed; HMA-capable in a stack; a context manager."""

from __future__ import annotations

from typing_extensions import assert_type

from capkv import HMAMultiConnector, KVSpec, MultiConnector, SupportsHMA
from capkv.connectors import CPUOffloadConnector, RedisStoreConnector


def needs_hma(connector: SupportsHMA) -> None: ...


def build(spec: KVSpec) -> None:
    redis = RedisStoreConnector(spec, url="redis://127.0.0.1:6379", namespace="llama", timeout_s=0.5)
    stack = MultiConnector(CPUOffloadConnector(spec, capacity_blocks=1024), redis)
    assert_type(stack, HMAMultiConnector[CPUOffloadConnector, RedisStoreConnector])
    needs_hma(stack)
    with RedisStoreConnector(spec) as store:
        assert_type(store, RedisStoreConnector)
        store.flush()
    RedisStoreConnector(spec, "redis://127.0.0.1:6379")  # expect-error
    RedisStoreConnector(spec, url=6379)  # expect-error
    RedisStoreConnector(spec, capacity_blocks=4)  # expect-error
