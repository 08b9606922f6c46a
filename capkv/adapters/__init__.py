"""Adapters between capkv and inference engines (private: use the fronts, e.g. :mod:`capkv.vllm`).

One folder per engine, so capkv's core never imports an engine; open ``vllm/_host.py`` first.
"""
