"""capkv and vLLM (private: use the front, :mod:`capkv.vllm`, whose ImportError names the extra).

vLLM hosting a capkv stack (open ``_host.py`` first; ``_drop_in.py`` is the ``MultiConnector`` drop-in) and
vLLM's connectors as capkv children (``_child.py``); the mechanics: docs/internals.md, "The vLLM adapter".
"""
