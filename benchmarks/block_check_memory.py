"""Memory and time of the production block-id check, as the pool grows and the ids do not.

Each measurement runs in a fresh child process and prints the growth of its peak
resident memory (``ru_maxrss``) across one ``check_block_groups`` call on
3 groups x 4,096 valid ids, and the best call time, for pools of 2**11 to 2**31
blocks. Before capkv bounded it, the check allocated ``num_groups x num_blocks``
int32 slots (2**31 blocks in 3 groups: a 25.8 GB allocation attempt).

Run from the repository root: ``python benchmarks/block_check_memory.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = """
import json, resource, sys, time
from capkv import KVSpec
from capkv.contracts._block_ids import check_block_groups
num_blocks = int(sys.argv[1])
spec = KVSpec(num_groups=3, num_blocks=num_blocks)
step = max(1, (num_blocks - 1) // 4096)
ids = tuple([1 + g + step * i for i in range(4096)] for g in range(3))
ids = tuple([min(x, num_blocks - 1 - g) for x in group] for g, group in enumerate(ids))
ids = tuple(list(dict.fromkeys(group)) for group in ids)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
best = float("inf")
for _ in range(20):
    started = time.perf_counter()
    check_block_groups(spec, ids, connector="bench", method="check")
    best = min(best, time.perf_counter() - started)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"ids": sum(map(len, ids)), "grew_kib": after - before, "best_us": best * 1e6}))
"""


def main() -> None:
    print(f"{'pool blocks':>14} {'ids':>7} {'peak RSS growth':>16} {'best call':>10}  {'unbounded scratch (before)':>26}")
    for exponent in (11, 16, 20, 24, 28, 31):
        num_blocks = 2**exponent - (1 if exponent == 31 else 0)
        done = subprocess.run(
            [sys.executable, "-c", CHILD, str(num_blocks)], cwd=ROOT, capture_output=True, text=True, check=True,
            env={"CAPKV_DEV": "0", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
        )
        figures = json.loads(done.stdout.strip().splitlines()[-1])
        before = 4 * (3 * num_blocks + 1)  # int32 slots: one per (group, block), plus one
        print(f"{num_blocks:>14,} {figures['ids']:>7,} {figures['grew_kib'] / 1024:>12.1f} MiB {figures['best_us']:>7.0f} us"
              f"  {before / 2**20:>22.1f} MiB")


if __name__ == "__main__":
    main()
