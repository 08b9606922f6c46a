"""vLLM's own connectors as capkv children: HMA-capable exactly when the vLLM class derives from vLLM's SupportsHMA.

Checked against stubs/vllm (no vLLM needed). A stack holding a wrapped ExampleConnector is not HMA-capable
in mypy and pyright, and the plugin names the wrapped connector, as capkv check and check_stack do.
vLLM's own MultiConnector derives from SupportsHMA whatever its children are: wrapped, it proves nothing.
"""

from __future__ import annotations

from typing_extensions import assert_type
from vllm.config import VllmConfig
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import ExampleConnector
from vllm.distributed.kv_transfer.kv_connector.v1.multi_connector import MultiConnector as VllmMultiConnector
from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import OffloadingConnector
from vllm.distributed.kv_transfer.kv_connector.v1.simple_cpu_offload_connector import SimpleCPUOffloadConnector
from vllm.v1.kv_cache_interface import KVCacheConfig

from capkv import HMAConnector, HMAMultiConnector, KVConnector, MultiConnector, SupportsHMA
from capkv.vllm import HMAVllmChild, VllmChild, wrap
from tests.typing_cases._connectors import Disk, Offload


def needs_hma(connector: SupportsHMA) -> None: ...
def needs_hma_connector(connector: HMAConnector) -> None: ...
def needs_connector(connector: KVConnector) -> None: ...


def cases(config: VllmConfig, kv: KVCacheConfig) -> None:
    role = KVConnectorRole.SCHEDULER
    example = wrap(ExampleConnector(config, role, kv))
    offload = wrap(OffloadingConnector(config, role, kv))
    simple = wrap(SimpleCPUOffloadConnector(config, role, kv), vllm_config=config)
    composite = wrap(VllmMultiConnector(config, role, kv))
    assert_type(example, VllmChild[ExampleConnector])
    assert_type(offload, HMAVllmChild[OffloadingConnector])
    assert_type(simple, HMAVllmChild[SimpleCPUOffloadConnector])
    assert_type(composite, VllmChild[VllmMultiConnector])
    assert_type(offload.wrapped, OffloadingConnector)

    # Wrapped HMA connectors, next to capkv's own: an HMA stack.
    good = MultiConnector(offload, simple, Offload())
    assert_type(good, HMAMultiConnector[HMAVllmChild[OffloadingConnector], HMAVllmChild[SimpleCPUOffloadConnector], Offload])
    needs_hma(good)
    needs_hma_connector(offload)
    good.request_finished_all_groups
    needs_connector(MultiConnector(offload, example))

    # A wrapped ExampleConnector: the stack is not HMA-capable, and the plugin names it.
    needs_hma(MultiConnector(offload, example))  # expect-error
    # ^ mypy+plugin: "MultiConnector" is not HMA-capable: sub-connector #2 "ExampleConnector" does not implement SupportsHMA (missing request_finished_all_groups); an HMA stack needs every child to  [capkv-hma]
    needs_hma_connector(MultiConnector(example, MultiConnector(offload, Disk())))  # expect-error
    # ^ mypy+plugin: "MultiConnector" is not HMA-capable: sub-connector #1 "ExampleConnector" does not implement SupportsHMA (missing request_finished_all_groups); sub-connector #2.2 "Disk" does not implement SupportsHMA (missing request_finished_all_groups); an HMA stack needs every child to  [capkv-hma]
    MultiConnector(offload, example).request_finished_all_groups  # expect-error
    # ^ mypy+plugin: "MultiConnector" has no request_finished_all_groups: sub-connector #2 "ExampleConnector" does not implement SupportsHMA (missing request_finished_all_groups); an HMA stack needs every child to  [capkv-hma]
    needs_hma(example)  # expect-error
    needs_hma(composite)  # expect-error

    # Unwrapped vLLM connectors are not capkv connectors; an HMA wrapper refuses a non-HMA class.
    needs_connector(ExampleConnector(config, role, kv))  # expect-error
    needs_connector(OffloadingConnector(config, role, kv))  # expect-error
    HMAVllmChild(ExampleConnector(config, role, kv))  # expect-error
