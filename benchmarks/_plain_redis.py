"""Plain Redis I/O of the same values a store moves, at several pipeline depths, and a server to run it against.

The store's load must land each value in the engine's KV cache, so a plain GET is timed the same way: the
values fetched with redis-py's pipelined GET (the client the store uses) and copied into a CPU tensor touched
beforehand; GET alone (values left in Python ``bytes``) is a reference, not a baseline. Each strategy returns
the bytes it moved, and the smoke test checks they are the values that were set.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from capkv.stores._host import row_memory

__all__ = ["DEPTHS", "TRIP_BYTES", "RedisServer", "get_alone", "get_strategies", "set_strategies"]

DEPTHS = (1, 16, 256, 1024)
"""Pipeline depths tried (commands per round trip)."""
TRIP_BYTES = (256 << 10, 1 << 20, 4 << 20)
"""Bytes of values per round trip tried, whatever the value size (one command at least); the store's ``GET``s
go about 1 MiB a trip."""


def set_strategies(client: Any, names: list[bytes], source: torch.Tensor, value_nbytes: int) -> dict[str, Callable[[], int]]:
    """Pipelined SET of ``source``'s values (one per ``value_nbytes``, no copy) under ``names``, per depth."""
    memory = row_memory(source)
    values = [memory[index * value_nbytes : (index + 1) * value_nbytes] for index in range(len(names))]

    def at(depth: int) -> Callable[[], int]:
        def run() -> int:
            stored = 0
            for start in range(0, len(names), depth):
                pipe = client.pipeline(transaction=False)
                for index in range(start, min(start + depth, len(names))):
                    pipe.set(names[index], values[index])
                stored += sum(len(values[start + i]) for i, ok in enumerate(pipe.execute()) if ok)
            return stored

        return run

    return {f"SET, {depth} a round trip": at(depth) for depth in DEPTHS}


def get_strategies(
    client: Any, names: list[bytes], destination: torch.Tensor, value_nbytes: int
) -> dict[str, Callable[[], int]]:
    """Pipelined GET of ``names``, each value copied into its place in ``destination`` (contiguous, touched), per
    depth and per bytes a round trip: what landing the values costs with no checks and no paged layout."""
    memory = row_memory(destination)

    def at(depth: int) -> Callable[[], int]:
        def run() -> int:
            landed = 0
            for start in range(0, len(names), depth):
                pipe = client.pipeline(transaction=False)
                for index in range(start, min(start + depth, len(names))):
                    pipe.get(names[index])
                for value in pipe.execute():
                    if value is None:
                        raise RuntimeError("a plain GET found no value")
                    memory[landed : landed + len(value)] = value
                    landed += len(value)
            return landed

        return run

    per_trip = {f"GET, {nbytes >> 10} KiB a round trip, + copy into a tensor": at(max(1, nbytes // value_nbytes))
                for nbytes in TRIP_BYTES}
    return {**{f"GET, {depth} a round trip, + copy into a tensor": at(depth) for depth in DEPTHS}, **per_trip}


def get_alone(client: Any, names: list[bytes], depth: int = 512) -> Callable[[], int]:
    """Pipelined GET, the values left in ``bytes`` (what the store's client hands it; a reference)."""

    def run() -> int:
        got = 0
        for start in range(0, len(names), depth):
            pipe = client.pipeline(transaction=False)
            for name in names[start : start + depth]:
                pipe.get(name)
            got += sum(len(value) for value in pipe.execute() if value is not None)
        return got

    return run


class RedisServer:
    """``url`` as given, or a fresh redis-server on a free loopback port (no persistence), stopped afterwards."""

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
                self.__exit__()
                raise SystemExit("redis-server did not start")
            time.sleep(0.05)
        return f"redis://127.0.0.1:{port}"

    def __exit__(self, *exc: object) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=10)
            self.process = None
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None
