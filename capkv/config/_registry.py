"""Connector names → connector classes, for stacks written in configuration.

Names resolve lazily, to a *class*: nothing is imported until a configuration uses the name, and nothing is
constructed.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping
from importlib.metadata import entry_points
from typing import Any, TypeVar, cast

from capkv._homes import publish
from capkv.contracts._connector import missing_members
from capkv.errors import ConfigError

__all__ = [
    "BUILTIN_CONNECTORS",
    "ENGINE_NAMESPACES",
    "ENTRY_POINT_GROUP",
    "ConnectorRegistry",
    "default_registry",
    "register_connector",
    "resolve_connector",
]

ENTRY_POINT_GROUP = "capkv.connectors"
"""Installed packages publish connectors here: ``name = "package.module:Class"``."""

BUILTIN_CONNECTORS: Mapping[str, str] = {
    "MultiConnector": "capkv.composite._multi:MultiConnector",
    "CPUOffloadConnector": "capkv.connectors._cpu_offload:CPUOffloadConnector",
    "FileStoreConnector": "capkv.connectors._file_store:FileStoreConnector",
    "SingleGroupOffloadConnector": "capkv.connectors._single_group:SingleGroupOffloadConnector",
    "RedisStoreConnector": "capkv.connectors._redis_store:RedisStoreConnector",
    "cpu": "capkv.connectors._cpu_offload:CPUOffloadConnector",
    "file": "capkv.connectors._file_store:FileStoreConnector",
    "redis": "capkv.connectors._redis_store:RedisStoreConnector",
    "single": "capkv.connectors._single_group:SingleGroupOffloadConnector",
}
"""capkv's own connectors, by the names vLLM configurations use (one line per connector),
and the short names ``capkv demo --stack`` has always used (``cpu,file``)."""

ENGINE_NAMESPACES: tuple[str, ...] = ("capkv.adapters.vllm._names:resolve_vllm_name",)
"""Engines' connector names, asked in order for a name capkv does not know: each a ``"module:function"``
taking the name and the whole configuration entry (an engine may pick the class by the entry's config,
as vLLM does for NIXL's ``transfer_mode``) and returning the class, or ``None`` when the engine does not
know it (or is not installed). The module is imported only on such a miss, so an engine is imported
only when needed; the answer is asked again for each entry."""

_C = TypeVar("_C", bound=type[Any])


class ConnectorRegistry:
    """Resolves connector names to classes; registered names win over entry points.

    A configuration names a connector the ways vLLM does: by a registered name (capkv's own connectors,
    ``@register_connector("name")``, or an entry point in the ``capkv.connectors`` group of an installed
    package), or by where it lives — a ``"module:Class"`` path, or the class name plus
    ``kv_connector_module_path``. A name none of these knows is then asked of the engines' own registries
    (:data:`ENGINE_NAMESPACES`: vLLM's connector names, when vLLM is installed), so a vLLM connector can be
    named in a stack as vLLM's own configuration names it.
    """

    def __init__(
        self,
        builtins: Mapping[str, str] = BUILTIN_CONNECTORS,
        *,
        entry_point_group: str | None = ENTRY_POINT_GROUP,
        engine_namespaces: tuple[str, ...] = ENGINE_NAMESPACES,
    ) -> None:
        self._targets: dict[str, type[Any] | str] = dict(builtins)
        self._entry_point_group = entry_point_group
        self._entry_points: dict[str, str] | None = None
        self._engine_namespaces = engine_namespaces
        self._from_engine: set[str] = set()
        """Names an engine's registry resolved (the engine's, not capkv's)."""

    def register(self, name: str) -> Callable[[_C], _C]:
        """Class decorator: make the class resolvable as ``name``."""

        def decorate(cls: _C) -> _C:
            self.add(name, cls)
            return cls

        return decorate

    def add(self, name: str, target: type[Any] | str) -> None:
        """Register a class, or a ``"module:Class"`` path resolved on first use.

        Re-registering a name for a different target is a :class:`~capkv.ConfigError`:
        a silently shadowed connector is a stack that is not what its file says.
        """
        existing = self._targets.get(name)
        if existing is not None and not _same_target(existing, target):
            raise ConfigError(
                f'connector name "{name}" is already registered for {_show(existing)}; '
                f"cannot register {_show(target)} under it",
                connector=name,
                method="register",
                value=target,
            )
        self._targets[name] = target

    def names(self) -> list[str]:
        """Every resolvable name (registered and entry points), sorted."""
        return sorted({*self._targets, *self._published()})

    def owns(self, name: str) -> bool:
        """Whether ``name`` is one of capkv's (built in, registered, or an installed package's entry point),
        not a name only an engine's registry knows — decided without importing anything."""
        return (name in self._targets and name not in self._from_engine) or name in self._published()

    def resolve(
        self, name: str, *, module_path: str | None = None, entry: Mapping[str, Any] | None = None
    ) -> type[Any]:
        """The connector class for ``name``.

        ``module_path`` (vLLM's ``kv_connector_module_path``) makes ``name`` a
        class name inside that module; a ``name`` containing ``:`` is a
        ``"module:Class"`` path. Raises :class:`~capkv.ConfigError` for an unknown
        name, a module that does not import, a missing attribute, or an
        attribute that is not a connector class. ``entry`` (the whole configuration entry) goes to the
        engines' registries with a name capkv does not know.
        """
        if module_path is not None:
            return _require_connector_class(
                _import_attribute(module_path, name, shown=f"{module_path}:{name}"), name
            )
        if ":" in name:
            module, _, attribute = name.partition(":")
            return _require_connector_class(_import_attribute(module, attribute, shown=name), name)
        target = self._targets.get(name)
        if target is None:
            target = self._published().get(name)
        if target is None:
            target = self._from_engines(name, {} if entry is None else entry)
        if target is None:
            raise ConfigError(
                f'unknown connector "{name}" (registered: {", ".join(self.names()) or "none"}; '
                f'{_engine_hint(self._engine_namespaces)}or give a "module:Class" path)',
                connector=name,
                method="resolve",
                value=name,
            )
        if isinstance(target, str):
            module, _, attribute = target.partition(":")
            cls = _require_connector_class(_import_attribute(module, attribute, shown=target), name)
            self._targets[name] = cls
            return cls
        return _require_connector_class(target, name)

    def _from_engines(self, name: str, entry: Mapping[str, Any]) -> type[Any] | None:
        for namespace in self._engine_namespaces:
            module, _, function = namespace.partition(":")
            lookup = _import_attribute(module, function, shown=namespace)
            found: object = cast("Callable[[str, Mapping[str, Any]], object]", lookup)(name, entry)
            if found is not None:
                cls = _require_connector_class(found, name)
                self._from_engine.add(name)
                return cls
        return None

    def _published(self) -> dict[str, str]:
        if self._entry_points is None:
            group = self._entry_point_group
            found = entry_points(group=group) if group else ()
            self._entry_points = {ep.name: ep.value for ep in found}
        return self._entry_points


def _engine_hint(namespaces: tuple[str, ...]) -> str:
    hints = [getattr(importlib.import_module(ns.partition(":")[0]), "HINT", "") for ns in namespaces]
    return "".join(f"{hint}; " for hint in hints if hint)


def _same_target(a: type[Any] | str, b: type[Any] | str) -> bool:
    return a is b or _show(a) == _show(b)


def _show(target: type[Any] | str) -> str:
    return target if isinstance(target, str) else f"{target.__module__}:{target.__qualname__}"


def _import_attribute(module: str, attribute: str, *, shown: str) -> object:
    if not module or not attribute:
        raise ConfigError(
            f'bad connector path "{shown}" (expected "package.module:Class")',
            connector=shown,
            method="resolve",
            value=shown,
        )
    try:
        loaded = importlib.import_module(module)
    except ImportError as exc:
        raise ConfigError(
            f'cannot import module "{module}" for connector "{shown}": {exc}',
            connector=shown,
            method="resolve",
            value=module,
        ) from exc
    except Exception as exc:  # the module's own code failed while importing
        raise ConfigError(
            f'importing module "{module}" for connector "{shown}" failed: {type(exc).__name__}: {exc}',
            connector=shown,
            method="resolve",
            value=module,
        ) from exc
    try:
        return getattr(loaded, attribute)
    except AttributeError:
        raise ConfigError(
            f'module "{module}" has no attribute "{attribute}" (connector "{shown}")',
            connector=shown,
            method="resolve",
            value=attribute,
        ) from None


def _require_connector_class(obj: object, name: str) -> type[Any]:
    """``obj``, when it is a connector class: every contract member, none left abstract."""
    if not isinstance(obj, type):
        raise ConfigError(
            f'connector "{name}" is not a class (got {type(obj).__name__})',
            connector=name,
            method="resolve",
            value=obj,
        )
    missing = missing_members(obj)
    if missing:
        raise ConfigError(
            f'connector "{name}" ({obj.__qualname__}) is not a KVConnector class '
            f"(missing {', '.join(missing)})",
            connector=name,
            method="resolve",
            value=obj,
        )
    if inspect.isabstract(obj):
        abstract = sorted(getattr(obj, "__abstractmethods__", ()))
        raise ConfigError(
            f'connector "{name}" ({obj.__qualname__}) is abstract (does not implement {", ".join(abstract)})',
            connector=name,
            method="resolve",
            value=obj,
        )
    return obj


default_registry: ConnectorRegistry = ConnectorRegistry()
"""The registry ``capkv check`` and :func:`~capkv.config.load_stack` use unless given another."""


def register_connector(name: str) -> Callable[[_C], _C]:
    """Class decorator registering a connector in :data:`default_registry`."""
    return default_registry.register(name)


def resolve_connector(name: str, *, module_path: str | None = None) -> type[Any]:
    """:meth:`ConnectorRegistry.resolve` on :data:`default_registry`."""
    return default_registry.resolve(name, module_path=module_path)


publish(__name__)
