"""Wall time of the default ``capkv demo`` — the issue's bound is 30 s on 2 CPU cores.

Runs ``python -m capkv demo`` (default options: hybrid 6-layer model, 3 KV-cache
groups, 32 requests cold then warm through MultiConnector(CPUOffloadConnector,
FileStoreConnector), bit-exact verification) in a fresh interpreter, as a user
would, so imports, the temporary file store and its removal are all counted.
Prints each run's wall time, then the median and the worst, and the demo's exit status.

Run: python -m benchmarks.demo_wall_time [runs] [-- extra demo options]
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

BOUND_S = 30.0


def main(argv: list[str]) -> int:
    runs = int(argv[0]) if argv and argv[0] != "--" else 3
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    command = [sys.executable, "-m", "capkv", "demo", *extra]
    print(f"command: {' '.join(command[1:])}")
    print(f"CPU cores available: {len(os.sched_getaffinity(0))}")
    times: list[float] = []
    for index in range(runs):
        started = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        times.append(time.perf_counter() - started)
        verdict = next((line for line in done.stdout.splitlines() if line.startswith("verified:")), "no verdict")
        print(f"run {index + 1}: {times[-1]:6.2f} s  exit {done.returncode}  {verdict}")
        if done.returncode != 0:
            print(done.stdout + done.stderr)
            return done.returncode
    median, worst = statistics.median(times), max(times)
    print(f"median {median:.2f} s, worst {worst:.2f} s (bound {BOUND_S:.0f} s: {'met' if worst < BOUND_S else 'MISSED'})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
