"""``capkv check`` with sleep mode mirrors vLLM 0.33: a configuration with a leaf that cannot sleep is
refused (exit 2) naming the child and the leaf; on a vLLM without ``supports_sleep_mode`` (0.32) it says
sleep mode is not judged, and the HMA verdict stands.

On 0.32, 0.33's member is patched onto vLLM's base (its default: yes) to judge as 0.33 would; the capkv
hosts' own ``supports_sleep_mode`` must give the same answer as the judge.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vllm is not installed (the `vllm` tox environment runs this)")

from vllm.config import KVTransferConfig  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import ExampleConnector  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import OffloadingConnector  # noqa: E402

from capkv.connectors import FileStoreConnector  # noqa: E402
from tests.config.cli_check import check  # noqa: E402
from capkv.vllm import CapkvConnector, CapkvHMAConnector, MultiConnector  # noqa: E402

MODULE = "tests.vllm.test_check_sleep"
HAS_MEMBER = hasattr(KVConnectorBase_V1, "supports_sleep_mode")


class Sleepless(FileStoreConnector):
    """A capkv store whose class-level fact says the engine may not sleep with it."""

    @classmethod
    def supports_sleep_mode(cls) -> bool:
        return False


class AsksInstance(FileStoreConnector):
    """A capkv store that answers sleep mode per instance: the host cannot say from the class (no)."""

    def supports_sleep_mode(self) -> bool:
        return True


class Sleeper(OffloadingConnector):
    """A vLLM connector that keeps HMA on and can sleep, whatever the installed release says of its base."""

    @classmethod
    def supports_sleep_mode(cls, kv_transfer_config: KVTransferConfig) -> bool:
        return True


class Insomniac(ExampleConnector):
    """A vLLM connector that cannot sleep."""

    @classmethod
    def supports_sleep_mode(cls, kv_transfer_config: KVTransferConfig) -> bool:
        return False


FILES = {"kv_connector": "FileStoreConnector", "kv_connector_extra_config": {"root": "/var/cache/capkv"}}
CPU = {"kv_connector": "CPUOffloadConnector", "kv_connector_extra_config": {"capacity_blocks": 64}}
SLEEPLESS = {"kv_connector": f"{MODULE}:Sleepless", "kv_connector_extra_config": {"root": "/var/cache/capkv"}}
ASKS = {"kv_connector": f"{MODULE}:AsksInstance", "kv_connector_extra_config": {"root": "/var/cache/capkv"}}
OFFLOAD = {"kv_connector": "Sleeper", "kv_connector_module_path": MODULE, "kv_role": "kv_both"}
INSOMNIAC = {"kv_connector": "Insomniac", "kv_connector_module_path": MODULE, "kv_role": "kv_both"}


def multi(*children: dict[str, Any], **top: Any) -> dict[str, Any]:
    return {"kv_connector": "MultiConnector", "kv_connector_extra_config": {"connectors": list(children)}, **top}


def hosted(host: str, stack: dict[str, Any]) -> dict[str, Any]:
    return {"kv_connector": host, "kv_connector_module_path": "capkv.vllm", "kv_role": "kv_both",
            "kv_connector_extra_config": {"stack": stack}}


@pytest.fixture
def vllm_033_member(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """0.33's ``supports_sleep_mode`` on vLLM's base, as 0.33 defines it (yes) where it is missing."""
    if not HAS_MEMBER:
        def supports_sleep_mode(cls: type[Any], kv_transfer_config: KVTransferConfig) -> bool:
            return True

        monkeypatch.setattr(KVConnectorBase_V1, "supports_sleep_mode", classmethod(supports_sleep_mode), raising=False)
    yield


REFUSED = [
    pytest.param(hosted("CapkvHMAConnector", multi(FILES, multi(CPU, SLEEPLESS))),
                 "CapkvHMAConnector", "#2 MultiConnector cannot sleep: its leaf #2.2 Sleepless", id="capkv class, nested"),
    pytest.param(hosted("CapkvConnector", multi(SLEEPLESS, FILES)), "CapkvConnector", "#1 Sleepless answers",
                 id="capkv class, first"),
    pytest.param(hosted("CapkvConnector", SLEEPLESS), "CapkvConnector", "Sleepless answers", id="capkv class alone"),
    pytest.param(hosted("CapkvHMAConnector", multi(FILES, ASKS)), "CapkvHMAConnector",
                 "#2 AsksInstance cannot say from its class", id="capkv instance method"),
    pytest.param(hosted("CapkvConnector", multi(FILES, INSOMNIAC)), "CapkvConnector", "#2 Insomniac answers",
                 id="vLLM class in a hosted stack"),
    pytest.param(multi(OFFLOAD, INSOMNIAC, kv_role="kv_both"), "MultiConnector", "#2 Insomniac answers",
                 id="vLLM's composite"),
    pytest.param(multi(OFFLOAD, multi(OFFLOAD, INSOMNIAC, kv_role="kv_both"), kv_role="kv_both"), "MultiConnector",
                 "#2 MultiConnector cannot sleep: its leaf #2.2 Insomniac", id="vLLM's composite, nested"),
    pytest.param(multi(OFFLOAD, INSOMNIAC, kv_role="kv_both", kv_connector_module_path="capkv.vllm"), "MultiConnector",
                 "#2 Insomniac answers", id="the drop-in"),
    pytest.param(multi(OFFLOAD, hosted("CapkvConnector", multi(FILES, SLEEPLESS)), kv_role="kv_both"),
                 "MultiConnector", "#2 CapkvConnector cannot sleep: its leaf #2.2 Sleepless", id="a host in vLLM's composite"),
]


@pytest.mark.usefixtures("vllm_033_member")
@pytest.mark.parametrize(("config", "top", "names"), REFUSED)
def test_a_leaf_that_cannot_sleep_refuses_sleep_mode(
    config: dict[str, Any], top: str, names: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, _, err = check(tmp_path, config, "--enable-sleep-mode", capsys=capsys)
    assert status == 2, err
    assert f"with enable_sleep_mode, {top} answers supports_sleep_mode False" in err
    assert names in err
    assert len(err.strip().splitlines()) == 1, err
    plain, _, _ = check(tmp_path, config, capsys=capsys)
    assert plain in (0, 1)  # without sleep mode, vLLM runs it
    wrapped, _, err = check(tmp_path, {"kv_transfer_config": config, "enable_sleep_mode": True}, capsys=capsys)
    assert wrapped == 2 and names in err


@pytest.mark.usefixtures("vllm_033_member")
@pytest.mark.parametrize("host", [CapkvConnector, CapkvHMAConnector])
@pytest.mark.parametrize("stack", [multi(FILES, SLEEPLESS), multi(FILES, multi(CPU, FILES)), multi(INSOMNIAC, FILES),
                                   multi(ASKS), FILES])
def test_the_verdict_is_the_hosts_own_answer(
    host: type[Any], stack: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if host is CapkvHMAConnector and "Insomniac" in json.dumps(stack):
        pytest.skip("refused for HMA first: ExampleConnector is not HMA-capable")
    config = hosted(host.__name__, stack)
    sleeps = host.supports_sleep_mode(KVTransferConfig(**config))
    status, out, err = check(tmp_path, config, "--enable-sleep-mode", capsys=capsys)
    assert (status != 2) is sleeps, (out, err)
    assert ("vLLM may sleep with this configuration" in out) is sleeps


@pytest.mark.usefixtures("vllm_033_member")
def test_the_drop_in_and_vllms_composite_agree_when_every_child_sleeps(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for config in (multi(OFFLOAD, OFFLOAD, kv_role="kv_both"),
                   multi(OFFLOAD, OFFLOAD, kv_role="kv_both", kv_connector_module_path="capkv.vllm")):
        status, out, err = check(tmp_path, config, "--enable-sleep-mode", capsys=capsys)
        assert status == 0, err
        assert "vLLM may sleep with this configuration" in out and out.rstrip().endswith("HMA) on")
    assert MultiConnector.supports_sleep_mode(KVTransferConfig(**multi(OFFLOAD, INSOMNIAC, kv_role="kv_both"))) is False


def test_a_capkv_stack_file_says_sleep_mode_is_not_judged(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = check(tmp_path, multi(FILES, SLEEPLESS), "--enable-sleep-mode", capsys=capsys)
    assert status == 0, err
    assert "sleep mode is not judged: only on a configuration vLLM reads as its own" in out


@pytest.mark.skipif(HAS_MEMBER, reason="the installed vLLM asks connectors about sleep mode")
@pytest.mark.parametrize("config", [hosted("CapkvHMAConnector", multi(FILES, SLEEPLESS)),
                                    multi(OFFLOAD, INSOMNIAC, kv_role="kv_both")])
def test_without_the_member_sleep_mode_is_not_judged(
    config: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import vllm

    status, out, err = check(tmp_path, config, "--enable-sleep-mode", capsys=capsys)
    plain, plain_out, _ = check(tmp_path, config, capsys=capsys)
    assert status == plain != 2, err
    said = [line for line in out.splitlines() if "sleep" in line]
    assert said == [
        f"sleep mode is not judged: the installed vLLM ({vllm.__version__}) has no supports_sleep_mode for connectors "
        "(vLLM 0.33 added it), so it does not ask this configuration whether the engine may sleep"
    ]
    assert out.splitlines()[-1] == plain_out.splitlines()[-1]  # the HMA verdict stands
