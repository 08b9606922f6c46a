"""vLLM's rule for whether a built connector serves its hybrid allocator (HMA), and the wrappers' check.

vLLM's rule is nominal (the class derives from its ``SupportsHMA``), except for composites:
vLLM's ``MultiConnector`` (and capkv's drop-in nested under one) always derives from it, and
its children decide.
"""

from __future__ import annotations

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, SupportsHMA
from vllm.distributed.kv_transfer.kv_connector.v1.multi_connector import MultiConnector as VllmMultiConnector

from capkv.errors import CapabilityError, ContractError

__all__ = ["check_vllm_connector", "is_hma_vllm_connector"]


def is_hma_vllm_connector(connector: object) -> bool:
    """vLLM's rule, nominally: the class derives from vLLM's ``SupportsHMA``.

    vLLM's ``MultiConnector`` always does; its real answer is its sub-connectors' (as
    vLLM decides it from the configured children), so they decide here too.
    """
    if not isinstance(connector, SupportsHMA):
        return False
    if isinstance(connector, VllmMultiConnector):
        return all(is_hma_vllm_connector(child) for child in connector.sub_connectors)
    decided: object = getattr(connector, "_all_support_hma", None)  # capkv's drop-in, nested: its stack's
    return decided if isinstance(decided, bool) else True


def check_vllm_connector(wrapper: str, connector: object, *, hma: bool) -> None:
    """A wrapper takes a vLLM connector; an HMA wrapper (``hma``) only an HMA-capable one."""
    if not isinstance(connector, KVConnectorBase_V1):
        raise ContractError(
            f"{wrapper}: expected a vLLM connector (a KVConnectorBase_V1), got "
            f"{type(connector).__name__} {connector!r}",
            connector=type(connector).__name__,
            method="__init__",
            value=connector,
        )
    if hma and not is_hma_vllm_connector(connector):
        raise CapabilityError(
            f'{wrapper}: "{type(connector).__name__}" does not derive from vLLM\'s SupportsHMA '
            "(or, for vLLM's MultiConnector, a sub-connector does not); wrap it with capkv.vllm.wrap",
            connector=type(connector).__name__,
            method="__init__",
            value=connector,
        )
