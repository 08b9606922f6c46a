"""Building a stack at run time: checking the children and choosing the class.

``MultiConnector(...)`` decides here what its overloads decide statically: the
stack is an instance of the HMA variant of the requested class exactly when
every child is HMA-capable (:func:`capkv.supports_hma`), so a non-HMA stack has
no ``request_finished_all_groups`` at all. ``capkv check`` uses the same
functions to name a configured stack before it is built.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from types import new_class
from typing import TYPE_CHECKING, Any, cast

from capkv.capabilities._facts import StaticFact
from capkv.capabilities._hma import StackNode, describe, explain_not_hma, non_hma_children, supports_hma
from capkv.composite._agreement import child_label
from capkv.composite._options import STACK_OPTIONS
from capkv.composite._runtime import StackRuntime
from capkv.contracts._connector import KVConnector, missing_members
from capkv.errors import ArgumentError, CapabilityError, ConfigError

if TYPE_CHECKING:
    from capkv.composite._multi import MultiConnector

__all__ = ["answers_by_agreement", "build_stack", "rebuild_stack", "stack_class"]

_HMA_VARIANTS: dict[type[Any], type[Any]] = {}


def build_stack(cls: type[Any], children: tuple[object, ...], init_kwargs: dict[str, Any]) -> Any:
    """A new, fresh stack of ``cls`` (or its HMA variant) over ``children``; ``__init__`` is not run."""
    name = cls.__name__
    if not children:
        raise CapabilityError(
            f"{name}() needs at least one sub-connector", connector=name, method="__new__", value=children
        )
    promote: object = init_kwargs.get("promote", False)
    if type(promote) is not bool:
        raise ArgumentError(
            f"{name}(promote={promote!r}): expected a bool", parameter="promote", value=promote,
            connector=name, method="__new__",
        )
    unknown = sorted(set(init_kwargs) - set(STACK_OPTIONS))
    if unknown and cls.__init__ is object.__init__:
        raise ConfigError(
            f"{name}() takes sub-connectors and promote= only, got keyword arguments {unknown}; a subclass "
            "that takes options of its own defines __init__(self, *children, **options)",
            connector=name,
            method="__new__",
            value=init_kwargs,
        )
    for position, child in enumerate(children, start=1):
        missing = missing_members(child)
        if missing:
            raise CapabilityError(
                f'{name}: sub-connector #{position} "{describe(child)}" is not a '
                f"KVConnector (missing {', '.join(missing)})",
                connector=f"#{position} {describe(child)}",
                method="__new__",
                value=child,
            )
    _refuse_shared_children(name, children)
    hma = all(supports_hma(child) for child in children)
    from capkv.composite._multi import HMAMultiConnector

    if not hma and issubclass(cls, HMAMultiConnector):
        offenders = explain_not_hma(non_hma_children(_Children(children)))
        raise CapabilityError(
            f"{name} needs every child to be HMA-capable: {offenders}",
            connector=name,
            method="__new__",
            value=children,
        )
    stack = cast("StackRuntime", object.__new__(stack_class(cls, children)))
    names = tuple(child_label(i, describe(c)) for i, c in enumerate(children, start=1))
    stack._setup(cast("tuple[KVConnector, ...]", children), names, hma, init_kwargs, promote=promote)  # pyright: ignore[reportPrivateUsage]
    return stack


def rebuild_stack(cls: type[Any], children: tuple[object, ...], init_kwargs: dict[str, Any]) -> Any:
    """How copies and unpickled stacks are made: built again, then given the state (``__setstate__``)."""
    return build_stack(cls, children, init_kwargs)


def declared_class(stack: StackRuntime) -> type[Any]:
    """The class a stack was asked to be (its HMA variant is an implementation detail)."""
    kind = type(stack)
    return cast("type[Any]", kind.__dict__.get("_declared", kind))


class _Children(StackNode):
    """A bare tuple of children, to reuse the stack walk in error messages."""

    __slots__ = ("_items",)

    def __init__(self, items: tuple[object, ...]) -> None:
        self._items = items

    @property
    def children(self) -> tuple[object, ...]:
        return self._items


def _refuse_shared_children(stack: str, children: tuple[object, ...]) -> None:
    """One connector object may sit at one place in a stack only.

    Its per-step state (bound metadata, planned saves) would be overwritten by
    its second position's calls, and the blocks it was to release would leak.
    """
    seen: dict[int, str] = {}
    pending: list[tuple[str, object]] = [(f"#{i}", c) for i, c in enumerate(children, start=1)]
    while pending:
        position, node = pending.pop(0)
        first = seen.setdefault(id(node), position)
        if first != position:
            raise ConfigError(
                f'{stack}: sub-connector {position} "{describe(node)}" is the same object as {first}; '
                "give each position its own connector",
                connector=f"{position} {describe(node)}",
                method="__new__",
                value=node,
            )
        if isinstance(node, StackNode):
            pending += [(f"{position}.{i}", c) for i, c in enumerate(node.children, start=1)]


def stack_class(cls: type[Any], children: Iterable[object]) -> type[Any]:
    """The class ``cls(*children)`` builds: a stack's HMA variant when every child is HMA-capable.

    ``children`` may be connectors, connector classes or stack nodes, so a stack
    read from configuration is named as the built one will be. A class that is
    not a :class:`~capkv.MultiConnector` builds itself.
    """
    if StackRuntime not in cls.__mro__:
        return cls
    return _hma_variant(cls) if all(supports_hma(child) for child in children) else cls


def answers_by_agreement(cls: type[Any], fact: StaticFact) -> bool:
    """Whether ``cls`` answers ``fact`` from its children by :mod:`capkv.composite._agreement`.

    True for :class:`~capkv.MultiConnector` and subclasses that keep its member; a
    subclass that overrides it has a rule of its own, which only an instance knows.
    """
    if not issubclass(cls, StackRuntime):
        return False
    member: object = inspect.getattr_static(cast("type[object]", cls), fact)
    return member is inspect.getattr_static(StackRuntime, fact)


def _hma_variant(cls: type[Any]) -> type[Any]:
    """The HMA class to build for ``cls``: itself, ``HMAMultiConnector``, or a cached mix-in of both."""
    from capkv.composite._multi import HMAMultiConnector, MultiConnector

    if HMAMultiConnector in cls.__mro__:
        return cls
    if cls is MultiConnector:
        return HMAMultiConnector
    variant = _HMA_VARIANTS.get(cls)
    if variant is None:
        stack = cast("type[MultiConnector[Any]]", cls)

        def body(namespace: dict[str, Any]) -> None:
            namespace.update(
                __slots__=(), __module__=cls.__module__, __qualname__=cls.__qualname__, _declared=cls
            )

        variant = new_class(cls.__name__, (stack, HMAMultiConnector), exec_body=body)
        _HMA_VARIANTS[cls] = variant
    return variant
