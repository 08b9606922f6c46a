"""Tensor parallel 2, end to end: each rank saves and loads its own KV heads through capkv's file store.

Each engine runs in a script of its own (``tests/vllm/tp_child.py``), started in
a session of its own, with ``tensor_parallel_size=2`` and vLLM's multiprocessing
executor (one worker process per rank); at the end the whole session is killed,
so no engine-core or worker process outlives the test. Every wait is bounded.

Run 1 saves through ``CapkvHMAConnector`` over ``FileStoreConnector`` and then
serves the prompts again from its *local* prefix cache — the reference. A fresh
engine then loads the prefixes from the store: its tokens and logprobs must be
bit-equal to that local hit. Before issue 15 both ranks wrote and read the same
keys, and the fresh engine generated other tokens.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from capkv.connectors._block_file import scan_pack
from tests.vllm.engine import counter, file_store_host
from tests.vllm.model import prompts

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = prompts(2, 200, seed=1)  # 6 full blocks of 32: a 192-token prefix each
ENGINE_TIMEOUT_S = 600


def run_engine(tmp_path: Path, name: str, request: dict[str, Any]) -> dict[str, Any]:
    """One TP=2 engine in a session of its own; its result. The session is killed whatever happens."""
    request_path, result_path, log_path = (tmp_path / f"{name}.{suffix}" for suffix in ("json", "result.json", "log"))
    request_path.write_text(json.dumps(request))
    with open(log_path, "w") as log:
        child = subprocess.Popen(
            [sys.executable, "-m", "tests.vllm.tp_child", str(request_path), str(result_path)],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])},
        )
        try:
            returncode = child.wait(timeout=ENGINE_TIMEOUT_S)
        finally:
            try:
                os.killpg(child.pid, signal.SIGKILL)  # the engine core's and the ranks' processes with it
            except ProcessLookupError:
                pass
            child.wait(timeout=60)
    assert returncode == 0 and result_path.exists(), f"{name} failed:\n{log_path.read_text()[-6000:]}"
    result: dict[str, Any] = json.loads(result_path.read_text())
    return result


def test_tensor_parallel_2_loads_each_ranks_own_kv_bit_equal_to_a_local_hit(model_dir: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    config = file_store_host(store)
    request = {"model": str(model_dir), "prompts": PROMPTS, "max_tokens": 8, "kv_transfer_config": config}
    first = run_engine(tmp_path, "save", {**request, "runs": 2})
    assert first["groups"] == 2
    cold, local_hit = first["runs"]
    assert cold["cached"] == [0, 0] and local_hit["cached"] == [192, 192]
    assert counter(first["stats"], "saved_blocks") > 0

    second = run_engine(tmp_path, "load", {**request, "runs": 1})
    (loaded,) = second["runs"]
    assert loaded["cached"] == [192, 192]
    assert counter(second["stats"], "hit_tokens") == 2 * 192, second["stats"]
    assert loaded["tokens"] == local_hit["tokens"], "the loaded KV is not the KV a local hit reads"
    assert loaded["logprobs"] == local_hit["logprobs"]
    # Both ranks stored their own values: one layout fingerprint per rank and group.
    layouts = {(record.key.group, record.fingerprint) for pack in store.glob("*.kvpack") for record in scan_pack(pack)}
    assert len(layouts) == 4, layouts
