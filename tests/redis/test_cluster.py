"""A 3-node Redis Cluster on loopback: keys spread over the nodes, loads verify, a dead node costs only its keys."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from capkv.connectors import RedisStoreConnector
from capkv.stores._keys import RequestKeys
from tests.connectors.conftest import tokens
from tests.connectors.engine import MiniEngine
from tests.paged import Group, make_spec
from tests.redis.servers import RedisCluster, needs_redis

pytestmark = needs_redis

SPEC = make_spec([Group(16), Group(16, layers=1)], num_blocks=128)  # two full-attention groups
PROMPTS = [tokens(50 + i, 193) for i in range(6)]  # 12 full blocks per group each
BLOCKS = 12
TIMEOUT_S = 2.0
"""Generous: a live node on a loaded machine must not look dead (a killed node refuses connections at once)."""


def connector(cluster: RedisCluster, url: str | None = None) -> RedisStoreConnector:
    return RedisStoreConnector(
        SPEC, url=url or cluster.url, namespace="cluster", timeout_s=TIMEOUT_S, retry_interval_s=0.2
    )


def servers(store: RedisStoreConnector, prompt: list[int]) -> dict[int, list[tuple[str, int] | None]]:
    """Per group, the server of each block's key."""
    keys = RequestKeys(store._scheduler._hasher, prompt)
    return {
        group: [store.kv.server_of(store.key_name(keys.key(group, b, method="test"))) for b in range(BLOCKS)]
        for group in range(2)
    }


def test_keys_spread_loads_verify_and_a_killed_node_costs_only_its_keys(redis_cluster: RedisCluster) -> None:
    writer = MiniEngine(SPEC, connector(redis_cluster))
    for i, prompt in enumerate(PROMPTS):
        writer.run(f"write-{i}", prompt)
    writer.connector.flush()
    sizes = [int(node.cli("dbsize")) for node in redis_cluster.nodes]
    assert sum(sizes) == len(PROMPTS) * BLOCKS * 2 and min(sizes) > 0, sizes  # every node holds some

    reader = MiniEngine(SPEC, connector(redis_cluster), seed=1)
    for i, prompt in enumerate(PROMPTS[:2]):
        run = reader.run(f"read-{i}", prompt + [1])
        assert run.hit_tokens == BLOCKS * 16 and run.load_errors == {}
        assert {g: len(ids) for g, ids in run.loaded.items()} == {0: BLOCKS, 1: BLOCKS}  # checked bit for bit

    # Kill the node holding block 3 of group 0 of prompt 2 after its load was planned: exactly the
    # blocks whose keys live there are load errors; every other block loads and verifies.
    where = servers(reader.connector, PROMPTS[2])
    victim = where[0][3]
    assert victim is not None
    node = redis_cluster.node_at(victim)
    started = time.monotonic()
    original = reader.connector.bind_connector_metadata

    def kill_then_load(metadata: Any, /) -> None:  # binding starts an asynchronous load
        node.kill()
        original(metadata)

    reader.connector.bind_connector_metadata = kill_then_load
    run = reader.run("during", PROMPTS[2] + [1])
    reader.connector.bind_connector_metadata = original
    assert run.hit_tokens == BLOCKS * 16
    for group in range(2):
        dead = {run.blocks[group][b] for b in range(BLOCKS) if where[group][b] == victim}
        assert run.load_errors.get(group, set()) == dead
        assert set(run.loaded.get(group, [])) == set(run.blocks[group][:BLOCKS]) - dead

    # From now on lookups miss exactly from the first block whose key lived on the dead node: for
    # the engine that was running, and for one that starts now (given every node, as any may be down).
    fresh = MiniEngine(SPEC, connector(redis_cluster, ",".join(n.url for n in redis_cluster.nodes)), seed=2)
    lost = Counter[str]()
    for i, prompt in enumerate(PROMPTS[3:]):
        for engine in (reader, fresh):
            where = servers(engine.connector, prompt)
            first_dead = min(
                (b for b in range(BLOCKS) if where[0][b] == victim or where[1][b] == victim), default=BLOCKS
            )
            run = engine.run(f"after-{i}-{id(engine)}", prompt + [1])
            assert run.hit_tokens == first_dead * 16 and run.load_errors == {}
            lost["blocks"] += BLOCKS - first_dead
    assert time.monotonic() - started < 20, "a dead node must cost timeouts, not a hang"
    assert lost["blocks"] > 0  # the dead node did own some of these prefixes' keys
