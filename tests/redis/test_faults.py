"""Faults never corrupt and never hang: a killed, hung or restarted server, evictions, damaged values."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from capkv.connectors import RedisStoreConnector
from capkv.stores import StoreKey
from capkv.stores._checksum import CHECKSUM_SIZE
from capkv.stores._value import HEADER_SIZE, ValueCheck, check_value, pack_header
from tests.connectors.conftest import tokens
from tests.connectors.engine import MiniEngine, Req
from tests.paged import Group, make_spec
from tests.redis.servers import RedisServer, needs_redis

pytestmark = needs_redis

WINDOWED = [Group(16), Group(16, window=32)]
PROMPT = tokens(7, 100)  # 6 full blocks per group
TIMEOUT_S = 2.0
"""Generous: a live server on a loaded machine must not look dead (a refused connection fails at once anyway)."""
HUNG_TIMEOUT_S = 0.5


def connector(server: RedisServer, spec: Any = None, **options: Any) -> RedisStoreConnector:
    options = {"timeout_s": TIMEOUT_S, "retry_interval_s": 0.2, **options}
    spec = spec or make_spec(WINDOWED, num_blocks=64)
    return RedisStoreConnector(spec, url=server.url, namespace="faults", **options)


def fingerprint(engine: MiniEngine, group: int) -> bytes:
    return bytes(engine.connector._store.fingerprints[group])


def stored(server: RedisServer) -> MiniEngine:
    """An engine that has saved PROMPT's blocks (6 + 2 in the window) into ``server``."""
    engine = MiniEngine(make_spec(WINDOWED, num_blocks=64), connector(server))
    engine.run("first", PROMPT)
    engine.connector.flush()
    return engine


def before_load(engine: MiniEngine, action: Callable[[], object]) -> None:
    """Run ``action`` after the load was planned (hit offered, blocks allocated), before it runs: before
    the worker's metadata is bound, where an asynchronous load starts."""
    bind = engine.connector.bind_connector_metadata

    def patched(metadata: Any, /) -> None:
        action()
        engine.connector.bind_connector_metadata = bind
        bind(metadata)

    engine.connector.bind_connector_metadata = patched


def stats(engine: MiniEngine) -> dict[str, int]:
    return engine.connector.get_kv_connector_stats() or {}


def test_blocks_round_trip_between_two_connectors(redis_server: RedisServer) -> None:
    stored(redis_server)
    reader = MiniEngine(make_spec(WINDOWED, num_blocks=64), connector(redis_server), seed=3)
    run = reader.run("second", PROMPT + [1])
    assert run.hit_tokens == 96 and run.load_errors == {}
    assert {g: len(ids) for g, ids in run.loaded.items()} == {0: 6, 1: 2}  # checked bit for bit
    assert int(redis_server.cli("dbsize")) == 8


def test_server_killed_mid_run_loads_become_load_errors_then_misses_and_dropped_saves(
    redis_server: RedisServer,
) -> None:
    stored(redis_server)
    engine = MiniEngine(make_spec(WINDOWED, num_blocks=64), connector(redis_server), seed=3)
    stats(engine)
    before_load(engine, redis_server.kill)
    started = time.monotonic()
    run = engine.run("during", PROMPT + [1])
    # Offered while the server was up; every block it would have read is a load error, per group,
    # and the engine recomputed them (MiniEngine checks the recomputed KV at finish).
    assert run.hit_tokens == 96 and run.loaded == {}
    assert run.load_errors == {0: set(run.blocks[0][:6]), 1: set(run.blocks[1][4:6])}
    engine.connector.flush()
    after = stats(engine)
    assert after["failed_blocks"] == 8
    assert after["failed_save_blocks"] == 8  # the saves of its 6 + 2 blocks were dropped, and counted
    # Lookups now miss; saves are dropped; nothing waits longer than the timeouts.
    missed = engine.run("after", PROMPT + [2])
    assert missed.hit_tokens == 0 and missed.load_errors == {}
    engine.connector.flush()
    assert stats(engine)["failed_save_blocks"] == 8
    assert time.monotonic() - started < 10 * TIMEOUT_S + 5


def test_server_back_the_connector_recovers_by_itself(redis_server: RedisServer) -> None:
    engine = stored(redis_server)
    redis_server.kill()
    assert engine.run("down", PROMPT + [1]).hit_tokens == 0
    redis_server.start()  # same port, empty
    deadline = time.monotonic() + 10
    while engine.run(f"retry-{time.monotonic()}", PROMPT).hit_tokens == 0 and int(redis_server.cli("dbsize")) == 0:
        if time.monotonic() > deadline:
            raise AssertionError("the connector did not save again after the server came back")
        time.sleep(0.1)
    engine.connector.flush()
    assert int(redis_server.cli("dbsize")) == 8
    reader = MiniEngine(make_spec(WINDOWED, num_blocks=64), connector(redis_server), seed=4)
    run = reader.run("back", PROMPT + [3])
    assert run.hit_tokens == 96 and run.load_errors == {} and len(run.loaded[0]) == 6


def test_a_hung_server_costs_timeouts_never_a_hang(redis_server: RedisServer) -> None:
    stored(redis_server)
    engine = MiniEngine(make_spec(WINDOWED, num_blocks=64), connector(redis_server, timeout_s=HUNG_TIMEOUT_S), seed=3)
    redis_server.pause()
    try:
        started = time.monotonic()
        for attempt in range(3):
            assert engine.run(f"hung-{attempt}", PROMPT + [attempt]).hit_tokens == 0
        engine.connector.flush()
        elapsed = time.monotonic() - started
        assert elapsed < 3 * 4 * HUNG_TIMEOUT_S + 5, elapsed
        assert stats(engine).get("failed_save_blocks", 0) > 0
    finally:
        redis_server.resume()


def test_blocks_evicted_before_their_load_are_load_errors_never_wrong_kv(redis_server: RedisServer) -> None:
    stored(redis_server)
    engine = MiniEngine(make_spec(WINDOWED, num_blocks=64), connector(redis_server), seed=3)
    victims = [engine.connector.key_name(key) for key in _keys(engine, PROMPT, group=0)[2:4]]
    before_load(engine, lambda: redis_server.cli("del", *(v.decode() for v in victims)))
    run = engine.run("evicted", PROMPT + [1])
    assert run.hit_tokens == 96
    assert run.load_errors == {0: {run.blocks[0][2], run.blocks[0][3]}}
    assert sorted(run.loaded[0]) == sorted(set(run.blocks[0][:6]) - run.load_errors[0])


def test_maxmemory_eviction_means_misses_and_every_load_verifies(tmp_path: Any) -> None:
    server = RedisServer(tmp_path, "--maxmemory", "3mb", "--maxmemory-policy", "allkeys-lru").start()
    try:
        spec = make_spec(WINDOWED, num_blocks=256, heads=4, dim=32)  # 16 KiB blocks
        engine = MiniEngine(spec, RedisStoreConnector(spec, url=server.url, namespace="lru"))
        prompts = [tokens(100 + i, 100) for i in range(40)]  # 480 blocks, ~7.8 MB: most are evicted
        for i, prompt in enumerate(prompts):
            engine.run(f"fill-{i}", prompt)
        engine.connector.flush()
        assert "evicted_keys:0" not in server.cli("info", "stats")
        reader = MiniEngine(spec, RedisStoreConnector(spec, url=server.url, namespace="lru"), seed=9)
        # Newest first: a missed prompt is saved again and evicts older ones, as it should.
        runs = [reader.run(f"read-{i}", prompt + [1]) for i, prompt in reversed(list(enumerate(prompts)))]
        hits = [run.hit_tokens for run in runs]
        assert hits[0] == 96 and 0 in hits  # the newest prefixes survived, the oldest were evicted
        assert sum(len(ids) for run in runs for ids in run.loaded.values()) > 0  # each checked bit for bit
    finally:
        server.stop()


def test_a_damaged_value_is_a_load_error_and_removed(redis_server: RedisServer) -> None:
    stored(redis_server)
    engine = MiniEngine(make_spec(WINDOWED, num_blocks=64), connector(redis_server), seed=3)
    key = _keys(engine, PROMPT, group=0)[1]
    name = engine.connector.key_name(key).decode()
    redis_server.cli("setrange", name, str(HEADER_SIZE + 100), "X")  # same length: the lookup cannot tell
    run = engine.run("damaged", PROMPT + [1])
    assert run.hit_tokens == 96 and run.load_errors == {0: {run.blocks[0][1]}}
    assert engine.connector._store.damaged_values == 1
    # Removed, recomputed, and saved again: the value under the key is whole once more.
    engine.connector.flush()
    assert check_value(_get(redis_server, name.encode()), StoreKey(key, fingerprint(engine, 0), HEADER_SIZE + 2048)) is ValueCheck.OK


@pytest.mark.parametrize("pattern", ["two-bit", "spliced", "swapped"])
def test_damage_patterns_in_a_real_server_are_never_loaded(redis_server: RedisServer, pattern: str) -> None:
    """Values damaged in place on the server: two top bits flipped, another block's checksum and
    payload under this block's header, or two blocks' values swapped. A reader loads none of them."""
    stored(redis_server)
    engine = MiniEngine(make_spec(WINDOWED, num_blocks=64), connector(redis_server), seed=3)
    first, second = _keys(engine, PROMPT, group=0)[1:3]
    one, two = engine.connector.key_name(first), engine.connector.key_name(second)
    a, b = _get(redis_server, one), _get(redis_server, two)
    if pattern == "two-bit":
        damaged = bytearray(a)
        damaged[HEADER_SIZE + 3 * 8 + 7] ^= 0x80
        damaged[HEADER_SIZE + 17 * 8 + 7] ^= 0x80
        _set(redis_server, one, bytes(damaged))
    elif pattern == "spliced":
        checksum_at = HEADER_SIZE - CHECKSUM_SIZE  # the key, layout and length come before it
        _set(redis_server, one, a[:checksum_at] + b[checksum_at:])
    else:
        _set(redis_server, one, b)
        _set(redis_server, two, a)
    run = engine.run("damaged", PROMPT + [1])  # raises on any wrong byte
    bad = {run.blocks[0][1]} | ({run.blocks[0][2]} if pattern == "swapped" else set())
    assert run.hit_tokens == 96 and run.load_errors == {0: bad}
    assert engine.connector._store.damaged_values == len(bad)


def test_a_truncated_value_is_a_miss_at_lookup(redis_server: RedisServer) -> None:
    spec = make_spec([Group(16)], num_blocks=64)
    writer = MiniEngine(spec, connector(redis_server, spec=spec))
    writer.run("first", PROMPT)
    writer.connector.flush()  # its saves have landed: nothing overwrites the truncation below
    engine = MiniEngine(spec, connector(redis_server, spec=spec), seed=3)
    name = engine.connector.key_name(_keys(engine, PROMPT, group=0)[3]).decode()
    _set(redis_server, name.encode(), _get(redis_server, name.encode())[:-1])
    run = engine.run("truncated", PROMPT + [1])
    assert run.hit_tokens == 48 and run.load_errors == {}  # blocks 0-2 only
    assert len(run.loaded[0]) == 3


def test_a_value_claiming_another_layout_under_this_name_is_deleted_and_saved_again(redis_server: RedisServer) -> None:
    """The layout is in the name, so a value there that claims another is damage: one failed load, then
    every engine misses it, and the engine that recomputed it saves it again."""
    stored(redis_server)
    engine = MiniEngine(make_spec(WINDOWED, num_blocks=64), connector(redis_server), seed=3)
    other = MiniEngine(make_spec(WINDOWED, num_blocks=64), connector(redis_server), seed=4)
    key = _keys(engine, PROMPT, group=0)[0]
    name = engine.connector.key_name(key)
    payload = b"\x07" * (redis_server_strlen(redis_server, name) - HEADER_SIZE)
    claimed = pack_header(key, b"F" * 16, len(payload), bytes(16)) + payload
    _set(redis_server, name, claimed)
    other.step()  # its scheduler side learns the layout from its worker's first report
    assert other.connector.get_num_new_matched_tokens(Req("before", PROMPT + [2]), 0)[0] == 96  # offered: STRLEN fits
    run = engine.run("claimed", PROMPT + [1], finish=False)
    assert run.hit_tokens == 96 and run.load_errors == {0: {run.blocks[0][0]}}
    assert engine.connector._store.damaged_values == 1
    assert redis_server_strlen(redis_server, name) == 0  # deleted, for every engine
    offered, _ = other.connector.get_num_new_matched_tokens(Req("probe", PROMPT + [2]), 0)
    assert offered == 0
    engine.finish(run)
    engine.step()
    engine.connector.flush()
    again = other.run("again", PROMPT + [3])
    assert again.hit_tokens == 96 and again.load_errors == {}  # saved again, whole


def test_close_stops_the_writer_and_is_idempotent(redis_server: RedisServer) -> None:
    with connector(redis_server) as store:
        engine = MiniEngine(make_spec(WINDOWED, num_blocks=64), store)
        engine.run("first", PROMPT)
    assert int(redis_server.cli("dbsize")) == 8  # close waited for the saves
    store.close()
    writer = store._store._writer
    assert writer is not None and writer._threads == ()  # the writer threads were joined


# ---- helpers ------------------------------------------------------------------------------


def _keys(engine: MiniEngine, prompt: list[int], *, group: int) -> list[Any]:
    from capkv.stores._keys import RequestKeys

    keys = RequestKeys(engine.connector._scheduler._hasher, prompt)
    return [keys.key(group, block, method="test") for block in range(len(prompt) // 16)]


def _client(server: RedisServer) -> Any:
    import redis

    return redis.Redis(host="127.0.0.1", port=server.port, socket_timeout=5)


def redis_server_strlen(server: RedisServer, name: bytes) -> int:
    with _client(server) as client:
        return int(client.strlen(name))


def _get(server: RedisServer, name: bytes) -> bytes:
    with _client(server) as client:
        return bytes(client.get(name))


def _set(server: RedisServer, name: bytes, value: bytes) -> None:
    with _client(server) as client:
        client.set(name, value)


def test_a_full_server_that_refuses_writes_drops_and_counts_saves(tmp_path: Any) -> None:
    server = RedisServer(tmp_path, "--maxmemory", "2mb", "--maxmemory-policy", "noeviction").start()
    try:
        spec = make_spec(WINDOWED, num_blocks=256, heads=4, dim=32)  # 16 KiB blocks
        engine = MiniEngine(spec, RedisStoreConnector(spec, url=server.url, namespace="full"))
        for i in range(12):  # ~1.5 MB of blocks; the server has room for well under 1.2 MB
            engine.run(f"fill-{i}", tokens(200 + i, 100))
        engine.connector.flush()
        counts = stats(engine)
        assert counts["failed_save_blocks"] > 0  # OOM replies: dropped and counted, not raised
        assert counts["saved_blocks"] == 12 * 8
        stored = int(server.cli("dbsize"))
        assert 0 < stored == 12 * 8 - counts["failed_save_blocks"]
    finally:
        server.stop()


def test_engines_with_other_memory_layouts_keep_their_own_blocks(redis_server: RedisServer) -> None:
    """Same spec (shapes, dtype, block dimension), another memory order: other keys, never the other's bytes."""
    stored(redis_server)  # flash layout
    hnd = make_spec(WINDOWED, num_blocks=64, layout="hnd")
    first = MiniEngine(hnd, connector(redis_server, spec=hnd), layout="hnd", seed=3)
    run = first.run("hnd-1", PROMPT)
    assert run.hit_tokens == 0 and run.load_errors == {}
    first.connector.flush()
    assert int(redis_server.cli("dbsize")) == 16  # both layouts' blocks, side by side
    second = MiniEngine(hnd, connector(redis_server, spec=hnd), layout="hnd", seed=4)
    run = second.run("hnd-2", PROMPT + [1])
    assert run.hit_tokens == 96 and run.load_errors == {} and len(run.loaded[0]) == 6  # checked bit for bit
