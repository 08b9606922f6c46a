"""``capkv demo --stack cpu,redis``: a second demo process's cold run already loads the first one's prefixes."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.redis.servers import RedisServer, needs_redis

pytestmark = needs_redis

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--requests", "6", "--prefixes", "2", "--prefix-len", "64", "--suffix-len", "17", "--max-tokens", "3",
         "--window", "32", "--kv-heads", "1", "--head-dim", "8", "--num-blocks", "512"]


def demo(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "capkv", "demo", *SMALL, *args], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert done.stdout.rstrip().endswith(
        "verified: bit-exact (every loaded block, and every request's KV at finish, against recomputation)"
    )
    return done.stdout


def test_two_demo_processes_share_prefixes_through_one_server(redis_server: RedisServer) -> None:
    first = demo("--stack", "cpu,redis", "--redis-url", redis_server.url)
    assert re.search(r'└─ #2 RedisStoreConnector \("redis"\) +HMA: yes .* ' + re.escape(redis_server.url) + r"\n", first)
    cold = re.search(r"prefix-hit tokens, group 0 \(full\) +(\S+ \+ \S+) +(\S+ \+ \S+)", first)
    assert cold is not None and cold.group(1).endswith("+ 0")  # nothing to load at first
    second = demo("--stack", "cpu,redis", "--redis-url", redis_server.url)
    hits = re.search(r"prefix-hit tokens, group 0 \(full\) +(\S+ \+ \S+) +(\S+ \+ \S+)", second)
    assert hits is not None and hits.group(1) == "0 + 480"  # the cold run loads every prompt from Redis
    loaded = re.search(r"bytes loaded +(\S+ \S+) +(\S+ \S+)", second)
    assert loaded is not None and loaded.group(1) != "0 B"


def test_an_unreachable_server_is_said_and_served_as_misses(tmp_path: Path) -> None:
    from tests.redis.servers import free_port

    out = demo("--stack", "cpu,redis", "--redis-url", f"redis://127.0.0.1:{free_port()}")
    assert "(not answering: every lookup a miss)" in out
