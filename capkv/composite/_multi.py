"""``MultiConnector``: the typed front of a stack, whose capabilities are inferred from its children.

HMA-capable exactly when every child is, in its static type and at run time alike, so structural checks agree
with the types (docs/internals.md, "The composite").
"""

from __future__ import annotations

from typing import Any, Generic, cast, overload

from typing_extensions import Self, TypeVar, TypeVarTuple, Unpack

from capkv._homes import publish
from capkv.composite._building import VARIANT_ATTRIBUTE, HMAVariant, build_stack, declared_class
from capkv.composite._finish import FinishResult
from capkv.composite._runtime import StackRuntime
from capkv.contracts._connector import HMAConnector, KVConnector
from capkv.contracts._engine import BlockIds, Request

__all__ = ["HMAMultiConnector", "MultiConnector"]

_Ts = TypeVarTuple("_Ts")
_H1 = TypeVar("_H1", bound=HMAConnector)
_H2 = TypeVar("_H2", bound=HMAConnector)
_H3 = TypeVar("_H3", bound=HMAConnector)
_H4 = TypeVar("_H4", bound=HMAConnector)
_H5 = TypeVar("_H5", bound=HMAConnector)
_H6 = TypeVar("_H6", bound=HMAConnector)
_H7 = TypeVar("_H7", bound=HMAConnector)
_H8 = TypeVar("_H8", bound=HMAConnector)
_C1 = TypeVar("_C1", bound=KVConnector)
_C2 = TypeVar("_C2", bound=KVConnector)
_C3 = TypeVar("_C3", bound=KVConnector)
_C4 = TypeVar("_C4", bound=KVConnector)
_C5 = TypeVar("_C5", bound=KVConnector)
_C6 = TypeVar("_C6", bound=KVConnector)
_C7 = TypeVar("_C7", bound=KVConnector)
_C8 = TypeVar("_C8", bound=KVConnector)


class MultiConnector(StackRuntime, Generic[Unpack[_Ts]]):
    """A stack of connectors: hits add up across children (each loads its own slice), saves go to all."""

    __slots__ = ()

    @overload
    def __new__(cls, c1: _H1, /, *, promote: bool = ...) -> HMAMultiConnector[_H1]: ...
    @overload
    def __new__(cls, c1: _H1, c2: _H2, /, *, promote: bool = ...) -> HMAMultiConnector[_H1, _H2]: ...
    @overload
    def __new__(cls, c1: _H1, c2: _H2, c3: _H3, /, *, promote: bool = ...) -> HMAMultiConnector[_H1, _H2, _H3]: ...
    @overload
    def __new__(cls, c1: _H1, c2: _H2, c3: _H3, c4: _H4, /, *, promote: bool = ...) -> HMAMultiConnector[_H1, _H2, _H3, _H4]: ...
    @overload
    def __new__(cls, c1: _H1, c2: _H2, c3: _H3, c4: _H4, c5: _H5, /, *, promote: bool = ...) -> HMAMultiConnector[_H1, _H2, _H3, _H4, _H5]: ...
    @overload
    def __new__(cls, c1: _H1, c2: _H2, c3: _H3, c4: _H4, c5: _H5, c6: _H6, /, *, promote: bool = ...) -> HMAMultiConnector[_H1, _H2, _H3, _H4, _H5, _H6]: ...
    @overload
    def __new__(cls, c1: _H1, c2: _H2, c3: _H3, c4: _H4, c5: _H5, c6: _H6, c7: _H7, /, *, promote: bool = ...) -> HMAMultiConnector[_H1, _H2, _H3, _H4, _H5, _H6, _H7]: ...
    @overload
    def __new__(cls, c1: _H1, c2: _H2, c3: _H3, c4: _H4, c5: _H5, c6: _H6, c7: _H7, c8: _H8, /, *, promote: bool = ...) -> HMAMultiConnector[_H1, _H2, _H3, _H4, _H5, _H6, _H7, _H8]: ...
    @overload
    def __new__(cls, c1: _C1, /, *, promote: bool = ...) -> MultiConnector[_C1]: ...
    @overload
    def __new__(cls, c1: _C1, c2: _C2, /, *, promote: bool = ...) -> MultiConnector[_C1, _C2]: ...
    @overload
    def __new__(cls, c1: _C1, c2: _C2, c3: _C3, /, *, promote: bool = ...) -> MultiConnector[_C1, _C2, _C3]: ...
    @overload
    def __new__(cls, c1: _C1, c2: _C2, c3: _C3, c4: _C4, /, *, promote: bool = ...) -> MultiConnector[_C1, _C2, _C3, _C4]: ...
    @overload
    def __new__(cls, c1: _C1, c2: _C2, c3: _C3, c4: _C4, c5: _C5, /, *, promote: bool = ...) -> MultiConnector[_C1, _C2, _C3, _C4, _C5]: ...
    @overload
    def __new__(cls, c1: _C1, c2: _C2, c3: _C3, c4: _C4, c5: _C5, c6: _C6, /, *, promote: bool = ...) -> MultiConnector[_C1, _C2, _C3, _C4, _C5, _C6]: ...
    @overload
    def __new__(cls, c1: _C1, c2: _C2, c3: _C3, c4: _C4, c5: _C5, c6: _C6, c7: _C7, /, *, promote: bool = ...) -> MultiConnector[_C1, _C2, _C3, _C4, _C5, _C6, _C7]: ...
    @overload
    def __new__(cls, c1: _C1, c2: _C2, c3: _C3, c4: _C4, c5: _C5, c6: _C6, c7: _C7, c8: _C8, /, *, promote: bool = ...) -> MultiConnector[_C1, _C2, _C3, _C4, _C5, _C6, _C7, _C8]: ...
    @overload
    def __new__(
        cls, first: HMAConnector, /, *rest: HMAConnector, promote: bool = ...
    ) -> HMAMultiConnector[Unpack[tuple[Any, ...]]]: ...
    @overload
    def __new__(
        cls, first: KVConnector, /, *rest: KVConnector, promote: bool = ...
    ) -> MultiConnector[Unpack[tuple[Any, ...]]]: ...
    @overload
    def __new__(cls, first: KVConnector, /, *rest: KVConnector, **options: Any) -> Self: ...
    def __new__(cls, /, *children: object, **options: Any) -> Any:
        """Build the stack; its class (plain or HMA) is decided here, from the children.

        ``promote=True``: blocks a later child loads are saved by the earlier children too, so
        the fast tiers warm up (off by default). Other ``options`` are a subclass's own keyword
        arguments: they go to its ``__init__`` (which receives ``promote`` too, when given).
        """
        # ``object``: the children are checked at run time, with a CapabilityError that names
        # the offender — also in dev mode, where beartype would otherwise refuse them first.
        return build_stack(cls, children, options)

    @property
    def children(self) -> tuple[Unpack[_Ts]]:
        """The sub-connectors, in stack order."""
        return cast("tuple[Unpack[_Ts]]", self._children)

    def with_children(self, first: KVConnector, /, *rest: KVConnector) -> MultiConnector[Unpack[tuple[Any, ...]]]:
        """A fresh stack of this class, with this stack's options, over new children — e.g. these, instrumented.

        Nothing of this stack's state is carried over, so do it before serving.
        """
        stack: MultiConnector[Unpack[tuple[Any, ...]]] = declared_class(self)(first, *rest, **self._init_kwargs)
        stack._alignment = self._alignment  # configuration (the engine's KV cache), not state
        stack._spec = self._spec
        return stack

    def __reduce__(self) -> tuple[object, ...]:
        """Copies and pickles: the same class, children and options, then this stack's state.

        The pickle names the stack's public class (``capkv.MultiConnector``, or yours) and its
        :meth:`_rebuilt`, so it loads wherever capkv keeps its implementation.
        """
        return (declared_class(self)._rebuilt, (self._children, self._init_kwargs), self.__getstate__())

    @classmethod
    def _rebuilt(cls, children: tuple[object, ...], init_kwargs: dict[str, Any]) -> Any:
        """A copied or unpickled stack: built again over the children, then given the state (``__setstate__``)."""
        return build_stack(cls, children, init_kwargs)

    def __reduce_ex__(self, protocol: Any, /) -> tuple[object, ...]:
        return self.__reduce__()


class HMAMultiConnector(MultiConnector[Unpack[_Ts]]):
    """A stack whose every child is HMA-capable, so the stack is too."""

    __slots__ = ()

    def request_finished_all_groups(self, request: Request, block_ids: BlockIds, /) -> FinishResult:
        """Every child gets every group; the same aggregation as ``request_finished``."""
        return self._finish(request, self._hma_finishers, block_ids, "request_finished_all_groups")


setattr(MultiConnector, VARIANT_ATTRIBUTE, HMAVariant(MultiConnector, HMAMultiConnector))


publish(__name__)
