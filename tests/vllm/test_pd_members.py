"""Per-child state beside NIXL: handshakes, Prometheus metrics and resets, kept per child as vLLM keeps them.

vLLM's real ``Scheduler`` drives the stacks (:mod:`tests.vllm.pd_harness`); NIXL is
:mod:`tests.vllm.pd_children`'s (vLLM's ``NixlConnector`` on the scheduler side).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vllm is not installed (the `vllm` tox environment runs this)")

from tests.vllm.pd_harness import BLOCK, engine_config, prompt  # noqa: E402
from tests.vllm.pd_stacks import ORDERS, Scene, composite, nixl, store, tier  # noqa: E402


def _hit_after_save(scene: Scene) -> list[int]:
    """Tokens the engine computed for a prompt a file store saved before (the local prefix cache emptied)."""
    node = scene.node
    text = prompt(4 * BLOCK, seed=7)
    node.add("warm", text, max_tokens=1)
    node.run(1)
    _store_of(node.worker).flush()  # its background writer's saves are on disk
    node.run(2)  # their report reaches the scheduler side
    assert not node.scheduler.requests
    assert node.scheduler.reset_prefix_cache()
    node.add("again", text, max_tokens=1)
    deadline = time.monotonic() + 30  # a file store reads on its reader thread: the load lands in its own time
    while "again" in node.scheduler.requests and time.monotonic() < deadline:
        node.step()
        time.sleep(0.01)
    assert "again" not in node.scheduler.requests, "the request did not finish within 30 s"
    return [n for s in node.steps for (rid, n) in s["scheduled"] if rid == "again"]


def _store_of(worker: Any) -> Any:
    """The file store under the drop-in's worker side (inside its capkv host)."""
    host = next(child for child in worker.sub_connectors if type(child).__name__ == "CapkvHMAConnector")
    return getattr(host.stack, "__wrapped__", host.stack)


@pytest.mark.parametrize("order", ORDERS)
def test_each_child_gets_its_own_handshake_and_a_store_beside_nixl_learns_its_layout(
    model_dir: Path, tmp_path: Path, order: str
) -> None:
    """NIXL's scheduler accepts only its own payload (a ``NixlHandshakePayload``); a file store offers nothing until
    its workers' layout reached the scheduler side, which travels in the handshake."""
    leaf = store("file", tmp_path / "store")
    scene = Scene(model_dir, "capkv", role="kv_producer", tier_kind="hma-host", order=order, groups=1, leaf=leaf)
    try:
        computed = _hit_after_save(scene)
    finally:
        scene.close()
    assert computed and computed[0] < 4 * BLOCK, f"the store offered nothing: the engine computed {computed}"


def test_vllms_composite_hands_every_child_the_first_handshake(model_dir: Path, tmp_path: Path) -> None:
    """What capkv differs from on purpose (docs/vllm.md, "P/D stacks"): vLLM's composite, the store listed first,
    hands NIXL the store's handshake and NIXL refuses it."""
    with pytest.raises(ValueError, match="expects NixlHandshakePayload"):
        Scene(model_dir, "vllm", role="kv_producer", tier_kind="hma-host", order="tier-first", groups=1,
              leaf=store("file", tmp_path / "store"), handshake="engine")


def test_prometheus_metrics_register_once_for_a_drop_in_over_a_nested_host(model_dir: Path) -> None:
    """vLLM's Prometheus logger (the OpenAI server's) over the drop-in over NIXL and a nested capkv host: built, and a
    step's statistics counted, per child as vLLM's composite counts them; built again (a new logger) as well."""
    from prometheus_client import REGISTRY
    from vllm.v1.metrics.loggers import PrometheusStatLogger

    children = [nixl("kv_producer", "prom"), tier("hma-host", "kv_producer", store())]
    for which in ("capkv", "vllm", "capkv"):
        config = engine_config(model_dir, composite(which, "kv_producer", "P", children), groups=1)
        logger = PrometheusStatLogger(config)
        assert logger.kv_connector_prom is not None
    scene = Scene(model_dir, "capkv", role="kv_producer", tier_kind="hma-host", order="nixl-first", groups=1)
    try:
        scene.node.add("warm", prompt(4 * BLOCK, seed=8), max_tokens=1)
        stats: dict[str, Any] = {}
        for record in scene.node.run(2):
            stats.update(record["stats"])
    finally:
        scene.close()
    logger.kv_connector_prom.observe(stats, 0)
    saved = REGISTRY.get_sample_value(
        "vllm:capkv_connector_events_total",
        {"model_name": str(model_dir), "engine": "0", "connector": "CPUOffloadConnector", "counter": "saved_blocks"},
    )
    assert saved == 4, f"capkv's counter, counted once: {saved}"


def test_a_reset_answers_true_only_when_every_tier_dropped_what_it_held(model_dir: Path) -> None:
    """A capkv connector without ``reset_cache`` keeps what it holds: the stack answers ``False``."""
    from tests.vllm.pd_harness import node

    keeper = {"kv_connector": "tests.vllm.faulty:Faulty", "kv_role": "kv_producer", "kv_connector_extra_config": {}}
    held = node(model_dir, composite("capkv", "kv_producer", "P", [nixl("kv_producer", "reset"), keeper]), groups=1)
    dropped = node(model_dir, composite("capkv", "kv_producer", "P",
                                        [nixl("kv_producer", "reset"), tier("hma-host", "kv_producer", store())]), groups=1)
    try:
        assert held.connector.reset_cache() is False
        assert dropped.connector.reset_cache() is True
        assert held.scheduler.reset_prefix_cache(reset_connector=True) is False
    finally:
        held.shutdown()
        dropped.shutdown()


def test_a_vllm_connectors_statistics_inside_a_nested_capkv_composite_reach_vllms_logs(model_dir: Path) -> None:
    """NIXL two composites deep in a host's stack reports under its own class at the top, as vLLM's composite
    keys it (its statistics object is what vLLM's loggers reduce), and its failed handshake is counted."""
    from tests.vllm.pd_harness import node
    from tests.vllm.pd_stacks import pull_params

    inner = {"kv_connector": "MultiConnector", "kv_connector_extra_config": {"connectors": [
        nixl("kv_consumer", "nested-stats"), store()]}}
    stack = {"kv_connector": "MultiConnector", "kv_connector_extra_config": {"connectors": [inner, store()]}}
    host = {"kv_connector": "CapkvHMAConnector", "kv_connector_module_path": "capkv.vllm", "kv_role": "kv_consumer",
            "engine_id": "D", "kv_connector_extra_config": {"stack": stack}}
    served = node(model_dir, host, groups=2)
    try:
        served.add("pull", prompt(4 * BLOCK, seed=9), max_tokens=1,
                   params=pull_params("unreachable", "p-9", [[1, 2, 3, 4]] * 2, 4 * BLOCK))
        stats: dict[str, Any] = {}
        for record in served.run(3):
            stats.update(record["stats"])
    finally:
        served.shutdown()
    assert stats.get("NixlLike", {}).get("num_failed_handshakes") == [1], stats
