"""Two engine processes share one Redis server: B's first run loads A's prompts, verified bit for bit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.redis.engine_child import SHAPE, WORKLOAD
from tests.redis.servers import RedisServer, needs_redis

pytestmark = needs_redis

ROOT = Path(__file__).resolve().parents[2]


def engine_process(url: str, label: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "tests.redis.engine_child", url, label],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]  # non-zero on any KV mismatch
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def test_engine_b_loads_engine_a_prompts(redis_server: RedisServer) -> None:
    a = engine_process(redis_server.url, "a")
    assert a["finished"] == WORKLOAD.num_requests and a["saved_blocks"] > 0
    assert sum(a["loaded_tokens"]) == 0  # nothing to load yet
    b = engine_process(redis_server.url, "b")
    # Every prompt's KV comes from A's engine, but for the last, partial block (and the last token).
    block = SHAPE.block_size
    reusable = sum((len(r.all_token_ids) - 1) // block * block for r in WORKLOAD.requests())
    assert b["finished"] == WORKLOAD.num_requests
    assert b["loaded_tokens"][0] + b["local_hit_tokens"][0] == reusable
    assert b["loaded_tokens"][0] >= reusable // 2  # loaded across processes, not only B's own reuse
    assert b["load_error_blocks"] == 0
    assert b["computed_tokens"] == b["prompt_tokens"] - reusable + (WORKLOAD.max_tokens - 1) * WORKLOAD.num_requests
