"""vLLM 0.34's three members on the drop-in and both hosts: answered per leaf, by the table's rows, as vLLM's own
MultiConnector answers them over the same children (NIXL's push mode included).

The rows apply on every release (a vLLM class here declares the members itself); the side-by-side comparisons
with vLLM's MultiConnector need vLLM 0.34 (the ``vllm34`` tox environment).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vllm is not installed (the `vllm` tox environment runs this)")

import torch  # noqa: E402
from vllm.config import KVTransferConfig, VllmConfig  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorRole  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import ExampleConnector  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.multi_connector import (  # noqa: E402
    MultiConnector as VllmMultiConnector,
)
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec  # noqa: E402

import capkv  # noqa: E402
from capkv.connectors import CPUOffloadConnector  # noqa: E402
from capkv.errors import ConfigError, ConflictError  # noqa: E402
from capkv.vllm import CapkvConnector, CapkvHMAConnector, MultiConnector  # noqa: E402

MODULE = "tests.vllm.test_access_members"
HAS_034 = hasattr(KVConnectorBase_V1, "kv_cache_access")
needs_034 = pytest.mark.skipif(not HAS_034, reason="vLLM's own MultiConnector answers these from vLLM 0.34 on")
A = capkv.KVCacheAccess


class Registering(ExampleConnector):
    """A vLLM connector that registers the KV cache, takes lookahead hashes, and loads "remote-..." asynchronously."""

    @classmethod
    def kv_cache_access(cls, kv_transfer_config: KVTransferConfig) -> Any:
        return A.REGISTERS | (A.EXPORTS_FABRIC if kv_transfer_config.kv_connector_extra_config.get("fabric") else 0)

    @classmethod
    def supports_lookahead_block_hashes(cls, kv_transfer_config: KVTransferConfig) -> bool:
        return True

    def may_load_async(self, request: Any) -> bool:
        return str(request.request_id).startswith("remote")


class Exporting(CPUOffloadConnector):
    """A capkv connector that says, class-level, that another process imports the KV cache."""

    @capkv.class_level
    def kv_cache_access(cls) -> capkv.KVCacheAccess:
        return A.EXPORTS_FD

    @capkv.class_level
    def supports_lookahead_block_hashes(cls) -> bool:
        return True


class Unsure(CPUOffloadConnector):
    """A capkv connector that knows its KV-cache access only once built (from its extra config)."""

    def __init__(self, spec: capkv.KVSpec, *, capacity_blocks: int, exports: bool = False) -> None:
        super().__init__(spec, capacity_blocks=capacity_blocks)
        self.exports = exports

    def kv_cache_access(self) -> capkv.KVCacheAccess:
        return A.EXPORTS_FD if self.exports else A.REGISTERS


def _vllm(name: str, **extra: Any) -> dict[str, Any]:
    return {"kv_connector": name, "kv_connector_module_path": MODULE, "kv_role": "kv_both",
            "kv_connector_extra_config": {"shared_storage_path": "/nonexistent", **extra}}


def _capkv(name: str, **extra: Any) -> dict[str, Any]:
    entry = {"kv_connector": name, "kv_role": "kv_both", "kv_connector_extra_config": {"capacity_blocks": 8, **extra}}
    if name != "CPUOffloadConnector":
        entry["kv_connector_module_path"] = MODULE
    return entry


def _hosted(host: str, entries: list[dict[str, Any]]) -> KVTransferConfig:
    stack = {"kv_connector": "MultiConnector", "kv_connector_extra_config": {"connectors": entries}}
    return KVTransferConfig(kv_connector=host, kv_connector_module_path="capkv.vllm", kv_role="kv_both",
                            kv_connector_extra_config={"stack": stack})


HOSTS = {"MultiConnector": MultiConnector, "CapkvConnector": CapkvConnector, "CapkvHMAConnector": CapkvHMAConnector}


@pytest.mark.parametrize("host", sorted(HOSTS))
def test_the_rows_combine_every_leaf(host: str) -> None:
    cls = HOSTS[host]
    mixed = [_vllm("Registering", fabric=True), _capkv("Exporting"), _capkv("CPUOffloadConnector")]
    assert int(cls.kv_cache_access(_hosted(host, mixed))) == A.REGISTERS | A.EXPORTS_FABRIC | A.EXPORTS_FD
    assert int(cls.kv_cache_access(_hosted(host, [_capkv("CPUOffloadConnector")]))) == A.IN_PROCESS
    assert int(cls.kv_cache_access(_hosted(host, [_capkv("Unsure")]))) == A.REGISTERS  # told before building
    assert cls.supports_lookahead_block_hashes(_hosted(host, mixed)) is False  # CPUOffloadConnector: no
    assert cls.supports_lookahead_block_hashes(_hosted(host, mixed[:2])) is True


def _kv_cache_config() -> KVCacheConfig:
    full = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=8, dtype=torch.bfloat16)
    return KVCacheConfig(num_blocks=64, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["layer.0"], full)])


def _built(host: str, entries: list[dict[str, Any]]) -> Any:
    transfer = _hosted(host, entries)
    return HOSTS[host](VllmConfig(kv_transfer_config=transfer), KVConnectorRole.SCHEDULER, _kv_cache_config())


@pytest.mark.parametrize("host", ["CapkvConnector", "MultiConnector"])  # Registering is not HMA-capable
def test_may_load_async_is_any_leafs_own_answer(host: str, tmp_path: Path) -> None:
    store = {"kv_connector": "FileStoreConnector", "kv_role": "kv_both", "kv_connector_extra_config": {"root": str(tmp_path)}}
    built = _built(host, [_vllm("Registering"), store, _capkv("CPUOffloadConnector")])
    assert built.may_load_async(_request("remote-1")) is True
    assert built.may_load_async(_request("local-1")) is False  # the file store holds nothing yet; CPU offload loads synchronously
    built.shutdown()


def _request(request_id: str) -> Any:
    tokens = list(range(40))
    return SimpleNamespace(request_id=request_id, kv_transfer_params=None, all_token_ids=tokens,
                           prompt_token_ids=tokens, num_computed_tokens=0, block_hashes=[])


def test_a_built_leaf_needing_more_than_its_class_told_is_refused_naming_it() -> None:
    assert _built("CapkvConnector", [_capkv("Unsure"), _capkv("CPUOffloadConnector")]) is not None
    with pytest.raises(ConflictError, match=r"Unsure\.kv_cache_access\(\) answers .*EXPORTS_FD"):
        _built("CapkvConnector", [_capkv("Unsure", exports=True), _capkv("CPUOffloadConnector")])


NIXL = [
    {"kv_connector": "NixlConnector", "kv_role": "kv_both", "kv_buffer_device": device,
     "kv_connector_extra_config": {"transfer_mode": mode}}
    for device in ("cuda", "cpu") for mode in ("push", "pull")
]
EXAMPLE = {"kv_connector": "ExampleConnector", "kv_role": "kv_both", "kv_connector_extra_config": {"shared_storage_path": "/x"}}


@needs_034
@pytest.mark.parametrize("children", [[], [EXAMPLE], *([nixl] for nixl in NIXL), *([nixl, EXAMPLE] for nixl in NIXL)])
def test_the_drop_in_and_the_hosts_answer_as_vllms_multiconnector_over_the_same_children(
    children: list[dict[str, Any]],
) -> None:
    vllm_shape = KVTransferConfig(kv_connector="MultiConnector", kv_role="kv_both",
                                  kv_connector_extra_config={"connectors": children})
    drop_in = KVTransferConfig(kv_connector="MultiConnector", kv_connector_module_path="capkv.vllm", kv_role="kv_both",
                               kv_connector_extra_config={"connectors": children})
    access = VllmMultiConnector.kv_cache_access(vllm_shape)
    lookahead = VllmMultiConnector.supports_lookahead_block_hashes(vllm_shape)
    assert MultiConnector.kv_cache_access(drop_in) == access
    assert MultiConnector.supports_lookahead_block_hashes(drop_in) is lookahead
    if children:
        for host in ("CapkvConnector", "CapkvHMAConnector"):
            assert HOSTS[host].kv_cache_access(_hosted(host, children)) == access
            assert HOSTS[host].supports_lookahead_block_hashes(_hosted(host, children)) is lookahead


@needs_034
def test_nixl_push_is_the_class_vllms_factory_builds() -> None:
    from capkv.config._loader import load_stack

    stack = load_stack({"kv_connector": "MultiConnector", "kv_connector_extra_config": {"connectors": NIXL[:2]}})
    assert [type(entry).__name__ for entry in stack.entries] == ["ConfiguredConnector"] * 2
    assert [entry.cls.__name__ for entry in stack.entries] == ["NixlPushConnector", "NixlPullConnector"]
    cuda_push = KVTransferConfig(kv_connector="MultiConnector", kv_connector_module_path="capkv.vllm",
                                 kv_role="kv_both", kv_connector_extra_config={"connectors": NIXL[:1]})
    assert MultiConnector.kv_cache_access(cuda_push) == A.REGISTERS | A.EXPORTS_FABRIC
    sideways = {"kv_connector": "NixlConnector", "kv_role": "kv_both", "kv_connector_extra_config": {"transfer_mode": "sideways"}}
    with pytest.raises(ConfigError, match=r'#1: "NixlConnector": vLLM refuses its kv_connector_extra_config: .*sideways'):
        load_stack({"kv_connector": "MultiConnector", "kv_connector_extra_config": {"connectors": [sideways]}})


@needs_034
def test_capkv_check_prints_what_vllm_is_told(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from capkv.cli import main

    config = tmp_path / "stack.json"
    config.write_text(json.dumps({"kv_connector": "MultiConnector", "kv_connector_module_path": "capkv.vllm",
                                  "kv_role": "kv_both", "kv_connector_extra_config": {"connectors": NIXL[:1]}}))
    main(["check", str(config)])
    assert "vLLM 0.34 is told: KV-cache access REGISTERS|EXPORTS_FABRIC; lookahead block hashes yes" in capsys.readouterr().out
