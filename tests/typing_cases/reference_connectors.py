"""capkv's reference connectors: the stores stack as HMA; the single-group one does not."""

from __future__ import annotations

from typing_extensions import assert_type

from capkv import ComputedTokenRequest, HMAConnector, HMAMultiConnector, KVSpec, MultiConnector, SupportsHMA
from capkv.connectors import CPUOffloadConnector, FileStoreConnector, SingleGroupOffloadConnector


def needs_hma(connector: SupportsHMA) -> None: ...
def needs_hma_connector(connector: HMAConnector[ComputedTokenRequest]) -> None: ...


def build(spec: KVSpec) -> None:
    cpu = CPUOffloadConnector(spec, capacity_blocks=1024)
    files = FileStoreConnector(spec, root="/tmp/kv")
    single = SingleGroupOffloadConnector(spec, capacity_blocks=1024)

    stack = MultiConnector(cpu, files)
    assert_type(stack, HMAMultiConnector[CPUOffloadConnector, FileStoreConnector])
    needs_hma(stack)
    needs_hma_connector(cpu)
    needs_hma_connector(files)

    mixed = MultiConnector(cpu, single)
    assert_type(mixed, MultiConnector[CPUOffloadConnector, SingleGroupOffloadConnector])
    needs_hma(mixed)  # expect-error
    needs_hma(single)  # expect-error
    mixed.request_finished_all_groups  # expect-error
    CPUOffloadConnector(spec)  # expect-error
    FileStoreConnector(spec, capacity_blocks=4)  # expect-error
