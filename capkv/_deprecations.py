"""The names capkv moved or made internal, and what reading one of them says.

capkv's deprecation policy (README, "Stability and deprecations"): a public name
that moves or goes keeps working for at least one minor release, and reading it
raises a ``DeprecationWarning`` that names its new home. This is the table; the
fronts and the old modules kept as shims (``capkv/connectors/file_store.py``, ...)
serve the names through :func:`capkv._lazy.attach` and
:func:`capkv._lazy.deprecated_module`, and ``tests/test_deprecations.py`` reads
every one of them against capkv 0.1.0's public surface
(``tests/data/surface-0.1.0.txt``).

A target with no ``_`` part is the name's public home (the warning says to
import it from there); a private target means the name is internal now, with no
public replacement, and is served from that module until :data:`REMOVED_IN`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, ParamSpec, TypeVar

__all__ = ["DEPRECATED", "HINTS", "REMOVED", "REMOVED_IN", "SINCE", "is_public", "message", "removal", "signature_of"]

SINCE: Final = "0.2.0"
"""The release that moved the names in :data:`DEPRECATED`."""

REMOVED_IN: Final = "0.3.0"
"""The release that removes them."""

DEPRECATED: Final[dict[str, dict[str, str]]] = {
    "capkv": {"instrument": "capkv.devmode"},
    "capkv.capabilities": {
        "HMA_METHOD": "capkv.capabilities._hma",
        "HMA_RULE": "capkv.capabilities._hma",
        "KVCacheConfigLike": "capkv",
        "NEEDS_INSTANCE": "capkv.capabilities._facts",
        "NonHMAChild": "capkv",
        "STATIC_FACTS": "capkv.capabilities._facts",
        "StackNode": "capkv",
        "StaticFact": "capkv.capabilities._facts",
        "check_stack": "capkv",
        "class_fact": "capkv.capabilities._facts",
        "explain_not_hma": "capkv.capabilities._hma",
        "finish_request": "capkv",
        "non_hma_children": "capkv",
        "num_kv_cache_groups": "capkv.capabilities._serving",
        "require_hma": "capkv",
        "supports_hma": "capkv",
    },
    "capkv.capabilities.facts": {
        "FINISHED_COUNT": "capkv.capabilities._facts",
        "LAYOUT": "capkv.capabilities._facts",
        "NEEDS_INSTANCE": "capkv.capabilities._facts",
        "NeedsInstance": "capkv.capabilities._facts",
        "PIECEWISE": "capkv.capabilities._facts",
        "STATIC_FACTS": "capkv.capabilities._facts",
        "StaticFact": "capkv.capabilities._facts",
        "class_fact": "capkv.capabilities._facts",
    },
    "capkv.capabilities.hma": {
        "HMA_METHOD": "capkv.capabilities._hma",
        "HMA_RULE": "capkv.capabilities._hma",
        "NonHMAChild": "capkv",
        "StackNode": "capkv",
        "explain_not_hma": "capkv.capabilities._hma",
        "non_hma_children": "capkv",
        "supports_hma": "capkv",
    },
    "capkv.capabilities.serving": {
        "KVCacheConfigLike": "capkv",
        "check_stack": "capkv",
        "finish_request": "capkv",
        "num_kv_cache_groups": "capkv.capabilities._serving",
        "require_hma": "capkv",
    },
    "capkv.cli.bench": {"add_arguments": "capkv.cli._bench", "run": "capkv.cli._bench"},
    "capkv.cli.check": {"add_arguments": "capkv.cli._check", "run": "capkv.cli._check"},
    "capkv.cli.demo": {"add_arguments": "capkv.cli._demo", "run": "capkv.cli._demo"},
    "capkv.cli.main": {"SUBCOMMANDS": "capkv.cli._main", "main": "capkv.cli"},
    "capkv.cli.progress": {"Progress": "capkv.cli._progress", "TextStream": "capkv.cli._progress"},
    "capkv.cli.stack_spec": {"parse_stack": "capkv.cli._stack_spec"},
    "capkv.composite": {
        "HMAMultiConnector": "capkv",
        "MultiConnector": "capkv",
        "MultiConnectorMetadata": "capkv",
        "MultiWorkerMetadata": "capkv",
    },
    "capkv.composite.agreement": {
        "agreed_finished_count": "capkv.composite._agreement",
        "agreed_layout": "capkv.composite._agreement",
        "child_label": "capkv.composite._agreement",
        "combine": "capkv.composite._agreement",
        "piecewise_needed": "capkv.composite._agreement",
    },
    "capkv.composite.metadata": {"MultiConnectorMetadata": "capkv", "MultiWorkerMetadata": "capkv"},
    "capkv.composite.multi": {
        "HMAMultiConnector": "capkv",
        "MultiConnector": "capkv",
        "answers_by_agreement": "capkv.composite._building",
        "stack_class": "capkv.composite._building",
    },
    "capkv.config": {
        "BUILTIN_CONNECTORS": "capkv.config._registry",
        "FACTORY_HOOK": "capkv.config._build",
        "read_config_file": "capkv.config._loader",
        "resolve_connector": "capkv.config._registry",
    },
    "capkv.config.build": {
        "ConnectorFactory": "capkv.config",
        "FACTORY_HOOK": "capkv.config._build",
        "build_connector": "capkv.config",
        "build_stack": "capkv.config",
    },
    "capkv.config.loader": {
        "ConfiguredConnector": "capkv.config",
        "ConfiguredNode": "capkv.config",
        "ConfiguredStack": "capkv.config",
        "load_stack": "capkv.config",
        "load_stack_file": "capkv.config",
        "read_config_file": "capkv.config._loader",
    },
    "capkv.config.registry": {
        "BUILTIN_CONNECTORS": "capkv.config._registry",
        "ConnectorRegistry": "capkv.config",
        "ENTRY_POINT_GROUP": "capkv.config",
        "default_registry": "capkv.config",
        "register_connector": "capkv.config",
        "resolve_connector": "capkv.config._registry",
    },
    "capkv.connectors": {"BlockMove": "capkv.stores._metadata", "HostPoolConnector": "capkv.connectors._cpu_offload"},
    "capkv.connectors.base": {"PrefixStoreConnector": "capkv.connectors", "require_store_spec": "capkv.stores._base"},
    "capkv.connectors.block_file": {
        "TEMP_SUFFIX": "capkv.connectors._block_file",
        "sweep_temporary_files": "capkv.connectors._block_file",
    },
    "capkv.connectors.cpu_offload": {
        "CPUOffloadConnector": "capkv.connectors",
        "HostPoolConnector": "capkv.connectors._cpu_offload",
    },
    "capkv.connectors.file_store": {"FileStoreConnector": "capkv.connectors"},
    "capkv.connectors.hits": {"GroupGeometry": "capkv.connectors", "longest_hit": "capkv.connectors"},
    "capkv.connectors.host_pool": {"HostPoolIndex": "capkv.connectors._host_pool"},
    "capkv.connectors.keys": {
        "BlockKey": "capkv.connectors",
        "DIGEST_SIZE": "capkv.stores._keys",
        "PrefixHasher": "capkv.connectors",
        "RequestKeys": "capkv.stores._keys",
    },
    "capkv.connectors.metadata": {
        "BlockMove": "capkv.stores._metadata",
        "SaveReport": "capkv.connectors",
        "StoreMetadata": "capkv.connectors",
    },
    "capkv.connectors.scheduler": {"StoreIndex": "capkv.stores._index_contract", "StoreScheduler": "capkv.stores._scheduler"},
    "capkv.connectors.single_group": {"SingleGroupOffloadConnector": "capkv.connectors"},
    "capkv.connectors.worker": {"StoreWorker": "capkv.stores._worker"},
    "capkv.contracts": {
        "AttentionMetadata": "capkv",
        "BlockIds": "capkv",
        "ComputedTokenRequest": "capkv",
        "ConnectorMetadata": "capkv",
        "ForwardContext": "capkv",
        "HMAConnector": "capkv",
        "HandshakeMetadata": "capkv",
        "KVConnector": "capkv",
        "KVConnectorBase": "capkv",
        "KVConnectorOutput": "capkv",
        "KVGroupSpec": "capkv",
        "KVSpec": "capkv",
        "KVTransferParams": "capkv",
        "LoadErrors": "capkv",
        "Request": "capkv",
        "RequestT": "capkv.contracts._connector",
        "SchedulerOutput": "capkv",
        "SupportsHMA": "capkv",
        "TokenRequest": "capkv",
        "WorkerMetadata": "capkv",
        "class_level": "capkv",
    },
    "capkv.contracts.base": {"KVConnectorBase": "capkv"},
    "capkv.contracts.class_level": {"class_level": "capkv"},
    "capkv.contracts.connector": {
        "HMAConnector": "capkv",
        "KVConnector": "capkv",
        "KV_CONNECTOR_MEMBERS": "capkv.contracts._connector",
        "RequestT": "capkv.contracts._connector",
        "SupportsHMA": "capkv",
        "missing_members": "capkv.contracts._connector",
    },
    "capkv.contracts.engine": {
        "AttentionMetadata": "capkv",
        "BlockIds": "capkv",
        "ComputedTokenRequest": "capkv",
        "ConnectorMetadata": "capkv",
        "ForwardContext": "capkv",
        "HandshakeMetadata": "capkv",
        "KVConnectorOutput": "capkv",
        "KVTransferParams": "capkv",
        "LoadErrors": "capkv",
        "Request": "capkv",
        "SchedulerOutput": "capkv",
        "TokenRequest": "capkv",
        "WorkerMetadata": "capkv",
    },
    "capkv.contracts.spec": {"KVGroupSpec": "capkv", "KVSpec": "capkv"},
    "capkv.devmode": {
        "CHECKED_METHODS": "capkv.devmode._instrument",
        "check_block_copies": "capkv.contracts._block_ids",
        "check_block_copy": "capkv.contracts._block_ids",
        "check_block_groups": "capkv.contracts._block_ids",
        "check_block_ids": "capkv.contracts._block_ids",
        "check_kv_caches": "capkv.contracts._kv_tensors",
        "check_kv_tensor": "capkv.contracts._kv_tensors",
    },
    "capkv.devmode.blocks": {
        "check_block_copies": "capkv.contracts._block_ids",
        "check_block_copy": "capkv.contracts._block_ids",
        "check_block_groups": "capkv.contracts._block_ids",
        "check_block_ids": "capkv.contracts._block_ids",
        "check_pool_ids": "capkv.contracts._block_ids",
    },
    "capkv.devmode.hints": {
        "block_copy_hint": "capkv.devmode",
        "block_groups_hint": "capkv.devmode",
        "block_ids_hint": "capkv.devmode",
        "contract_hint": "capkv.devmode",
        "kv_caches_hint": "capkv.devmode",
        "kv_layer_hint": "capkv.devmode",
        "single_group_hint": "capkv.devmode",
    },
    "capkv.devmode.instrument": {
        "CHECKED_METHODS": "capkv.devmode._instrument",
        "Instrumented": "capkv.devmode",
        "instrument": "capkv.devmode",
    },
    "capkv.devmode.message": {"contract_error": "capkv.contracts._violation"},
    "capkv.devmode.mode": {
        "ENV_VAR": "capkv.devmode",
        "check_capkv_types": "capkv.devmode._mode",
        "dev_mode": "capkv.devmode",
        "enabled": "capkv.devmode",
        "forced_off": "capkv.devmode",
        "set_dev_mode": "capkv.devmode",
        "types_checked": "capkv.devmode",
    },
    "capkv.devmode.scan": {
        "BadId": "capkv.contracts._id_scan",
        "all_valid": "capkv.contracts._id_scan",
        "expected_id": "capkv.contracts._id_scan",
        "first_bad_id": "capkv.contracts._id_scan",
    },
    "capkv.devmode.tensors": {
        "check_kv_caches": "capkv.contracts._kv_tensors",
        "check_kv_tensor": "capkv.contracts._kv_tensors",
    },
    "capkv.engine": {
        "BlockPool": "capkv.engine._block_pool",
        "BlockTables": "capkv.engine._block_tables",
        "ForwardContext": "capkv.engine._outputs",
        "KVFunction": "capkv.engine._compute",
        "KV_LAYOUT": "capkv.engine._model",
        "LayerAttentionMetadata": "capkv.engine._worker",
        "LoadCheck": "capkv.engine._outputs",
        "LocalHit": "capkv.engine._block_tables",
        "ModelRunnerOutput": "capkv.engine._outputs",
        "NULL_BLOCK_ID": "capkv.engine._model",
        "PagedKVCache": "capkv.engine._kv_cache",
        "Request": "capkv.engine._request",
        "RequestStatus": "capkv.engine._request",
        "ScheduledRequest": "capkv.testing",
        "Scheduler": "capkv.engine._scheduler",
        "SchedulerOutput": "capkv.engine._outputs",
        "Slots": "capkv.engine._kv_cache",
        "Verifier": "capkv.engine._verify",
        "Worker": "capkv.engine._worker",
    },
    "capkv.engine.block_pool": {"BlockPool": "capkv.engine._block_pool", "CacheKey": "capkv.engine._block_pool"},
    "capkv.engine.block_tables": {
        "BlockTables": "capkv.engine._block_tables",
        "LocalHit": "capkv.engine._block_tables",
    },
    "capkv.engine.compute": {"KVFunction": "capkv.engine._compute"},
    "capkv.engine.engine": {"Engine": "capkv.engine"},
    "capkv.engine.kv_cache": {"PagedKVCache": "capkv.engine._kv_cache", "Slots": "capkv.engine._kv_cache"},
    "capkv.engine.model": {
        "FULL": "capkv.engine",
        "GroupLayout": "capkv.engine",
        "KV_LAYOUT": "capkv.engine._model",
        "ModelShape": "capkv.engine",
        "NULL_BLOCK_ID": "capkv.engine._model",
        "SLIDING": "capkv.engine",
    },
    "capkv.engine.outputs": {
        "ForwardContext": "capkv.engine._outputs",
        "LoadCheck": "capkv.engine._outputs",
        "Mismatch": "capkv.engine",
        "ModelRunnerOutput": "capkv.engine._outputs",
        "ScheduledRequest": "capkv.testing",
        "SchedulerOutput": "capkv.engine._outputs",
    },
    "capkv.engine.request": {
        "Request": "capkv.engine._request",
        "RequestStatus": "capkv.engine._request",
        "chain_hash": "capkv.engine._request",
    },
    "capkv.engine.scheduler": {"FinishedRequest": "capkv.engine", "Scheduler": "capkv.engine._scheduler"},
    "capkv.engine.stats": {"EngineStats": "capkv.engine", "GroupStats": "capkv.engine"},
    "capkv.engine.verify": {"VerificationError": "capkv.engine", "Verifier": "capkv.engine._verify"},
    "capkv.engine.worker": {"LayerAttentionMetadata": "capkv.engine._worker", "Worker": "capkv.engine._worker"},
    "capkv.engine.workload": {"Workload": "capkv.engine"},
    "capkv.mypy": {"CAPKV_HMA": "capkv._mypy_plugin", "CapkvPlugin": "capkv._mypy_plugin", "SUPPORTED_MYPY": "capkv._mypy_plugin"},
    "capkv.transfer": {
        "CudaEventCopy": "capkv.transfer._handle",
        "FinishedCopy": "capkv.transfer._handle",
        "GroupRuns": "capkv.transfer._layout",
        "KVLayout": "capkv.transfer._layout",
        "LayerRuns": "capkv.transfer._runs",
        "layer_runs": "capkv.transfer._runs",
    },
    "capkv.transfer.bench": {
        "Timing": "capkv.transfer._bench",
        "TransferFigures": "capkv.transfer._bench",
        "measure_transfer": "capkv.transfer._bench",
    },
    "capkv.transfer.copier": {"BlockCopier": "capkv.transfer"},
    "capkv.transfer.cpu": {"CpuCopies": "capkv.transfer._cpu"},
    "capkv.transfer.cuda": {
        "CudaCopies": "capkv.transfer._cuda",
        "DEFAULT_STAGING_BYTES": "capkv.transfer._cuda",
        "chunk_spans": "capkv.transfer._cuda",
    },
    "capkv.transfer.handle": {
        "AllCopies": "capkv.transfer._handle",
        "CopyHandle": "capkv.transfer",
        "CudaEventCopy": "capkv.transfer._handle",
        "FINISHED": "capkv.transfer._handle",
        "FinishedCopy": "capkv.transfer._handle",
        "all_of": "capkv.transfer._handle",
    },
    "capkv.transfer.layout": {
        "GroupRuns": "capkv.transfer._layout",
        "KVLayout": "capkv.transfer._layout",
        "spec_block_nbytes": "capkv.transfer",
    },
    "capkv.transfer.runs": {
        "LayerRuns": "capkv.transfer._runs",
        "WORD_DTYPES": "capkv.transfer._runs",
        "layer_runs": "capkv.transfer._runs",
        "storage_words": "capkv.transfer._runs",
        "widest_word": "capkv.transfer._runs",
    },
}
"""Module of capkv 0.1.0 -> {name: where it is now}: its public home, or the private module it is internal to."""

HINTS: Final[dict[str, str]] = {
    "capkv.engine._request.Request": "build one with capkv.testing.make_request; connectors see it as capkv.Request",
    "capkv.engine._outputs.SchedulerOutput": (
        "build one with capkv.testing.scheduler_output; connectors see it as capkv.SchedulerOutput"
    ),
    "capkv.engine._outputs.ForwardContext": (
        "build one with capkv.testing.forward_context; connectors see it as capkv.ForwardContext"
    ),
    "capkv.connectors._cpu_offload.HostPoolConnector": (
        "a store of your own is a capkv.stores.Backend under capkv.stores.StoreConnector"
    ),
    **dict.fromkeys(
        [
            "capkv.contracts._block_ids.check_block_copies",
            "capkv.contracts._block_ids.check_block_copy",
            "capkv.contracts._block_ids.check_block_groups",
            "capkv.contracts._block_ids.check_block_ids",
            "capkv.contracts._block_ids.check_pool_ids",
            "capkv.contracts._kv_tensors.check_kv_caches",
            "capkv.contracts._kv_tensors.check_kv_tensor",
        ],
        "capkv.devmode.instrument checks a stack's calls, and capkv.devmode's hints (block_ids_hint, ...) "
        "are the same checks for your own functions",
    ),
}
"""What to use instead of an internal name, where capkv offers something (keyed by where the name is now)."""

_WHY = {
    "pack": "the file store keeps blocks in pack files now (capkv.connectors.FileStoreConnector)",
    "stores": "capkv's stores are backends under one store layer now: a store of your own is a "
    "capkv.stores.Backend under capkv.stores.StoreConnector",
    "completion": "MultiConnector tracks completions per child now (stack.dropped_reports counts what it drops)",
    "stack": "a --stack text is a kv_transfer_config now: capkv.config.load_stack reads one, "
    "capkv.config.build_stack builds it",
}

REMOVED: Final[dict[str, dict[str, str]]] = {
    "capkv.cli.stack_spec": {"StackTree": "stack", "build_stack": "stack", "render_stack": "stack"},
    "capkv.composite.completion": {"ReceiveFromLoader": "completion", "SendCountdown": "completion"},
    "capkv.connectors.block_file": {
        "HEADER_SIZE": "pack",
        "ReadResult": "pack",
        "block_path": "pack",
        "read_block_file": "pack",
        "tensor_memory": "stores",
        "write_block_file": "pack",
    },
    "capkv.connectors.cpu_offload": {"HostPoolWorker": "stores"},
    "capkv.connectors.file_store": {"BlockWriter": "pack", "FileIndex": "stores", "FileStoreWorker": "stores"},
    "capkv.connectors.worker": {"Landing": "stores", "StoredWhenCopied": "stores", "consecutive_runs": "stores"},
}
"""Names of capkv 0.1.0 modules whose implementation 0.2.0 replaced: reading one raises ``ImportError`` saying why."""

_P = ParamSpec("_P")
_R = TypeVar("_R")


def is_public(target: str) -> bool:
    """Whether a target is a public home (no part of its dotted name is private)."""
    return not any(part.startswith("_") for part in target.split("."))


def message(module: str, name: str) -> str:
    """The ``DeprecationWarning`` text for ``module.name`` (a key of :data:`DEPRECATED`)."""
    target = DEPRECATED[module][name]
    old = f"{module}.{name} is deprecated (capkv {SINCE}, removed in {REMOVED_IN})"
    if is_public(target):
        return f"{old}: use {target}.{name}"
    hint = HINTS.get(f"{target}.{name}")
    return f"{old}: it is internal, with no public replacement" + (f"; {hint}" if hint else "")


def removal(module: str, name: str) -> str:
    """The ``ImportError`` text for ``module.name`` (a key of :data:`REMOVED`)."""
    return f"{module}.{name} was removed in capkv {SINCE}: {_WHY[REMOVED[module][name]]}"


def signature_of(function: Callable[_P, _R]) -> Callable[[Callable[..., object]], Callable[_P, _R]]:
    """For type checkers: the decorated stub takes ``function``'s exact signature.

    The shims declare a deprecated function as
    ``@deprecated(...) @signature_of(target) def name() -> None: ...``, so mypy
    and pyright report its use as deprecated (PEP 702) and still check its calls.
    """

    def same(_stub: Callable[..., object]) -> Callable[_P, _R]:
        return function

    return same
