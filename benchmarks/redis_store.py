"""RedisStoreConnector: save/load throughput against plain pipelined SET/GET, and the demo's run time.

1. Throughput. The connector's worker side saves ``--blocks`` blocks of the
   demo model (gather from the paged KV cache, header and XXH3-128 checksum, pipelined SET
   on the writer thread, until every save is reported over) and loads them
   back (pipelined GET, checks, scatter into the paged KV cache). The baseline
   sends the same bytes (gathered beforehand into host memory) to the same
   server with redis-py's plain pipelined SET and GET (512 commands per round
   trip, as the connector), nothing else. The copies out of and into the paged
   cache are also timed alone, to show where the difference goes.
   Goal: connector >= 0.8x the baseline, both ways.
2. The engine's whole run. ``capkv demo`` on its default workload with the
   stacks ``cpu`` (host pool), ``redis`` and ``cpu,redis``, each in a fresh
   process against an empty server: the cold and warm runs' wall times as
   the demo prints them, and then a second process's cold run (``redis`` only,
   which loads the first process's prefixes from the server).

Starts its own ``redis-server`` on a free loopback port (no persistence)
unless ``--url`` is given. Run: ``python -m benchmarks.redis_store [--blocks N] [--rounds R]``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from capkv.connectors import RedisStoreConnector
from capkv.stores._value import row_memory as tensor_memory
from capkv.stores._keys import BlockKey
from capkv.stores._metadata import BlockMove, StoreMetadata
from capkv.engine import ModelShape
from capkv.engine._kv_cache import PagedKVCache

PIPELINE = 512


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default=None, help="an existing server (default: start one)")
    parser.add_argument("--blocks", type=int, default=1024, help="blocks per round (default: 1024)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds; the median is reported (default: 5)")
    parser.add_argument("--skip-demo", action="store_true", help="throughput only")
    parser.add_argument("--threads", type=int, default=1, help="torch threads, as the demo (default: 1)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with server(args.url) as url:
        print(f"server: {url}   CPU cores: {len(os.sched_getaffinity(0))}")
        throughput(url, args.blocks, args.rounds)
        if not args.skip_demo:
            whole_run(url)
    return 0


# ---- 1. throughput -------------------------------------------------------------------------


def throughput(url: str, count: int, rounds: int) -> None:
    import redis

    shape = ModelShape()
    spec = shape.kv_spec()
    cache = PagedKVCache(shape)
    torch.manual_seed(0)
    for tensor in cache.tensors.values():
        tensor.view(torch.int16).random_(-30000, 30000)
    group = 0
    ids = [1 + i % (shape.num_blocks - 1) for i in range(count)]
    client = redis.Redis.from_url(url, socket_timeout=30)
    with RedisStoreConnector(spec, url=url, namespace="bench", timeout_s=30) as store:
        store.register_kv_caches(dict(cache.tensors))
        worker = store._store
        nbytes = _block_nbytes(store, group)
        print(f"\nthroughput: {count} blocks of {nbytes / 1024:.0f} KiB ({count * nbytes / 1e6:.1f} MB) per round, "
              f"median of {rounds} rounds")
        copier = worker.copier("benchmark")
        host = copier.host_rows(count, nbytes)
        results: dict[str, list[float]] = {k: [] for k in ("save", "load", "SET", "GET", "gather", "scatter")}
        for round_ in range(rounds):
            client.flushall()
            keys = tuple(BlockKey(group, os.urandom(16)) for _ in range(count))
            chunks = [slice(i, i + 64) for i in range(0, count, 64)]  # 64-block requests, as finished requests come
            saves = tuple(BlockMove(f"r{round_}-{j}", group, tuple(ids[c]), keys[c], (0,) * len(ids[c])) for j, c in enumerate(chunks))
            loads = tuple(BlockMove(f"l{round_}-{j}", group, tuple(ids[c]), keys[c], (0,) * len(ids[c])) for j, c in enumerate(chunks))
            results["save"].append(_timed(lambda: (worker.save(StoreMetadata(saves=saves)), worker.flush())))
            report = worker.report()
            if report is None or report.failed or len(report.stored) != count:
                raise SystemExit(f"saves failed in the benchmark: {report}")
            results["load"].append(_timed(lambda: worker.load(StoreMetadata(loads=loads, step=round_ + 1))))
            errors = worker.take_load_errors()
            if errors:
                raise SystemExit(f"load errors in the benchmark: {errors}")
            # The same bytes, already in host memory: what the connector copies out of the paged cache.
            results["gather"].append(_timed(lambda: copier.gather(group, ids, host).wait()))
            payloads = [tensor_memory(host[i]) for i in range(count)]
            names = [b"plain:%d:%d" % (round_, i) for i in range(count)]
            results["SET"].append(_timed(lambda: _plain_set(client, names, payloads)))
            results["GET"].append(_timed(lambda: _plain_get(client, names, nbytes)))
            distinct = list(dict.fromkeys(ids))
            results["scatter"].append(_timed(lambda: copier.scatter(group, distinct, host[: len(distinct)]).wait()))
    client.close()
    rate = {k: count * nbytes / statistics.median(v) / 1e9 for k, v in results.items()}
    for way, plain in (("save", "SET"), ("load", "GET")):
        ratios = sorted(p / c for c, p in zip(results[way], results[plain], strict=True))  # time ratio, per round
        print(f"  connector {way}  {rate[way]:6.2f} GB/s   plain pipelined {plain} {rate[plain]:6.2f} GB/s   "
              f"ratio {statistics.median(ratios):.2f}x (median of the rounds' ratios; "
              f"range {ratios[0]:.2f}-{ratios[-1]:.2f})")
    print("  (goal: >= 0.80x both ways; each round runs all measurements in turn, so a busy machine "
          "slows them alike)")
    print(f"  of which the copies out of / into the paged KV cache alone: gather {rate['gather']:.2f} GB/s, "
          f"scatter {rate['scatter']:.2f} GB/s (the baseline's bytes are already in host memory)")


def _block_nbytes(store: RedisStoreConnector, group: int) -> int:
    return store._store.copier("benchmark").block_nbytes(group)


def _timed(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def _plain_set(client: object, names: list[bytes], payloads: list[memoryview]) -> None:
    for start in range(0, len(names), PIPELINE):
        pipe = client.pipeline(transaction=False)  # type: ignore[attr-defined]
        for i in range(start, min(start + PIPELINE, len(names))):
            pipe.set(names[i], payloads[i])
        pipe.execute()


def _plain_get(client: object, names: list[bytes], nbytes: int) -> None:
    for start in range(0, len(names), PIPELINE):
        pipe = client.pipeline(transaction=False)  # type: ignore[attr-defined]
        for i in range(start, min(start + PIPELINE, len(names))):
            pipe.get(names[i])
        values = pipe.execute()
        if any(v is None or len(v) != nbytes for v in values):
            raise SystemExit("plain GET returned a wrong value")


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


# ---- the server ---------------------------------------------------------------------------------


class server:
    """``url`` as given, or a fresh redis-server on a free loopback port, stopped afterwards."""

    def __init__(self, url: str | None) -> None:
        self.url = url
        self.process: subprocess.Popen[bytes] | None = None
        self.directory: str | None = None

    def __enter__(self) -> str:
        if self.url is not None:
            return self.url
        binary = shutil.which("redis-server")
        if binary is None:
            raise SystemExit("redis-server is not installed (apt-get install redis-server), or pass --url")
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        self.directory = tempfile.mkdtemp(prefix="capkv-redis-bench-")
        self.process = subprocess.Popen(
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", self.directory, "--logfile", str(Path(self.directory) / "redis.log")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(16).startswith(b"+PONG"):
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("redis-server did not start")
            time.sleep(0.05)
        return f"redis://127.0.0.1:{port}"

    def __exit__(self, *exc: object) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=10)
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
