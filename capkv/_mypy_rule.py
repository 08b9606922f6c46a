"""The stack rule on mypy's types: what a ``MultiConnector(...)`` call is, and why it is not HMA-capable.

The composite's overloads and :func:`capkv.supports_hma` asked of types; nothing here reports, so each answer
is a plain function of the types.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeGuard

from mypy.maptype import map_instance_to_supertype
from mypy.nodes import SymbolTableNode, TypeInfo
from mypy.subtypes import is_subtype
from mypy.types import AnyType, Instance, ProperType, Type, TypeOfAny, TypeVarType, UnpackType, get_proper_type

from capkv.capabilities._hma import WRAPPER_MARK, NonHMAChild

__all__ = ["CONNECTOR", "HMA_STACK", "STACK", "StackRule", "has_unpack", "is_plain_stack", "type_name"]

STACK = "capkv.composite._multi.MultiConnector"
HMA_STACK = "capkv.composite._multi.HMAMultiConnector"
CONNECTOR = "capkv.contracts._connector.KVConnector"
HMA_CONNECTOR = "capkv.contracts._connector.HMAConnector"
_ITERABLE = "typing.Iterable"
_TUPLE = "builtins.tuple"


class StackRule:
    """The rule, for one mypy build: classes looked up once, protocol checks memoised.

    A child is a connector when it satisfies ``KVConnector``, HMA-capable when it satisfies ``HMAConnector``
    (``Any`` proves nothing); a stack is HMA-capable exactly when every child is. Reporting and hooking are
    :mod:`capkv.mypy`'s.
    """

    def __init__(self, lookup: Callable[[str], SymbolTableNode | None]) -> None:
        self._lookup = lookup
        self._stack_classes: dict[str, bool] = {}
        self._infos: dict[str, TypeInfo] = {}
        self._capabilities: dict[Type, tuple[bool, bool]] = {}  # type -> (connector, HMA)
        self._demands: dict[Type, bool] = {}  # expected type -> whether it wants an HMA stack

    def is_stack_class(self, fullname: str) -> bool:
        """Whether ``fullname`` is ``MultiConnector`` or a subclass."""
        known = self._stack_classes.get(fullname)
        if known is None:
            symbol = self._lookup(fullname)
            node = symbol.node if symbol is not None else None
            known = isinstance(node, TypeInfo) and node.has_base(STACK)
            self._stack_classes[fullname] = known
        return known

    def info(self, fullname: str) -> TypeInfo:
        info = self._infos.get(fullname)
        if info is None:
            symbol = self._lookup(fullname)
            node = symbol.node if symbol is not None else None
            if not isinstance(node, TypeInfo):  # a stack was built, so capkv is analysed
                raise LookupError(f"capkv.mypy: {fullname} is not a class known to mypy")
            info = self._infos[fullname] = node
        return info

    def protocol(self, fullname: str) -> Instance:
        """``KVConnector[Any]`` or ``HMAConnector[Any]``."""
        return Instance(self.info(fullname), [AnyType(TypeOfAny.special_form)])

    def is_connector(self, typ: Type) -> bool:
        return self._capability(typ)[0]

    def is_hma(self, typ: Type) -> bool:
        """The static rule: an HMAConnector. ``Any`` proves nothing, so it is not."""
        return self._capability(typ)[1]

    def _capability(self, typ: Type) -> tuple[bool, bool]:
        """(is a KVConnector, is an HMAConnector), memoised: protocol checks are costly."""
        proper = get_proper_type(typ)
        if isinstance(proper, AnyType):
            return True, False
        if isinstance(proper, Instance) and proper.type.fullname in (STACK, HMA_STACK):
            return True, proper.type.fullname == HMA_STACK  # the composite's own rule
        known = self._capabilities.get(proper)
        if known is None:
            hma = is_subtype(proper, self.protocol(HMA_CONNECTOR))
            known = self._capabilities[proper] = (hma or is_subtype(proper, self.protocol(CONNECTOR)), hma)
        return known

    def stack(self, children: Sequence[Type], *, hma: bool) -> Instance:
        """The stack type over exactly these children."""
        return Instance(self.info(HMA_STACK if hma else STACK), list(children))

    def any_arity_stack(self, *, hma: bool) -> Instance:
        """``MultiConnector[*tuple[Any, ...]]`` (or the HMA one): children unknown in number."""
        anything = Instance(self.info(_TUPLE), [AnyType(TypeOfAny.special_form)])
        return self.stack([UnpackType(anything)], hma=hma)

    def element_type(self, iterable: ProperType) -> Type | None:
        """What ``*iterable`` passes, or ``None`` when it is not an iterable mypy can see into."""
        if isinstance(iterable, AnyType):
            return iterable
        if isinstance(iterable, Instance) and iterable.type.has_base(_ITERABLE):
            return map_instance_to_supertype(iterable, self.info(_ITERABLE)).args[0]
        return None

    def offenders(self, children: Sequence[Type], path: tuple[int, ...] = ()) -> list[NonHMAChild]:
        """Every non-HMA leaf below ``children``, by position — the runtime walk, on types."""
        found: list[NonHMAChild] = []
        for index, child in enumerate(children, start=1):
            where = (*path, index)
            proper = get_proper_type(child)
            if isinstance(proper, AnyType):
                found.append(NonHMAChild(where, "Any", known=False))
            elif self.is_hma(proper):
                continue
            elif is_plain_stack(proper) and not has_unpack(proper.args):
                found.extend(self.offenders(proper.args, where) or [NonHMAChild(where, proper.type.name)])
            else:
                found.append(NonHMAChild(where, type_name(proper)))
        return found

    def requires_hma(self, context: Type | None, children: Sequence[Type] | None) -> bool:
        """Whether the expected type admits the HMA stack but not the plain one.

        A type variable's bound is not treated as a requirement: inside another
        stack's overloads it is only a trial, and there mypy's own error stands.
        """
        expected = get_proper_type(context) if context is not None else None
        if expected is None or isinstance(expected, (AnyType, TypeVarType)):
            return False
        if children is None:
            known = self._demands.get(expected)
            if known is None:
                hma, plain = self.any_arity_stack(hma=True), self.any_arity_stack(hma=False)
                known = self._demands[expected] = is_subtype(hma, expected) and not is_subtype(plain, expected)
            return known
        hma, plain = self.stack(children, hma=True), self.stack(children, hma=False)
        return is_subtype(hma, expected) and not is_subtype(plain, expected)


def is_plain_stack(typ: ProperType) -> TypeGuard[Instance]:
    return isinstance(typ, Instance) and typ.type.has_base(STACK) and not typ.type.has_base(HMA_STACK)


def has_unpack(types: Sequence[Type]) -> bool:
    return any(isinstance(t, UnpackType) for t in types)


def type_name(typ: ProperType) -> str:
    """How a child's type is named in an explanation: its class, else mypy's spelling."""
    if isinstance(typ, Instance):
        if typ.args and typ.type.get(WRAPPER_MARK) is not None:  # an adapter: name what it wraps
            return type_name(get_proper_type(typ.args[0]))
        return typ.type.name
    if isinstance(typ, TypeVarType):
        return typ.name
    return str(typ)
