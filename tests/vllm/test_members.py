"""vLLM's connector members: capkv knows each of the installed release's, and a member it does not know
never breaks import (a documented default rule and one warning naming it).

Run against every supported release (the ``vllm`` tox environment: 0.32; ``vllm33``: 0.33). On 0.32,
0.33's three sleep-mode members are patched onto the base to show the hosts answer them as 0.33 does.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vllm is not installed (the `vllm` tox environment runs this)")

from vllm.config import KVTransferConfig  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1  # noqa: E402

from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import ExampleConnector  # noqa: E402

from capkv.adapters.vllm import _members  # noqa: E402
from capkv.vllm import CapkvConnector, CapkvHMAConnector, MultiConnector  # noqa: E402

MODULE = "tests.vllm.test_members"


def test_capkv_knows_every_member_of_the_installed_release() -> None:
    unknown = _members.unknown_members()
    assert unknown == [], f"vLLM's connector base has members capkv does not know yet: {', '.join(unknown)}"


@pytest.mark.parametrize("cls", [MultiConnector, CapkvConnector, CapkvHMAConnector])
def test_every_known_member_of_the_installed_base_is_defined_by_the_class(cls: type[Any]) -> None:
    left_to_base = [
        name for name in dir(KVConnectorBase_V1)
        if not name.startswith("_") and name not in _members.BASE_OWNED
        and next(owner for owner in cls.__mro__ if name in vars(owner)) is KVConnectorBase_V1
    ]
    assert left_to_base == []


@pytest.fixture
def fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_members, "_warned", set())


@pytest.mark.usefixtures("fresh_warnings")
def test_an_unknown_member_gets_the_default_rule_and_one_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def frobnicate(self: Any, value: int) -> str:
        return f"base {value}"

    def tally(cls: type[Any]) -> int:
        return 7

    monkeypatch.setattr(KVConnectorBase_V1, "frobnicate", frobnicate, raising=False)
    monkeypatch.setattr(KVConnectorBase_V1, "tally", classmethod(tally), raising=False)

    class Host(CapkvConnector):
        pass

    class Other(CapkvHMAConnector):
        pass

    with caplog.at_level(logging.WARNING, logger="capkv.vllm"):
        assert _members.complete(Host) == ("frobnicate", "tally")
        assert _members.complete(Other) == ("frobnicate", "tally")
    warnings = [r.getMessage() for r in caplog.records if "does not know" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "frobnicate" in warnings[0] and "tally" in warnings[0] and "docs/vllm.md" in warnings[0]
    assert _members.unknown_members() == ["frobnicate", "tally"]

    calls: list[tuple[str, int]] = []

    class Knows:
        def __init__(self, name: str) -> None:
            self.name = name

        def frobnicate(self, value: int) -> str:
            calls.append((self.name, value))
            return f"{self.name} {value}"

    class DoesNot:
        pass

    children = SimpleNamespace(_vllm_children=[DoesNot(), Knows("a"), Knows("b")])
    assert Host.frobnicate(children, 3) == "a 3"  # every vLLM child that has it, in order; the first answers
    assert calls == [("a", 3), ("b", 3)]
    assert Host.frobnicate(SimpleNamespace(_vllm_children=[]), 4) == "base 4"  # no vLLM child: the base's
    assert Host.tally() == 7  # a classmethod: the base default
    assert Host.frobnicate.__qualname__.endswith("Host.frobnicate")


def _sleepy_transfer(host: str, *leaves: dict[str, Any]) -> KVTransferConfig:
    stack: dict[str, Any] = {"kv_connector": "MultiConnector", "kv_connector_extra_config": {"connectors": list(leaves)}}
    return KVTransferConfig(kv_connector=host, kv_connector_module_path="capkv.vllm", kv_role="kv_both",
                            kv_connector_extra_config={"stack": stack})


class Insomniac(ExampleConnector):
    """A vLLM connector that cannot sleep (as 0.33's MooncakeStoreConnector answers)."""

    @classmethod
    def supports_sleep_mode(cls, kv_transfer_config: KVTransferConfig) -> bool:
        return False


class Sleeper(ExampleConnector):
    @classmethod
    def supports_sleep_mode(cls, kv_transfer_config: KVTransferConfig) -> bool:
        return True


def _vllm_leaf(name: str) -> dict[str, Any]:
    return {"kv_connector": name, "kv_connector_module_path": MODULE, "kv_role": "kv_both"}


@pytest.mark.parametrize("host", ["CapkvConnector", "CapkvHMAConnector"])
def test_sleep_mode_is_answered_from_every_leaf(host: str, tmp_path: Any) -> None:
    cls: type[Any] = {"CapkvConnector": CapkvConnector, "CapkvHMAConnector": CapkvHMAConnector}[host]
    store = {"kv_connector": "FileStoreConnector", "kv_connector_extra_config": {"root": str(tmp_path)}}
    assert cls.supports_sleep_mode(_sleepy_transfer(host, store, _vllm_leaf("Sleeper"))) is True
    assert cls.supports_sleep_mode(_sleepy_transfer(host, store, _vllm_leaf("Insomniac"))) is False
    assert cls.supports_sleep_mode(_sleepy_transfer(host, _vllm_leaf("Insomniac"), store)) is False
