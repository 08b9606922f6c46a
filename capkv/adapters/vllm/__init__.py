"""capkv and vLLM (private: use the front, :mod:`capkv.vllm`).

Every module here needs vLLM; importing any of them without it is an
:class:`ImportError` that names the extra to install.
"""

from capkv.adapters.vllm._require import require_vllm

require_vllm()
