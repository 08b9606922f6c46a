"""How the reference engine's speed depends on torch's intra-op thread count.

The engine runs many small tensor ops (per-layer writes, slot gathers, bit-exact
comparisons); with several intra-op threads each op pays thread hand-offs that
cost more than the op. Serves the default demo workload (hybrid 6-layer model,
3 KV-cache groups, 32 requests cold then warm through
MultiConnector(CPUOffloadConnector, FileStoreConnector), verification on) once per
thread count, each in a fresh interpreter, and prints the wall time of serving
(imports and set-up excluded) and the ratio to one thread.

Run: python -m benchmarks.engine_threads [thread counts, default: 1 and torch's default]
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

_SERVE = textwrap.dedent(
    """
    import sys, tempfile, time
    import torch
    if sys.argv[1] != "default":
        torch.set_num_threads(int(sys.argv[1]))
    from capkv import MultiConnector
    from capkv.connectors import CPUOffloadConnector, FileStoreConnector
    from capkv.engine import Engine, ModelShape, Workload
    shape, workload = ModelShape(), Workload()
    with tempfile.TemporaryDirectory() as root:
        spec = shape.kv_spec()
        stack = MultiConnector(CPUOffloadConnector(spec, capacity_blocks=2048), FileStoreConnector(spec, root=root))
        engine = Engine(shape, stack)
        started = time.perf_counter()
        engine.run(workload.requests("cold"))
        engine.reset_prefix_cache()
        engine.run(workload.requests("warm"))
        elapsed = time.perf_counter() - started
        engine.shutdown()
    print(torch.get_num_threads(), elapsed)
    """
)


def serve(threads: str) -> tuple[int, float]:
    done = subprocess.run([sys.executable, "-c", _SERVE, threads], capture_output=True, text=True, check=True)
    count, seconds = done.stdout.split()
    return int(count), float(seconds)


def main(argv: list[str]) -> int:
    counts = argv or ["1", "default"]
    print(f"CPU cores available: {len(os.sched_getaffinity(0))}")
    base: float | None = None
    for threads in counts:
        used, seconds = serve(threads)
        base = seconds if base is None else base
        print(f"threads {threads:>7} ({used}): serving cold + warm {seconds:7.2f} s   x{seconds / base:.1f} of the first")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
