"""Building a stack at run time: checking the children and choosing the class.

``MultiConnector(...)`` decides here what its overloads decide statically, so a non-HMA stack has no
``request_finished_all_groups`` at all; ``capkv check`` names a configured stack with the same functions.
"""

from __future__ import annotations

import copyreg
import inspect
from collections.abc import Callable, Iterable
from types import new_class
from typing import Any, cast

from capkv.capabilities._facts import StaticFact
from capkv.capabilities._hma import StackNode, describe, explain_not_hma, non_hma_children, supports_hma
from capkv.composite._agreement import child_label
from capkv.composite._options import STACK_OPTIONS
from capkv.composite._runtime import StackRuntime
from capkv.contracts._connector import KVConnector, missing_members
from capkv.errors import ArgumentError, CapabilityError, ConfigError

__all__ = ["HMAVariant", "answers_by_agreement", "build_stack", "declared_class", "stack_class"]

VARIANT_ATTRIBUTE = "_hma_class"
"""The class attribute (an :class:`HMAVariant`) that names a stack class's HMA variant."""


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
    if not hma and _hma_class(cls) is cls:
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


def declared_class(stack: StackRuntime) -> type[Any]:
    """The class a stack was asked to be (its HMA variant is an implementation detail)."""
    return declared_class_of(type(stack))


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
    return _hma_class(cls) if all(supports_hma(child) for child in children) else cls


def answers_by_agreement(cls: type[Any], fact: StaticFact) -> bool:
    """Whether ``cls`` answers ``fact`` from its children by :mod:`capkv.composite._agreement`.

    True for :class:`~capkv.MultiConnector` and subclasses that keep its member; a
    subclass that overrides it has a rule of its own, which only an instance knows.
    """
    if not issubclass(cls, StackRuntime):
        return False
    member: object = inspect.getattr_static(cast("type[object]", cls), fact)
    return member is inspect.getattr_static(StackRuntime, fact)


def _hma_class(cls: type[Any]) -> type[Any]:
    return cast("type[Any]", getattr(cls, VARIANT_ATTRIBUTE))


class HMAVariant:
    """Class attribute of a stack class: the class its stacks are when every child is HMA-capable.

    That is the class itself when it is HMA already, ``hma`` for ``plain``, and for
    any other subclass a cached mix-in of the subclass and ``hma``.
    """

    def __init__(self, plain: type[Any], hma: type[Any]) -> None:
        self._plain = plain
        self._hma = hma
        self._variants: dict[type[Any], type[Any]] = {}

    def __get__(self, instance: object, owner: type[Any]) -> type[Any]:
        if issubclass(owner, self._hma):
            return owner
        if owner is self._plain:
            return self._hma
        variant = self._variants.get(owner)
        if variant is None:
            variant = self._variants[owner] = self._mix(owner)
        return variant

    def _mix(self, cls: type[Any]) -> type[Any]:
        def body(namespace: dict[str, Any]) -> None:
            namespace.update(__slots__=(), __module__=cls.__module__, __qualname__=cls.__qualname__, _declared=cls)

        meta = _variant_metaclass(type(cls))
        return new_class(cls.__name__, (cls, self._hma), {"metaclass": meta}, body)


_VARIANT_METACLASSES: dict[type[Any], type[Any]] = {}


def _variant_metaclass(meta: type[Any]) -> type[Any]:
    """A metaclass for variants of classes of ``meta``, whose classes pickle by reference to their declared class.

    A variant shares its declared class's module and name, so pickle's lookup by
    name would find the declared class instead; its own metaclass gets a reducer.
    """
    known = _VARIANT_METACLASSES.get(meta)
    if known is not None:
        return known
    variant_meta: type[Any] = type(f"HMAVariantOf{meta.__name__}", (meta,), {"__module__": __name__})
    _VARIANT_METACLASSES[meta] = variant_meta
    copyreg.pickle(variant_meta, _reduce_variant)
    return variant_meta


def _reduce_variant(variant: Any) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    return (getattr, (declared_class_of(variant), VARIANT_ATTRIBUTE))


def declared_class_of(kind: type[Any]) -> type[Any]:
    """The class a stack class was asked to be (a variant's declared class; else itself)."""
    return cast("type[Any]", kind.__dict__.get("_declared", kind))
