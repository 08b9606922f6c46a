"""Stacks from configuration: a vLLM-shaped ``kv_transfer_config`` → a tree of classes.

Nothing is constructed, so capability is decided before any connector exists, by the rule
:class:`~capkv.MultiConnector`'s static types apply.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from capkv._homes import publish
from capkv.capabilities._hma import StackNode, class_finishes_all_groups
from capkv.config._registry import ConnectorRegistry, default_registry
from capkv.errors import ConfigError

__all__ = [
    "ConfiguredConnector",
    "ConfiguredNode",
    "ConfiguredStack",
    "load_stack",
    "load_stack_file",
    "read_config_file",
]

MAX_NESTING = 32
"""Stacks nest at most this deep: deeper is refused in one line, not a RecursionError."""


@dataclass(frozen=True)
class ConfiguredConnector:
    """A leaf of a configured stack: its class and the extra config to build it from."""

    name: str
    """The connector as the configuration names it."""
    cls: type[Any]
    """The resolved connector class."""
    extra_config: Mapping[str, Any]
    """Its ``kv_connector_extra_config``."""
    position: str
    """Where it sits: ``""`` for the root, ``"#2"``, ``"#1.2"`` below it."""
    entry: Mapping[str, Any] = field(default_factory=lambda: dict[str, Any](), compare=False)
    """Its whole configuration entry (``kv_role``, ``engine_id``, ... as an engine reads them)."""


@dataclass(frozen=True)
class ConfiguredStack(StackNode):
    """A composite of a configured stack; its :attr:`children` are classes or nested stacks."""

    name: str
    """The composite as the configuration names it."""
    cls: type[Any]
    """The composite's class (``MultiConnector`` or a subclass)."""
    extra_config: Mapping[str, Any]
    """Its ``kv_connector_extra_config`` without ``connectors``."""
    position: str
    """Where it sits: ``""`` for the root, ``"#2"``, ``"#1.2"`` below it."""
    entries: tuple[ConfiguredNode, ...]
    """The configured children, in stack order."""

    @property
    def children(self) -> tuple[object, ...]:
        """Leaf classes and nested stacks: what the capability rule looks at."""
        return tuple(e.cls if isinstance(e, ConfiguredConnector) else e for e in self.entries)

    @property
    def node_name(self) -> str:
        return self.cls.__name__

    @property
    def finishes_all_groups(self) -> bool:
        """Answered for the class the configuration will build, not for this description."""
        return class_finishes_all_groups(self.cls)


ConfiguredNode = ConfiguredConnector | ConfiguredStack
"""One node of a configured stack."""


def load_stack(
    config: Mapping[str, Any], *, registry: ConnectorRegistry | None = None
) -> ConfiguredNode:
    """Resolve a ``kv_transfer_config`` mapping into classes (nothing is constructed).

    Raises :class:`~capkv.ConfigError`, naming the entry (``#2``, ``#1.2``), for
    a malformed mapping, an unknown name, a module that does not import, or a
    class that is not a connector. A ``{"kv_transfer_config": {...}}`` wrapper,
    as in an engine configuration file, is unwrapped.

    The result is a :class:`~capkv.StackNode` whose leaves are classes, so
    :func:`capkv.supports_hma`, :func:`capkv.non_hma_children` and :func:`capkv.require_hma` decide its capability.
    The accepted shape is vLLM's::

        {"kv_connector": "MultiConnector",
         "kv_connector_extra_config": {"connectors": [
             {"kv_connector": "CPUOffloadConnector", "kv_connector_extra_config": {...}},
             {"kv_connector": "DiskConnector", "kv_connector_module_path": "my.connectors"}]}}

    A connector whose class is a :class:`~capkv.StackNode` (``MultiConnector`` or a subclass) is a composite:
    its ``connectors`` list holds its children, nested to any depth. Other vLLM keys (``kv_role``,
    ``engine_id``, …) are accepted and ignored.
    """
    wrapped: object = config.get("kv_transfer_config")
    if "kv_connector" not in config and isinstance(wrapped, Mapping):
        return _load(cast("Mapping[str, Any]", wrapped), (), registry or default_registry)
    return _load(config, (), registry or default_registry)


def read_config_file(path: str | Path) -> dict[str, Any]:
    """Parse a ``.json`` or ``.toml`` stack file; every failure is a one-line :class:`~capkv.ConfigError`."""
    path = Path(path)
    parsers = {".json": _parse_json, ".toml": _parse_toml}
    parse = parsers.get(path.suffix.lower())
    if parse is None:
        raise ConfigError(
            f'{path}: unsupported file type "{path.suffix}" (use .json or .toml)', value=str(path)
        )
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError(f"{path}: cannot read: {reason}", value=str(path)) from exc
    data = parse(path, text)
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path}: expected an object with \"kv_connector\" at the top level, got {_kind(data)}",
            value=str(path),
        )
    return _string_keyed(cast("dict[object, Any]", data), str(path))


def load_stack_file(
    path: str | Path, *, registry: ConnectorRegistry | None = None
) -> ConfiguredNode:
    """:func:`read_config_file` then :func:`load_stack`."""
    return load_stack(read_config_file(path), registry=registry)


def _parse_json(path: Path, text: str) -> object:
    try:
        return json.loads(text)
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply to read", value=str(path)) from None
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{path}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}", value=str(path)
        ) from exc


def _parse_toml(path: Path, text: str) -> object:
    try:
        return tomllib.loads(text)
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply to read", value=str(path)) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}", value=str(path)) from exc


def _load(config: object, path: tuple[int, ...], registry: ConnectorRegistry) -> ConfiguredNode:
    position = "#" + ".".join(map(str, path)) if path else ""
    where = f"{position}: " if position else ""
    if len(path) > MAX_NESTING:
        raise ConfigError(
            f"{'#' + '.'.join(map(str, path[:3]))}...: stacks nest at most {MAX_NESTING} levels deep",
            connector=position, method="load_stack", value=len(path),
        )
    if not isinstance(config, Mapping):
        raise ConfigError(
            f'{where}a connector entry must be an object with "kv_connector", got {_kind(config)}',
            connector=position or None,
            value=config,
        )
    entry = _string_keyed(cast("Mapping[object, Any]", config), position or "the configuration")
    name = _optional_str(entry, "kv_connector", where)
    if name is None:
        raise ConfigError(f'{where}missing "kv_connector"', connector=position or None, value=entry)
    module_path = _optional_str(entry, "kv_connector_module_path", where)
    extra = entry.get("kv_connector_extra_config", {})
    if not isinstance(extra, Mapping):
        raise ConfigError(
            f'{where}"kv_connector_extra_config" must be an object, got {_kind(extra)}',
            connector=position or name,
            value=extra,
        )
    extra = _string_keyed(cast("Mapping[object, Any]", extra), f"{where}kv_connector_extra_config")
    try:
        cls = registry.resolve(name, module_path=module_path, entry=entry)
    except ConfigError as exc:
        raise ConfigError(
            f"{where}{exc}", connector=exc.connector, method=exc.method, value=exc.value
        ) from exc
    if not issubclass(cls, StackNode):
        return ConfiguredConnector(name, cls, extra, position, entry)
    entries = _list_of_entries(extra.get("connectors"))
    if not entries:
        raise ConfigError(
            f'{where}composite "{name}" needs a non-empty "connectors" list in '
            f'"kv_connector_extra_config", got {_kind(extra.get("connectors"))}',
            connector=position or name,
            value=extra.get("connectors"),
        )
    rest = {key: value for key, value in extra.items() if key != "connectors"}
    nodes = tuple(_load(child, (*path, index), registry) for index, child in enumerate(entries, start=1))
    return ConfiguredStack(name, cls, rest, position, nodes)


def _list_of_entries(value: object) -> list[object]:
    return cast("list[object]", value) if isinstance(value, list) else []


def _optional_str(entry: Mapping[str, Any], key: str, where: str) -> str | None:
    value = entry.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise ConfigError(
            f'{where}"{key}" must be a non-empty string, got {_kind(value)}', value=value
        )
    return value


def _string_keyed(mapping: Mapping[object, Any], where: str) -> dict[str, Any]:
    keyed: dict[str, Any] = {}
    for key, value in mapping.items():
        if not isinstance(key, str):
            raise ConfigError(f"{where}: keys must be strings, got {key!r}", value=key)
        keyed[key] = value
    return keyed


def _kind(value: object) -> str:
    if value is None:
        return "nothing"
    names: dict[type[object], str] = {
        dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "a number", float: "a number",
    }
    return names.get(type(value), type(value).__name__)


publish(__name__)
