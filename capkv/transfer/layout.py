"""capkv 0.1.0's ``capkv.transfer.layout``, deprecated: kept until capkv 0.3.0.

Its public names are imported from :mod:`capkv.transfer` now; its other names are internal. Reading
a name here warns with its new home (the table: :mod:`capkv._deprecations`).
"""

from typing import TYPE_CHECKING

from capkv._lazy import deprecated_module

if TYPE_CHECKING:
    from typing_extensions import deprecated

    from capkv._deprecations import signature_of
    from capkv.transfer import _layout
    from capkv.transfer._layout import GroupRuns as GroupRuns
    from capkv.transfer._layout import KVLayout as KVLayout

    @deprecated("capkv.transfer.layout.spec_block_nbytes is deprecated (capkv 0.2.0, removed in 0.3.0): use capkv.transfer.spec_block_nbytes")
    @signature_of(_layout.spec_block_nbytes)
    def spec_block_nbytes() -> None: ...

__all__: list[str] = []

if not TYPE_CHECKING:  # each name read with a DeprecationWarning (or, if gone, an ImportError)
    __getattr__, __dir__ = deprecated_module(__name__)
