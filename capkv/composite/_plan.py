"""A request's composed hit, as the scheduler side keeps it from the hit to the allocation."""

from __future__ import annotations

__all__ = ["Plan", "Slice"]

Slice = tuple[int, int, int, bool]
"""One child's part of a composed hit: ``(child index, first token, tokens, load_async)``."""
Plan = tuple[int, tuple[Slice, ...]]
"""A request's composed hit, until the engine allocates it: ``(local hit, slices in token order)``."""
