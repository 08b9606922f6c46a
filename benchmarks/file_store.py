"""The file store against plain file I/O, and ``capkv demo --stack file`` against ``--stack cpu``.

1. Throughput. A demo-shaped model (6 layers, 3 KV-cache groups, 4 KV heads x 64,
   bfloat16, 16-token blocks: 32 KiB per block and group) saves every block of
   ``--requests`` prompts of ``--tokens`` tokens through ``FileStoreConnector``
   (finish-time saves, timed from the finish calls until ``flush`` returns: gathered,
   packed, written, fsynced, renamed), then loads them all back into other engine
   blocks (timed from ``build_connector_meta`` until ``start_load_kv`` returns:
   looked up, read, checked, scattered). Each is compared with a plain sequential
   write (then one fsync) and read of the same number of bytes, one file in the same
   directory. Goal: both ratios >= 0.8.
2. Whole process. ``python -m capkv demo --requests 256 --prefixes 16 --num-blocks
   8192 --cpu-blocks 16384`` with ``--stack file`` and ``--stack cpu``, each in a fresh
   interpreter, ``--runs`` times alternating; the medians of wall time and of CPU time
   (user + system) and their ratios. Goal: file <= 1.5x cpu. On a machine shared with
   other work wall time waits for the CPU; the CPU-time ratio is the steadier figure.

Throughput figures are medians of ``--repeats`` rounds (a shared disk's fsync times vary a lot).

Run: python -m benchmarks.file_store [--requests 16] [--tokens 1024] [--repeats 5] [--runs 3] [--dir DIR] [--skip-demo]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from capkv import KVConnectorOutput
from capkv.connectors import FileStoreConnector
from capkv.engine import ModelShape

DEMO = ["--requests", "256", "--prefixes", "16", "--num-blocks", "8192", "--cpu-blocks", "16384"]


@dataclass
class Req:
    request_id: str
    all_token_ids: list[int]
    num_computed_tokens: int


def _step(connector: FileStoreConnector) -> None:
    connector.bind_connector_metadata(connector.build_connector_meta(None))
    connector.start_load_kv(None)
    connector.wait_for_save()
    connector.get_finished(set())
    report = connector.build_connector_worker_meta()
    connector.clear_connector_metadata()
    connector.update_connector_output(KVConnectorOutput(worker_meta=report))


def throughput(root: Path, requests: int, tokens: int) -> tuple[float, float, float, float, int]:
    """One round of the four measurements (see :func:`measure`)."""
    return _round(root, requests, tokens)


def _round(root: Path, requests: int, tokens: int) -> tuple[float, float, float, float, int]:
    """(store save, plain write, store load, plain read) in GB/s, and the bytes moved."""
    blocks = tokens // 16
    shape = ModelShape(num_blocks=2 * requests * blocks + 1)
    spec = shape.kv_spec()
    generator = torch.Generator().manual_seed(0)
    caches = {
        name: torch.randint(-(2**15), 2**15 - 1, spec.groups[g].kv_shape or (), dtype=torch.int16, generator=generator).view(torch.bfloat16)
        for g, group in enumerate(spec.groups) for name in group.layer_names
    }
    store_dir = root / "store"
    connector = FileStoreConnector(spec, root=store_dir)
    connector.register_kv_caches(caches)
    prompts = [[r * tokens + t for t in range(tokens)] for r in range(requests)]
    started = time.perf_counter()
    for index, prompt in enumerate(prompts):
        ids = list(range(1 + index * blocks, 1 + (index + 1) * blocks))
        connector.request_finished_all_groups(Req(f"s{index}", prompt, tokens), tuple(list(ids) for _ in spec.groups))
    _step(connector)
    connector.flush()
    save_s = time.perf_counter() - started
    layer_block_bytes = caches[spec.groups[0].layer_names[0]].nbytes // spec.num_blocks
    nbytes = sum(len(group.layer_names) for group in spec.groups) * blocks * requests * layer_block_bytes
    _step(connector)  # the saves' report: the blocks are loadable
    # Loads: the same prompts (plus a token) into the other half of the engine's blocks.
    offset = 1 + requests * blocks
    for index, prompt in enumerate(prompts):
        request = Req(f"l{index}", [*prompt, 7], 0)
        matched, _ = connector.get_num_new_matched_tokens(request, 0)
        if matched != tokens:
            raise SystemExit(f"load {index}: {matched} tokens offered, expected {tokens}")
        ids = list(range(offset + index * blocks, offset + (index + 1) * blocks))
        connector.update_state_after_alloc(request, tuple(list(ids) for _ in spec.groups), matched)
    started = time.perf_counter()
    connector.bind_connector_metadata(connector.build_connector_meta(None))
    connector.start_load_kv(None)
    load_s = time.perf_counter() - started
    errors = connector.get_block_ids_with_load_errors()
    connector.clear_connector_metadata()
    if errors:
        raise SystemExit(f"load errors: {errors}")
    connector.close()
    # Plain I/O of the same bytes, in the same directory.
    payload = torch.randint(0, 255, (min(nbytes, 64 << 20),), dtype=torch.uint8, generator=generator).numpy().tobytes()
    plain = store_dir / "plain.bin"
    started = time.perf_counter()
    descriptor = os.open(plain, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    left = nbytes
    while left:
        left -= os.write(descriptor, payload[: min(left, len(payload))])
    os.fsync(descriptor)
    os.close(descriptor)
    write_s = time.perf_counter() - started
    buffer = bytearray(len(payload))
    started = time.perf_counter()
    with open(plain, "rb", buffering=0) as file:
        while file.readinto(buffer):
            pass
    read_s = time.perf_counter() - started
    plain.unlink()
    gb = nbytes / 1e9
    return gb / save_s, gb / write_s, gb / load_s, gb / read_s, nbytes


def demo_times(stack: str, extra: list[str]) -> tuple[float, float]:
    """Wall and CPU (user + system) seconds of one demo process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    command = [sys.executable, "-m", "capkv", "demo", *DEMO, *extra, "--stack", stack]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"demo --stack {stack} exited {done.returncode}:\n{done.stdout}{done.stderr}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.file_store")
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--runs", type=int, default=3, help="demo runs per stack")
    parser.add_argument("--repeats", type=int, default=5, help="throughput rounds")
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: a temporary directory)")
    parser.add_argument("--skip-demo", action="store_true")
    parser.add_argument("--demo-options", default="",
                        help="more demo options, e.g. '--window 128 --max-tokens 8' (the defaults when the issue measured)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rounds: list[tuple[float, float, float, float, int]] = []
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory(prefix="capkv-bench-", dir=args.dir) as root:
            rounds.append(throughput(Path(root), args.requests, args.tokens))
    save, write, load, read = (statistics.median(r[i] for r in rounds) for i in range(4))
    nbytes = rounds[0][4]
    print(
        f"file store throughput, {nbytes / 1e6:.0f} MB in 32 KiB blocks ({args.requests} prompts x {args.tokens} "
        f"tokens x 3 groups), median of {args.repeats} rounds (each: store save, plain write, store load, plain read)"
    )
    print(f"  save {save:6.2f} GB/s   plain write+fsync {write:6.2f} GB/s   ratio {save / write:.2f}  (goal >= 0.8)")
    print(f"  load {load:6.2f} GB/s   plain read        {read:6.2f} GB/s   ratio {load / read:.2f}  (goal >= 0.8)")
    if args.skip_demo:
        return 0
    walls: dict[str, list[float]] = {"file": [], "cpu": []}
    cpus: dict[str, list[float]] = {"file": [], "cpu": []}
    for _ in range(args.runs):
        for stack in ("file", "cpu"):
            wall, cpu = demo_times(stack, args.demo_options.split())
            walls[stack].append(wall)
            cpus[stack].append(cpu)
    print(f"capkv demo {' '.join([*DEMO, *args.demo_options.split()])}: median of {args.runs} runs, whole process")
    for stack in ("file", "cpu"):
        print(f"  --stack {stack:<4}  wall {statistics.median(walls[stack]):6.2f} s   CPU {statistics.median(cpus[stack]):6.2f} s")
    wall_ratio = statistics.median(walls["file"]) / statistics.median(walls["cpu"])
    cpu_ratio = statistics.median(cpus["file"]) / statistics.median(cpus["cpu"])
    print(f"  file / cpu: wall {wall_ratio:.2f}x, CPU {cpu_ratio:.2f}x  (goal <= 1.5x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
