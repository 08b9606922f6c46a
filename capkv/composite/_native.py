"""Children that take the engine's own objects: translated once per call, not once per child.

Translating capkv's arguments back per child costs a call frame on the stack's hottest members
(docs/internals.md, "Native calls").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any, Final, Literal

from capkv.composite._fanout import Failures

__all__ = ["NOT_CARRIED", "IndexedCalls", "NativeCalls", "NotCarried", "PassOutput", "native_calls"]


class NotCarried(Enum):
    """The type of :data:`NOT_CARRIED`."""

    NOT_CARRIED = "not carried"


NOT_CARRIED: Final = NotCarried.NOT_CARRIED
"""What a pass function returns when capkv's object carries no engine object: the stack translates per child."""

AllocCall = Callable[[Any, Any, int], None]
OutputCall = Callable[[Any], None]
IndexedCalls = tuple[tuple[int, OutputCall], ...]
"""``(child index, call)`` for each child whose output member does something (in child order)."""
PassOutput = Callable[[IndexedCalls, Any, tuple[object, ...] | None], Failures | None | Literal[NotCarried.NOT_CARRIED]]
"""``(calls, output, shares)``: each call with the engine's output carried in ``output``, its worker-metadata
field set to its child's share (``shares[index]``) for the call (restored after; with no shares, left as it is
when it holds none, else ``None`` for each); what the calls raised, by child index (every call made), or
:data:`NOT_CARRIED` (no call made)."""


@dataclass(frozen=True, slots=True)
class NativeCalls:
    """How a wrapped engine connector takes the engine's objects directly."""

    update_state_after_alloc: AllocCall
    """The connector's own member, called with the engine's blocks when it loads nothing."""
    update_connector_output: OutputCall | None
    """The connector's own member, called with the engine's output (its worker metadata set to the child's);
    ``None`` where it is its engine's base member, which does nothing: the stack calls nothing for it."""
    blocks: str
    """The attribute of capkv's block ids that carries the engine's blocks (read once per call, by name:
    one ``getattr`` costs less than a call into the adapter)."""
    pass_output: PassOutput
    """Unwraps the engine's output from capkv's output and calls the children's own members."""

    def same_carriers(self, other: NativeCalls) -> bool:
        return self.blocks == other.blocks and self.pass_output is other.pass_output


def native_calls(children: tuple[object, ...]) -> tuple[NativeCalls, ...] | None:
    """Every child's :class:`NativeCalls`, when every child offers them over the same carriers; else ``None``."""
    found: list[NativeCalls] = []
    for child in children:
        if hasattr(child, "__wrapped__"):  # a proxy checks the calls it forwards (dev mode): keep them its way
            return None
        calls: object = getattr(child, "native_calls", None)
        if not isinstance(calls, NativeCalls) or (found and not found[0].same_carriers(calls)):
            return None
        found.append(calls)
    return tuple(found)
