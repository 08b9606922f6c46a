"""Fixtures: real Redis servers (standalone, a 3-node cluster), and connectors closed after each test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.redis.servers import MISSING, RedisCluster, RedisServer


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def redis_cluster(tmp_path: Path) -> Iterator[RedisCluster]:
    cluster = RedisCluster(tmp_path)
    try:
        yield cluster.start()
    finally:
        cluster.stop()


@pytest.fixture(autouse=True)
def _close_redis_connectors(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Close every ``RedisStoreConnector`` a test makes, so no writer thread outlives its test."""
    if MISSING is not None:
        yield
        return
    from capkv.connectors import RedisStoreConnector

    created: list[Any] = []
    original = RedisStoreConnector.__init__

    def recording_init(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        created.append(self)

    monkeypatch.setattr(RedisStoreConnector, "__init__", recording_init)
    yield
    for connector in created:
        connector.close()
