"""vLLM checks some connectors by name, at configuration time, only where it looks: say when a stack hides one.

vLLM's ``KVTransferConfig.has_connector`` sees the top-level connector and the
entries of a ``"MultiConnector"`` list, nothing deeper; behind a capkv host (or a
host nested in the drop-in) its checks for these connectors (context-parallel
layouts, routed experts, the CPU state layout NIXL needs) do not run.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Final

from capkv.config._loader import ConfiguredConnector, ConfiguredNode, ConfiguredStack

__all__ = ["CHECKED_BY_NAME", "warn_hidden"]

CHECKED_BY_NAME: Final = frozenset({
    "NixlConnector", "NixlPullConnector", "NixlPushConnector", "MooncakeConnector", "MoRIIOConnector",
    "HiSparseConnector",
})
"""The connectors vLLM 0.32's configuration checks look up by name (``has_connector``)."""

_log = logging.getLogger("capkv.vllm")
_said: set[str] = set()


def warn_hidden(host: str, configured: ConfiguredNode | None, *, top_level_visible: bool) -> list[str]:
    """Warn (once per message) about every connector of :data:`CHECKED_BY_NAME` vLLM will not see in
    ``configured``; ``top_level_visible``: the host is vLLM's ``"MultiConnector"`` (the drop-in), whose own
    entries vLLM sees. Returns the hidden ones, by position."""
    hidden = [f"{leaf.position or '#1'} {leaf.name}" for leaf in _hidden(configured, top_level_visible)]
    if hidden:
        message = (
            f"{host} (capkv.vllm): vLLM's configuration checks for {', '.join(hidden)} do not see "
            "it behind this host (vLLM looks only at the top level and at a \"MultiConnector\"'s own entries): "
            "list it directly among capkv.vllm.MultiConnector's connectors"
        )
        if message not in _said:
            _said.add(message)
            _log.warning("%s", message)
    return hidden


def _hidden(node: ConfiguredNode | None, visible: bool) -> Iterator[ConfiguredConnector]:
    """The leaves vLLM checks by name and will not see: every one, but a direct entry of a visible list."""
    if isinstance(node, ConfiguredStack):
        for entry in node.entries:
            yield from _hidden(entry, visible and not isinstance(entry, ConfiguredStack))
    elif node is not None and not visible and node.name in CHECKED_BY_NAME:
        yield node
