"""One engine process serving through a FileStoreConnector on a shared root:
``python -m tests.connectors.file_store_child ROOT CAPACITY_BYTES LABEL ROUNDS``.

capkv's reference engine verifies every loaded block, and every request's KV at
finish, bit for bit (a mismatch exits non-zero). Each round serves the workload
again under a fresh engine (an empty local prefix cache), so its prefixes come
from the store, written by this process or the other one. The last line of
output is what it did, as JSON.
"""

from __future__ import annotations

import json
import sys

import torch

from capkv.connectors import FileStoreConnector
from capkv.engine import Engine, ModelShape, Workload

SHAPE = ModelShape(num_layers=3, pattern="FS", sliding_window=32, num_kv_heads=2, head_dim=16, num_blocks=256)
WORKLOAD = Workload(num_requests=12, num_prefixes=6, prefix_len=96, suffix_len=17, max_tokens=2)


def main(root: str, capacity: str, label: str, rounds: str) -> None:
    torch.set_num_threads(1)
    totals = {"finished": 0, "loaded_tokens": 0, "load_error_blocks": 0, "saved_blocks": 0}
    with FileStoreConnector(SHAPE.kv_spec(), root=root, capacity_bytes=int(capacity)) as connector:
        for index in range(int(rounds)):
            # both processes share prefixes; each seed twice in a row, so a round follows one that saved its
            # prefixes (cycling 0,1,2 through a store holding ~3/4 of them missed every time, as LRU does)
            workload = Workload(**{**WORKLOAD.__dict__, "seed": index // 2 % 3})
            engine = Engine(SHAPE, connector)
            finished = engine.run(workload.requests(f"{label}{index}"))
            stats = engine.stats
            totals["finished"] += len(finished)
            totals["loaded_tokens"] += sum(group.loaded_tokens for group in stats.groups)
            totals["load_error_blocks"] += stats.load_error_blocks
            totals["saved_blocks"] += int(stats.connector_total("saved_blocks"))
        totals["evictions"] = connector.catalog.evictions
    print(json.dumps(totals))


if __name__ == "__main__":
    main(*sys.argv[1:])
