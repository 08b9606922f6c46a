"""Stacks written in configuration: name → class registry, loader, and builder.

Capability is decided from the configured *classes*, before any connector is
constructed, by the same rule as :class:`~capkv.MultiConnector`'s static types.
"""

from capkv.config._build import FACTORY_HOOK, BuildContext, ConnectorFactory, build_connector, build_stack
from capkv.config._loader import (
    ConfiguredConnector,
    ConfiguredNode,
    ConfiguredStack,
    load_stack,
    load_stack_file,
    read_config_file,
)
from capkv.config._options import OPTIONS_ATTRIBUTE, ConnectorOptions, Option, check_extra_config, declared_options
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
    "OPTIONS_ATTRIBUTE",
    "BuildContext",
    "ConfiguredConnector",
    "ConfiguredNode",
    "ConfiguredStack",
    "ConnectorFactory",
    "ConnectorOptions",
    "ConnectorRegistry",
    "Option",
    "build_connector",
    "build_stack",
    "check_extra_config",
    "declared_options",
    "default_registry",
    "load_stack",
    "load_stack_file",
    "read_config_file",
    "register_connector",
    "resolve_connector",
]
