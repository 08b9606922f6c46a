"""Build connectors from a configured stack — the explicit step after loading.

Capability is decided from classes; building is needed only for what a connector decides per instance (its
layout, its finished count, piecewise CUDA graphs).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from capkv._homes import publish
from capkv.composite._options import STACK_OPTIONS
from capkv.config._loader import ConfiguredConnector, ConfiguredNode, ConfiguredStack
from capkv.config._options import ConnectorOptions, declared_options
from capkv.contracts._spec import KVSpec
from capkv.errors import CapkvError, ConfigError

__all__ = [
    "FACTORY_HOOK", "BuildContext", "ConnectorFactory", "build_composite", "build_connector", "build_stack",
    "call_user_code", "closed_on_error",
]

FACTORY_HOOK = "from_extra_config"
"""Name of the optional classmethod that builds a connector from its extra config."""

ConnectorFactory = Callable[[ConfiguredConnector], Any]
"""Builds one leaf connector from its configuration."""


@dataclass(frozen=True)
class BuildContext:
    """What the builder knows beyond the configuration: the engine's KV cache, and defaults."""

    spec: KVSpec | None = None
    """The engine's KV cache; connectors whose options say ``takes_spec`` need it."""
    defaults: Mapping[str, object] = field(default_factory=dict[str, object])
    """Values for declared options a configuration leaves out (``capkv demo``: ``capacity_blocks``, ``root``)."""


def build_connector(leaf: ConfiguredConnector, *, context: BuildContext | None = None) -> Any:
    """Build one leaf; every failure is one :class:`~capkv.ConfigError`.

    One rule builds a leaf, for ``capkv check``, ``capkv demo`` and engines alike:

    1. its extra config is checked against the options the class declares
       (:class:`~capkv.config.ConnectorOptions`), and the context's defaults fill
       declared options the configuration leaves out;
    2. a class whose options say ``takes_spec`` is built as ``cls(spec, **extra)``
       with the context's :class:`~capkv.KVSpec` (without one it cannot be built);
    3. otherwise ``cls.from_extra_config(extra)`` when the class provides that
       classmethod (connectors whose constructor wants engine objects offer a light
       one there), else ``cls(**extra)``.

    Whatever a connector's own code raises while being built — any exception, ``SystemExit`` included — comes
    back as one :class:`~capkv.ConfigError` naming the entry; only ``KeyboardInterrupt`` passes.
    """
    context = context or BuildContext()
    where = f"{leaf.position}: " if leaf.position else ""
    label = leaf.position or leaf.name
    options = _declared(leaf, where)
    extra = dict(leaf.extra_config)
    if options is not None:
        extra = {**{k: v for k, v in context.defaults.items() if k in options.options}, **extra}
        _prefixed(lambda: options.check(extra, connector=f'"{leaf.name}"'), where)
    hook = getattr(leaf.cls, FACTORY_HOOK, None)
    if options is not None and options.takes_spec and context.spec is not None:
        spec = context.spec
        return call_user_code(lambda: leaf.cls(spec, **extra), f"{where}cannot build \"{leaf.name}\" with "
                              f"{leaf.cls.__name__}(spec, **kv_connector_extra_config)", label, extra)
    if callable(hook):
        return call_user_code(lambda: hook(extra), f'{where}cannot build "{leaf.name}" with '
                              f"{leaf.cls.__name__}.{FACTORY_HOOK}(kv_connector_extra_config)", label, extra)
    if options is not None and options.takes_spec:
        raise ConfigError(
            f'{where}"{leaf.name}" is built with the engine\'s KVSpec, which a configuration file does not '
            "give (its extra config was checked against its declared options)",
            connector=label, method="build_stack", value=extra,
        )
    return call_user_code(lambda: leaf.cls(**extra), f'{where}cannot build "{leaf.name}" with '
                          f"{leaf.cls.__name__}(kv_connector_extra_config)", label, extra)


def call_user_code(make: Callable[[], Any], doing: str, connector: str, value: object, method: str = "build_stack") -> Any:
    """``make()``; a :class:`~capkv.CapkvError` passes, anything else it raises — ``SystemExit`` and
    other ``BaseException`` included, but ``KeyboardInterrupt`` — becomes one ``ConfigError`` saying ``doing``."""
    try:
        return make()
    except (CapkvError, KeyboardInterrupt):
        raise
    except RecursionError as exc:
        raise ConfigError(f"{doing}: RecursionError: {exc}", connector=connector, method=method, value=value) from None
    except BaseException as exc:  # a user's connector: SystemExit must not end capkv quietly
        text = str(exc)
        raise ConfigError(
            f"{doing}: {type(exc).__name__}{': ' + text if text else ''}",
            connector=connector, method=method, value=value,
        ) from exc


def _declared(leaf: ConfiguredConnector, where: str) -> ConnectorOptions | None:
    try:
        return declared_options(leaf.cls)
    except ConfigError as exc:
        raise ConfigError(f"{where}{exc}", connector=exc.connector, method=exc.method, value=exc.value) from None


def _prefixed(check: Callable[[], None], where: str) -> None:
    try:
        check()
    except ConfigError as exc:
        raise ConfigError(f"{where}{exc}", connector=exc.connector, method=exc.method, value=exc.value) from None


def build_stack(
    node: ConfiguredNode, *, factory: ConnectorFactory | None = None, context: BuildContext | None = None
) -> Any:
    """Construct the connectors of ``node``, leaves first; returns the root connector.

    Pass ``factory`` to build leaves yourself. Composites are built from their built children:
    ``cls(*children)``. A stack whose build fails half way shuts down the connectors it already built
    (:func:`closed_on_error`): their writer threads, files and sockets do not outlive the error.
    """
    if isinstance(node, ConfiguredConnector):
        return factory(node) if factory is not None else build_connector(node, context=context)
    children: list[Any] = []
    with closed_on_error(children):
        for entry in node.entries:
            children.append(build_stack(entry, factory=factory, context=context))
        return build_composite(node, children)


def build_composite(node: ConfiguredStack, children: Sequence[object]) -> Any:
    """``node``'s composite over its built ``children``, with the options its configuration gives
    (:data:`~capkv.composite._options.STACK_OPTIONS`, e.g. ``{"connectors": [...], "promote": true}``)."""
    options = {name: node.extra_config[name] for name in STACK_OPTIONS if name in node.extra_config}
    return call_user_code(
        lambda: node.cls(*children, **options), f'{node.position + ": " if node.position else ""}cannot build "{node.name}"',
        node.position or node.name, None,
    )


@contextmanager
def closed_on_error(built: Sequence[Any]) -> Generator[None]:
    """Shut down the connectors in ``built`` (as it is when the error comes, newest first) if the
    block raises; the error passes on. A connector's own failure to shut down does not hide it."""
    try:
        yield
    except BaseException:
        for connector in reversed(list(built)):
            shutdown: object = getattr(connector, "shutdown", None)
            if callable(shutdown):
                try:
                    shutdown()
                except Exception:  # the build's error is the one to report
                    pass
        raise


publish(__name__)
