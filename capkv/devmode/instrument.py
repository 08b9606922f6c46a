"""``instrument``: put a connector — a stack's children included — under dev-mode contracts.

In production (dev mode off, and always under ``python -O``) :func:`instrument`
returns the very same object: nothing is wrapped and nothing costs. In dev mode
it returns a proxy whose transfer calls are checked against the engine's
:class:`~capkv.KVSpec` by beartype before they reach the connector:

- ``update_state_after_alloc`` and ``request_finished_all_groups``: block-id groups;
- ``request_finished``: one group's ids, and only when the cache has one group;
- ``register_kv_caches`` and ``save_kv_layer``: KV tensor shape, dtype and device.

Everything else is the connector's own: other attributes are looked up on it
(and set on it), and ``isinstance`` sees its class. The proxy keeps the
connector's capabilities — it has a checked ``request_finished_all_groups``
exactly when the connector has one, so :func:`capkv.supports_hma` answers as
before. A composite (:class:`~capkv.StackNode`) is rebuilt over its instrumented
children with its ``with_children`` method and then wrapped itself, so the
engine's calls are checked at the top and each child's where the composite makes them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, cast

from beartype import beartype

from capkv.capabilities.hma import StackNode, describe
from capkv.contracts.connector import KVConnector
from capkv.contracts.spec import KVSpec
from capkv.devmode.hints import (
    block_groups_hint,
    kv_caches_hint,
    kv_layer_hint,
    single_group_hint,
)
from capkv.devmode.mode import enabled
from capkv.errors import CapabilityError, ConfigError

__all__ = ["CHECKED_METHODS", "Instrumented", "instrument"]

_C = TypeVar("_C", bound=KVConnector)
_Method = Callable[..., Any]


def instrument(connector: _C, spec: KVSpec) -> _C:
    """``connector`` under dev-mode contracts for ``spec`` — or, in production, ``connector`` itself.

    Dev mode is read here, once (:func:`capkv.devmode.enabled`). Instrumenting an
    instrumented connector again re-binds it to ``spec``. Raises
    :class:`~capkv.CapabilityError` for a composite that cannot be rebuilt over
    new children (no ``with_children``), rather than leaving its children unchecked.
    """
    if not enabled():
        return connector
    return cast(_C, _instrument(connector, spec, ()))


class Instrumented:
    """A connector under dev-mode contracts; ``__wrapped__`` is the connector itself."""

    __slots__ = ("__wrapped__", "_spec")

    __wrapped__: object
    _spec: KVSpec

    def __init__(self, connector: object, spec: KVSpec) -> None:
        object.__setattr__(self, "__wrapped__", connector)
        object.__setattr__(self, "_spec", spec)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__wrapped__, name)

    def __setattr__(self, name: str, value: object) -> None:
        setattr(self.__wrapped__, name, value)

    def __delattr__(self, name: str) -> None:
        delattr(self.__wrapped__, name)

    def __dir__(self) -> list[str]:
        return sorted({*dir(self.__wrapped__), *type(self).__dict__})

    def __repr__(self) -> str:
        return f"instrument({self.__wrapped__!r})"


def _instrument(node: object, spec: KVSpec, path: tuple[int, ...]) -> object:
    if isinstance(node, Instrumented):
        if node._spec == spec:  # pyright: ignore[reportPrivateUsage]
            return node
        node = node.__wrapped__
    if isinstance(node, type):
        raise ConfigError(
            f"instrument needs a connector instance, got the class {node.__name__}",
            connector=node.__name__, method="instrument", value=node,
        )
    if isinstance(node, StackNode):
        node = _rebuild(node, spec, path)
    label = describe(node) if not path else f"#{'.'.join(map(str, path))} {describe(node)}"
    return _wrap(node, spec, label)


def _rebuild(node: StackNode, spec: KVSpec, path: tuple[int, ...]) -> object:
    """A fresh composite over the instrumented children."""
    rebuild: object = getattr(node, "with_children", None)
    if not callable(rebuild):
        raise CapabilityError(
            f'instrument: "{describe(node)}" is a StackNode without with_children(*children), so its '
            "children cannot be instrumented; give it a with_children method that returns a fresh "
            f"{describe(node)} over the given children",
            connector=describe(node), method="instrument", value=node,
        )
    children = [_instrument(child, spec, (*path, index)) for index, child in enumerate(node.children, start=1)]
    return rebuild(*children)


def _wrap(connector: object, spec: KVSpec, label: str) -> Instrumented:
    cls = type(connector)
    namespace: dict[str, object] = {
        "__slots__": (),
        "__module__": cls.__module__,
        "__qualname__": cls.__qualname__,
        "__doc__": Instrumented.__doc__,
        "__class__": property(lambda self: cls),
    }
    for name, checked in CHECKED_METHODS.items():
        method: object = getattr(connector, name, None)
        if callable(method):
            namespace[name] = checked(cast(_Method, method), spec, label)
    proxy = type(cls.__name__, (Instrumented,), namespace)
    return cast(Instrumented, proxy(connector, spec))


def _beartyped(func: _Method, **hints: object) -> _Method:
    """``func`` checked by beartype against ``hints`` (its own annotations are replaced)."""
    func.__annotations__ = dict(hints)
    return beartype(func)


def _update_state_after_alloc(method: _Method, spec: KVSpec, label: str) -> _Method:
    def update_state_after_alloc(self: object, request: object, blocks: object, num_external_tokens: object, /) -> Any:
        return method(request, blocks, num_external_tokens)

    hint = block_groups_hint(spec, connector=label, method="update_state_after_alloc", subject="blocks")
    return _beartyped(update_state_after_alloc, blocks=hint)


def _request_finished_all_groups(method: _Method, spec: KVSpec, label: str) -> _Method:
    def request_finished_all_groups(self: object, request: object, block_ids: object, /) -> Any:
        return method(request, block_ids)

    hint = block_groups_hint(spec, connector=label, method="request_finished_all_groups")
    return _beartyped(request_finished_all_groups, block_ids=hint)


def _request_finished(method: _Method, spec: KVSpec, label: str) -> _Method:
    def request_finished(self: object, request: object, block_ids: object, /) -> Any:
        return method(request, block_ids)

    return _beartyped(request_finished, block_ids=single_group_hint(spec, connector=label, method="request_finished"))


def _register_kv_caches(method: _Method, spec: KVSpec, label: str) -> _Method:
    def register_kv_caches(self: object, kv_caches: object, /) -> Any:
        return method(kv_caches)

    return _beartyped(register_kv_caches, kv_caches=kv_caches_hint(spec, connector=label, method="register_kv_caches"))


def _save_kv_layer(method: _Method, spec: KVSpec, label: str) -> _Method:
    def check(layer: object, /) -> None:
        """The tensor's shape depends on the layer, so the contract sees them as a pair."""

    gate = _beartyped(check, layer=kv_layer_hint(spec, connector=label, method="save_kv_layer"))

    def save_kv_layer(self: object, layer_name: object, kv_layer: object, attn_metadata: object, **kwargs: Any) -> Any:
        gate((layer_name, kv_layer))
        return method(layer_name, kv_layer, attn_metadata, **kwargs)

    return save_kv_layer


CHECKED_METHODS: dict[str, Callable[[_Method, KVSpec, str], _Method]] = {
    "update_state_after_alloc": _update_state_after_alloc,
    "request_finished": _request_finished,
    "request_finished_all_groups": _request_finished_all_groups,
    "register_kv_caches": _register_kv_caches,
    "save_kv_layer": _save_kv_layer,
}
"""The transfer calls :func:`instrument` checks, and how it builds each checked method."""
