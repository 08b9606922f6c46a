"""``benchmarks/redis_store.py`` measures what it says: a round moves real values through the connector, and every
plain strategy it compares with really stores or lands the same values (none can win by doing less)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from benchmarks._plain_redis import get_alone, get_strategies, set_strategies
from benchmarks.redis_store import blocks_for, throughput
from capkv.engine._presets import model_preset
from capkv.stores._host import row_memory
from tests.redis.servers import RedisServer, needs_redis

pytestmark = needs_redis

VALUE = 3000
COUNT = 40


@pytest.fixture
def client(tmp_path: Path) -> Iterator[Any]:
    import redis

    server = RedisServer(tmp_path).start()
    connection = redis.Redis.from_url(server.url, socket_timeout=10)
    try:
        yield connection
    finally:
        connection.close()
        server.stop()


def test_a_round_saves_loads_and_times_every_baseline(client: Any) -> None:
    url = "redis://{host}:{port}".format(**client.connection_pool.connection_kwargs)
    figures = throughput(url, model_preset("demo"), 8, 1)
    (times,) = figures.rounds
    assert figures.nbytes == 8 * model_preset("demo").value_nbytes()
    assert min(times.values()) > 0 and {"save", "load", "gather", "scatter"} <= times.keys()
    assert figures.winner("save").startswith("SET,") and figures.winner("load").startswith("GET,")


def test_a_preset_is_scaled_in_values_not_in_value_size() -> None:
    assert blocks_for(model_preset("llama-8b"), 128 << 20) == 64
    assert blocks_for(model_preset("llama-70b"), 1 << 20) == 8  # at least 8 values of 5 MiB


def test_every_set_strategy_stores_the_sources_values(client: Any) -> None:
    source = torch.randint(0, 256, (COUNT * VALUE,), dtype=torch.uint8)
    expected = bytes(row_memory(source))
    names = [b"v%d" % index for index in range(COUNT)]
    for name, strategy in set_strategies(client, names, source, VALUE).items():
        client.flushall()
        assert strategy() == len(expected), name
        assert b"".join(client.mget(names)) == expected, f"{name} did not store the source's values"


def test_every_get_strategy_lands_the_values_in_the_destination(client: Any) -> None:
    values = [os.urandom(VALUE) for _ in range(COUNT)]
    names = [b"v%d" % index for index in range(COUNT)]
    client.mset(dict(zip(names, values, strict=True)))
    destination = torch.zeros(COUNT * VALUE, dtype=torch.uint8)
    for name, strategy in get_strategies(client, names, destination, VALUE).items():
        destination.zero_()
        assert strategy() == COUNT * VALUE, name
        assert bytes(row_memory(destination)) == b"".join(values), f"{name} did not land the values"
    assert get_alone(client, names)() == COUNT * VALUE
    client.delete(names[0])
    with pytest.raises(RuntimeError, match="found no value"):
        next(iter(get_strategies(client, names, destination, VALUE).values()))()
