"""A request's composed hit, as the scheduler side keeps it from the hit until the request finishes
(or is asked again): the allocation splits the accepted tokens by it, and an engine may ask later
which children serve the request (vLLM: the loaded groups, the hit's sources)."""

from __future__ import annotations

__all__ = ["Plan", "Slice"]

Slice = tuple[int, int, int, bool]
"""One child's part of a composed hit: ``(child index, first token, tokens, load_async)``."""
Plan = tuple[int, tuple[Slice, ...]]
"""A request's composed hit: ``(local hit, slices in token order)``."""
