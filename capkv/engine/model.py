"""capkv 0.1.0's ``capkv.engine.model``, deprecated: kept until capkv 0.3.0.

Its public names are imported from :mod:`capkv.engine` now; its other names are internal. Reading a
name here warns with its new home (the table: :mod:`capkv._deprecations`).
"""

from typing import TYPE_CHECKING

from capkv._lazy import deprecated_module

if TYPE_CHECKING:
    from capkv.engine._model import FULL as FULL
    from capkv.engine._model import GroupLayout as GroupLayout
    from capkv.engine._model import KV_LAYOUT as KV_LAYOUT
    from capkv.engine._model import ModelShape as ModelShape
    from capkv.engine._model import NULL_BLOCK_ID as NULL_BLOCK_ID
    from capkv.engine._model import SLIDING as SLIDING

__all__: list[str] = []

if not TYPE_CHECKING:  # each name read with a DeprecationWarning (or, if gone, an ImportError)
    __getattr__, __dir__ = deprecated_module(__name__)
