"""mypy plugin: ``MultiConnector`` stacks that say *why* they are not HMA-capable.

Enable it with ``plugins = capkv.mypy``; it changes messages, never verdicts (docs/api/mypy.md says which).
"""

from typing import TYPE_CHECKING

from capkv._lazy import attach

if not TYPE_CHECKING:  # registered before the plugin loads, so plugin.__module__ is this front
    __getattr__, __dir__ = attach(__name__, {"capkv._mypy_plugin": ["plugin"]})

from capkv._mypy_plugin import plugin  # noqa: E402 - mypy looks the entry point up as a plain attribute

__all__ = ["plugin"]

del TYPE_CHECKING, attach  # dir(), vars(): the plugin's entry point only
