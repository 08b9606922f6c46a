"""capkv and vLLM (private: use the front, :mod:`capkv.vllm`, whose ImportError names the extra)."""
