"""A stack's own keyword options, beside its children: one list, read by the runtime, configuration and the
mypy plugin (which must not take them for a subclass's options)."""

from __future__ import annotations

__all__ = ["STACK_OPTIONS"]

STACK_OPTIONS: tuple[str, ...] = ("promote",)
"""``MultiConnector(*children, promote=...)``; in configuration, beside ``"connectors"``."""
