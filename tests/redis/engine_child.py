"""One engine process serving a workload through a RedisStoreConnector: ``python -m tests.redis.engine_child URL``.

The reference engine verifies every loaded block, and every request's KV at
finish, bit for bit (a mismatch exits non-zero); the last line of output is
what it did, as JSON.
"""

from __future__ import annotations

import json
import sys

from capkv.connectors import RedisStoreConnector
from capkv.engine import Engine, ModelShape, Workload

SHAPE = ModelShape(num_layers=3, pattern="FS", sliding_window=32, num_kv_heads=2, head_dim=16, num_blocks=512)
WORKLOAD = Workload(num_requests=8, num_prefixes=2, prefix_len=96, suffix_len=33, max_tokens=2)


def main(url: str, label: str) -> None:
    with RedisStoreConnector(SHAPE.kv_spec(), url=url, namespace="two-engines") as connector:
        engine = Engine(SHAPE, connector)
        finished = engine.run(WORKLOAD.requests(label))
    stats = engine.stats
    print(json.dumps({
        "finished": len(finished),
        "prompt_tokens": stats.prompt_tokens,
        "computed_tokens": stats.computed_tokens,
        "loaded_tokens": [group.loaded_tokens for group in stats.groups],
        "local_hit_tokens": [group.local_hit_tokens for group in stats.groups],
        "load_error_blocks": stats.load_error_blocks,
        "saved_blocks": stats.connector_total("saved_blocks"),
    }))


if __name__ == "__main__":
    main(*sys.argv[1:])
