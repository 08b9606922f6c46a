"""P/D conformance: capkv's drop-in over NIXL and a capkv tier behaves as vLLM's own ``MultiConnector`` over the same children.

vLLM's real ``Scheduler`` drives each stack (:mod:`tests.vllm.pd_harness`): NIXL
(:mod:`tests.vllm.pd_children`: vLLM's ``NixlConnector`` scheduler side, its worker
protocol in-process) beside a capkv store, in both orders, hosted (nested) or named
directly in the drop-in (flat), with one KV-cache group and with two (HMA), on a
decode node (pulls that land and pulls that fail, beside a running request that
shares the failed one's prefix, under both ``kv_load_failure_policy`` values) and
on a prefill node (a one-token request whose prefix a synchronous tier loads, then
a connector reset). Every step's observables — the worker's finished sets,
``failed_recving``, invalid blocks, the engine's outputs (tokens, finish reasons,
``kv_transfer_params``), every request's state, the connector statistics — must
equal those of vLLM's composite over the same children, except for
:data:`DIFFERENCES`; and the outcomes vLLM's own composite gets wrong are checked
outright (the shared prefix untouched, NIXL handed the loaded blocks, nothing
served after a reset).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vllm is not installed (the `vllm` tox environment runs this)")

from tests.vllm.pd_harness import BLOCK, prompt  # noqa: E402
from tests.vllm.pd_stacks import ORDERS, Scene, pull_params  # noqa: E402

DIFFERENCES = {
    "handshake": "each child gets back the handshake its own workers produced; vLLM's composite hands every "
                 "child the first one (NIXL then refuses a capkv tier's, or a tier never learns its layout): "
                 "the reference runs get each child's own by hand",
    "marks": "a capkv host's statistics carry '__capkv__' marks (a host nesting it rebuilds them across "
             "processes) and, when it counted any, its own 'capkv' counters: left out of the comparison",
    "flat": "a store named directly in the drop-in reports its statistics under its own class; vLLM's composite "
            "can only host it in CapkvHMAConnector, under whose name its statistics nest",
}
"""Where capkv's drop-in differs from vLLM's composite on purpose (docs/vllm.md, "P/D stacks")."""

SHAPES = [("hma-host", 1), ("hma-host", 2), ("plain-host", 1), ("flat", 1)]
"""(tier, KV-cache groups). ``CapkvConnector`` turns vLLM's hybrid allocator off (one group); so does a store
named directly in the drop-in: vLLM resolves every entry of a ``"MultiConnector"`` by its own registry to decide
the allocator, and a capkv store's name is not there (with the allocator forced on, vLLM raises)."""


def _comparable(record: dict[str, Any], *, flat_reference: bool) -> dict[str, Any]:
    record = dict(record)
    stats = _unmarked(record["stats"])
    if flat_reference and "CapkvHMAConnector" in stats:
        stats.update(stats.pop("CapkvHMAConnector"))
    stats.pop("capkv", None)
    record["stats"] = stats
    return record


def _unmarked(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _unmarked(inner) for key, inner in value.items() if key != "__capkv__"}
    return value


def _play(model_dir: Path, which: str, script: Any, **scene: Any) -> tuple[list[dict[str, Any]], Any, BaseException | None]:
    built = Scene(model_dir, which, **scene)
    raised: BaseException | None = None
    extra: Any = None
    try:
        extra = script(built)
    except AssertionError as exc:  # vLLM's scheduler asserting: the engine would end
        raised = exc
    finally:
        built.close()
    return built.node.steps, extra, raised


def _conform(model_dir: Path, script: Any, *, tier: str, **scene: Any) -> tuple[list[dict[str, Any]], Any, BaseException | None]:
    """Play ``script`` on capkv's drop-in and on vLLM's composite; every step must be equal up to the point
    the reference raised (if it did). Returns capkv's steps, what the script returned, and the reference's error."""
    ours, extra, raised = _play(model_dir, "capkv", script, tier_kind=tier, **scene)
    assert raised is None, f"capkv's drop-in: {raised!r}"
    theirs, their_extra, their_error = _play(model_dir, "vllm", script, tier_kind=tier, **scene)
    flat = tier == "flat"
    mine = [_comparable(r, flat_reference=False) for r in ours]
    reference = [_comparable(r, flat_reference=flat) for r in theirs]
    compared = len(reference) - (1 if their_error is not None else 0)  # the step that raised is vLLM's own fault
    for index in range(compared):
        assert mine[index] == reference[index], f"step {index}: capkv {mine[index]} != vLLM {reference[index]}"
    if their_error is None:
        assert len(mine) == len(reference) and extra == their_extra
    return ours, extra, their_error


# ---- decode node: pulls that land and pulls that fail, beside a request sharing the failed one's prefix -------


def _decode(scene: Scene) -> None:
    node = scene.node
    shared = prompt(2 * BLOCK, seed=1)
    node.add("run", prompt(4 * BLOCK, seed=2, prefix=shared), max_tokens=8)
    node.run(2)
    producer = scene.producer()
    remote = [list(range(1, 6))] * scene.groups
    node.add("ok", prompt(5 * BLOCK, seed=4), max_tokens=3, params=pull_params(producer.engine_id, "p-ok", remote, 5 * BLOCK))
    node.add("pull", prompt(5 * BLOCK, seed=3, prefix=shared), max_tokens=3,
             params=pull_params("unreachable", "p-1", remote, 5 * BLOCK))
    node.run(8)


@pytest.mark.parametrize("policy", ["fail", "recompute"])
@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize(("tier", "groups"), SHAPES)
def test_a_failed_pull_fails_only_its_own_blocks(model_dir: Path, tier: str, groups: int, order: str, policy: str) -> None:
    steps, _, raised = _conform(model_dir, _decode, tier=tier, role="kv_consumer", order=order, groups=groups, policy=policy)
    assert raised is None, f"vLLM's composite: {raised!r}"
    failed = [step for step in steps if "pull" in step["failed_recving"]]
    assert len(failed) == 1, "failed_recving passes through, once"
    step = failed[0]
    shared_blocks = _blocks_of(steps, "run")
    assert shared_blocks
    assert not set(step["invalid_block_ids"]) & shared_blocks, "the shared prefix is never reported invalid"
    if groups == 1:
        assert step["invalid_block_ids"], "with one group NIXL names the blocks it was loading"
    # the request sharing the prefix runs on untouched: one token a step, never rolled back or failed
    computed = [n for s in steps for (rid, _, n) in s["states"] if rid == "run"]
    assert computed == sorted(computed) and len(set(computed)) == len(computed)
    finishes = {rid: reason for s in steps for (rid, _, reason, _) in s["outputs"] if reason != "None"}
    assert finishes["run"] == "length" and finishes["ok"] == "length"
    assert finishes["pull"] == ("error" if policy == "fail" else "length")


def _blocks_of(steps: list[dict[str, Any]], request_id: str) -> set[int]:
    """The blocks of ``request_id``'s shared prefix (its first two blocks of every group), as the scheduler held them."""
    held = next(s["blocks"][request_id] for s in steps if request_id in s["blocks"])
    return {block for group in held for block in group[:2] if block}


# ---- prefill node: a one-token request loaded from a synchronous tier, then a connector reset ----------------


def _prefill(scene: Scene) -> bool:
    node = scene.node
    text = prompt(4 * BLOCK, seed=4)
    node.add("warm", text, max_tokens=1)
    node.run(2)
    assert node.scheduler.reset_prefix_cache()  # vLLM's own prefix cache only: the next hit is the tier's
    node.add("pd", text, max_tokens=1, params={"do_remote_decode": True})
    node.run(3)
    scene.read_by_consumer("pd")
    node.run(2)
    answered = node.scheduler.reset_prefix_cache(reset_connector=True)
    node.add("after", text, max_tokens=1)
    node.run(2)
    return answered


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize(("tier", "groups"), SHAPES)
def test_a_one_token_prefill_hands_nixl_its_blocks_and_a_reset_reaches_the_tier(
    model_dir: Path, tier: str, groups: int, order: str
) -> None:
    steps, answered, raised = _conform(model_dir, _prefill, tier=tier, role="kv_producer", order=order, groups=groups)
    assert raised is None
    params = [p for s in steps for (rid, _, _, p) in s["outputs"] if rid == "pd" and p]
    assert len(params) == 1
    remote = params[0]["remote_block_ids"]
    assert remote[0] and 0 not in remote[0] and len(remote[0]) == 4, f"NIXL was handed {remote}"
    loaded = [s for s in steps if ("pd", 4 * BLOCK - 3 * BLOCK) in s["scheduled"] or ("pd", BLOCK) in s["scheduled"]]
    assert loaded, "the tier served the prefix (only the last block computed)"
    assert any("pd" in s["finished_sending"] for s in steps), "the send ends once the consumer read it"
    assert answered is True
    after = [n for s in steps for (rid, n) in s["scheduled"] if rid == "after"]
    assert after == [4 * BLOCK], "nothing saved before the reset is served after it"


# ---- a child raising while a load is under way, beside a request sharing the load's prefix -------------------


def _raising(scene: Scene) -> None:
    node = scene.node
    shared = prompt(2 * BLOCK, seed=11)
    node.add("run", prompt(4 * BLOCK, seed=12, prefix=shared), max_tokens=8)
    node.run(2)
    node.add("load", prompt(5 * BLOCK, seed=13, prefix=shared), max_tokens=3)  # the tier claims beyond the prefix
    node.run(8)


@pytest.mark.parametrize("policy", ["fail", "recompute"])
@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize(("tier", "groups"), [("hma-host", 1), ("hma-host", 2), ("flat", 1)])
def test_a_child_raising_while_loading_fails_only_that_loads_blocks(
    model_dir: Path, tier: str, groups: int, order: str, policy: str
) -> None:
    """A capkv tier raises in ``start_load_kv``: its host contains it and fails that step's load — the blocks it
    was loading, never the prefix the running request shares."""
    raising = {"kv_connector": "tests.vllm.faulty:Faulty", "kv_connector_extra_config": {
        "claim": True, "raise_in": ["start_load_kv"], "min_local": 2 * BLOCK}}
    steps, _, raised = _conform(model_dir, _raising, tier=tier, role="kv_consumer", order=order, groups=groups,
                                policy=policy, leaf=raising)
    assert raised is None
    shared = _blocks_of(steps, "run")
    invalid = {block for s in steps for block in s["invalid_block_ids"]}
    assert not invalid & shared, "the shared prefix is never reported invalid"
    assert bool(invalid) == (groups == 1) and any("load" in s["failed_recving"] for s in steps) == (groups > 1)
    computed = [n for s in steps for (rid, _, n) in s["states"] if rid == "run"]
    assert computed == sorted(computed) and len(set(computed)) == len(computed)
    finishes = {rid: reason for s in steps for (rid, _, reason, _) in s["outputs"] if reason != "None"}
    assert finishes["run"] == "length" and finishes["load"] == ("error" if policy == "fail" else "length")
