"""Whether vLLM can be imported here; under ``CAPKV_REQUIRE_VLLM=1`` it must be (an error, never a skip)."""

from __future__ import annotations

import importlib
import os

try:
    importlib.import_module("vllm")
    VLLM_ERROR: str | None = None
except Exception as exc:  # ImportError, or a broken install (e.g. a CUDA torchvision)
    VLLM_ERROR = f"{type(exc).__name__}: {exc}"

if VLLM_ERROR is not None and os.environ.get("CAPKV_REQUIRE_VLLM") == "1":
    raise RuntimeError(f"CAPKV_REQUIRE_VLLM=1 but vLLM cannot be imported ({VLLM_ERROR})")
