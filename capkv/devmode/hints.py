"""capkv 0.1.0's ``capkv.devmode.hints``, deprecated: kept until capkv 0.3.0.

Its public names are imported from :mod:`capkv.devmode` now. Reading a name here warns with its new
home (the table: :mod:`capkv._deprecations`).
"""

from typing import TYPE_CHECKING

from capkv._lazy import deprecated_module

if TYPE_CHECKING:
    from typing_extensions import deprecated

    from capkv._deprecations import signature_of
    from capkv.devmode import _hints

    @deprecated("capkv.devmode.hints.block_copy_hint is deprecated (capkv 0.2.0, removed in 0.3.0): use capkv.devmode.block_copy_hint")
    @signature_of(_hints.block_copy_hint)
    def block_copy_hint() -> None: ...

    @deprecated("capkv.devmode.hints.block_groups_hint is deprecated (capkv 0.2.0, removed in 0.3.0): use capkv.devmode.block_groups_hint")
    @signature_of(_hints.block_groups_hint)
    def block_groups_hint() -> None: ...

    @deprecated("capkv.devmode.hints.block_ids_hint is deprecated (capkv 0.2.0, removed in 0.3.0): use capkv.devmode.block_ids_hint")
    @signature_of(_hints.block_ids_hint)
    def block_ids_hint() -> None: ...

    @deprecated("capkv.devmode.hints.contract_hint is deprecated (capkv 0.2.0, removed in 0.3.0): use capkv.devmode.contract_hint")
    @signature_of(_hints.contract_hint)
    def contract_hint() -> None: ...

    @deprecated("capkv.devmode.hints.kv_caches_hint is deprecated (capkv 0.2.0, removed in 0.3.0): use capkv.devmode.kv_caches_hint")
    @signature_of(_hints.kv_caches_hint)
    def kv_caches_hint() -> None: ...

    @deprecated("capkv.devmode.hints.kv_layer_hint is deprecated (capkv 0.2.0, removed in 0.3.0): use capkv.devmode.kv_layer_hint")
    @signature_of(_hints.kv_layer_hint)
    def kv_layer_hint() -> None: ...

    @deprecated("capkv.devmode.hints.single_group_hint is deprecated (capkv 0.2.0, removed in 0.3.0): use capkv.devmode.single_group_hint")
    @signature_of(_hints.single_group_hint)
    def single_group_hint() -> None: ...

__all__: list[str] = []

if not TYPE_CHECKING:  # each name read with a DeprecationWarning (or, if gone, an ImportError)
    __getattr__, __dir__ = deprecated_module(__name__)
