"""vLLM's connector members: capkv knows each of the installed release's, and a member it does not know
never breaks import (a documented default rule and one warning naming it).

Run against every supported release (the ``vllm`` tox environment: 0.32; ``vllm33``: 0.33; ``vllm34``: 0.34).
Two future members, patched onto vLLM's base with their rules on vLLM's MultiConnector, are answered by
those rules.
"""

from __future__ import annotations

import enum
import logging
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vllm is not installed (the `vllm` tox environment runs this)")

import torch  # noqa: E402
from vllm.config import KVTransferConfig, VllmConfig  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # noqa: E402
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    SupportsHMA,
)
from vllm.distributed.kv_transfer.kv_connector.v1.multi_connector import (  # noqa: E402
    MultiConnector as VllmMultiConnector,
)
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec  # noqa: E402

from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import ExampleConnector  # noqa: E402

from capkv.adapters.vllm import _members  # noqa: E402
from capkv.connectors import CPUOffloadConnector  # noqa: E402
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


class Flags(enum.IntFlag):
    NONE = 0
    PIN = 1
    SHARE = 2


def _base_flags(cls: type[Any], kv_transfer_config: KVTransferConfig) -> Flags:
    return Flags.NONE


def _composite_flags(cls: type[Any], kv_transfer_config: KVTransferConfig) -> Flags:
    """A future vLLM composite rule: the children's flags together, each child asked by its own config."""
    flags = Flags.NONE
    for entry in kv_transfer_config.kv_connector_extra_config.get("connectors", []):
        config = KVTransferConfig(**{"engine_id": kv_transfer_config.engine_id, **entry})
        flags |= KVConnectorFactory.get_connector_class(config).frob_flags(config)  # type: ignore[attr-defined]
    return flags


def _base_prefetch(self: Any, request: Any) -> bool:
    return False


def _composite_prefetch(self: Any, request: Any) -> bool:
    """A future vLLM composite rule: any child."""
    return any(child.may_prefetch(request) for child in self._connectors)


class Pinner(KVConnectorBase_V1, SupportsHMA):
    """A vLLM connector with the future members: flags by its own config, prefetch for requests ``v...``."""

    @classmethod
    def frob_flags(cls, kv_transfer_config: KVTransferConfig) -> Flags:
        return Flags.PIN if kv_transfer_config.kv_connector_extra_config.get("pin") else Flags.NONE

    def may_prefetch(self, request: Any) -> bool:
        return str(request.request_id).startswith("v")

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int | None, bool]:
        return 0, False

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        return None

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        return KVConnectorMetadata()

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        return None

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any) -> None:
        return None

    def wait_for_save(self) -> None:
        return None

    def request_finished_all_groups(self, request: Any, block_ids: Any) -> tuple[bool, dict[str, Any] | None]:
        return False, None


class Sharer(CPUOffloadConnector):
    """A capkv connector with the future members as its own (a class-level fact, an instance answer)."""

    @classmethod
    def frob_flags(cls) -> Flags:
        return Flags.SHARE

    def may_prefetch(self, request: Any) -> bool:
        return str(request.request_id).startswith("c")


def _future_entries(pin: bool, share: bool) -> list[dict[str, Any]]:
    pinner = {"kv_connector": "Pinner", "kv_connector_module_path": MODULE, "kv_role": "kv_both",
              "kv_connector_extra_config": {"pin": pin}}
    store = {"kv_connector": "Sharer" if share else "CPUOffloadConnector", "kv_role": "kv_both",
             "kv_connector_extra_config": {"capacity_blocks": 8}}
    if share:
        store["kv_connector_module_path"] = MODULE
    plain = {"kv_connector": "CPUOffloadConnector", "kv_role": "kv_both", "kv_connector_extra_config": {"capacity_blocks": 8}}
    return [pinner, store, plain]


def _future_transfer(host: str, entries: list[dict[str, Any]]) -> KVTransferConfig:
    """The stack in capkv's shape (the drop-in reads it too: vLLM's own check of a ``connectors`` list
    would refuse capkv's classes)."""
    extra = {"stack": {"kv_connector": "MultiConnector", "kv_connector_extra_config": {"connectors": entries}}}
    return KVTransferConfig(kv_connector=host, kv_connector_module_path="capkv.vllm", kv_role="kv_both",
                            kv_connector_extra_config=extra)


def _kv_cache_config() -> KVCacheConfig:
    full = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=8, dtype=torch.bfloat16)
    return KVCacheConfig(num_blocks=64, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["layer.0"], full)])


@pytest.mark.usefixtures("fresh_warnings")
def test_unknown_members_are_answered_by_vllms_own_composite_rule_over_the_leaves(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Two future members patched onto vLLM's base, with their rules onto vLLM's MultiConnector (a class-level
    flag union, an instance-level "any"): the drop-in and both hosts answer by those rules, and no capkv code
    names either member."""
    monkeypatch.setattr(KVConnectorBase_V1, "frob_flags", classmethod(_base_flags), raising=False)
    monkeypatch.setattr(VllmMultiConnector, "frob_flags", classmethod(_composite_flags), raising=False)
    monkeypatch.setattr(KVConnectorBase_V1, "may_prefetch", _base_prefetch, raising=False)
    monkeypatch.setattr(VllmMultiConnector, "may_prefetch", _composite_prefetch, raising=False)

    class DropIn(MultiConnector):
        pass

    class Host(CapkvConnector):
        pass

    class HMAHost(CapkvHMAConnector):
        pass

    with caplog.at_level(logging.WARNING, logger="capkv.vllm"):
        assert _members.complete(DropIn, own=True) == ("frob_flags", "may_prefetch")
        assert _members.complete(Host) == ("frob_flags", "may_prefetch")
        assert _members.complete(HMAHost) == ("frob_flags", "may_prefetch")
    warnings = [r.getMessage() for r in caplog.records if "does not know" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "frob_flags" in warnings[0] and "may_prefetch" in warnings[0] and "docs/vllm.md" in warnings[0]
    assert _members.unknown_members() == ["frob_flags", "may_prefetch"]

    for cls, name in ((DropIn, "MultiConnector"), (Host, "CapkvConnector"), (HMAHost, "CapkvHMAConnector")):
        answer = cls.frob_flags(_future_transfer(name, _future_entries(pin=True, share=True)))
        assert answer == Flags.PIN | Flags.SHARE, cls  # the vLLM child's by its own config, the capkv leaf's own
        assert cls.frob_flags(_future_transfer(name, _future_entries(pin=False, share=False))) == Flags.NONE
        assert cls.frob_flags(_future_transfer(name, _future_entries(pin=False, share=True))) == Flags.SHARE

        transfer = _future_transfer(name, _future_entries(pin=False, share=True))
        host = cls(VllmConfig(kv_transfer_config=transfer), KVConnectorRole.SCHEDULER, _kv_cache_config())
        assert host.may_prefetch(SimpleNamespace(request_id="v-1")) is True  # the vLLM child's own answer
        assert host.may_prefetch(SimpleNamespace(request_id="c-1")) is True  # the capkv leaf's own answer
        assert host.may_prefetch(SimpleNamespace(request_id="x-1")) is False  # and the base's for the plain store
        assert cls.may_prefetch.__qualname__.endswith(f"{cls.__qualname__}.may_prefetch")
        host.shutdown()


def test_a_member_vllms_composite_leaves_to_the_base_keeps_the_base_default(monkeypatch: pytest.MonkeyPatch) -> None:
    def tally(cls: type[Any]) -> int:
        return 7

    monkeypatch.setattr(_members, "_warned", {"tally"})
    monkeypatch.setattr(KVConnectorBase_V1, "tally", classmethod(tally), raising=False)

    class Host(CapkvConnector):
        pass

    assert _members.complete(Host) == ("tally",)
    assert Host.tally() == 7


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
