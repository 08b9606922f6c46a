"""A small, faithful reference engine for exercising connectors.

Its "model" computes KV as a pure function of (layer, position, token prefix), so every block a connector
loads is checked bit-exact against recomputation, which vLLM cannot offer. Open ``_engine.py`` first.
"""

from typing import TYPE_CHECKING

from capkv._lazy import attach

if TYPE_CHECKING:
    from capkv.engine._engine import Engine
    from capkv.engine._model import FULL, SLIDING, GroupLayout, ModelShape
    from capkv.engine._outputs import Mismatch
    from capkv.engine._scheduler import FinishedRequest
    from capkv.engine._stats import EngineStats, GroupStats
    from capkv.engine._verify import VerificationError
    from capkv.engine._workload import Workload

__all__ = [
    "FULL",
    "SLIDING",
    "Engine",
    "EngineStats",
    "FinishedRequest",
    "GroupLayout",
    "GroupStats",
    "Mismatch",
    "ModelShape",
    "VerificationError",
    "Workload",
]

if not TYPE_CHECKING:  # checkers read the imports above (see capkv._lazy)
    __getattr__, __dir__ = attach(
        __name__,
        {
            "capkv.engine._engine": ["Engine"],
            "capkv.engine._model": ["FULL", "SLIDING", "GroupLayout", "ModelShape"],
            "capkv.engine._outputs": ["Mismatch"],
            "capkv.engine._scheduler": ["FinishedRequest"],
            "capkv.engine._stats": ["EngineStats", "GroupStats"],
            "capkv.engine._verify": ["VerificationError"],
            "capkv.engine._workload": ["Workload"],
        },
    )

del TYPE_CHECKING, attach  # dir(), vars(): the front's names only
