"""A Redis load's ``GET``s go about 1 MiB of values a round trip, not 512 commands whatever their size: trips
of several MiB ran at half the throughput (redis-py and hiredis on loopback, 32 KiB-2 MiB values)."""

from __future__ import annotations

import os
from typing import Any

import pytest

from capkv.connectors._redis_client import RedisKV
from capkv.connectors._redis_store import RedisBackend
from capkv.stores import StoreKey
from capkv.stores._keys import BlockKey
from tests.redis.servers import RedisServer, needs_redis

pytestmark = needs_redis


@pytest.mark.parametrize(("size", "per_trip"), [(600 << 10, [1, 1, 1, 1, 1]), (100 << 10, [10, 10, 10, 10, 10, 2])])
def test_gets_of_values_of_known_size_go_about_a_mib_a_round_trip(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch, size: int, per_trip: list[int]
) -> None:
    kv = RedisKV(redis_server.url, owner="test", timeout_s=10.0)
    count = sum(per_trip)
    names = [b"k%d" % index for index in range(count)]
    values = [os.urandom(size) for _ in range(count)]
    assert all(kv.set(names, values))
    trips: list[int] = []
    pipeline = kv._pipeline

    def counted(node: Any, commands: list[tuple[object, ...]]) -> list[object]:
        trips.append(len(commands))
        return pipeline(node, commands)

    monkeypatch.setattr(kv, "_pipeline", counted)
    assert kv.get(names, [size] * count) == values
    assert trips == per_trip
    trips.clear()
    assert kv.get(names) == values  # sizes unknown: commands a trip are bounded by count only
    assert trips == [count]
    kv.close()


def test_the_redis_backend_gets_a_steps_values_by_their_size(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    kv = RedisKV(redis_server.url, owner="test", timeout_s=10.0)
    backend = RedisBackend(kv, namespace="trips")
    keys = [StoreKey(BlockKey(0, bytes([index]) * 16), b"\x01" * 16, 700 << 10) for index in range(3)]
    values = [os.urandom(700 << 10) for _ in keys]
    assert backend.put([(key, memoryview(value)) for key, value in zip(keys, values, strict=True)]) == [True] * 3
    trips: list[int] = []
    pipeline = kv._pipeline
    monkeypatch.setattr(kv, "_pipeline", lambda node, commands: (trips.append(len(commands)), pipeline(node, commands))[1])
    assert backend.get(keys) == values
    assert trips == [1, 1, 1]  # 700 KiB values: one a round trip
    kv.close()
