"""The reference engine through a Redis store whose server dies mid-run, then comes back: never wrong KV, never a hang."""

from __future__ import annotations

import time

from capkv.connectors import RedisStoreConnector
from capkv.engine import Engine, ModelShape, Workload
from tests.redis.servers import RedisServer, needs_redis

pytestmark = needs_redis

SHAPE = ModelShape(num_layers=3, pattern="FS", sliding_window=32, num_kv_heads=2, head_dim=16, num_blocks=512)
WORKLOAD = Workload(num_requests=12, num_prefixes=3, prefix_len=96, suffix_len=33, max_tokens=2)


def engine(server: RedisServer) -> Engine:
    store = RedisStoreConnector(SHAPE.kv_spec(), url=server.url, namespace="engine", timeout_s=2.0, retry_interval_s=0.2)
    return Engine(SHAPE, store, max_num_seqs=2, transfer_timeout_s=20.0)  # verifies every load, and at finish


def test_server_killed_mid_run_then_back(redis_server: RedisServer) -> None:
    first = engine(redis_server)
    first.run(WORKLOAD.requests("warmup"))
    first.shutdown()
    assert int(redis_server.cli("dbsize")) > 0

    second = engine(redis_server)
    killed: list[int] = []

    def kill_after_two_steps(finished: int, added: int) -> None:
        if len(killed) < 2:
            killed.append(finished)
            if len(killed) == 2:
                redis_server.kill()

    started = time.monotonic()
    done = second.run(WORKLOAD.requests("during"), kill_after_two_steps)  # a mismatch raises VerificationError
    assert len(done) == WORKLOAD.num_requests and time.monotonic() - started < 60
    stats = second.stats
    assert stats.external_hit_tokens > 0  # the first steps were offered hits from Redis
    # each offered load landed or, cut short by the kill, failed and was recomputed: never counted as loaded
    assert stats.loaded_hit_tokens + stats.failed_load_tokens == stats.external_hit_tokens
    assert second.stats.connector_total("failed_save_blocks")  # saves after the kill: dropped, counted

    redis_server.start()  # same port, empty
    time.sleep(0.3)  # past the retry interval: the same connector tries the server again by itself
    second.reset_prefix_cache()
    second.stats.reset()
    second.run(WORKLOAD.requests("refill"))  # computes and saves again
    second.connector.flush()  # type: ignore[attr-defined]
    assert int(redis_server.cli("dbsize")) > 0
    second.reset_prefix_cache()
    second.stats.reset()
    second.run(WORKLOAD.requests("back"))
    assert sum(group.loaded_tokens for group in second.stats.groups) > 0  # loads again, verified
    second.shutdown()
