"""Real Redis servers for tests: started on 127.0.0.1 with free ports, no persistence, always stopped.

Every wait is bounded; a server that does not come up fails the test with its log.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

REDIS_SERVER = shutil.which("redis-server")
REDIS_CLI = shutil.which("redis-cli")
START_TIMEOUT_S = 10.0


def free_port() -> int:
    """A TCP port nothing listens on now, whose cluster bus port (+10000) is free too."""
    for _ in range(100):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
        if port + 10000 < 65536 and _free(port + 10000):
            return port
    raise RuntimeError("no free port pair found")


def _free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    """One ``redis-server`` process on 127.0.0.1; ``kill``/``start`` again on the same port, empty."""

    def __init__(self, directory: Path, *extra: str, port: int | None = None) -> None:
        if REDIS_SERVER is None:
            raise RuntimeError("redis-server is not installed")
        self.port = port or free_port()
        self.directory = directory / f"redis-{self.port}"
        self.directory.mkdir(parents=True, exist_ok=True)
        self.extra: tuple[str, ...] = extra
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.directory / "redis.log"

    def start(self) -> RedisServer:
        command = [
            str(REDIS_SERVER), "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
            "--dir", str(self.directory), "--logfile", str(self.log), *self.extra,
        ]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _answers(self.port):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                log = self.log.read_text() if self.log.exists() else "(no log)"
                raise RuntimeError(f"redis-server on port {self.port} did not start:\n{log[-2000:]}")
            time.sleep(0.02)
        return self

    def kill(self) -> None:
        """SIGKILL: the server dies mid-whatever, its data gone (no persistence)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    def pause(self) -> None:
        """SIGSTOP: connections stay open, nothing answers (a hung server)."""
        if self.process is not None:
            os.kill(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self.process is not None:
            os.kill(self.process.pid, signal.SIGCONT)

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        os.kill(process.pid, signal.SIGCONT)  # a paused server cannot act on SIGTERM
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)

    def cli(self, *args: str, timeout: float = 10.0) -> str:
        """``redis-cli -p PORT args...``: its output (raises on failure)."""
        return subprocess.run(
            [str(REDIS_CLI), "-h", "127.0.0.1", "-p", str(self.port), *args],
            check=True, capture_output=True, text=True, timeout=timeout,
        ).stdout


class RedisCluster:
    """A cluster of masters on loopback (no replicas) that keeps serving the slots of live nodes."""

    def __init__(self, directory: Path, size: int = 3) -> None:
        self.nodes = [
            RedisServer(
                directory, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", "1000", "--cluster-require-full-coverage", "no",
            )
            for _ in range(size)
        ]

    @property
    def url(self) -> str:
        return self.nodes[0].url

    def start(self) -> RedisCluster:
        for node in self.nodes:
            node.start()
        subprocess.run(
            [str(REDIS_CLI), "--cluster", "create", *(f"127.0.0.1:{n.port}" for n in self.nodes), "--cluster-yes"],
            check=True, capture_output=True, timeout=30,
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        while not all("cluster_state:ok" in n.cli("cluster", "info") for n in self.nodes):
            if time.monotonic() > deadline:
                raise RuntimeError("the cluster did not reach cluster_state:ok")
            time.sleep(0.05)
        return self

    def node_at(self, address: tuple[str, int]) -> RedisServer:
        return next(n for n in self.nodes if n.port == address[1])

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


@contextmanager
def module_server(prefix: str) -> Iterator[RedisServer | None]:
    """One server in a fresh directory for a whole test module (``None`` where Redis is missing: the module's
    Redis cases skip), stopped and removed after."""
    if MISSING is not None:
        yield None
        return
    directory = Path(tempfile.mkdtemp(prefix=prefix))
    server = RedisServer(directory).start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(directory, ignore_errors=True)


def missing_reason() -> str | None:
    """Why the Redis tests cannot run here (``None``: they can)."""
    try:
        import redis  # noqa: F401
    except ImportError:
        return "the 'redis' package is not installed (pip install 'capkv[redis]')"
    if REDIS_SERVER is None or REDIS_CLI is None:
        return "redis-server / redis-cli are not installed (apt-get install redis-server)"
    return None


MISSING = missing_reason()

if MISSING is not None and (os.environ.get("CI") == "true" or os.environ.get("CAPKV_REQUIRE_REDIS") == "1"):
    # CI installs redis-server and the client (.ci/run, tox extras): there a missing one is a failure, not a skip.
    raise RuntimeError(f"the Redis tests must run here, but {MISSING}")

needs_redis = pytest.mark.skipif(MISSING is not None, reason=MISSING or "")
"""Marks a test that starts real servers: skipped, with the reason, when redis-server or the client is missing."""
