"""Handshakes per child: every child of a stack learns exactly what its own workers produced.

A stack's workers hand the engine one handshake; the engine hands what every
worker produced back to the stack's scheduler side. Merged into one payload
(the first there is), a child would get another child's payload, or none.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeVar

from typing_extensions import Self

__all__ = ["ChildHandshakes", "Handshakes", "child_share"]

_K = TypeVar("_K")


@dataclass(frozen=True, slots=True)
class ChildHandshakes:
    """One worker's handshake of a stack: each child's own payload, in stack order (``None``: it had none)."""

    children: tuple[object, ...]


class Handshakes(dict[int, object]):
    """The workers' handshakes by rank, as a stack's scheduler side gets them; :meth:`for_child` is one
    child's share. A payload that is not a :class:`ChildHandshakes` (a peer's, or one from an engine
    that made none per child) reaches every child, as a stack handed it before it kept them apart."""

    def for_child(self, index: int) -> Self:
        """Child ``index``'s payloads by rank (ranks where it produced none are left out)."""
        return type(self)(child_share(self, index))


def child_share(metadata: Mapping[_K, object], index: int) -> dict[_K, object]:
    """Child ``index``'s payload from each key's handshake (keys where it produced none left out)."""
    share: dict[_K, object] = {}
    for key, payload in metadata.items():
        own = payload.children[index] if isinstance(payload, ChildHandshakes) else payload
        if own is not None:
            share[key] = own
    return share
