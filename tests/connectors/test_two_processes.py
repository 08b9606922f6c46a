"""Two engine processes share one bounded file-store root: no load error, no wrong byte, capacity held.

Each process runs capkv's reference engine (which verifies every loaded block bit for bit and exits
non-zero on a mismatch) over the same prefixes, through its own ``FileStoreConnector`` on one root
whose capacity holds about half of what they write, so each evicts packs the other is about to pin
and load. The test samples the directory's size while they run.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CAPACITY = 700_000
"""About three quarters of the three workloads' blocks (~920 kB), so the processes evict each other's packs."""
ROUNDS = 6


def _sizes(root: Path) -> tuple[int, int]:
    """The packs' total size and the largest pack, as listed now (packs vanish while we look)."""
    total = largest = 0
    for path in root.glob("*.kvpack"):
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            continue
        total += size
        largest = max(largest, size)
    return total, largest


def test_two_processes_sharing_a_bounded_root(tmp_path: Path) -> None:
    children = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.connectors.file_store_child", str(tmp_path), str(CAPACITY), label, str(ROUNDS)],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for label in ("a", "b")
    ]
    peak = largest = 0
    deadline = time.monotonic() + 300
    try:
        while any(child.poll() is None for child in children):
            if time.monotonic() > deadline:
                raise AssertionError("the engine processes did not finish within 300 s")
            total, biggest = _sizes(tmp_path)
            peak, largest = max(peak, total), max(largest, biggest)
            time.sleep(0.005)
        results: list[dict[str, Any]] = []
        for child in children:
            out, err = child.communicate(timeout=30)
            assert child.returncode == 0, err[-3000:]  # non-zero on any wrong byte
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait(timeout=30)
    final, _ = _sizes(tmp_path)
    print(f"two processes: {results}; peak {peak} B, final {final} B, capacity {CAPACITY} B, largest pack {largest} B")
    assert all(r["finished"] == 12 * ROUNDS for r in results)
    assert [r["load_error_blocks"] for r in results] == [0, 0]
    assert sum(r["loaded_tokens"] for r in results) > 0  # they loaded from the store (how much: timing)
    assert sum(r["evictions"] for r in results) > 0  # under pressure
    # Capacity: at rest it holds; while both write, at most each one's newest pack is over it.
    assert final <= CAPACITY
    assert peak <= CAPACITY + 2 * largest
