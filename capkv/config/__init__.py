"""Stacks written in configuration: name → class registry, loader, and builder.

Capability is decided from the configured *classes*, before any connector is
constructed, by the same rule as :class:`~capkv.MultiConnector`'s static types.
"""

from capkv.config._build import FACTORY_HOOK, ConnectorFactory, build_connector, build_stack
from capkv.config._loader import (
    ConfiguredConnector,
    ConfiguredNode,
    ConfiguredStack,
    load_stack,
    load_stack_file,
    read_config_file,
)
from capkv.config._registry import (
    BUILTIN_CONNECTORS,
    ENTRY_POINT_GROUP,
    ConnectorRegistry,
    default_registry,
    register_connector,
    resolve_connector,
)

__all__ = [
    "BUILTIN_CONNECTORS",
    "ENTRY_POINT_GROUP",
    "FACTORY_HOOK",
    "ConfiguredConnector",
    "ConfiguredNode",
    "ConfiguredStack",
    "ConnectorFactory",
    "ConnectorRegistry",
    "build_connector",
    "build_stack",
    "default_registry",
    "load_stack",
    "load_stack_file",
    "read_config_file",
    "register_connector",
    "resolve_connector",
]
