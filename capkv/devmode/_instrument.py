"""``instrument``: put a connector — a stack's children included — under dev-mode contracts.

In production it returns the very same object, so nothing is wrapped and nothing costs.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from operator import itemgetter
from typing import Any, TypeVar, cast

from beartype import beartype

from capkv._homes import publish
from capkv.capabilities._hma import StackNode, describe
from capkv.contracts._arguments import require_instance
from capkv.contracts._connector import KVConnector
from capkv.contracts._spec import KVSpec
from capkv.devmode._hints import (
    block_groups_hint,
    kv_caches_hint,
    kv_layer_hint,
    single_group_hint,
)
from capkv.devmode._mode import enabled
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

    In production (dev mode off, and always under ``python -O``) nothing is wrapped and nothing costs. In dev
    mode the result is a proxy whose transfer calls are checked against ``spec`` by beartype before they reach
    the connector:

    - ``update_state_after_alloc`` and ``request_finished_all_groups``: block-id groups;
    - ``request_finished``: one group's ids, and only when the cache has one group;
    - ``register_kv_caches`` and ``save_kv_layer``: KV tensor shape, dtype and device
      (and ``register_kv_caches`` gets every layer the spec names, and no other).

    A composite (:class:`~capkv.StackNode`) is rebuilt over its instrumented children with its
    ``with_children`` method and then wrapped itself, so the engine's calls are checked at the top and each
    child's where the composite makes them.
    """
    require_instance(spec, KVSpec, "instrument", "spec", "a capkv.KVSpec")  # in production too: one isinstance
    if not enabled():
        return connector
    return cast(_C, _instrument(connector, spec, ()))


class Instrumented:
    """A connector under dev-mode contracts; ``__wrapped__`` is the connector itself.

    A checked method takes its arguments exactly as the connector's own method does: a call is bound against
    the connector's signature (read once, when instrumenting), so a keyword call the connector accepts is
    checked like a positional one, and a call the connector refuses fails with its own error.

    Everything else is the connector's own: other attributes are looked up on it (and set on it), and
    ``isinstance`` sees its class. The proxy keeps the connector's capabilities — it has a checked
    ``request_finished_all_groups`` exactly when the connector has one, so :func:`capkv.supports_hma` answers
    as before.
    """

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


_Hint = Callable[[KVSpec, str, str], object]
"""Builds a contract's beartype hint from the spec, the connector's label and the method name."""


def _checked(
    name: str, params: tuple[str, ...], checked: tuple[int, ...], hint: _Hint
) -> Callable[[_Method, KVSpec, str], _Method]:
    """How to build method ``name``, checked: its contract takes ``params`` and checks those at ``checked``.

    The checked value is the argument at the one position, or the tuple of
    arguments at several (a KV tensor is checked with its layer name).
    """
    arity = len(params)
    pick = cast("Callable[[Sequence[object]], object]", itemgetter(*checked))

    def build(method: _Method, spec: KVSpec, label: str) -> _Method:
        def check(value: object, /) -> None:
            """The check alone, as a function, so that beartype judges ``value`` against the hint."""

        gate = _beartyped(check, value=hint(spec, label, name))
        arguments = _Arguments(method, params)
        positional = arguments.take_positional

        def checked_method(self: object, /, *args: Any, **kwargs: Any) -> Any:
            if positional and not kwargs and len(args) == arity:  # how engines call: no binding needed
                gate(pick(args))
            else:
                found = arguments.find(args, kwargs)
                if found is not None:
                    gate(pick(found))
            return method(*args, **kwargs)

        checked_method.__name__ = checked_method.__qualname__ = name
        checked_method.__doc__ = getattr(method, "__doc__", None)
        return checked_method

    return build


class _Arguments:
    """Finds a call's contract arguments as the connector's own method will receive them.

    A call is bound against the method's signature (read once, here), so that
    a keyword call the connector accepts is checked like a positional one, and
    a call it refuses reaches it unchecked — to fail there, as without dev mode.
    """

    __slots__ = ("_declared", "_params", "_signature", "take_positional")

    def __init__(self, method: _Method, params: tuple[str, ...]) -> None:
        try:
            signature = inspect.signature(method)
        except (TypeError, ValueError):  # none to read (some builtins): assume the contract's, by position or name
            signature = inspect.Signature([
                *(inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD) for name in params),
                inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD),
            ])
        self._signature = signature
        self._params = params
        self._declared = [
            name for name, parameter in signature.parameters.items()
            if parameter.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
        ]
        self.take_positional = self._binds(*params)
        """Whether the method takes the contract's arguments by position, as engines pass them."""

    def _binds(self, *args: object) -> bool:
        try:
            self._signature.bind(*args)
        except TypeError:
            return False
        return True

    def find(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[object, ...] | None:
        """The contract's arguments in contract order; ``None`` if the call does not bind or leaves one out."""
        try:
            bound = self._signature.bind(*args, **kwargs)
        except TypeError:
            return None
        bound.apply_defaults()  # the connector sees a default as if it were passed
        found = list(bound.args[: len(self._params)])
        for index in range(len(found), len(self._params)):
            if index < len(self._declared):  # keyword-only in the connector's signature
                found.append(bound.arguments[self._declared[index]])
            elif self._params[index] in bound.kwargs:  # taken by **kwargs under the contract's name
                found.append(bound.kwargs[self._params[index]])
            else:
                return None
        return tuple(found)


_CONTRACTS: dict[str, tuple[tuple[str, ...], tuple[int, ...], _Hint]] = {
    "update_state_after_alloc": (
        ("request", "blocks", "num_external_tokens"), (1,),
        lambda spec, label, method: block_groups_hint(spec, connector=label, method=method, subject="blocks"),
    ),
    "request_finished": (
        ("request", "block_ids"), (1,),
        lambda spec, label, method: single_group_hint(spec, connector=label, method=method),
    ),
    "request_finished_all_groups": (
        ("request", "block_ids"), (1,),
        lambda spec, label, method: block_groups_hint(spec, connector=label, method=method),
    ),
    "register_kv_caches": (
        ("kv_caches",), (0,),
        lambda spec, label, method: kv_caches_hint(spec, connector=label, method=method),
    ),
    "save_kv_layer": (  # the tensor's shape depends on the layer, so the contract sees them as a pair
        ("layer_name", "kv_layer", "attn_metadata"), (0, 1),
        lambda spec, label, method: kv_layer_hint(spec, connector=label, method=method),
    ),
}
"""Each checked method's contract: its parameters (vLLM's names, in order), the positions checked, the hint."""

CHECKED_METHODS: dict[str, Callable[[_Method, KVSpec, str], _Method]] = {
    name: _checked(name, *contract) for name, contract in _CONTRACTS.items()
}
"""The transfer calls :func:`instrument` checks, and how it builds each checked method."""


publish(__name__)
