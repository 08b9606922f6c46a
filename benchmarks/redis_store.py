"""RedisStoreConnector against plain pipelined SET/GET of the same values, per model shape; and the demo's run time.

1. Throughput, per ``--model`` preset (:mod:`capkv.engine._presets`, scaled to ``--mib`` in blocks, never in
   value size). The connector's worker side saves one group's blocks (gather from the paged KV cache, header and
   XXH3-128 checksum, pipelined SET on the writer thread, until every save is reported over) and loads them back
   (pipelined GET, each value checked where it arrived and copied into its engine block). The baselines move the
   same values with redis-py's pipelined SET and GET at several depths (:mod:`benchmarks._plain_redis`); a GET
   baseline also copies each value into a CPU tensor, as a load must land it. The strategy with the lowest median
   is the baseline, and ratios are per round (everything runs back to back each round). Goal (1B and 8B shapes):
   >= 0.9x the best plain GET for loads, >= 0.8x the best plain SET for saves. Also printed: GET alone (values
   left in ``bytes``: what the client hands the store) and the copies out of / into the paged cache alone.
2. The engine's whole run (demo model): ``capkv demo`` on its default workload with the stacks ``cpu`` (host
   pool), ``redis`` and ``cpu,redis``, each in a fresh process against an empty server, and a second process's
   cold run (``redis`` only, which loads the first process's prefixes from the server).

Starts its own ``redis-server`` on a free loopback port (no persistence) unless ``--url`` is given.
Run: ``python -m benchmarks.redis_store [--model demo llama-1b llama-8b | all] [--mib 128] [--rounds 5] [--skip-demo]``.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from benchmarks._models import add_model_argument, chosen_models, engine_heap, print_summary, spread
from benchmarks._plain_io import best_strategy, timed_rounds
from benchmarks._plain_redis import RedisServer, get_alone, get_strategies, set_strategies
from capkv.connectors import RedisStoreConnector
from capkv.engine._kv_cache import PagedKVCache
from capkv.engine._presets import ModelPreset
from capkv.stores._keys import BlockKey
from capkv.stores._metadata import BlockMove, StoreMetadata


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default=None, help="an existing server (default: start one)")
    add_model_argument(parser, default=["demo", "llama-1b", "llama-8b"])
    parser.add_argument("--mib", type=int, default=128, help="MiB of values per round and preset (default: 128)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds; medians are reported (default: 5)")
    parser.add_argument("--skip-demo", action="store_true", help="throughput only")
    parser.add_argument("--threads", type=int, default=1, help="torch threads, as the demo (default: 1)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with RedisServer(args.url) as url:
        print(f"server: {url}   CPU cores: {len(os.sched_getaffinity(0))}")
        found = [throughput(url, preset, blocks_for(preset, args.mib << 20), args.rounds) for preset in chosen_models(args)]
        print_summary(found, "connector")
        if not args.skip_demo:
            whole_run(url)
    return 0


# ---- 1. throughput -------------------------------------------------------------------------


def blocks_for(preset: ModelPreset, budget: int) -> int:
    """Blocks of one group whose values make ``budget`` bytes: at least 8."""
    return max(8, budget // preset.value_nbytes())


@dataclass
class Figures:
    """One preset's rounds: the connector's seconds and every plain strategy's, per round."""

    preset: ModelPreset
    nbytes: int
    """Bytes of values moved each way per round."""
    rounds: list[dict[str, float]]

    def winner(self, way: str) -> str:
        """The plain strategy with the lowest median: pipelined SETs for saves, GETs landed in a tensor for loads."""
        prefix = "SET," if way == "save" else "GET,"
        return best_strategy([{k: v for k, v in r.items() if k.startswith(prefix)} for r in self.rounds])

    def ratios(self, way: str) -> list[float]:
        winner = self.winner(way)
        return [r[winner] / r[way] for r in self.rounds]

    def rate(self, name: str) -> float:
        return self.nbytes / statistics.median(r[name] for r in self.rounds) / 1e9


def throughput(url: str, preset: ModelPreset, count: int, rounds: int) -> Figures:
    import redis

    shape = preset.shape(num_blocks=count + 1)
    spec = shape.kv_spec()
    cache = PagedKVCache(shape)
    torch.manual_seed(0)
    for tensor in cache.tensors.values():
        tensor.view(torch.int16).random_(-30000, 30000)
    group = 0
    ids = list(range(1, count + 1))
    client = redis.Redis.from_url(url, socket_timeout=60)
    with RedisStoreConnector(spec, url=url, namespace="bench", timeout_s=60.0) as store, engine_heap():
        store.register_kv_caches(dict(cache.tensors))
        worker = store._store
        copier = worker.copier("benchmark")
        nbytes = copier.block_nbytes(group)
        host = copier.host_rows(count, nbytes)
        destination = torch.ones(count * nbytes, dtype=torch.uint8)
        names = [b"plain:%d" % i for i in range(count)]
        sets = set_strategies(client, names, host.view(-1), nbytes)
        plain = {**get_strategies(client, names, destination, nbytes),
                 "GET alone (values left in bytes)": get_alone(client, names),
                 "gather": lambda: (copier.gather(group, ids, host).wait(), count * nbytes)[1],
                 "scatter": lambda: (copier.scatter(group, ids, host).wait(), count * nbytes)[1]}
        results: list[dict[str, float]] = []
        for round_ in range(rounds):
            client.flushall()
            keys = tuple(BlockKey(group, os.urandom(16)) for _ in range(count))
            chunks = [slice(i, i + 64) for i in range(0, count, 64)]  # 64-block requests, as finished requests come
            saves = tuple(BlockMove(f"r{round_}-{j}", group, tuple(ids[c]), keys[c], (0,) * len(ids[c])) for j, c in enumerate(chunks))
            loads = tuple(BlockMove(f"l{round_}-{j}", group, tuple(ids[c]), keys[c], (0,) * len(ids[c])) for j, c in enumerate(chunks))
            timed = {"save": _timed(lambda: (worker.save(StoreMetadata(saves=saves)), worker.flush()))}
            report = worker.report()
            if report is None or report.failed or len(report.stored) != count:
                raise SystemExit(f"saves failed in the benchmark: {report}")
            timed["load"] = _timed(lambda: worker.load(StoreMetadata(loads=loads, step=round_ + 1)))
            errors = worker.take_load_errors()
            if errors:
                raise SystemExit(f"load errors in the benchmark: {errors}")
            copier.gather(group, ids, host).wait()  # the same bytes, in host memory, for the plain SETs
            # Each plain SET writes new keys, as the connector's save does (overwriting a value reuses its memory).
            stored, _ = timed_rounds(sets, count * nbytes, first=round_, before=lambda: client.delete(*names))
            wall, _ = timed_rounds(plain, count * nbytes, first=round_)  # the last SET's values
            results.append({**timed, **stored, **wall})
    client.close()
    figures = Figures(preset, count * nbytes, results)
    _report(figures, count, rounds)
    return figures


def _report(figures: Figures, count: int, rounds: int) -> None:
    print(f"\n{figures.preset.describe()}")
    print(f"  {count} values ({figures.nbytes / 1e6:.0f} MB) each way per round, {rounds} rounds; ratios per round (median, range)")
    for way, goal in (("save", 0.8), ("load", 0.9)):
        winner = figures.winner(way)
        print(f"  connector {way}  {figures.rate(way):6.2f} GB/s   best plain {figures.rate(winner):6.2f} GB/s ({winner})   "
              f"ratio {spread(figures.ratios(way))}  (goal >= {goal})")
    print(f"  references: GET alone (values left in bytes) {figures.rate('GET alone (values left in bytes)'):.2f} GB/s; "
          f"copies out of / into the paged KV cache alone: gather {figures.rate('gather'):.2f} GB/s, "
          f"scatter {figures.rate('scatter'):.2f} GB/s")
    depths = ", ".join(f"{name.split(',')[0]} {name.split(',')[1].removesuffix(' a round trip').strip()} {figures.rate(name):.2f}"
                       for name in figures.rounds[0] if name.startswith(("SET,", "GET,")))
    print(f"  plain strategies by commands or bytes a round trip (GB/s, medians): {depths}")


def _timed(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


# ---- 2. the engine's whole run ----------------------------------------------------------------


def whole_run(url: str) -> None:
    import redis

    client = redis.Redis.from_url(url, socket_timeout=30)
    print("\nwhole run: capkv demo, default workload (32 requests, 3 KV-cache groups), each stack in a fresh "
          "process against an empty server")
    print(f"  {'stack':<26} {'cold':>8} {'warm':>8} {'process':>9}")
    for label, stack, fresh in (
        ("cpu (host pool)", "cpu", True),
        ("redis", "redis", True),
        ("cpu,redis", "cpu,redis", True),
        ("redis, second process", "redis", False),
    ):
        if fresh:
            client.flushall()
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "capkv", "demo", "--stack", stack, "--redis-url", url],
            capture_output=True, text=True, timeout=600, check=False,
        )
        elapsed = time.perf_counter() - started
        walls = re.search(r"wall time +(\S+) s +(\S+) s", done.stdout)
        verified = "verified: bit-exact" in done.stdout
        if done.returncode != 0 or walls is None or not verified:
            print(done.stdout[-2000:] + done.stderr[-2000:])
            raise SystemExit(f"demo --stack {stack} failed (exit {done.returncode})")
        print(f"  {label:<26} {walls.group(1):>6} s {walls.group(2):>6} s {elapsed:7.2f} s")
        if not fresh:
            hits = re.search(r"prefix-hit tokens, group 0 \(full\) +(\S+ \+ \S+)", done.stdout)
            print(f"  (second process, cold run: group-0 prefix hits {hits.group(1) if hits else '?'} "
                  "= local + loaded from Redis)")
    client.close()


if __name__ == "__main__":
    sys.exit(main())
