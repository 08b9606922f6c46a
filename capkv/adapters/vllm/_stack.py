"""The hosted stack: read from the host's extra config, built for one role, and its class-level facts.

Names resolve as ``capkv check`` reads them, vLLM's own connector names included; each leaf is built the way
its kind expects.
"""

from __future__ import annotations

import copy
import inspect
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

from vllm.config import VllmConfig
from vllm.config.kv_transfer import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorRole
from vllm.v1.kv_cache_interface import KVCacheConfig

from capkv.adapters.vllm._carry import VLLM_NULL_BLOCK_ID
from capkv.adapters.vllm._child import VllmChild, wrap
from capkv.adapters.vllm._names import resolve_vllm_name
from capkv.capabilities._facts import (
    ACCESS,
    CONFIG_FACTS,
    LAYOUT,
    NEEDS_INSTANCE,
    PIECEWISE,
    ConfigFact,
    StaticFact,
    class_answer,
    class_fact,
)
from capkv.composite._agreement import child_label, combine
from capkv.config._build import build_connector, build_stack
from capkv.config._loader import ConfiguredConnector, ConfiguredNode, ConfiguredStack, load_stack
from capkv.contracts._spec import KVSpec
from capkv.errors import CapkvError, ConfigError

__all__ = [
    "Engine",
    "build_hosted",
    "child_entry",
    "child_transfer_config",
    "child_vllm_config",
    "configured_fact",
    "load_hosted",
]


@dataclass(frozen=True)
class Engine:
    """What vLLM handed the host: everything a leaf may be built from."""

    vllm_config: VllmConfig
    role: KVConnectorRole
    kv_cache_config: KVCacheConfig
    spec: KVSpec | None
    """``None`` for vLLM's placeholder configuration without a KV-cache group."""
    inherit_role: bool = True
    """A vLLM child without a ``kv_role`` takes the host's (the ``stack`` shape); vLLM's own
    composite leaves it unset (the drop-in, in vLLM's shape)."""


def load_hosted(stack: Mapping[str, Any]) -> ConfiguredNode:
    """The hosted stack's classes (nothing is built)."""
    return load_stack(stack)


def is_vllm_connector(cls: type[Any]) -> bool:
    """Whether ``cls`` is one of vLLM's own connector classes (built by vLLM's constructor)."""
    return issubclass(cls, KVConnectorBase_V1)


def child_vllm_config(vllm_config: VllmConfig, leaf: ConfiguredConnector, *, inherit_role: bool = True) -> VllmConfig:
    """The engine's config as ``leaf`` must see it: its own entry as the ``kv_transfer_config``."""
    child = copy.copy(vllm_config)
    child.kv_transfer_config = child_transfer_config(vllm_config.kv_transfer_config, leaf, inherit_role=inherit_role)
    return child


def child_transfer_config(
    host: KVTransferConfig | None, leaf: ConfiguredConnector, *, inherit_role: bool = True
) -> KVTransferConfig:
    """``leaf``'s own ``kv_transfer_config`` (:func:`child_entry`)."""
    return KVTransferConfig(**child_entry(host, leaf, inherit_role=inherit_role))


def child_entry(
    host: KVTransferConfig | None, leaf: ConfiguredConnector, *, inherit_role: bool = True
) -> dict[str, Any]:
    """``leaf``'s entry as vLLM's ``MultiConnector`` reads it: its own keys, named as vLLM's factory finds
    it (the entry's own name where vLLM's factory resolves it to the same class, so vLLM's per-name rules
    still apply), with the host's ``engine_id`` (and ``kv_role``, with ``inherit_role``) unless it has its own."""
    entry: dict[str, Any] = {
        key: value for key, value in leaf.entry.items() if key in _TRANSFER_FIELDS and value is not None
    }
    if not _named_as_vllm(leaf):
        entry.update(kv_connector=leaf.cls.__name__, kv_connector_module_path=leaf.cls.__module__)
    entry["kv_connector_extra_config"] = dict(leaf.extra_config)
    if host is not None:
        entry.setdefault("engine_id", host.engine_id)
        if inherit_role:
            entry.setdefault("kv_role", host.kv_role)
    return entry


def _named_as_vllm(leaf: ConfiguredConnector) -> bool:
    """Whether vLLM's factory finds ``leaf``'s class by the entry's own name (and module path)."""
    name: object = leaf.entry.get("kv_connector")
    if not isinstance(name, str) or ":" in name:
        return False
    if leaf.entry.get("kv_connector_module_path"):
        return True  # capkv's registry imported the class from that module, as vLLM's factory does
    return resolve_vllm_name(name, leaf.entry) is leaf.cls


_TRANSFER_FIELDS: frozenset[str] = frozenset(getattr(KVTransferConfig, "__dataclass_fields__", ()))
"""What a ``KVTransferConfig`` takes (capkv's own keys in an entry are not passed on)."""


def build_hosted(configured: ConfiguredNode, engine: Engine) -> Any:
    """The stack's connectors for ``engine``'s role, leaves first."""
    return build_stack(configured, factory=lambda leaf: _build_leaf(leaf, engine))


def _build_leaf(leaf: ConfiguredConnector, engine: Engine) -> Any:
    if is_vllm_connector(leaf.cls):
        return _guarded(leaf, lambda: _wrap_vllm(leaf, engine))
    if _takes_spec(leaf.cls):
        spec = engine.spec
        if spec is None:
            where = f"{leaf.position}: " if leaf.position else ""
            raise ConfigError(
                f'{where}"{leaf.name}" is built over the engine\'s KV-cache groups, and vLLM\'s KVCacheConfig '
                "has none (a placeholder configuration)",
                connector=leaf.position or leaf.name, method="__init__", value=0,
            )
        return _guarded(leaf, lambda: leaf.cls(spec, **leaf.extra_config))
    return build_connector(leaf)


def _wrap_vllm(leaf: ConfiguredConnector, engine: Engine) -> Any:
    config = child_vllm_config(engine.vllm_config, leaf, inherit_role=engine.inherit_role)
    built: object = leaf.cls(config, engine.role, engine.kv_cache_config)
    null = VLLM_NULL_BLOCK_ID if engine.spec is None else engine.spec.null_block_id
    return wrap_configured(built, leaf.cls, vllm_config=config, null_block_id=null)


def wrap_configured(
    connector: object, cls: type[Any], *, vllm_config: VllmConfig | None, null_block_id: int
) -> VllmChild[Any]:
    """:func:`~capkv.vllm.wrap`, answering vLLM's class-level calls from ``cls``, the class the connector was
    configured as (vLLM asks the configured class; its constructor may hand back another object)."""
    child: VllmChild[Any] = wrap(cast("Any", connector), vllm_config=vllm_config, null_block_id=null_block_id)
    vars(child)["_cls"] = cls
    return child


def _guarded(leaf: ConfiguredConnector, make: Callable[[], Any]) -> Any:
    try:
        return make()
    except CapkvError:
        raise
    except Exception as exc:
        where = f"{leaf.position}: " if leaf.position else ""
        raise ConfigError(
            f'{where}cannot build "{leaf.name}" for vLLM: {type(exc).__name__}: {exc}',
            connector=leaf.position or leaf.name, method="__init__", value=dict(leaf.extra_config),
        ) from exc


def _takes_spec(cls: type[Any]) -> bool:
    """Whether ``cls``'s constructor takes the engine's :class:`~capkv.KVSpec` first."""
    init: object = getattr(cls, "__init__", None)
    try:
        hints = typing.get_type_hints(init)
        parameters = list(inspect.signature(cls).parameters.values())
    except (NameError, TypeError, ValueError):
        return False
    return bool(parameters) and hints.get(parameters[0].name) is KVSpec


def configured_fact(
    node: ConfiguredNode,
    fact: StaticFact | ConfigFact,
    *,
    vllm_config: VllmConfig | None,
    transfer: KVTransferConfig | None = None,
    inherit_role: bool = True,
) -> object:
    """``fact`` for the configured stack from its classes; :data:`NEEDS_INSTANCE` when a class cannot say.

    vLLM's own connector classes answer with vLLM's arguments: the layout from
    their ``kv_transfer_config``, piecewise CUDA graphs from their extra config,
    the configuration-time facts (sleep mode, KV-cache access, lookahead hashes)
    from their own ``kv_transfer_config`` (``transfer``, else ``vllm_config``'s, is
    the host's); capkv's by class-level facts. A stack combines its children's
    answers by the fact's row of :mod:`capkv.capabilities._table` (flags as ``int``).
    """
    if transfer is None and vllm_config is not None:
        transfer = vllm_config.kv_transfer_config
    if isinstance(node, ConfiguredStack):
        answers = [
            configured_fact(entry, fact, vllm_config=vllm_config, transfer=transfer, inherit_role=inherit_role)
            for entry in node.entries
        ]
        if any(answer is NEEDS_INSTANCE for answer in answers):
            return NEEDS_INSTANCE
        labelled = [(child_label(i, entry.cls.__name__), a) for i, (entry, a) in enumerate(zip(node.entries, answers), 1)]
        return combine(node.cls.__name__, fact, labelled)
    if fact in CONFIG_FACTS:
        answer = _vllm_config_fact(node, fact, transfer, inherit_role) if is_vllm_connector(node.cls) else (
            class_answer(node.cls, fact)
        )
        return int(cast("int", answer)) if fact == ACCESS and answer is not NEEDS_INSTANCE else answer
    if is_vllm_connector(node.cls):
        if fact == LAYOUT and vllm_config is not None:
            child = child_vllm_config(vllm_config, node, inherit_role=inherit_role)
            layout: object = node.cls.get_required_kvcache_layout(child)
            return layout
        if fact == PIECEWISE:
            piecewise: object = node.cls.requires_piecewise_for_cudagraph(dict(node.extra_config))
            return piecewise
        return NEEDS_INSTANCE
    return class_fact(node.cls, fact)


def _vllm_config_fact(
    node: ConfiguredConnector, fact: ConfigFact, transfer: KVTransferConfig | None, inherit_role: bool
) -> object:
    """A vLLM class's own answer for its own entry (vLLM's factory asks KV-cache access, with its
    per-name rules); a vLLM release without the member asks nothing: the base default."""
    if getattr(node.cls, fact, None) is None:
        return CONFIG_FACTS[fact]
    child = child_transfer_config(transfer, node, inherit_role=inherit_role)
    asked: Any = (getattr(_factory(), fact, None) if fact == ACCESS else None) or getattr(node.cls, fact)
    answer: object = asked(child)
    return answer


def _factory() -> Any:
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    return KVConnectorFactory
