"""Dev mode: every transfer call checked against the engine's KV cache; nothing in production.

Turn it on with ``CAPKV_DEV=1`` or ``python -X dev`` (never under ``python -O``),
then wrap the stack once the KV cache is known:
``stack = capkv.devmode.instrument(stack, spec)``. The same checks are beartype
hints (``block_ids_hint(spec)``, ...) for annotating functions of your own.
"""

from typing import TYPE_CHECKING

from capkv._lazy import attach

if TYPE_CHECKING:
    from capkv.devmode._hints import (
        block_copy_hint,
        block_groups_hint,
        block_ids_hint,
        contract_hint,
        kv_caches_hint,
        kv_layer_hint,
        single_group_hint,
    )
    from capkv.devmode._instrument import Instrumented, instrument
    from capkv.devmode._mode import ENV_VAR, dev_mode, enabled, forced_off, set_dev_mode, types_checked

    # Deprecated (capkv._deprecations): names that left this front; each read warns with its new home.
    from typing_extensions import deprecated

    from capkv._deprecations import signature_of
    from capkv.contracts import _block_ids
    from capkv.contracts import _kv_tensors
    from capkv.devmode._instrument import CHECKED_METHODS as CHECKED_METHODS

    @deprecated("capkv.devmode.check_block_copies is deprecated (capkv 0.2.0, removed in 0.3.0): it is internal, with no public replacement; capkv.devmode.instrument checks a stack's calls, and capkv.devmode's hints (block_ids_hint, ...) are the same checks for your own functions")
    @signature_of(_block_ids.check_block_copies)
    def check_block_copies() -> None: ...

    @deprecated("capkv.devmode.check_block_copy is deprecated (capkv 0.2.0, removed in 0.3.0): it is internal, with no public replacement; capkv.devmode.instrument checks a stack's calls, and capkv.devmode's hints (block_ids_hint, ...) are the same checks for your own functions")
    @signature_of(_block_ids.check_block_copy)
    def check_block_copy() -> None: ...

    @deprecated("capkv.devmode.check_block_groups is deprecated (capkv 0.2.0, removed in 0.3.0): it is internal, with no public replacement; capkv.devmode.instrument checks a stack's calls, and capkv.devmode's hints (block_ids_hint, ...) are the same checks for your own functions")
    @signature_of(_block_ids.check_block_groups)
    def check_block_groups() -> None: ...

    @deprecated("capkv.devmode.check_block_ids is deprecated (capkv 0.2.0, removed in 0.3.0): it is internal, with no public replacement; capkv.devmode.instrument checks a stack's calls, and capkv.devmode's hints (block_ids_hint, ...) are the same checks for your own functions")
    @signature_of(_block_ids.check_block_ids)
    def check_block_ids() -> None: ...

    @deprecated("capkv.devmode.check_kv_caches is deprecated (capkv 0.2.0, removed in 0.3.0): it is internal, with no public replacement; capkv.devmode.instrument checks a stack's calls, and capkv.devmode's hints (block_ids_hint, ...) are the same checks for your own functions")
    @signature_of(_kv_tensors.check_kv_caches)
    def check_kv_caches() -> None: ...

    @deprecated("capkv.devmode.check_kv_tensor is deprecated (capkv 0.2.0, removed in 0.3.0): it is internal, with no public replacement; capkv.devmode.instrument checks a stack's calls, and capkv.devmode's hints (block_ids_hint, ...) are the same checks for your own functions")
    @signature_of(_kv_tensors.check_kv_tensor)
    def check_kv_tensor() -> None: ...

__all__ = [
    "ENV_VAR",
    "Instrumented",
    "block_copy_hint",
    "block_groups_hint",
    "block_ids_hint",
    "contract_hint",
    "dev_mode",
    "enabled",
    "forced_off",
    "instrument",
    "kv_caches_hint",
    "kv_layer_hint",
    "set_dev_mode",
    "single_group_hint",
    "types_checked",
]

if not TYPE_CHECKING:  # checkers read the imports above (see capkv._lazy)
    __getattr__, __dir__ = attach(
        __name__,
        {
            "capkv.devmode._hints": [
                "block_copy_hint",
                "block_groups_hint",
                "block_ids_hint",
                "contract_hint",
                "kv_caches_hint",
                "kv_layer_hint",
                "single_group_hint",
            ],
            "capkv.devmode._instrument": ["Instrumented", "instrument"],
            "capkv.devmode._mode": ["ENV_VAR", "dev_mode", "enabled", "forced_off", "set_dev_mode", "types_checked"],
        },
    )

del TYPE_CHECKING, attach  # dir(), vars(): the front's names only
