"""Build connectors from a configured stack — the explicit step after loading.

Capability is decided from classes (:mod:`capkv.config._loader`); building is only
needed for what a connector decides per instance: its KV-cache layout, its
finished count, whether it needs piecewise CUDA graphs. A leaf is built with
``cls.from_extra_config(extra_config)`` when the class provides that classmethod
(connectors whose constructor wants engine objects offer a light one there),
and with ``cls(**extra_config)`` otherwise; pass ``factory`` to decide yourself.
Composites are built from their built children: ``cls(*children)``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from capkv.config._loader import ConfiguredConnector, ConfiguredNode
from capkv.errors import CapkvError, ConfigError

__all__ = ["FACTORY_HOOK", "ConnectorFactory", "build_connector", "build_stack"]

FACTORY_HOOK = "from_extra_config"
"""Name of the optional classmethod that builds a connector from its extra config."""

ConnectorFactory = Callable[[ConfiguredConnector], Any]
"""Builds one leaf connector from its configuration."""


def build_connector(leaf: ConfiguredConnector) -> Any:
    """The default factory: ``cls.from_extra_config(extra)`` if defined, else ``cls(**extra)``."""
    hook = getattr(leaf.cls, FACTORY_HOOK, None)
    try:
        if callable(hook):
            return hook(dict(leaf.extra_config))
        return leaf.cls(**leaf.extra_config)
    except CapkvError:
        raise
    except Exception as exc:
        where = f"{leaf.position}: " if leaf.position else ""
        how = f"{leaf.cls.__name__}.{FACTORY_HOOK}" if callable(hook) else leaf.cls.__name__
        raise ConfigError(
            f'{where}cannot build "{leaf.name}" with {how}(kv_connector_extra_config): '
            f"{type(exc).__name__}: {exc}",
            connector=leaf.position or leaf.name,
            method="build_stack",
            value=dict(leaf.extra_config),
        ) from exc


def build_stack(node: ConfiguredNode, *, factory: ConnectorFactory = build_connector) -> Any:
    """Construct the connectors of ``node``, leaves first; returns the root connector."""
    if isinstance(node, ConfiguredConnector):
        return factory(node)
    return node.cls(*(build_stack(entry, factory=factory) for entry in node.entries))
