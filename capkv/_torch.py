"""torch, imported when first used; and telling tensors apart without importing it.

Importing torch costs about a second, so ``capkv check``, the mypy plugin and stacks of torch-free connectors
never pay for it; serving pays once, at the first tensor operation.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING

from typing_extensions import TypeIs

if TYPE_CHECKING:
    import torch as _real_torch

__all__ = ["is_tensor", "torch"]


class _Deferred(types.ModuleType):
    """Stands in for torch: the first read of an attribute imports torch; each is then kept here.

    capkv's modules that move KV bind ``torch`` to :data:`torch`, this stand-in;
    type checkers see the real module::

        if TYPE_CHECKING:
            import torch
        else:
            from capkv._torch import torch
    """

    def __getattr__(self, name: str) -> object:
        value = getattr(importlib.import_module("torch"), name)
        setattr(self, name, value)  # later reads are plain attribute reads
        return value


torch = _Deferred("torch", "torch, imported on the first attribute read (capkv._torch)")
"""The stand-in; not in ``sys.modules``, so ``"torch" in sys.modules`` still says whether torch is loaded."""


def is_tensor(value: object) -> TypeIs[_real_torch.Tensor]:
    """``isinstance(value, torch.Tensor)``, answered without importing torch when it is not loaded.

    A value can only be a tensor once torch is loaded, so ``sys.modules`` answers.
    """
    loaded = sys.modules.get("torch")
    return loaded is not None and isinstance(value, loaded.Tensor)
