"""Dev mode: every transfer call checked against the engine's KV cache; nothing in production.

Turn it on with ``CAPKV_DEV=1`` or ``python -X dev`` (never under ``python -O``),
then wrap the stack once the KV cache is known: ``stack = capkv.instrument(stack, spec)``.
The checks themselves live beside the contracts (``capkv.contracts._block_ids``,
``_kv_tensors``), since capkv's connectors and copy ops run some of them in
production too; they are re-exported here, usable directly (:func:`check_block_copy`
for copy ops) and as beartype hints (:mod:`capkv.devmode._hints`).
"""

# First, before any other capkv module loads: in dev mode, the rest of capkv
# is imported under beartype (see check_capkv_types).
from capkv.devmode._mode import (
    ENV_VAR,
    check_capkv_types,
    dev_mode,
    enabled,
    forced_off,
    set_dev_mode,
    types_checked,
)

check_capkv_types()

from capkv.contracts._block_ids import (  # noqa: E402
    check_block_copies,
    check_block_copy,
    check_block_groups,
    check_block_ids,
)
from capkv.devmode._hints import (  # noqa: E402
    block_copy_hint,
    block_groups_hint,
    block_ids_hint,
    contract_hint,
    kv_caches_hint,
    kv_layer_hint,
    single_group_hint,
)
from capkv.devmode._instrument import CHECKED_METHODS, Instrumented, instrument  # noqa: E402
from capkv.contracts._kv_tensors import check_kv_caches, check_kv_tensor  # noqa: E402

__all__ = [
    "CHECKED_METHODS",
    "ENV_VAR",
    "Instrumented",
    "block_copy_hint",
    "block_groups_hint",
    "block_ids_hint",
    "check_block_copies",
    "check_block_copy",
    "check_block_groups",
    "check_block_ids",
    "check_kv_caches",
    "check_kv_tensor",
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
