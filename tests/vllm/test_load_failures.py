"""A failed load never hangs or ends vLLM: the request fails or is recomputed, as the policy says.

vLLM's ``kv_load_failure_policy``: ``"fail"`` ends the request with an error
finish reason, ``"recompute"`` computes what failed to load. With several
KV-cache groups vLLM 0.32 refuses block-level failures (a ``RuntimeError`` that
ends the engine) and honours request-level ones only for asynchronous loads;
the host makes that hold for every failure path — a store found damaged while
loading (synchronous loads), an asynchronous load whose blocks failed, and a
child raising while a load is under way — with one group and with several.

Every engine runs under :func:`tests.vllm.engine.serve`'s bounds (a step budget
and a ``SIGALRM`` watchdog): a hang fails the test, it does not stall the suite.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.vllm.engine import Served, counter, serve
from tests.vllm.model import prompts

PROMPTS = prompts(2, 200, seed=1)
SHORT = 8
HOSTS = {"hma": ("CapkvHMAConnector", 2), "plain": ("CapkvConnector", 1), "drop-in": ("MultiConnector", 2)}
POLICIES = ("fail", "recompute")


def config(host: str, stack: Mapping[str, Any], policy: str) -> dict[str, Any]:
    """``host`` over ``stack``; the drop-in (vLLM's configuration shape) over a nested HMA host."""
    if host == "MultiConnector":
        nested = {"kv_connector": "CapkvHMAConnector", "kv_connector_module_path": "capkv.vllm", "kv_role": "kv_both",
                  "kv_connector_extra_config": {"stack": dict(stack)}}
        return {"kv_connector": "MultiConnector", "kv_connector_module_path": "capkv.vllm", "kv_role": "kv_both",
                "kv_load_failure_policy": policy, "kv_connector_extra_config": {"connectors": [nested]}}
    return {
        "kv_connector": host,
        "kv_connector_module_path": "capkv.vllm",
        "kv_role": "kv_both",
        "kv_load_failure_policy": policy,
        "kv_connector_extra_config": {"stack": dict(stack)},
    }


def files(root: Path) -> dict[str, Any]:
    return {"kv_connector": "FileStoreConnector", "kv_connector_extra_config": {"root": str(root), "namespace": "tiny"}}


def faulty(**options: Any) -> dict[str, Any]:
    return {"kv_connector": "tests.vllm.faulty:Faulty", "kv_connector_extra_config": options}


def damage_packs(root: Path) -> int:
    """Flip the top bit of the last two 8-byte words of every pack on disk (payload bytes of its last record:
    a record's header precedes its bytes) — two-bit damage that a sum of words does not see."""
    damaged = 0
    for pack in sorted(root.rglob("*.kvpack")):
        data = bytearray(pack.read_bytes())
        data[-1] ^= 0x80
        data[-9] ^= 0x80
        pack.write_bytes(bytes(data))
        damaged += 1
    return damaged


_COLD: dict[int, Served] = {}


@pytest.fixture(scope="module")
def cold(model_dir: Path) -> Callable[[int], Served]:
    """A no-connector engine serving the prompts once, per group count (what a recomputed request must give)."""

    def get(groups: int) -> Served:
        if groups not in _COLD:
            _COLD[groups] = serve(model_dir, PROMPTS, max_tokens=SHORT, disable_hybrid_kv_cache_manager=groups == 1)
            assert _COLD[groups].groups == groups
        return _COLD[groups]

    return get


def assert_followed_policy(got: Served, cold: Served, policy: str, *, label: str) -> None:
    """``fail``: every request ends with an error or with the cold run's tokens, and one at least
    with an error; ``recompute``: every request gives the cold run's tokens."""
    run, reference = got.runs[0], cold.runs[0]
    for index, (reason, tokens) in enumerate(zip(run.finish_reasons, run.tokens, strict=True)):
        if policy == "fail" and reason == "error":
            assert tokens == [], f"{label}: request {index} failed but produced {tokens}"
            continue
        assert reason == "length", f"{label}: request {index} ended with {reason!r}"
        assert tokens == reference.tokens[index], f"{label}: request {index}'s tokens differ from a cold run"
    if policy == "fail":
        assert "error" in run.finish_reasons, f"{label}: no request failed: {run.finish_reasons}"


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("host", sorted(HOSTS))
def test_a_damaged_file_store(
    model_dir: Path, tmp_path: Path, cold: Callable[[int], Served], host: str, policy: str
) -> None:
    """Run 1 saves; the packs are damaged on disk; run 2 finds it while loading (synchronous loads)."""
    name, groups = HOSTS[host]
    store = tmp_path / "store"
    settings = config(name, files(store), policy)
    first = serve(model_dir, PROMPTS, max_tokens=SHORT, kv_transfer_config=settings)
    assert first.groups == groups and counter(first.stats, "saved_blocks") > 0
    assert damage_packs(store) > 0
    second = serve(model_dir, PROMPTS, max_tokens=SHORT, kv_transfer_config=settings)
    assert counter(second.stats, "failed_blocks") > 0, f"the damage was not found while loading: {second.stats}"
    assert_followed_policy(second, cold(groups), policy, label=f"{host}/{policy} run 2")
    # nothing the failed loads never received was saved: a fresh engine loads what is left, correctly
    third = serve(model_dir, PROMPTS, max_tokens=SHORT, kv_transfer_config=settings)
    assert counter(third.stats, "failed_blocks") == 0 and counter(third.stats, "hit_tokens") > 0, third.stats
    assert_followed_policy(third, cold(groups), "recompute", label=f"{host}/{policy} run 3")


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("host", ["hma", "plain"])
def test_an_asynchronous_load_that_fails(
    model_dir: Path, cold: Callable[[int], Served], host: str, policy: str
) -> None:
    """A child loading asynchronously reports its load finished a step later, every block failed."""
    name, groups = HOSTS[host]
    settings = config(name, faulty(claim=True, load_async=True, fail_load=True), policy)
    got = serve(model_dir, PROMPTS, max_tokens=SHORT, kv_transfer_config=settings)
    assert got.groups == groups
    assert_followed_policy(got, cold(groups), policy, label=f"{host}/{policy}")


@pytest.mark.parametrize(
    ("raise_in", "policy"),
    [
        ("start_load_kv", "fail"),
        ("start_load_kv", "recompute"),
        ("wait_for_layer_load", "fail"),
        ("bind_connector_metadata", "fail"),
        ("build_connector_meta", "fail"),
        ("update_state_after_alloc", "fail"),
        ("get_block_ids_with_load_errors", "recompute"),
    ],
)
def test_a_child_raising_while_loading(
    model_dir: Path, cold: Callable[[int], Served], raise_in: str, policy: str
) -> None:
    """A child that raises in a member a load depends on fails that load, not the engine."""
    settings = config("CapkvHMAConnector", faulty(claim=True, raise_in=[raise_in]), policy)
    got = serve(model_dir, PROMPTS, max_tokens=SHORT, kv_transfer_config=settings)
    assert_followed_policy(got, cold(2), policy, label=f"raising in {raise_in}")
    assert counter(got.stats, "contained_errors") > 0, got.stats


def test_a_child_raising_everywhere_else_ends_no_request(model_dir: Path, cold: Callable[[int], Served]) -> None:
    """Raising in every other serving member: each is contained, every request is served as cold."""
    members = [
        "get_num_new_matched_tokens", "update_connector_output", "request_finished_all_groups", "take_events",
        "save_kv_layer", "wait_for_save", "get_finished", "build_connector_worker_meta",
    ]
    settings = config("CapkvHMAConnector", faulty(raise_in=members), "fail")
    got = serve(model_dir, PROMPTS, max_tokens=SHORT, kv_transfer_config=settings)
    assert_followed_policy(got, cold(2), "recompute", label="raising everywhere")
    assert counter(got.stats, "contained_errors") > 0, got.stats
