"""What ``capkv check`` costs as a command, over a stack of every one of capkv's own connectors.

Runs ``python -m capkv check stack.json`` in a fresh interpreter (as a user or a
deployment script would), ``--repeats`` times, and prints the median wall time
and whether the process imported torch; then the same command in a process that
imports torch first, which is what every call cost while the store and copy
modules imported torch at the top. The box is shared: the figures are medians.

Run: python -m benchmarks.check_startup [--repeats N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

STACK = {
    "kv_connector": "MultiConnector",
    "kv_connector_extra_config": {
        "connectors": [
            {"kv_connector": "CPUOffloadConnector", "kv_connector_extra_config": {"capacity_blocks": 4096}},
            {
                "kv_connector": "MultiConnector",
                "kv_connector_extra_config": {
                    "connectors": [
                        {"kv_connector": "FileStoreConnector", "kv_connector_extra_config": {"root": "/var/cache/kv"}},
                        {"kv_connector": "RedisStoreConnector", "kv_connector_extra_config": {"url": "redis://h:6379"}},
                        {"kv_connector": "SingleGroupOffloadConnector",
                         "kv_connector_extra_config": {"capacity_blocks": 1024}},
                    ]
                },
            },
        ]
    },
}

RUN = """
import sys
{prelude}
from capkv.cli import main
code = main(["check", sys.argv[1], "--groups", "1"])
print("torch imported:", "torch" in sys.modules, file=sys.stderr)
sys.exit(code)
"""


def timed(prelude: str, stack: Path, repeats: int) -> tuple[float, bool]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CAPKV_DEV": "0"}
    times: list[float] = []
    torch = False
    for _ in range(repeats):
        start = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-c", RUN.format(prelude=prelude), str(stack)], env=env, capture_output=True, text=True,
            timeout=300, check=False,
        )
        times.append(time.perf_counter() - start)
        if done.returncode != 0:
            raise SystemExit(f"capkv check failed:\n{done.stdout}{done.stderr}")
        torch = "torch imported: True" in done.stderr
    return statistics.median(times), torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="capkv-check-bench-") as tmp:
        stack = Path(tmp) / "stack.json"
        stack.write_text(json.dumps(STACK))
        now, imported = timed("", stack, args.repeats)
        with_torch, _ = timed("import torch", stack, args.repeats)
    print(f"capkv check over CPUOffload, FileStore, Redis and SingleGroupOffload connectors, median of {args.repeats}:")
    print(f"  as the command runs now:        {now:.3f} s  (torch imported: {imported})")
    print(f"  with torch imported first:      {with_torch:.3f} s  (the cost of a torch import at the top)")
    print(f"  saved per call:                 {with_torch - now:.3f} s")


if __name__ == "__main__":
    main()
