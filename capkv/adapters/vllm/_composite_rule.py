"""A vLLM member capkv does not know, answered by the installed vLLM's own composite rule over the leaves.

vLLM's ``MultiConnector`` defines, in the release that adds a member, how the children's answers combine;
applying that definition to the stack's leaves gives vLLM's answer on the day the release ships.
"""

from __future__ import annotations

import copy
import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any, cast

from vllm.config import VllmConfig
from vllm.config.kv_transfer import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.v1.multi_connector import MultiConnector as VllmMultiConnector

from capkv.adapters.vllm._stack import child_entry, is_vllm_connector
from capkv.adapters.vllm._stand_ins import MODULE, stand_in, stand_in_name
from capkv.adapters.vllm._vllm_calls import leaves, wrapped_vllm
from capkv.config._loader import ConfiguredConnector, ConfiguredNode, ConfiguredStack

__all__ = ["composite_rule", "leaves_transfer_config"]


def composite_rule(name: str, cls: type[Any]) -> object | None:
    """``cls``'s member ``name`` by vLLM's ``MultiConnector`` definition of it; ``None`` where vLLM's
    composite leaves the member to its base class (or defines it in a way with no leaves to apply to)."""
    rule: object = vars(VllmMultiConnector).get(name)
    made: Any
    if isinstance(rule, classmethod | staticmethod):
        func: Callable[..., Any] = cast("Any", rule).__func__
        static = isinstance(rule, staticmethod)

        def by_class(host: type[Any], *args: Any, **kwargs: Any) -> Any:
            args = tuple(_as_leaves(host, value) for value in args)
            kwargs = {key: _as_leaves(host, value) for key, value in kwargs.items()}
            return func(*args, **kwargs) if static else func(VllmMultiConnector, *args, **kwargs)

        made = classmethod(_named(by_class, func, name, cls))
    elif isinstance(rule, property) and rule.fget is not None:
        getter: Callable[[Any], Any] = rule.fget

        def by_property(self: Any) -> Any:
            return getter(_LeavesView(self))

        made = property(_named(by_property, getter, name, cls))
    elif inspect.isfunction(rule):
        method = cast("Callable[..., Any]", rule)

        def by_instance(self: Any, *args: Any, **kwargs: Any) -> Any:
            return method(_LeavesView(self), *args, **kwargs)

        made = _named(by_instance, method, name, cls)
    else:
        return None
    answered: object = made
    return answered


def _named(function: Callable[..., Any], rule: Callable[..., Any], name: str, cls: type[Any]) -> Callable[..., Any]:
    functools.update_wrapper(function, rule)
    function.__qualname__ = f"{cls.__qualname__}.{name}"
    function.__module__ = cls.__module__
    return function


def _as_leaves(host: type[Any], value: object) -> object:
    """An argument vLLM passed the host class, with the hosted stack spelt as vLLM's leaf entries."""
    if isinstance(value, KVTransferConfig):
        return leaves_transfer_config(host, value)
    if isinstance(value, VllmConfig) and value.kv_transfer_config is not None:
        config = copy.copy(value)
        config.kv_transfer_config = leaves_transfer_config(host, value.kv_transfer_config)
        return config
    if isinstance(value, Mapping):  # an extra config (``requires_piecewise_for_cudagraph``'s kind)
        transfer = KVTransferConfig(kv_connector="MultiConnector", kv_role="kv_both",
                                    kv_connector_extra_config=dict(cast("Mapping[str, Any]", value)))
        return leaves_transfer_config(host, transfer).kv_connector_extra_config
    return value


def leaves_transfer_config(host: type[Any], transfer: KVTransferConfig) -> KVTransferConfig:
    """``transfer`` (the host's) as vLLM's ``MultiConnector`` config over the hosted stack's leaves."""
    configured: ConfiguredNode | None = host._configured(transfer.kv_connector_extra_config)
    inherit: bool = host.INHERIT_ROLE
    entries = [_entry(transfer, leaf, inherit) for leaf in _configured_leaves(configured)]
    return KVTransferConfig(
        kv_connector="MultiConnector", engine_id=transfer.engine_id, kv_role=transfer.kv_role or "kv_both",
        kv_connector_extra_config={"connectors": entries},
    )


def _entry(transfer: KVTransferConfig, leaf: ConfiguredConnector, inherit: bool) -> dict[str, Any]:
    if is_vllm_connector(leaf.cls):
        return child_entry(transfer, leaf, inherit_role=inherit)
    role: object = leaf.entry.get("kv_role") or transfer.kv_role or "kv_both"
    return {"kv_connector": stand_in_name(leaf.cls), "kv_connector_module_path": MODULE, "kv_role": role,
            "kv_connector_extra_config": dict(leaf.extra_config)}


def _configured_leaves(node: ConfiguredNode | None) -> list[ConfiguredConnector]:
    if isinstance(node, ConfiguredStack):
        return [leaf for entry in node.entries for leaf in _configured_leaves(entry)]
    return [] if node is None else [node]


class _LeavesView:
    """A host as vLLM's composite sees itself: its built leaves as ``_connectors``; anything else, the host's."""

    def __init__(self, host: Any) -> None:
        built: object = host._built
        state = cast("dict[str, Any]", vars(host))
        cached: tuple[object, list[object]] | None = state.get("_capkv_leaves")
        if cached is None or cached[0] is not built:
            cached = (built, [_as_vllm(host, leaf) for leaf in leaves(built)])
            state["_capkv_leaves"] = cached
        self._host: object = host
        self._connectors: list[object] = cached[1]

    @property
    def sub_connectors(self) -> list[object]:
        return list(self._connectors)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._host, name)


def _as_vllm(host: Any, leaf: object) -> object:
    found = wrapped_vllm(leaf)
    if found is not None:
        return found
    return stand_in(leaf, host._vllm_config, host._role, host._kv_cache_config)
