"""capkv 0.1.0's ``capkv.devmode.blocks``, deprecated: kept until capkv 0.3.0.

Its names are internal to capkv now. Reading a name here warns with its new home (the table:
:mod:`capkv._deprecations`).
"""

from typing import TYPE_CHECKING

from capkv._lazy import deprecated_module

if TYPE_CHECKING:
    from typing_extensions import deprecated

    from capkv._deprecations import signature_of
    from capkv.contracts import _block_ids

    @deprecated("capkv.devmode.blocks.check_block_copies is deprecated (capkv 0.2.0, removed in 0.3.0): it is internal, with no public replacement; capkv.devmode.instrument checks a stack's calls, and capkv.devmode's hints (block_ids_hint, ...) are the same checks for your own functions")
    @signature_of(_block_ids.check_block_copies)
    def check_block_copies() -> None: ...

    @deprecated("capkv.devmode.blocks.check_block_copy is deprecated (capkv 0.2.0, removed in 0.3.0): it is internal, with no public replacement; capkv.devmode.instrument checks a stack's calls, and capkv.devmode's hints (block_ids_hint, ...) are the same checks for your own functions")
    @signature_of(_block_ids.check_block_copy)
    def check_block_copy() -> None: ...

    @deprecated("capkv.devmode.blocks.check_block_groups is deprecated (capkv 0.2.0, removed in 0.3.0): it is internal, with no public replacement; capkv.devmode.instrument checks a stack's calls, and capkv.devmode's hints (block_ids_hint, ...) are the same checks for your own functions")
    @signature_of(_block_ids.check_block_groups)
    def check_block_groups() -> None: ...

    @deprecated("capkv.devmode.blocks.check_block_ids is deprecated (capkv 0.2.0, removed in 0.3.0): it is internal, with no public replacement; capkv.devmode.instrument checks a stack's calls, and capkv.devmode's hints (block_ids_hint, ...) are the same checks for your own functions")
    @signature_of(_block_ids.check_block_ids)
    def check_block_ids() -> None: ...

    @deprecated("capkv.devmode.blocks.check_pool_ids is deprecated (capkv 0.2.0, removed in 0.3.0): it is internal, with no public replacement; capkv.devmode.instrument checks a stack's calls, and capkv.devmode's hints (block_ids_hint, ...) are the same checks for your own functions")
    @signature_of(_block_ids.check_pool_ids)
    def check_pool_ids() -> None: ...

__all__: list[str] = []

if not TYPE_CHECKING:  # each name read with a DeprecationWarning (or, if gone, an ImportError)
    __getattr__, __dir__ = deprecated_module(__name__)
