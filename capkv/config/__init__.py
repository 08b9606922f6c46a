"""Stacks written in configuration: name → class registry, loader, and builder.

Capability is decided from the configured *classes*, before any connector is
constructed, by the same rule as :class:`~capkv.MultiConnector`'s static types.
A connector class may build itself from its extra config with a class method
named ``from_extra_config``.
"""

from typing import TYPE_CHECKING

from capkv._lazy import attach

if TYPE_CHECKING:
    from capkv.config._build import build_stack
    from capkv.config._loader import ConfiguredConnector, ConfiguredNode, ConfiguredStack, load_stack, load_stack_file
    from capkv.config._registry import ENTRY_POINT_GROUP, ConnectorRegistry, default_registry, register_connector

__all__ = [
    "ENTRY_POINT_GROUP",
    "ConfiguredConnector",
    "ConfiguredNode",
    "ConfiguredStack",
    "ConnectorRegistry",
    "build_stack",
    "default_registry",
    "load_stack",
    "load_stack_file",
    "register_connector",
]

if not TYPE_CHECKING:  # checkers read the imports above (see capkv._lazy)
    __getattr__, __dir__ = attach(
        __name__,
        {
            "capkv.config._build": ["build_stack"],
            "capkv.config._loader": [
                "ConfiguredConnector",
                "ConfiguredNode",
                "ConfiguredStack",
                "load_stack",
                "load_stack_file",
            ],
            "capkv.config._registry": ["ENTRY_POINT_GROUP", "ConnectorRegistry", "default_registry", "register_connector"],
        },
    )
