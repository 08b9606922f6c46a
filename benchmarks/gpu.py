"""One prepared GPU run: the CUDA tests, block copies and file-store loads at real model shapes, one table.

On one CUDA device (an H100 in about 5 minutes; ``--budget-s`` stops starting new rows, and says so):

1. the CUDA tests (``tests/transfer``: side-stream copies, staging, pinned rows; pytest in a subprocess);
2. block copies per preset and block size: ``BlockCopier.gather`` (device -> pinned host rows) and ``scatter``
   against a contiguous device -> host and host -> device copy of the same bytes, pinned (goal >= 0.9);
3. file-store rounds per preset into a KV cache on the device: save and load (the loaded blocks checked bit for
   bit), against the best plain write + fsync and read of the same bytes and against pinned copies of them.

``--device cpu`` (the default without CUDA) runs the same code with host copies standing in for the bus, at
small sizes: a dry run of every row that can run without a GPU; what it cannot run it lists as skipped. Run from
the repository root: ``python -m benchmarks.gpu [--out DIR]`` (``--out``: the table is written there too).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from benchmarks._models import engine_heap
from benchmarks.file_store import Round, prompts_for, throughput
from capkv.engine._presets import ModelPreset, model_presets
from capkv.transfer._bench import measure_transfer

TESTS = ["tests/transfer/test_cuda.py", "tests/transfer/test_copier.py", "tests/transfer/test_bench.py"]


@dataclass
class Row:
    """One line of the table: what ran, capkv's figure, the baseline's, the ratio, or why it did not run."""

    section: str
    preset: str
    case: str
    capkv: float | None = None
    baseline: float | None = None
    baseline_name: str = ""
    goal: float | None = None
    note: str = ""

    @property
    def ratio(self) -> float | None:
        return None if self.capkv is None or not self.baseline else self.capkv / self.baseline

    def line(self) -> str:
        figures = (
            f"{self.capkv:8.2f} {self.baseline or 0:8.2f} {self.ratio or 0:6.2f}x"
            if self.capkv is not None else f"{'':8} {'':8} {'':7}"
        )
        goal = f">= {self.goal:.1f}" if self.goal is not None and self.capkv is not None else ""
        verdict = "" if self.ratio is None or self.goal is None else ("met" if self.ratio >= self.goal else "MISSED")
        return (f"{self.section:9} {self.preset:11} {self.case:28} {figures} {goal:6} {verdict:6} "
                f"{self.baseline_name}{'; ' if self.baseline_name and self.note else ''}{self.note}")


HEADER = (f"{'section':9} {'preset':11} {'case':28} {'capkv':>8} {'baseline':>8} {'ratio':>7} {'goal':6} "
          f"{'':6} baseline (GB/s columns) / note")


class Run:
    """The rows so far, printed as they come, and the time left."""

    def __init__(self, budget_s: float) -> None:
        self.rows: list[Row] = []
        self.deadline = time.monotonic() + budget_s
        print(HEADER, flush=True)

    def left_s(self) -> float:
        return self.deadline - time.monotonic()

    def add(self, row: Row) -> None:
        self.rows.append(row)
        print(row.line(), flush=True)

    def attempt(self, section: str, preset: str, case: str, measure: Callable[[], list[Row]]) -> None:
        """``measure``'s rows, or one row saying why there are none (out of time, or what it raised)."""
        if self.left_s() <= 0:
            self.add(Row(section, preset, case, note="skipped: the time budget is spent"))
            return
        try:
            rows = measure()
        except (Exception, SystemExit) as error:  # noqa: BLE001 (a failed row is reported, the run goes on)
            self.add(Row(section, preset, case, note=f"FAILED: {type(error).__name__}: {error}"[:300]))
            return
        for row in rows:
            self.add(row)


def cuda_tests(run: Run) -> None:
    if importlib.util.find_spec("pytest") is None:
        run.add(Row("tests", "-", "tests/transfer", note="skipped: pytest is not installed here"))
        return
    timeout = max(30.0, min(240.0, run.left_s()))
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))}
    try:
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *TESTS],
                              capture_output=True, text=True, timeout=timeout, env=environment, check=False)
    except subprocess.TimeoutExpired:
        run.add(Row("tests", "-", "tests/transfer", note=f"FAILED: pytest did not finish in {timeout:.0f} s"))
        return
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr.strip()[-200:]
    counts = dict((kind, int(number)) for number, kind in re.findall(r"(\d+) (passed|failed|skipped|error)", summary))
    cuda_ran = torch.cuda.is_available() and "skipped" not in summary
    note = f"{summary} (exit {done.returncode})" + ("" if cuda_ran else "; the CUDA tests skip without a CUDA device")
    if done.returncode != 0:
        failures = [line for line in done.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
        note = f"FAILED: {note}; " + " | ".join(failures[:5])
    run.add(Row("tests", "-", f"tests/transfer ({counts.get('passed', 0)} passed)", note=note))


def copies(run: Run, preset: ModelPreset, device: torch.device, block_sizes: list[int], nbytes: int, rounds: int) -> None:
    layers = len(preset.layout().groups[0].layer_names)
    out, back = ("device -> host, pinned", "host -> device, pinned") if device.type == "cuda" else ("host copy", "host copy")
    for block_size in block_sizes:
        def measure(block_size: int = block_size) -> list[Row]:
            figures = measure_transfer(
                block_size, device=device, layers=layers, kv_heads=preset.num_kv_heads, head_dim=preset.head_dim,
                dtype=preset.dtype, nbytes=nbytes, rounds=rounds,
            )
            case = f"{block_size}-token blocks x {figures.num_blocks}"
            return [
                Row("copy", preset.name, f"gather, {case}", figures.gbps(figures.gather),
                    figures.gbps(figures.contiguous_out), out, 0.9),
                Row("copy", preset.name, f"scatter, {case}", figures.gbps(figures.scatter),
                    figures.gbps(figures.contiguous_in), back, 0.9),
            ]

        run.attempt("copy", preset.name, f"{block_size}-token blocks", measure)


def loads(run: Run, preset: ModelPreset, device: torch.device, budget: int, directory: Path | None) -> None:
    def measure() -> list[Row]:
        requests = prompts_for(preset, budget, 1024, 16)
        with tempfile.TemporaryDirectory(prefix="capkv-gpu-", dir=directory) as root:
            measured: Round = throughput(Path(root), preset, requests, 1024, device=device.type)
        if device.type == "cuda":
            torch.cuda.empty_cache()
        return _load_rows(preset.name, measured)

    run.attempt("store", preset.name, "file store", measure)


def _load_rows(name: str, measured: Round) -> list[Row]:
    saved, loaded = measured.saved_bytes, measured.loaded_bytes
    write = min(measured.writes, key=measured.writes.__getitem__)
    read = min(measured.reads, key=measured.reads.__getitem__)
    rows = [
        Row("store", name, f"file save, {saved >> 20} MiB", saved / measured.save_s / 1e9,
            saved / measured.writes[write] / 1e9, f"best plain write + fsync: {write}", 0.8),
        Row("store", name, f"file load, {loaded >> 20} MiB", loaded / measured.load_s / 1e9,
            loaded / measured.reads[read] / 1e9, f"best plain read: {read}", 0.9, "loaded blocks verified bit for bit"),
    ]
    for reference, seconds in measured.paged.items():  # pinned copies on CUDA; reads into the paged blocks on CPU
        rows.append(Row("store", name, "file load, vs a reference", loaded / measured.load_s / 1e9,
                        loaded / seconds / 1e9, reference))
    return rows


def main(argv: list[str]) -> int:
    cuda = torch.cuda.is_available()
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if cuda else "cpu", choices=["cuda", "cpu"])
    parser.add_argument("--model", nargs="+", default=["llama-1b", "llama-8b", "llama-70b", "gemma3-12b"])
    parser.add_argument("--block-sizes", type=int, nargs="+", default=None,
                        help="tokens per block for the copies (default: 16 32 64 128 256; on CPU 16 256)")
    parser.add_argument("--copy-mib", type=int, default=None, help="MiB per copy call (default: 1024; on CPU 32)")
    parser.add_argument("--load-mib", type=int, default=None, help="MiB saved per file-store round (default: 1024; on CPU 32)")
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds per copy (default: 10; on CPU 3)")
    parser.add_argument("--budget-s", type=float, default=420.0, help="no new row starts after this (default: 420)")
    parser.add_argument("--skip-tests", action="store_true")
    parser.add_argument("--dir", type=Path, default=None, help="where the store writes (default: a temporary directory)")
    parser.add_argument("--out", type=Path, default=None, help="also write the table to DIR/gpu_table.txt")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not cuda:
        print("--device cuda: torch.cuda.is_available() is False here", file=sys.stderr)
        return 2
    big = device.type == "cuda"
    block_sizes = args.block_sizes or ([16, 32, 64, 128, 256] if big else [16, 256])
    copy_bytes = (args.copy_mib or (1024 if big else 32)) << 20
    load_bytes = (args.load_mib or (1024 if big else 32)) << 20
    rounds = args.rounds or (10 if big else 3)
    torch.set_num_threads(min(8, os.cpu_count() or 1) if big else 1)
    name = torch.cuda.get_device_name(device) if big else "cpu (host copies stand in for the bus)"
    print(f"benchmarks.gpu on {name}; torch {torch.__version__}, CUDA {torch.version.cuda}; {os.cpu_count()} CPUs; "
          f"copies {copy_bytes >> 20} MiB a call, {rounds} rounds; file-store rounds {load_bytes >> 20} MiB; "
          f"budget {args.budget_s:.0f} s", flush=True)
    started = time.monotonic()
    run = Run(args.budget_s)
    presets = model_presets(args.model)
    if args.skip_tests:
        run.add(Row("tests", "-", "tests/transfer", note="skipped: --skip-tests"))
    else:
        cuda_tests(run)
    with engine_heap():
        for preset in presets:
            copies(run, preset, device, block_sizes, copy_bytes, rounds)
        for preset in presets:
            loads(run, preset, device, load_bytes, args.dir)
    run.add(Row("store", "-", "redis", note="skipped: not part of this run (needs redis-server on the GPU machine)"))
    table = "\n".join([HEADER, *(row.line() for row in run.rows)])
    print(f"\none table ({time.monotonic() - started:.0f} s):\n{table}")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gpu_table.txt").write_text(table + "\n")
    failed = [row for row in run.rows if row.note.startswith("FAILED")]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
