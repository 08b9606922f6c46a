"""A store that raises at shutdown must not leave vLLM holding its worker-side connector.

vLLM's ``ensure_kv_transfer_shutdown`` calls the worker connector's ``shutdown`` and only then forgets it
(``kv_transfer_state._KV_CONNECTOR_AGENT = None``). capkv's stores raise the failures they kept at shutdown
(here: every background save failed); the host passed that on, so vLLM kept the old connector, and the next
engine built in the same process reused it as its worker side: found by ``benchmarks/vllm_fault_campaign.py``,
where the next engine's scheduler side and the stale worker side disagreed and a request never finished. The
host now logs what the stack raises at shutdown.
"""

from __future__ import annotations

from pathlib import Path

from benchmarks import _fault_tier as faults
from tests.vllm.engine import serve
from tests.vllm.model import prompts


def test_a_store_failing_at_shutdown_leaves_no_worker_connector(model_dir: Path, tmp_path: Path) -> None:
    from vllm.distributed.kv_transfer import kv_transfer_state

    settings = {
        "kv_connector": "CapkvHMAConnector", "kv_connector_module_path": "capkv.vllm", "kv_role": "kv_both",
        "kv_connector_extra_config": {"stack": {
            "kv_connector": "benchmarks._fault_tier:FaultFileStoreConnector",
            "kv_connector_extra_config": {"root": str(tmp_path / "store"), "namespace": "tiny"},
        }},
    }
    faults.forget()
    faults.RAISE_FROM_THE_START.add("put")  # every save fails: the store raises them at shutdown
    try:
        try:
            serve(model_dir, prompts(1, 100, seed=3), max_tokens=2, kv_transfer_config=settings)
        except Exception:  # noqa: BLE001, S110 (whether shutdown raises is not the point: what vLLM keeps is)
            pass
        stale = kv_transfer_state._KV_CONNECTOR_AGENT  # noqa: SLF001
    finally:
        kv_transfer_state._KV_CONNECTOR_AGENT = None  # noqa: SLF001 (never leave it to the next test)
        faults.forget()
    assert stale is None, f"vLLM still holds the worker connector {type(stale).__name__} after the engine shut down"
