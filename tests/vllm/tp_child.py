"""One vLLM engine with tensor_parallel_size=2 (a worker process per rank), as a script.

``python -m tests.vllm.tp_child REQUEST.json RESULT.json``: the request names the
model, the prompts, ``max_tokens``, ``runs`` and the ``kv_transfer_config`` (or
none); the result has, per run, the tokens, logprobs and cached tokens of every
prompt, and the host's stats. Run by ``test_tensor_parallel.py`` in a session of
its own, so every engine-core and worker process it starts ends with it. The
``__main__`` guard matters: vLLM's workers are spawned and re-import this module.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main(request_path: str, result_path: str) -> None:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "0|1"  # one core list per rank
    from tests.vllm.engine import serve

    request = json.loads(Path(request_path).read_text())
    served = serve(
        Path(request["model"]), request["prompts"], max_tokens=request["max_tokens"], runs=request["runs"],
        kv_transfer_config=request.get("kv_transfer_config"), cache_salt=request.get("cache_salt"),
        tensor_parallel_size=2, distributed_executor_backend="mp",
    )
    result = {
        "groups": served.groups,
        "runs": [
            {"tokens": run.tokens, "logprobs": [[list(step.items()) for step in steps] for steps in run.logprobs],
             "cached": run.cached}
            for run in served.runs
        ],
        "stats": json.loads(json.dumps(served.stats, default=str)),
        "seconds": served.seconds,
    }
    Path(result_path).write_text(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
    sys.stdout.flush()
    os._exit(0)  # the executor's worker processes are ended by the caller (a session of their own)
