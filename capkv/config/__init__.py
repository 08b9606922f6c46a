"""Stacks written in configuration: name → class registry, loader, and builder.

Capability is decided from the configured *classes*, before anything is built, by the rule
:class:`~capkv.MultiConnector`'s static types apply; open ``_loader.py`` first.
"""

from typing import TYPE_CHECKING

from capkv._lazy import attach

if TYPE_CHECKING:
    from capkv.config._build import BuildContext, ConnectorFactory, build_connector, build_stack
    from capkv.config._loader import ConfiguredConnector, ConfiguredNode, ConfiguredStack, load_stack, load_stack_file
    from capkv.config._options import ConnectorOptions, Option, check_extra_config, declared_options
    from capkv.config._registry import ENTRY_POINT_GROUP, ConnectorRegistry, default_registry, register_connector

__all__ = [
    "ENTRY_POINT_GROUP",
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
    "register_connector",
]

if not TYPE_CHECKING:  # checkers read the imports above (see capkv._lazy)
    __getattr__, __dir__ = attach(
        __name__,
        {
            "capkv.config._build": ["BuildContext", "ConnectorFactory", "build_connector", "build_stack"],
            "capkv.config._loader": [
                "ConfiguredConnector",
                "ConfiguredNode",
                "ConfiguredStack",
                "load_stack",
                "load_stack_file",
            ],
            "capkv.config._options": ["ConnectorOptions", "Option", "check_extra_config", "declared_options"],
            "capkv.config._registry": ["ENTRY_POINT_GROUP", "ConnectorRegistry", "default_registry", "register_connector"],
        },
    )

del TYPE_CHECKING, attach  # dir(), vars(): the front's names only
