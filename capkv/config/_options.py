"""Declared options: what a connector accepts in ``kv_connector_extra_config``.

Declared once on the class, so the builder and ``capkv check`` refuse a wrong key or value before anything is
built — also for connectors no configuration file can build.
"""

from __future__ import annotations

import math
import reprlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from capkv._homes import publish
from capkv.errors import ConfigError

__all__ = ["OPTIONS_ATTRIBUTE", "ConnectorOptions", "Option", "check_extra_config", "declared_options"]

_short = reprlib.Repr()
_short.maxstring = _short.maxother = 60

OPTIONS_ATTRIBUTE = "extra_config_options"
"""The class attribute holding a connector's :class:`ConnectorOptions`."""


@dataclass(frozen=True)
class Option:
    """One key of the extra config: the types it accepts and its bounds.

    ``bool`` is never accepted as an ``int`` or a ``float``, and floats must be
    finite; a ``float`` option accepts an ``int``. ``choices`` restricts the value
    to a set. ``required`` keys must be present.
    """

    types: type[Any] | tuple[type[Any], ...]
    minimum: int | float | None = None
    maximum: int | float | None = None
    choices: tuple[object, ...] | None = None
    required: bool = False
    help: str = ""

    def problem(self, value: object) -> str | None:
        """Why ``value`` is not acceptable, in words; ``None`` when it is."""
        accepted = self.types if isinstance(self.types, tuple) else (self.types,)
        if not any(_is(value, kind) for kind in accepted):
            return f"expected {' or '.join(_kind_name(kind) for kind in accepted)}"
        if self.choices is not None and value not in self.choices:
            return f"expected one of {', '.join(map(repr, self.choices))}"
        if isinstance(value, int | float) and not isinstance(value, bool):
            if self.minimum is not None and value < self.minimum:
                return f"expected at least {self.minimum:g}"
            if self.maximum is not None and value > self.maximum:
                return f"expected at most {self.maximum:g}"
        return None

    def describe(self) -> str:
        """``int >= 1, required``: the option's rule in words."""
        accepted = self.types if isinstance(self.types, tuple) else (self.types,)
        words = " or ".join(_kind_name(kind) for kind in accepted)
        if self.minimum is not None:
            words += f" >= {self.minimum:g}"
        if self.maximum is not None:
            words += f" <= {self.maximum:g}"
        return words + (", required" if self.required else "")


def _is(value: object, kind: type[Any]) -> bool:
    if kind is float:
        return type(value) in (int, float) and math.isfinite(value)  # type: ignore[arg-type]
    if kind is int:
        return type(value) is int
    if kind is bool:
        return type(value) is bool
    return isinstance(value, kind)


def _kind_name(kind: type[Any]) -> str:
    return {int: "an int", float: "a number", str: "a string", bool: "true or false",
            list: "a list", dict: "an object"}.get(kind, kind.__name__)


@dataclass(frozen=True, init=False)
class ConnectorOptions:
    """Every option a connector class accepts in its extra config.

    ``takes_spec``: the constructor's first argument is the engine's
    :class:`~capkv.KVSpec`, so the builder calls ``cls(spec, **extra)`` when it
    has one (the demo, an engine) and refuses to build it otherwise (``capkv
    check`` then still checks the extra config against the options).

    A connector class declares its options once, as a class attribute::

        class MyStore(KVConnectorBase[TokenRequest]):
            extra_config_options = ConnectorOptions(
                capacity_blocks=Option(int, minimum=1, required=True),
                namespace=Option(str),
                takes_spec=True,   # built as MyStore(spec, **extra) with the engine's KVSpec
            )

    The builder (:func:`capkv.config.build_connector`) and ``capkv check`` both read the declaration: an
    unknown key, a missing required key, or a value of the wrong type is refused *before* anything is built,
    in one line naming the connector, the key and the value. A class that declares nothing gets its extra
    config passed through unchecked.
    """

    options: Mapping[str, Option] = field(default_factory=dict[str, Option])
    takes_spec: bool = False

    def __init__(self, *, takes_spec: bool = False, **options: Option) -> None:
        object.__setattr__(self, "options", dict(options))
        object.__setattr__(self, "takes_spec", takes_spec)

    def check(self, extra_config: Mapping[str, object], *, connector: str, method: str = "build_stack") -> None:
        """Refuse an unknown key, a missing required key or a bad value: one :class:`~capkv.ConfigError`, one line."""
        for key, value in extra_config.items():
            option = self.options.get(key)
            if option is None:
                known = ", ".join(f"{name} ({opt.describe()})" for name, opt in self.options.items()) or "none"
                raise ConfigError(
                    f'{connector}: unknown option "{key}" in kv_connector_extra_config (value {_short.repr(value)}); '
                    f"it accepts: {known}",
                    connector=connector, method=method, value={key: value},
                )
            problem = option.problem(value)
            if problem is not None:
                raise ConfigError(
                    f'{connector}: option "{key}" = {_short.repr(value)} in kv_connector_extra_config: {problem}',
                    connector=connector, method=method, value={key: value},
                )
        missing = [name for name, option in self.options.items() if option.required and name not in extra_config]
        if missing:
            raise ConfigError(
                f"{connector}: kv_connector_extra_config needs {', '.join(map(repr, missing))} "
                f"({'; '.join(self.options[name].describe() for name in missing)})",
                connector=connector, method=method, value=missing[0],
            )


def declared_options(cls: type[Any]) -> ConnectorOptions | None:
    """The options ``cls`` declares (:data:`OPTIONS_ATTRIBUTE`), or ``None`` when it declares none.

    A declaration of another type is refused: a misspelt or malformed declaration
    would otherwise silently turn the checks off.
    """
    declared: object = getattr(cls, OPTIONS_ATTRIBUTE, None)
    if declared is None or isinstance(declared, ConnectorOptions):
        return declared
    raise ConfigError(
        f"{cls.__qualname__}.{OPTIONS_ATTRIBUTE} must be a capkv.config.ConnectorOptions, "
        f"got {type(declared).__name__}",
        connector=cls.__qualname__, method="build_stack", value=declared,
    )


def check_extra_config(cls: type[Any], extra_config: Mapping[str, object], *, connector: str) -> bool:
    """Check ``extra_config`` against ``cls``'s declared options; whether it declares any."""
    options = declared_options(cls)
    if options is None:
        return False
    options.check(extra_config, connector=connector)
    return True


publish(__name__)
