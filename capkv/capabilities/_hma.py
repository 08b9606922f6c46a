"""The one rule for HMA capability, shared by runtime checks and stack analysis.

:class:`~capkv.MultiConnector`'s static types encode the same rule; this is its runtime form.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import ClassVar

from capkv._homes import publish
from capkv.capabilities._table import HMA_METHOD, fold

__all__ = [
    "HMA_METHOD",
    "HMA_RULE",
    "NonHMAChild",
    "WRAPPER_MARK",
    "StackNode",
    "class_finishes_all_groups",
    "explain_not_hma",
    "non_hma_children",
    "supports_hma",
]

HMA_RULE = "an HMA stack needs every child to"
"""How every explanation of a non-HMA stack ends (runtime checks, ``capkv check``, the mypy plugin)."""


class StackNode(ABC):
    """A node whose capabilities are inferred from its children.

    :class:`~capkv.MultiConnector` is one; a stack read from configuration is
    another. Subclass (or ``register``) it to make your own composite visible to
    :func:`supports_hma`, :func:`~capkv.check_stack` and ``capkv check``.
    """

    __slots__ = ()

    hma_by_children: ClassVar[bool] = False
    """True for composites built with ``request_finished_all_groups`` exactly when every
    child has it (:class:`~capkv.MultiConnector`); others must define it themselves."""

    @property
    def finishes_all_groups(self) -> bool:
        """Whether the composite itself can be handed every group (its children aside).

        A composite connector answers for its own class; a description of a stack
        (a configured stack) overrides this to answer for the class it will build.
        """
        return class_finishes_all_groups(type(self)) or callable(getattr(self, HMA_METHOD, None))

    @property
    @abstractmethod
    def children(self) -> tuple[object, ...]:
        """The children, in stack order (connectors, connector classes, or nodes)."""

    @property
    def node_name(self) -> str:
        """How the node is named in diagnostics."""
        return type(self).__name__


def supports_hma(connector: object) -> bool:
    """Whether ``connector`` (an instance, a class, or a stack node) handles several KV-cache groups.

    A leaf connector (or connector class) is HMA-capable when it has a callable
    ``request_finished_all_groups``: that is all vLLM's scheduler and :class:`~capkv.SupportsHMA` look at. A
    stack node — a composite connector or a configured stack — is HMA-capable exactly when every child is
    *and* the composite itself finishes all groups (the scheduler calls the composite's own member, not its
    children's).
    """
    if isinstance(connector, StackNode):
        return connector.finishes_all_groups and fold(HMA_METHOD, (supports_hma(child) for child in connector.children))
    return callable(getattr(connector, HMA_METHOD, None))


def class_finishes_all_groups(cls: type[object]) -> bool:
    """Whether instances of composite class ``cls`` get ``request_finished_all_groups`` when their
    children have it: the class defines it, or builds it by the children (``hma_by_children``)."""
    return bool(getattr(cls, "hma_by_children", False)) or callable(getattr(cls, HMA_METHOD, None))


WRAPPER_MARK = "__capkv_wrapper__"
"""A class attribute set true by adapters that wrap another engine's connector (``wrapped``):
diagnostics name the wrapped connector, at run time and in the ``capkv.mypy`` plugin."""


def describe(node: object) -> str:
    """A node's name in diagnostics: its class name (or its own name, for a class); a wrapper's, what it wraps."""
    if isinstance(node, StackNode):
        return node.node_name
    if isinstance(node, type):
        return node.__name__
    if getattr(node.__class__, WRAPPER_MARK, False) is True:  # __class__: also through dev mode's proxies
        return describe(getattr(node, "wrapped"))
    return type(node).__name__


@dataclass(frozen=True)
class NonHMAChild:
    """A leaf of a stack that lacks ``request_finished_all_groups``."""

    path: tuple[int, ...]
    """1-based positions from the root stack down to the child."""
    name: str
    """The child's class name."""
    known: bool = True
    """False when the child's type is unknown (``Any``): it does not *prove* HMA capability."""

    @property
    def position(self) -> str:
        """``#2`` for the root's second child, ``#1.2`` for the second child of its first."""
        return "#" + ".".join(str(index) for index in self.path)

    def explain(self) -> str:
        """One line saying which child lacks what."""
        subject = f"sub-connector {self.position}" if self.path else "connector"
        if not self.known:
            return f'{subject} "{self.name}" is not known to implement SupportsHMA (its type is unknown)'
        return f'{subject} "{self.name}" does not implement SupportsHMA (missing {HMA_METHOD})'


def explain_not_hma(offenders: Iterable[NonHMAChild]) -> str:
    """Why a stack is not HMA-capable: every offender, then the rule.

    The one wording shared by :func:`~capkv.check_stack`, ``capkv check`` and
    the ``capkv.mypy`` plugin, so a message found in one place greps in all.
    """
    return "; ".join([*(child.explain() for child in offenders), HMA_RULE])


def non_hma_children(node: object) -> list[NonHMAChild]:
    """Every leaf below ``node`` that is not HMA-capable, depth first, in stack order."""
    return list(_walk(node, ()))


def _walk(node: object, path: tuple[int, ...]) -> Iterator[NonHMAChild]:
    if isinstance(node, StackNode):
        if not node.finishes_all_groups:
            yield NonHMAChild(path, describe(node))
        for index, child in enumerate(node.children, start=1):
            yield from _walk(child, (*path, index))
    elif not supports_hma(node):
        yield NonHMAChild(path, describe(node))


publish(__name__)
