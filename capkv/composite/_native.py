"""Children that take the engine's own objects: translated once per call, not once per child.

A wrapped engine connector (``capkv.vllm.wrap``) translates capkv's arguments
back into its engine's objects on every call — a call frame per child on the
stack's hottest members. When the engine's adapter carries the engine's own
objects inside capkv's (vLLM's ``KVCacheBlocks`` inside the block ids, vLLM's
``KVConnectorOutput`` inside the output), the stack can hand them to such a
child directly: one attribute read per call, and the child's own method per
child, as the engine's own composite does. A child offers this through a
``native_calls`` attribute (:class:`NativeCalls`); the stack uses it only where
the translation is nothing more than unwrapping (a child loading nothing, an
output), and only when every child of the stack offers it (not through dev
mode's checking proxies, which must see every call).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["NativeCalls", "native_calls"]


@dataclass(frozen=True, slots=True)
class NativeCalls:
    """How a wrapped engine connector takes the engine's objects directly."""

    update_state_after_alloc: Callable[[Any, Any, int], None]
    """The connector's own member, called with the engine's blocks when it loads nothing."""
    update_connector_output: Callable[[Any], None]
    """The connector's own member, called with the engine's output (its worker metadata set to the child's)."""
    blocks: str
    """The attribute of capkv's block ids that carries the engine's blocks."""
    output: str
    """The attribute of capkv's output that carries the engine's output."""
    worker_meta: str
    """The engine output's field for a connector's worker metadata."""

    def same_carriers(self, other: NativeCalls) -> bool:
        return (self.blocks, self.output, self.worker_meta) == (other.blocks, other.output, other.worker_meta)


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
