"""vLLM 0.32 hosts capkv stacks, end to end, each scenario on fresh in-process engines.

The model is a tiny seeded random-weight hybrid Llama (full and sliding-window
layers, window 64); prompts are token ids. A run that loads its prefix through
the stack must be bit-identical — tokens and logprobs — to a no-connector engine
serving the same prompt a second time from its *local* prefix cache: the same
compute shape, so any wrong byte of loaded KV shows. ``test_wrong_kv_is_caught``
proves that comparison can fail.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.vllm.engine import Served, counter, serve
from tests.vllm.model import WINDOW, prompts

PROMPTS = prompts(2, 200, seed=1)  # 6 full blocks of 32 each: a 192-token prefix hit
SHORT = 8
LONG_PROMPTS = prompts(2, 300, seed=2)  # longer than the window
LONG = 80  # generated past the window: sliding blocks scroll out before the request finishes
ROOT = Path(__file__).resolve().parents[2]


def host(name: str, stack: Mapping[str, Any]) -> dict[str, Any]:
    """vLLM's ``kv_transfer_config`` for a capkv host over ``stack`` — what docs/vllm.md shows."""
    return {
        "kv_connector": name,
        "kv_connector_module_path": "capkv.vllm",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"stack": dict(stack)},
    }


def multi(*children: Mapping[str, Any]) -> dict[str, Any]:
    return {"kv_connector": "MultiConnector", "kv_connector_extra_config": {"connectors": [dict(c) for c in children]}}


def cpu(blocks: int = 256) -> dict[str, Any]:
    return {"kv_connector": "CPUOffloadConnector", "kv_connector_extra_config": {"capacity_blocks": blocks}}


def files(root: Path) -> dict[str, Any]:
    return {"kv_connector": "FileStoreConnector", "kv_connector_extra_config": {"root": str(root), "namespace": "tiny"}}


_REFERENCES: dict[tuple[Any, ...], Served] = {}


@pytest.fixture(scope="module")
def reference(model_dir: Path) -> Callable[..., Served]:
    """A no-connector engine serving the prompts twice (cold, then from its local prefix cache), cached by setting."""

    def get(prompt_set: list[list[int]], max_tokens: int, *, hma: bool) -> Served:
        key = (id(prompt_set), max_tokens, hma)
        if key not in _REFERENCES:
            _REFERENCES[key] = serve(
                model_dir, prompt_set, max_tokens=max_tokens, runs=2, disable_hybrid_kv_cache_manager=not hma
            )
            ref = _REFERENCES[key]
            assert ref.groups == (2 if hma else 1)
            assert all(c > 0 for c in ref.runs[1].cached), "the reference's second run must hit its prefix cache"
        return _REFERENCES[key]

    return get


def assert_same(got: Served, want: Served, *, run: int, label: str) -> None:
    """Tokens and logprobs bit-equal to the reference's ``run`` (0: cold, 1: local prefix hit)."""
    expected = want.runs[run]
    actual = got.runs[0]
    assert actual.tokens == expected.tokens, f"{label}: tokens differ from the reference run {run + 1}"
    assert actual.logprobs == expected.logprobs, f"{label}: logprobs differ from the reference run {run + 1}"


def test_hma_host_over_cpu_and_file_stores(model_dir: Path, tmp_path: Path, reference: Callable[..., Served]) -> None:
    """(a) CapkvHMAConnector over MultiConnector(CPUOffloadConnector, FileStoreConnector), HMA on."""
    ref = reference(PROMPTS, SHORT, hma=True)
    config = host("CapkvHMAConnector", multi(cpu(), files(tmp_path / "store")))
    first = serve(model_dir, PROMPTS, max_tokens=SHORT, kv_transfer_config=config)
    assert first.groups == 2
    assert_same(first, ref, run=0, label="run 1")
    assert counter(first.stats, "saved_blocks") > 0
    second = serve(model_dir, PROMPTS, max_tokens=SHORT, kv_transfer_config=config)
    assert second.groups == 2
    assert counter(second.stats, "hit_tokens") > 0, f"run 2 loaded nothing: {second.stats}"
    assert second.stats["FileStoreConnector"]["loaded_blocks"] > 0  # the file store (the host pool is empty in a new engine)
    assert second.runs[0].cached == ref.runs[1].cached
    assert_same(second, ref, run=1, label="run 2")


def test_mixed_stack_under_the_plain_host(model_dir: Path, tmp_path: Path, reference: Callable[..., Served]) -> None:
    """(b) vLLM's ExampleConnector next to capkv's FileStoreConnector: served by CapkvConnector (HMA off)."""
    ref = reference(PROMPTS, SHORT, hma=False)
    example = {"kv_connector": "ExampleConnector", "kv_connector_extra_config": {"shared_storage_path": str(tmp_path / "example")}}
    config = host("CapkvConnector", multi(example, files(tmp_path / "store")))
    first = serve(model_dir, PROMPTS, max_tokens=SHORT, kv_transfer_config=config)
    assert first.groups == 1
    assert_same(first, ref, run=0, label="run 1")
    assert counter(first.stats, "saved_blocks") > 0  # the file store saved too
    second = serve(model_dir, PROMPTS, max_tokens=SHORT, kv_transfer_config=config)
    # ExampleConnector (#1) has the hit and loads: a new engine's local cache is empty, so
    # every cached token came through the stack
    assert second.runs[0].cached == ref.runs[1].cached
    assert all(c > 0 for c in second.runs[0].cached)
    assert counter(second.stats, "hit_tokens") == 0  # ... and not from the file store
    assert_same(second, ref, run=1, label="run 2")


def test_mixed_stack_refused_by_the_hma_host(model_dir: Path, tmp_path: Path) -> None:
    """(b) The same mixed stack under CapkvHMAConnector: refused at start, naming ExampleConnector."""
    from capkv import CapabilityError

    example = {"kv_connector": "ExampleConnector", "kv_connector_extra_config": {"shared_storage_path": str(tmp_path)}}
    config = host("CapkvHMAConnector", multi(example, files(tmp_path / "store")))
    with pytest.raises(CapabilityError, match=r'sub-connector #1 "ExampleConnector" does not implement SupportsHMA') as caught:
        serve(model_dir, PROMPTS, max_tokens=SHORT, kv_transfer_config=config)
    assert caught.value.connector == "#1 ExampleConnector"


def test_sliding_blocks_scroll_out(model_dir: Path, tmp_path: Path, reference: Callable[..., Served]) -> None:
    """(c) Prompts longer than the window, 80 tokens generated: run 2 still loads, and still equals."""
    assert len(LONG_PROMPTS[0]) > WINDOW and LONG >= 64
    ref = reference(LONG_PROMPTS, LONG, hma=True)
    config = host("CapkvHMAConnector", multi(cpu(), files(tmp_path / "store")))
    first = serve(model_dir, LONG_PROMPTS, max_tokens=LONG, kv_transfer_config=config)
    assert_same(first, ref, run=0, label="run 1")
    second = serve(model_dir, LONG_PROMPTS, max_tokens=LONG, kv_transfer_config=config)
    assert counter(second.stats, "hit_tokens") > 0, f"run 2 loaded nothing: {second.stats}"
    assert second.runs[0].cached == ref.runs[1].cached
    assert_same(second, ref, run=1, label="run 2")


SINGLE_GROUP_CHILD = r'sub-connector #2 "SingleGroupOffloadConnector" does not implement SupportsHMA'


def test_hma_host_refuses_a_single_group_child(model_dir: Path) -> None:
    """(d) CapkvHMAConnector over a stack with a single-group child: CapabilityError at engine start."""
    from capkv import CapabilityError

    single = {"kv_connector": "SingleGroupOffloadConnector", "kv_connector_extra_config": {"capacity_blocks": 64}}
    config = host("CapkvHMAConnector", multi(cpu(), single))
    with pytest.raises(CapabilityError, match=SINGLE_GROUP_CHILD) as caught:
        serve(model_dir, PROMPTS, max_tokens=SHORT, kv_transfer_config=config)
    assert caught.value.connector == "#2 SingleGroupOffloadConnector"


def test_hma_host_refuses_a_single_group_child_under_python_O(tmp_path: Path) -> None:
    """(d) The same refusal with ``python -O``: capkv's check is no ``assert``.

    vLLM 0.32 itself cannot start a hybrid model under ``-O`` (it tells KV-cache
    specs apart by catching ``AssertionError``), so this engine's model is all
    full attention. The refusal does not depend on the group count: the HMA host
    promises vLLM every group, whatever the model.
    """
    single = {"kv_connector": "SingleGroupOffloadConnector", "kv_connector_extra_config": {"capacity_blocks": 64}}
    config = host("CapkvHMAConnector", multi(cpu(), single))
    script = textwrap.dedent(f"""
        import json, sys
        from pathlib import Path
        from capkv import CapabilityError
        from tests.vllm.engine import serve
        from tests.vllm.model import write_model
        if __debug__:
            sys.exit("not under python -O")
        model = write_model(Path({str(tmp_path / "full")!r}), hybrid=False)
        try:
            serve(model, [[5] * 40], max_tokens=2, kv_transfer_config=json.loads({json.dumps(config)!r}))
        except CapabilityError as exc:
            print("REFUSED:", exc.connector, "|", exc)
            sys.exit(3)
        print("SERVED")
    """)
    proc = subprocess.run(
        [sys.executable, "-O", "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 3, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert "REFUSED: #2 SingleGroupOffloadConnector |" in proc.stdout
    assert "SERVED" not in proc.stdout


def test_plain_host_lets_vllm_turn_hma_off(model_dir: Path, tmp_path: Path, reference: Callable[..., Served]) -> None:
    """(e) CapkvConnector with HMA left to vLLM: one group; a single-group child serves; run 2 loads, bit-equal."""
    ref = reference(PROMPTS, SHORT, hma=False)
    single = {"kv_connector": "SingleGroupOffloadConnector", "kv_connector_extra_config": {"capacity_blocks": 64}}
    config = host("CapkvConnector", multi(single, files(tmp_path / "store")))
    first = serve(model_dir, PROMPTS, max_tokens=SHORT, kv_transfer_config=config, disable_hybrid_kv_cache_manager=None)
    assert first.groups == 1
    assert_same(first, ref, run=0, label="run 1")
    second = serve(model_dir, PROMPTS, max_tokens=SHORT, kv_transfer_config=config, disable_hybrid_kv_cache_manager=None)
    assert second.groups == 1
    assert second.stats["FileStoreConnector"]["hit_tokens"] > 0, f"run 2 loaded nothing from the file store: {second.stats}"
    assert second.runs[0].cached == ref.runs[1].cached
    assert_same(second, ref, run=1, label="run 2")


def test_wrong_kv_is_caught(model_dir: Path, reference: Callable[..., Served]) -> None:
    """The comparison can fail: a connector that claims the prefix and loads nothing changes the output."""
    ref = reference(PROMPTS, SHORT, hma=True)
    config = host("CapkvHMAConnector", {"kv_connector": "tests.vllm.liar:ClaimsPrefixLoadsNothing"})
    liar = serve(model_dir, PROMPTS, max_tokens=SHORT, kv_transfer_config=config)
    assert liar.runs[0].cached == ref.runs[1].cached  # the same compute shape as the reference's run 2 ...
    assert liar.runs[0].logprobs != ref.runs[1].logprobs  # ... and different bytes: the test sees them


def test_the_drop_in_serves_vllms_configuration_shape(
    model_dir: Path, tmp_path: Path, reference: Callable[..., Served]
) -> None:
    """capkv.vllm.MultiConnector with vLLM's ``connectors`` list (capkv's stores through a nested host):
    vLLM keeps HMA on (every child supports it), and run 2 loads, bit-equal to a local prefix hit."""
    ref = reference(PROMPTS, SHORT, hma=True)
    nested = host("CapkvHMAConnector", multi(cpu(), files(tmp_path / "store")))
    config = {"kv_connector": "MultiConnector", "kv_connector_module_path": "capkv.vllm", "kv_role": "kv_both",
              "kv_connector_extra_config": {"connectors": [nested]}}
    first = serve(model_dir, PROMPTS, max_tokens=SHORT, kv_transfer_config=config)
    assert first.groups == 2
    assert_same(first, ref, run=0, label="run 1")
    second = serve(model_dir, PROMPTS, max_tokens=SHORT, kv_transfer_config=config)
    assert counter(second.stats, "hit_tokens") > 0, f"run 2 loaded nothing: {second.stats}"
    assert second.runs[0].cached == ref.runs[1].cached
    assert_same(second, ref, run=1, label="run 2")
