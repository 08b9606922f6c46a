"""Dev mode: every transfer call checked against the engine's KV cache; nothing in production.

Turn it on with ``CAPKV_DEV=1`` or ``python -X dev`` and wrap the stack with :func:`instrument`; the hints
(``block_ids_hint(spec)``, ...) are the same checks for your own functions. Open ``_instrument.py`` first.
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
