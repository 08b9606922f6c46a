"""Adapters between capkv and inference engines (private: use the fronts, e.g. :mod:`capkv.vllm`)."""
