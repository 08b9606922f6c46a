"""torch, imported when first used; and telling tensors apart without importing it.

Importing torch costs about a second (and, without numpy, a warning), so capkv's
modules that move KV bind ``torch`` to :data:`torch`, a stand-in that imports the
real module on its first attribute read. ``capkv check``, the mypy plugin and
stacks of torch-free connectors import those modules without paying for torch;
serving pays once, at the first tensor operation. Type checkers see the real
module::

    if TYPE_CHECKING:
        import torch
    else:
        from capkv._torch import torch

:func:`is_tensor` answers ``isinstance(value, torch.Tensor)`` from
``sys.modules``: a value can only be a tensor once torch is loaded.
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
    """Stands in for torch: the first read of an attribute imports torch; each is then kept here."""

    def __getattr__(self, name: str) -> object:
        value = getattr(importlib.import_module("torch"), name)
        setattr(self, name, value)  # later reads are plain attribute reads
        return value


torch = _Deferred("torch", "torch, imported on the first attribute read (capkv._torch)")
"""The stand-in; not in ``sys.modules``, so ``"torch" in sys.modules`` still says whether torch is loaded."""


def is_tensor(value: object) -> TypeIs[_real_torch.Tensor]:
    """``isinstance(value, torch.Tensor)``, answered without importing torch when it is not loaded."""
    loaded = sys.modules.get("torch")
    return loaded is not None and isinstance(value, loaded.Tensor)
